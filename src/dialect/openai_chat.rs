//! OpenAI Chat Completions (`POST /v1/chat/completions`): `tool` messages are tool results;
//! `image_url` parts of `user` messages are user images.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{count, digest, elements, span_in, Dialect, Text};
use crate::projection::{Raw, RequestView, ToolResult, UserImage};

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    model: Text<'a>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Vec<Message<'a>>,
    #[serde(borrow)]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    max_tokens: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Text<'a>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_call_id: Text<'a>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<ToolCall<'a>>>,
}

#[derive(Deserialize)]
struct ToolCall<'a> {
    #[serde(borrow)]
    id: Text<'a>,
    #[serde(borrow)]
    function: Option<Named<'a>>,
    #[serde(borrow)]
    custom: Option<Named<'a>>,
}

#[derive(Deserialize)]
struct Named<'a> {
    #[serde(borrow)]
    name: Text<'a>,
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, rename = "type")]
    kind: Text<'a>,
}

pub(super) fn read(body: &str) -> Result<RequestView<'_>, serde_json::Error> {
    let request: Request = serde_json::from_str(body)?;
    let mut names: HashMap<Cow<str>, Cow<str>> = HashMap::new();
    let mut tool_results = Vec::new();
    let mut user_images = Vec::new();
    for (item, message) in request.messages.iter().enumerate() {
        match message.role.as_deref() {
            Some("assistant") => {
                for call in message.tool_calls.iter().flatten() {
                    let name = call.function.as_ref().or(call.custom.as_ref());
                    if let (Some(id), Some(Some(name))) = (&call.id, name.map(|n| &n.name)) {
                        names.insert(id.clone(), name.clone());
                    }
                }
            }
            Some("tool") => {
                if let (Some(id), Some(content)) = (&message.tool_call_id, message.content) {
                    tool_results.push(ToolResult {
                        item,
                        source: id.clone(),
                        tool_name: names.get(id).cloned(),
                        content: content.into(),
                        span: span_in(body, content.get()),
                        digest: digest(content.get()),
                    });
                }
            }
            Some("user") => {
                for part in message.content.and_then(elements).into_iter().flatten() {
                    let Ok(p) = serde_json::from_str::<Part>(part.get()) else {
                        continue;
                    };
                    if p.kind.as_deref() == Some("image_url") {
                        user_images.push(UserImage {
                            item,
                            part: part.into(),
                            span: span_in(body, part.get()),
                        });
                    }
                }
            }
            _ => {}
        }
    }
    let first = |roles: &[&str]| {
        request
            .messages
            .iter()
            .find(|m| m.role.as_deref().is_some_and(|r| roles.contains(&r)))
            .and_then(|m| m.content)
            .map(RawValue::get)
    };
    let root = [first(&["system", "developer"]), first(&["user"])]
        .into_iter()
        .flatten()
        .map(Cow::Borrowed)
        .collect();
    Ok(RequestView {
        tools: request.tools.map(Raw::from),
        conversation: None,
        root,
        body,
        shapes: &Dialect::OpenAiChat,
        max_output: count(request.max_completion_tokens).or(count(request.max_tokens)),
        model: request.model,
        tool_results,
        user_images,
    })
}

/// Each message's span and whether it is a `tool` message. A second pass over the messages,
/// made only when images must be placed after a turn's tool messages (SPEC A7).
pub fn message_spans(body: &str) -> Option<Vec<(crate::projection::Span, bool)>> {
    #[derive(Deserialize)]
    struct Messages<'a> {
        #[serde(borrow, default)]
        messages: Vec<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Role<'a> {
        #[serde(borrow)]
        role: Text<'a>,
    }
    let parsed: Messages = serde_json::from_str(body).ok()?;
    Some(
        parsed
            .messages
            .iter()
            .map(|m| {
                let role = serde_json::from_str::<Role>(m.get())
                    .ok()
                    .and_then(|r| r.role);
                (span_in(body, m.get()), role.as_deref() == Some("tool"))
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tool_results_with_names_and_spans() {
        let body = r#"{ "messages": [
            {"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"out\nput"},
            {"role":"tool","tool_call_id":"c2","content":[{"type":"text","text":"x"}]}
        ], "model":"gpt-4o", "stream": true, "unknown": {"k": [1, 2.50]}}"#;
        let view = read(body).unwrap();
        assert_eq!(view.model.as_deref(), Some("gpt-4o"));
        assert_eq!(view.tool_results.len(), 2);
        let r = &view.tool_results[0];
        assert_eq!(
            (r.item, &*r.source, r.tool_name.as_deref()),
            (2, "c1", Some("bash"))
        );
        assert_eq!(&body[r.span.start..r.span.end], r#""out\nput""#);
        assert_eq!(view.tool_results[1].tool_name, None);
        assert_eq!(view.user_images.len(), 1);
        let img = &view.user_images[0];
        assert!(body[img.span.start..img.span.end].starts_with(r#"{"type":"image_url""#));
    }
}
