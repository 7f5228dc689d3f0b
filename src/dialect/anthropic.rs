//! Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`): `tool_result` blocks
//! in user messages are tool results; `image` blocks in user messages are user images.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{count, span_of, Dialect, Text};
use crate::projection::{RequestView, ToolResult, UserImage};

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
struct Message<'a> {
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
    valid: bool,
}

impl<'a> Block<'a> {
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

/// An object key, borrowed from the body when it has no escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Key<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<Key<'a>>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Key<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(Visit(std::marker::PhantomData))
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
        Some(inner) if !inner.contains('\\') => Some(Some(Cow::Borrowed(inner))),
        _ => serde_json::from_str::<String>(raw)
            .ok()
            .map(|s| Some(Cow::Owned(s))),
    }
}

pub(super) fn read(body: &str) -> Result<RequestView<'_>, serde_json::Error> {
    let request: Request = serde_json::from_str(body)?;
    let mut names: HashMap<Cow<str>, Cow<str>> = HashMap::new();
    let mut tool_results = Vec::new();
    let mut user_images = Vec::new();
    for (item, message) in request.messages.iter().enumerate() {
        let role = message.role.as_deref();
        let blocks = match &message.content {
            Some(Content::Blocks(blocks)) => blocks.as_slice(),
            _ => &[],
        };
        for block in blocks.iter().filter(|b| b.valid) {
            match (role, block.kind.as_deref()) {
                (Some("assistant"), Some("tool_use" | "server_tool_use")) => {
                    if let (Some(id), Some(name)) = (&block.id, &block.name) {
                        names.insert(id.clone(), name.clone());
                    }
                }
                (Some("user"), Some("tool_result")) => {
                    if let (Some(id), Some(content)) = (block.tool_use_id.clone(), block.content) {
                        tool_results.push(ToolResult {
                            item,
                            tool_name: names.get(&id).cloned(),
                            source: id,
                            content,
                            span: span_of(body, content),
                        });
                    }
                }
                (Some("user"), Some("image")) => {
                    // The image part whole: read again (an image part is one small object
                    // around its data; the scan is the price of not keeping every block's).
                    let part = block.text(body).and_then(|t| serde_json::from_str(t).ok());
                    if let Some(part) = part {
                        user_images.push(UserImage {
                            item,
                            part,
                            span: span_of(body, part),
                        });
                    }
                }
                _ => {}
            }
        }
    }
    // The first user message as its blocks or its text (a session fingerprint: what matters is
    // that a conversation's every turn gives the same parts).
    let first_user = request
        .messages
        .iter()
        .find(|m| m.role.as_deref() == Some("user"));
    let mut root: Vec<Cow<str>> = request
        .system
        .map(|raw| Cow::Borrowed(raw.get()))
        .into_iter()
        .collect();
    match first_user.and_then(|m| m.content.as_ref()) {
        Some(Content::Blocks(blocks)) => root.extend(
            blocks
                .iter()
                .map(|b| Cow::Borrowed(b.text(body).unwrap_or_default())),
        ),
        Some(Content::Text(text)) => root.push(text.clone()),
        Some(Content::Other) | None => {}
    }
    Ok(RequestView {
        tools: request.tools,
        conversation: request.metadata.and_then(|m| m.user_id),
        root,
        body,
        shapes: &Dialect::AnthropicMessages,
        max_output: count(request.max_tokens),
        model: request.model,
        tool_results,
        user_images,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::Span;
    use proptest::prelude::*;

    /// A tool result as the tests compare it: its id, its tool's name, its content's span.
    type Seen = (String, Option<String>, Span);

    /// The reading before content blocks were read in one pass: each block read again whole.
    fn reference(body: &str) -> (Vec<Seen>, Vec<Span>) {
        #[derive(Deserialize)]
        struct Msg<'a> {
            #[serde(borrow)]
            role: Text<'a>,
            #[serde(borrow)]
            content: Option<&'a RawValue>,
        }
        #[derive(Deserialize)]
        struct Req<'a> {
            #[serde(borrow, default)]
            messages: Vec<Msg<'a>>,
        }
        #[derive(Deserialize)]
        struct Old<'a> {
            #[serde(borrow, rename = "type")]
            kind: Text<'a>,
            #[serde(borrow)]
            id: Text<'a>,
            #[serde(borrow)]
            name: Text<'a>,
            #[serde(borrow)]
            tool_use_id: Text<'a>,
            #[serde(borrow)]
            content: Option<&'a RawValue>,
        }
        let req: Req = serde_json::from_str(body).unwrap();
        let (mut names, mut results, mut images) = (HashMap::new(), Vec::new(), Vec::new());
        for m in &req.messages {
            let blocks = m
                .content
                .and_then(super::super::elements)
                .unwrap_or_default();
            for raw in blocks {
                let Ok(b) = serde_json::from_str::<Old>(raw.get()) else {
                    continue;
                };
                match (m.role.as_deref(), b.kind.as_deref()) {
                    (Some("assistant"), Some("tool_use")) => {
                        if let (Some(id), Some(name)) = (b.id, b.name) {
                            names.insert(id.to_string(), name.to_string());
                        }
                    }
                    (Some("user"), Some("tool_result")) => {
                        if let (Some(id), Some(c)) = (b.tool_use_id, b.content) {
                            let name = names.get(id.as_ref()).cloned();
                            results.push((id.to_string(), name, span_of(body, c)));
                        }
                    }
                    (Some("user"), Some("image")) => images.push(span_of(body, raw)),
                    _ => {}
                }
            }
        }
        (results, images)
    }

    fn block() -> impl Strategy<Value = String> {
        let ws = prop::sample::select(vec!["", " ", "\n  ", "\t"]);
        let text = prop::sample::select(vec![
            r#""plain""#,
            r#""esc\"aped\n""#,
            r#"[{"type":"text","text":"a"},{"type":"image","source":{"data":"QUJD"}}]"#,
            "null",
            "7",
        ]);
        let kind = prop::sample::select(vec![
            r#""tool_use""#,
            r#""tool_result""#,
            r#""image""#,
            r#""text""#,
            r#""tool_\u0072esult""#,
            "3",
        ]);
        let id = prop::sample::select(vec![r#""t1""#, r#""t2""#, r#""t\u0031""#, "null"]);
        (kind, id, text, ws, any::<u8>(), any::<bool>()).prop_map(
            |(kind, id, text, ws, order, twice)| {
                let mut fields = vec![
                    format!(r#""type"{ws}:{ws}{kind}"#),
                    format!(r#""id":{id}"#),
                    format!(r#""name":"bash""#),
                    format!(r#""tool_use_id"{ws}:{id}"#),
                    format!(r#""content":{ws}{text}"#),
                    format!(r#""source":{{"type":"base64","data":"QUJD"}}"#),
                ];
                let n = fields.len();
                fields.rotate_left(usize::from(order) % n);
                fields.truncate(3 + usize::from(order) % 4);
                if twice {
                    fields.push(r#""content":"again""#.to_string());
                }
                format!("{{{ws}{}{ws}}}", fields.join(&format!(",{ws}")))
            },
        )
    }

    proptest! {
        #[test]
        fn one_pass_blocks_read_what_whole_blocks_read(
            messages in prop::collection::vec(
                (any::<bool>(), prop::collection::vec(block(), 0..5), any::<bool>()), 0..6)
        ) {
            let messages: Vec<String> = messages
                .into_iter()
                .map(|(user, blocks, odd)| {
                    let role = if user { "user" } else { "assistant" };
                    let content = if odd { "[1, \"x\", [2]]".to_string() } else {
                        format!("[ {} ]", blocks.join(" , "))
                    };
                    format!(r#"{{"role":"{role}","content":{content}}}"#)
                })
                .collect();
            let body = format!(r#"{{"model":"m","messages":[{}]}}"#, messages.join(","));
            let view = read(&body).unwrap();
            let (results, images) = reference(&body);
            let seen: Vec<Seen> = view
                .tool_results
                .iter()
                .map(|r| (r.source.to_string(), r.tool_name.as_deref().map(str::to_string), r.span))
                .collect();
            prop_assert_eq!(seen, results);
            let seen: Vec<Span> = view.user_images.iter().map(|u| u.span).collect();
            prop_assert_eq!(seen, images);
        }
    }

    #[test]
    fn message_content_of_any_shape_reads_and_roots_the_session() {
        let body = r#"{"model":"m","system":"be brief","messages":[
          {"role":"user","content":"line one\nline \"two\""},
          {"role":"assistant","content":{"odd":[1,{"type":"tool_use"}]}},
          {"role":"user","content":7},
          {"role":"user","content":null},
          {"role":"user","content":[true,{"type":"tool_result","tool_use_id":"x","content":"ok"}]}
        ]}"#;
        let view = read(body).unwrap();
        assert_eq!(view.root, ["\"be brief\"", "line one\nline \"two\""]);
        assert_eq!(view.tool_results.len(), 1);
        assert_eq!(view.tool_results[0].content.get(), r#""ok""#);
        let blocks = r#"{"messages":[{"role":"user","content":[ {"type":"text","text":"a"} ,{"type":"text","text":"b"}]}]}"#;
        let view = read(blocks).unwrap();
        assert_eq!(
            view.root,
            [
                r#"{"type":"text","text":"a"}"#,
                r#"{"type":"text","text":"b"}"#
            ]
        );
        // Bad JSON inside content is still bad JSON.
        assert!(read(r#"{"messages":[{"role":"user","content":[{"type":]}]}"#).is_err());
    }

    #[test]
    fn reads_tool_result_blocks() {
        let body = r#"{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[
          {"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA"}}]},
          {"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"tool_use","id":"tu1","name":"read_file","input":{}}]},
          {"role":"user","content":[{"type":"tool_result","tool_use_id":"tu1","content":"file text","cache_control":{"type":"ephemeral"}}]}
        ]}"#;
        let view = read(body).unwrap();
        let r = &view.tool_results[0];
        assert_eq!(r.tool_name.as_deref(), Some("read_file"));
        assert_eq!(&body[r.span.start..r.span.end], r#""file text""#);
        assert_eq!(view.user_images.len(), 1);
    }
}
