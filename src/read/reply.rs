//! One round's output as history items and calls, in each dialect's shape; the tool results
//! that answer it; and what the client is shown: every round's output but the read calls,
//! merged into one response (C2, C4).

use serde_json::{json, Map, Value};

use super::{add_usage, Answer, Call};
use crate::dialect::Dialect;
use crate::json;

/// What the model produced in one round.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Output {
    /// The output as history items, exactly as they go back to the model: the assistant
    /// message (chat, Anthropic; thinking blocks and signatures untouched) or the output items
    /// (Responses).
    pub items: Vec<Value>,
    /// Every tool call, in order.
    pub calls: Vec<Call>,
    pub usage: Option<Value>,
}

impl Output {
    /// The read calls and whether the model also called other tools.
    pub fn read_calls(&self, read: &str) -> (Vec<&Call>, bool) {
        let reads: Vec<&Call> = self.calls.iter().filter(|c| c.name == read).collect();
        let others = reads.len() < self.calls.len();
        (reads, others)
    }
}

fn arguments(raw: &Value) -> Value {
    match raw {
        Value::String(s) => serde_json::from_str(s).unwrap_or(Value::Null),
        other => other.clone(),
    }
}

/// Reads a whole (non-streamed) response.
pub fn parse(dialect: Dialect, response: &Value) -> Output {
    let usage = response.get("usage").cloned();
    match dialect {
        Dialect::OpenAiChat => {
            let message = &response["choices"][0]["message"];
            let tool_calls = message["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let calls = tool_calls
                .iter()
                .map(|c| Call {
                    id: c["id"].as_str().unwrap_or_default().to_string(),
                    name: c["function"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    arguments: arguments(&c["function"]["arguments"]),
                })
                .collect();
            Output {
                items: vec![chat_message(&message["content"], &tool_calls)],
                calls,
                usage,
            }
        }
        Dialect::OpenAiResponses => {
            let items = response["output"].as_array().cloned().unwrap_or_default();
            Output {
                calls: responses_calls(&items),
                items,
                usage,
            }
        }
        Dialect::AnthropicMessages => {
            let content = response["content"].as_array().cloned().unwrap_or_default();
            Output {
                calls: anthropic_calls(&content),
                items: vec![json!({"role": "assistant", "content": content})],
                usage,
            }
        }
    }
}

/// An assistant message of chat, as it goes back into the history.
pub fn chat_message(content: &Value, tool_calls: &[Value]) -> Value {
    let mut m = Map::new();
    m.insert("role".into(), "assistant".into());
    m.insert("content".into(), content.clone());
    if !tool_calls.is_empty() {
        m.insert("tool_calls".into(), Value::Array(tool_calls.to_vec()));
    }
    Value::Object(m)
}

pub fn responses_calls(items: &[Value]) -> Vec<Call> {
    items
        .iter()
        .filter(|i| i["type"] == "function_call")
        .map(|i| Call {
            id: i["call_id"].as_str().unwrap_or_default().to_string(),
            name: i["name"].as_str().unwrap_or_default().to_string(),
            arguments: arguments(&i["arguments"]),
        })
        .collect()
}

pub fn anthropic_calls(content: &[Value]) -> Vec<Call> {
    content
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .map(|b| Call {
            id: b["id"].as_str().unwrap_or_default().to_string(),
            name: b["name"].as_str().unwrap_or_default().to_string(),
            arguments: b["input"].clone(),
        })
        .collect()
}

/// The items that answer read calls. An image goes where the dialect takes a tool's image:
/// inside the tool result (Anthropic, Responses), or in a user message after the tool messages
/// (chat, whose tool messages take text only); audio, which only chat takes, goes there too.
pub fn results(dialect: Dialect, answers: &[Answer]) -> Vec<Value> {
    match dialect {
        Dialect::OpenAiChat => {
            let mut items: Vec<Value> = answers
                .iter()
                .map(|a| json!({"role": "tool", "tool_call_id": a.id, "content": a.text}))
                .collect();
            let images: Vec<Value> = answers
                .iter()
                .filter_map(|a| a.media.as_ref().map(|i| (a, i)))
                .flat_map(|(a, i)| match i.audio_format() {
                    Some(format) => [
                        json!({"type": "text", "text": format!("[sluice: the audio read by call {}]", a.id)}),
                        json!({"type": "input_audio", "input_audio": {"data": i.base64, "format": format}}),
                    ],
                    None => [
                        json!({"type": "text", "text": format!("[sluice: the image read by call {}]", a.id)}),
                        json!({"type": "image_url", "image_url": {"url": format!("data:{};base64,{}", i.mime, i.base64)}}),
                    ],
                })
                .collect();
            if !images.is_empty() {
                items.push(json!({"role": "user", "content": images}));
            }
            items
        }
        Dialect::OpenAiResponses => answers
            .iter()
            .map(|a| {
                let output = match a.media.as_ref().filter(|i| i.audio_format().is_none()) {
                    Some(i) => json!([
                        {"type": "input_text", "text": a.text},
                        {"type": "input_image", "image_url": format!("data:{};base64,{}", i.mime, i.base64)}
                    ]),
                    None => json!(a.text),
                };
                json!({"type": "function_call_output", "call_id": a.id, "output": output})
            })
            .collect(),
        Dialect::AnthropicMessages => vec![json!({"role": "user", "content": result_blocks(answers)})],
    }
}

/// Anthropic `tool_result` blocks.
pub fn result_blocks(answers: &[Answer]) -> Vec<Value> {
    answers
        .iter()
        .map(|a| {
            let content = match a.media.as_ref().filter(|i| i.audio_format().is_none()) {
                Some(i) => json!([
                    {"type": "text", "text": a.text},
                    {"type": "image", "source": {"type": "base64", "media_type": i.mime, "data": i.base64}}
                ]),
                None => json!(a.text),
            };
            json!({"type": "tool_result", "tool_use_id": a.id, "content": content})
        })
        .collect()
}

fn is_read_call(dialect: Dialect, value: &Value, read: &str) -> bool {
    match dialect {
        Dialect::OpenAiChat => value["function"]["name"] == read,
        Dialect::OpenAiResponses => value["type"] == "function_call" && value["name"] == read,
        Dialect::AnthropicMessages => value["type"] == "tool_use" && value["name"] == read,
    }
}

/// What the client is shown of `rounds`: everything but the read calls, as the history items
/// it will send back (one assistant message for chat and Anthropic, the output items for
/// Responses).
/// Between the texts of two rounds in chat's one content string: the rounds read as the
/// separate paragraphs they are (Anthropic and Responses keep them as separate blocks or items).
pub const CHAT_ROUND_SEPARATOR: &str = "\n\n";

pub fn visible(dialect: Dialect, rounds: &[Output], read: &str) -> Vec<Value> {
    match dialect {
        Dialect::OpenAiChat => {
            let mut text: Option<String> = None;
            let mut calls = Vec::new();
            for item in rounds.iter().flat_map(|r| &r.items) {
                if let Some(t) = item["content"].as_str() {
                    let text = text.get_or_insert_with(String::new);
                    if !text.is_empty() && !t.is_empty() {
                        text.push_str(CHAT_ROUND_SEPARATOR);
                    }
                    text.push_str(t);
                }
                for call in item["tool_calls"].as_array().into_iter().flatten() {
                    if !is_read_call(dialect, call, read) {
                        calls.push(call.clone());
                    }
                }
            }
            let content = text.map_or(Value::Null, Value::String);
            vec![chat_message(&content, &calls)]
        }
        Dialect::OpenAiResponses => rounds
            .iter()
            .flat_map(|r| &r.items)
            .filter(|i| !is_read_call(dialect, i, read))
            .cloned()
            .collect(),
        Dialect::AnthropicMessages => {
            let content: Vec<Value> = rounds
                .iter()
                .flat_map(|r| &r.items)
                .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
                .filter(|b| !is_read_call(dialect, b, read))
                .collect();
            vec![json!({"role": "assistant", "content": content})]
        }
    }
}

/// The usage of all rounds added up.
pub fn total_usage(rounds: &[Output]) -> Option<Value> {
    let mut total: Option<Value> = None;
    for usage in rounds.iter().filter_map(|r| r.usage.as_ref()) {
        match &mut total {
            Some(t) => add_usage(t, usage),
            None => total = Some(usage.clone()),
        }
    }
    total
}

/// The client's response: the last round's response, showing every round's visible output and
/// the usage of all rounds (C2, non-streamed).
pub fn merged(dialect: Dialect, mut last: Value, rounds: &[Output], read: &str) -> Value {
    let shown = visible(dialect, rounds, read);
    if let Some(usage) = total_usage(rounds) {
        json::set(&mut last, "usage", usage);
    }
    match dialect {
        Dialect::OpenAiChat => {
            let message = json::first_mut(&mut last, "choices")
                .and_then(|choice| json::member_mut(choice, "message"))
                .and_then(Value::as_object_mut);
            if let (Some(message), Some(item)) = (message, shown.first()) {
                message.insert("content".into(), item["content"].clone());
                match item.get("tool_calls") {
                    Some(calls) => message.insert("tool_calls".into(), calls.clone()),
                    None => message.remove("tool_calls"),
                };
            }
        }
        Dialect::OpenAiResponses => {
            json::set(&mut last, "output", Value::Array(shown));
        }
        Dialect::AnthropicMessages => {
            if let Some(item) = shown.first() {
                json::set(&mut last, "content", item["content"].clone());
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(content: Value, calls: Value, usage: u64) -> Value {
        json!({"id": "c", "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": calls}, "finish_reason": "tool_calls"}],
               "usage": {"prompt_tokens": usage, "completion_tokens": 1, "total_tokens": usage + 1}})
    }

    #[test]
    fn chat_rounds_merge_into_one_message_without_read_calls() {
        let read = json!([{"id": "r1", "type": "function", "function": {"name": "sluice_read", "arguments": "{\"cursor\":\"c\"}"}}]);
        let first = parse(Dialect::OpenAiChat, &chat(json!("Reading. "), read, 10));
        assert_eq!(first.calls[0].arguments["cursor"], "c");
        assert_eq!(first.read_calls("sluice_read").0.len(), 1);
        assert!(!first.read_calls("sluice_read").1);
        let last_response = chat(json!("Done."), json!(null), 20);
        let last = parse(Dialect::OpenAiChat, &last_response);
        let rounds = [first, last];
        let out = merged(Dialect::OpenAiChat, last_response, &rounds, "sluice_read");
        assert_eq!(
            out["choices"][0]["message"]["content"],
            "Reading. \n\nDone."
        );
        assert!(out["choices"][0]["message"].get("tool_calls").is_none());
        assert_eq!(out["usage"]["prompt_tokens"], 30);
        assert_eq!(out["usage"]["total_tokens"], 32);
    }

    #[test]
    fn anthropic_keeps_thinking_and_drops_only_read_blocks() {
        let r1 = json!({"content": [
            {"type": "thinking", "thinking": "hm", "signature": "SIG"},
            {"type": "tool_use", "id": "t1", "name": "sluice_read", "input": {"cursor": "c"}},
            {"type": "tool_use", "id": "t2", "name": "bash", "input": {}}],
            "usage": {"input_tokens": 3, "output_tokens": 4}});
        let out = parse(Dialect::AnthropicMessages, &r1);
        assert_eq!(out.items[0]["content"][0]["signature"], "SIG");
        assert!(out.read_calls("sluice_read").1, "mixed");
        let shown = visible(Dialect::AnthropicMessages, &[out], "sluice_read");
        let types: Vec<_> = shown[0]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].clone())
            .collect();
        assert_eq!(types, [json!(null), json!("t2")]);
    }

    #[test]
    fn responses_output_drops_read_items() {
        let r = json!({"output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
            {"type": "function_call", "call_id": "c1", "name": "sluice_read", "arguments": "{}"}]});
        let out = parse(Dialect::OpenAiResponses, &r);
        assert_eq!(out.calls.len(), 1);
        let merged = merged(Dialect::OpenAiResponses, r, &[out], "sluice_read");
        assert_eq!(merged["output"].as_array().unwrap().len(), 1);
    }
}
