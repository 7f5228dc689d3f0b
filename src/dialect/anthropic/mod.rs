//! Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`): `tool_result` blocks
//! in user messages are tool results; `image` blocks in user messages are user images.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::resume::Key;
use super::Text;
use crate::json::Str;

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    model: Text<'a>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Vec<Message<'a>>,
    #[serde(borrow)]
    system: Option<&'a RawValue>,
    #[serde(borrow)]
    metadata: Option<Metadata<'a>>,
    #[serde(borrow)]
    max_tokens: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Metadata<'a> {
    #[serde(borrow)]
    user_id: Text<'a>,
}

#[derive(Deserialize)]
pub(super) struct Message<'a> {
    #[serde(borrow)]
    role: Text<'a>,
    #[serde(borrow)]
    content: Option<Content<'a>>,
}

/// A message's `content`, read in the same pass as the message: its blocks, or its text. A tool
/// result's content is scanned once, as a raw value inside its block: reading the content whole,
/// then each block, then each tool result's content would scan it three times.
enum Content<'a> {
    Blocks(Vec<Block<'a>>),
    Text(Cow<'a, str>),
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<Content<'a>>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Content<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("message content")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut blocks = Vec::new();
                while let Some(block) = seq.next_element::<Block<'a>>()? {
                    blocks.push(block);
                }
                Ok(Content::Blocks(blocks))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Content::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
        }
        deserializer.deserialize_any(Visit(std::marker::PhantomData))
    }
}

/// A content block: the fields sluice reads, and where its bytes are. Anything that is not an
/// object, or an object with a field twice or of an unexpected type, is `valid: false`: left as
/// the client sent it, as the provider will read it.
#[derive(Default)]
struct Block<'a> {
    kind: Text<'a>,
    id: Text<'a>,
    name: Text<'a>,
    tool_use_id: Text<'a>,
    content: Option<&'a RawValue>,
    /// Its first key (borrowed from the body) and its last value: the object's own bytes are
    /// between them and the braces around them ([`Block::text`]).
    bounds: Option<(&'a str, &'a RawValue)>,
    /// It carries a `cache_control` field.
    marked: bool,
    valid: bool,
}

impl<'a> Block<'a> {
    /// Where a cache breakpoint could be added to the block: before its closing brace.
    fn slot(&self, body: &'a str) -> Option<crate::projection::edits::Slot> {
        let text = self.text(body)?;
        let close = crate::dialect::span_in(body, text).end.checked_sub(1)?;
        Some(crate::projection::edits::Slot {
            close,
            marked: self.marked,
        })
    }

    /// The block's bytes as sent, `{` to `}`: only whitespace lies between a brace and its
    /// object's first key or last value (RFC 8259).
    fn text(&self, body: &'a str) -> Option<&'a str> {
        let (key, last) = self.bounds?;
        let offset = |s: &str| (s.as_ptr() as usize).checked_sub(body.as_ptr() as usize);
        // The key's opening quote, then back over whitespace to the brace.
        let before = body.get(..offset(key)?.checked_sub(1)?)?;
        let start = before.trim_end_matches([' ', '\t', '\n', '\r']);
        let start = start.len().checked_sub(1)?;
        let after_last = offset(last.get())? + last.get().len();
        let rest = body.get(after_last..)?;
        let end =
            after_last + (rest.len() - rest.trim_start_matches([' ', '\t', '\n', '\r']).len());
        (body.as_bytes().get(start) == Some(&b'{') && body.as_bytes().get(end) == Some(&b'}'))
            .then(|| body.get(start..=end))
            .flatten()
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Block<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<Block<'a>>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Block<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a content block")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut block = Block {
                    valid: true,
                    ..Block::default()
                };
                let mut first_key = None;
                let mut first = true;
                // The fields read so far, one bit each.
                let mut seen = 0u8;
                while let Some(key) = map.next_key::<Key<'de>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    if first {
                        first_key = match key {
                            Key(Cow::Borrowed(k)) => Some(k),
                            Key(Cow::Owned(_)) => None,
                        };
                        first = false;
                    }
                    block.bounds = first_key.map(|k| (k, value));
                    let (bit, field) = match key.0.as_ref() {
                        "type" => (1u8, &mut block.kind),
                        "id" => (2, &mut block.id),
                        "name" => (4, &mut block.name),
                        "tool_use_id" => (8, &mut block.tool_use_id),
                        "cache_control" => {
                            block.marked = true;
                            continue;
                        }
                        "content" => {
                            // A field twice (even after a null) leaves the block as sent.
                            block.valid &= seen & 16 == 0;
                            seen |= 16;
                            block.content = (value.get() != "null").then_some(value);
                            continue;
                        }
                        _ => continue,
                    };
                    block.valid &= seen & bit == 0;
                    seen |= bit;
                    match text_of(value) {
                        Some(text) => *field = text,
                        None => block.valid = false,
                    }
                }
                Ok(block)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Block::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Block::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Block::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Block::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Block::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Block::default())
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Block::default())
            }
        }
        deserializer.deserialize_any(Visit(std::marker::PhantomData))
    }
}

/// A field's text: `Some(None)` for `null`, borrowed when it has no escapes; `None` when the
/// value is not a string.
fn text_of(raw: &RawValue) -> Option<Text<'_>> {
    let raw = raw.get();
    if raw == "null" {
        return Some(None);
    }
    if !raw.starts_with('"') {
        return None;
    }
    match raw.get(1..raw.len() - 1) {
        Some(inner) if !inner.contains('\\') => Some(Some(Str(Cow::Borrowed(inner)))),
        _ => serde_json::from_str::<String>(raw)
            .ok()
            .map(|s| Some(Str(Cow::Owned(s)))),
    }
}

mod reading;
mod wire;
pub(crate) use wire::Messages;
#[cfg(test)]
mod tests;

pub(crate) use reading::{read, Found, Reading};
