//! OpenAI Responses (`POST /v1/responses`): `function_call_output` items are tool results;
//! `input_image` parts of user messages are user images. A string `input` holds neither.

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
    #[serde(borrow)]
    input: Option<&'a RawValue>,
    #[serde(borrow)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_cache_key: Text<'a>,
    #[serde(borrow)]
    max_output_tokens: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Item<'a> {
    #[serde(borrow, rename = "type")]
    kind: Text<'a>,
    #[serde(borrow)]
    role: Text<'a>,
    #[serde(borrow)]
    call_id: Text<'a>,
    #[serde(borrow)]
    name: Text<'a>,
    #[serde(borrow)]
    output: Option<&'a RawValue>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, rename = "type")]
    kind: Text<'a>,
}

pub(super) fn read(body: &str) -> Result<RequestView<'_>, serde_json::Error> {
    let request: Request = serde_json::from_str(body)?;
    let items: Vec<Item> = match request.input {
        Some(raw) if raw.get().starts_with('[') => serde_json::from_str(raw.get())?,
        _ => Vec::new(),
    };
    let mut names: HashMap<Cow<str>, Cow<str>> = HashMap::new();
    let mut tool_results = Vec::new();
    let mut user_images = Vec::new();
    for (index, item) in items.iter().enumerate() {
        match (item.kind.as_deref(), item.role.as_deref()) {
            (Some("function_call" | "custom_tool_call"), _) => {
                if let (Some(id), Some(name)) = (&item.call_id, &item.name) {
                    names.insert(id.clone(), name.clone());
                }
            }
            (Some("function_call_output" | "custom_tool_call_output"), _) => {
                if let (Some(id), Some(output)) = (&item.call_id, item.output) {
                    tool_results.push(ToolResult {
                        item: index,
                        source: id.clone(),
                        tool_name: names.get(id).cloned(),
                        content: output.into(),
                        span: span_in(body, output.get()),
                        digest: digest(output.get()),
                    });
                }
            }
            (None | Some("message"), Some("user")) => {
                for part in item.content.and_then(elements).into_iter().flatten() {
                    let Ok(p) = serde_json::from_str::<Part>(part.get()) else {
                        continue;
                    };
                    if p.kind.as_deref() == Some("input_image") {
                        user_images.push(UserImage {
                            item: index,
                            part: part.into(),
                            span: span_in(body, part.get()),
                        });
                    }
                }
            }
            _ => {}
        }
    }
    let first_user = match request.input {
        Some(raw) if raw.get().starts_with('"') => Some(raw.get()),
        _ => items
            .iter()
            .find(|i| i.role.as_deref() == Some("user"))
            .and_then(|i| i.content)
            .map(RawValue::get),
    };
    let root = [request.instructions.map(RawValue::get), first_user]
        .into_iter()
        .flatten()
        .map(Cow::Borrowed)
        .collect();
    Ok(RequestView {
        tools: request.tools.map(Raw::from),
        conversation: request.prompt_cache_key,
        root,
        body,
        shapes: &Dialect::OpenAiResponses,
        max_output: count(request.max_output_tokens),
        model: request.model,
        tool_results,
        user_images,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_function_call_outputs() {
        let body = r#"{"model":"gpt-5","input":[
            {"role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"https://x/y.png"}]},
            {"type":"function_call","call_id":"f1","name":"screenshot","arguments":"{}"},
            {"type":"function_call_output","call_id":"f1","output":[{"type":"input_text","text":"ok"}]}
        ],"stream":false}"#;
        let view = read(body).unwrap();
        let r = &view.tool_results[0];
        assert_eq!(r.tool_name.as_deref(), Some("screenshot"));
        assert!(body[r.span.start..r.span.end].starts_with(r#"[{"type":"input_text""#));
        assert_eq!(view.user_images.len(), 1);
    }

    #[test]
    fn string_input_has_nothing_to_project() {
        let view = read(r#"{"model":"gpt-5","input":"hello"}"#).unwrap();
        assert!(view.tool_results.is_empty());
    }
}
