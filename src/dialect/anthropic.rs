//! Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`): `tool_result` blocks
//! in user messages are tool results; `image` blocks in user messages are user images.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{span_of, Dialect, Text};
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

/// A message's `content`, read in the same pass as the message: its blocks as raw JSON (each
/// read again by [`Block`]), or its text. Reading it whole first would scan every tool result,
/// image and all, one more time.
enum Content<'a> {
    Blocks(Vec<&'a RawValue>),
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
                while let Some(block) = seq.next_element::<&'de RawValue>()? {
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

#[derive(Deserialize)]
struct Block<'a> {
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
        for &raw in blocks {
            let Ok(block) = serde_json::from_str::<Block>(raw.get()) else {
                continue;
            };
            match (role, block.kind.as_deref()) {
                (Some("assistant"), Some("tool_use" | "server_tool_use")) => {
                    if let (Some(id), Some(name)) = (block.id, block.name) {
                        names.insert(id, name);
                    }
                }
                (Some("user"), Some("tool_result")) => {
                    if let (Some(id), Some(content)) = (block.tool_use_id, block.content) {
                        tool_results.push(ToolResult {
                            item,
                            tool_name: names.get(&id).cloned(),
                            source: id,
                            content,
                            span: span_of(body, content),
                        });
                    }
                }
                (Some("user"), Some("image")) => user_images.push(UserImage {
                    item,
                    part: raw,
                    span: span_of(body, raw),
                }),
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
        Some(Content::Blocks(blocks)) => root.extend(blocks.iter().map(|b| Cow::Borrowed(b.get()))),
        Some(Content::Text(text)) => root.push(text.clone()),
        Some(Content::Other) | None => {}
    }
    Ok(RequestView {
        tools: request.tools,
        conversation: request.metadata.and_then(|m| m.user_id),
        root,
        body: body.as_bytes(),
        shapes: &Dialect::AnthropicMessages,
        model: request.model,
        tool_results,
        user_images,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
