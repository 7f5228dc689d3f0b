//! Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`): `tool_result` blocks
//! in user messages are tool results; `image` blocks in user messages are user images.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{elements, span_of, Dialect, Text};
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
    content: Option<&'a RawValue>,
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
        for raw in message.content.and_then(elements).into_iter().flatten() {
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
    let first_user = request
        .messages
        .iter()
        .find(|m| m.role.as_deref() == Some("user"))
        .and_then(|m| m.content)
        .map(RawValue::get);
    let root = [request.system.map(RawValue::get), first_user]
        .into_iter()
        .flatten()
        .collect();
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
