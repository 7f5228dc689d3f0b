//! Anthropic Messages' shapes for the read tool's rounds (`crate::dialect::wire::Wire`): one
//! assistant message of content blocks (thinking and signatures kept), `tool_result` blocks in
//! one user message, and events by block index closed by `message_delta` and `message_stop`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::dialect::span_of;
use crate::dialect::stitch::{emit, Closing, Events, Stream};
use crate::dialect::wire::{
    event_text, into_list, push_text, top_name, Answer, Call, Kind, Output, Wire,
};
use crate::json;
use crate::projection::Edit;

/// Anthropic Messages.
#[derive(Debug)]
pub struct Messages;

fn calls(content: &[Value]) -> Vec<Call> {
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

fn is_read_call(block: &Value, read: &str) -> bool {
    block["type"] == "tool_use" && block["name"] == read
}

/// `tool_result` blocks.
fn result_blocks(answers: &[Answer]) -> Vec<Value> {
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

impl Wire for Messages {
    fn tool(&self, name: &str, description: &str, parameters: Value) -> Value {
        json!({"name": name, "description": description, "input_schema": parameters})
    }

    fn tool_names(&self, tool: &RawValue) -> Vec<String> {
        top_name(tool)
    }

    fn history_key(&self) -> &'static str {
        "messages"
    }

    fn answer_in_text(&self) -> (&'static str, &'static str) {
        ("tool_choice", r#"{"type":"none"}"#)
    }

    fn output(&self, response: &Value) -> Output {
        let content = response["content"].as_array().cloned().unwrap_or_default();
        Output {
            calls: calls(&content),
            items: vec![json!({"role": "assistant", "content": content})],
            usage: response.get("usage").cloned(),
        }
    }

    fn results(&self, answers: &[Answer]) -> Vec<Value> {
        vec![json!({"role": "user", "content": result_blocks(answers)})]
    }

    fn results_first_in_next(&self, answers: &[Answer]) -> Option<Vec<Value>> {
        Some(result_blocks(answers))
    }

    fn visible(&self, rounds: &[Output], read: &str) -> Vec<Value> {
        let content: Vec<Value> = rounds
            .iter()
            .flat_map(|r| &r.items)
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .filter(|b| !is_read_call(b, read))
            .collect();
        vec![json!({"role": "assistant", "content": content})]
    }

    fn show(&self, last: &mut Value, shown: Vec<Value>, usage: Option<Value>) {
        if let Some(usage) = usage {
            json::set(last, "usage", usage);
        }
        if let Some(item) = shown.first() {
            json::set(last, "content", item["content"].clone());
        }
    }

    fn item_text(&self, item: &Value, out: &mut String) {
        for key in ["role", "tool_use_id"] {
            if let Some(s) = item[key].as_str() {
                push_text(out, s);
            }
        }
        // A message's `id` is the provider's and not echoed by every client: only a call's.
        if item["type"] == "tool_use" {
            if let Some(s) = item["id"].as_str() {
                push_text(out, s);
            }
        }
        for key in ["content", "text"] {
            match &item[key] {
                Value::String(s) => push_text(out, s),
                Value::Array(parts) => {
                    for part in parts {
                        if !matches!(
                            part["type"].as_str(),
                            Some("thinking" | "redacted_thinking")
                        ) {
                            self.item_text(part, out);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    fn is_model_item(&self, raw: &RawValue) -> bool {
        Kind::of(raw).is_some_and(|k| k.role.as_deref() == Some("assistant"))
    }

    fn put_first(&self, body: &str, next: &RawValue, prefix: &str) -> Option<Edit> {
        #[derive(Deserialize)]
        struct Content<'a> {
            #[serde(borrow)]
            content: Option<&'a RawValue>,
        }
        let content = serde_json::from_str::<Content>(next.get()).ok()?.content?;
        let span = span_of(body, content);
        let raw = content.get();
        if raw.starts_with('"') {
            return Some(Edit {
                span,
                with: format!(r#"[{prefix},{{"type":"text","text":{raw}}}]"#).into(),
            });
        }
        into_list(span, raw, prefix, true)
    }

    fn events(&self) -> Box<dyn Events> {
        Box::<MessagesEvents>::default()
    }

    fn answer(&self, model: &str, text: &str, streamed: bool) -> String {
        if !streamed {
            return json!({"id": "msg_replay", "type": "message", "role": "assistant",
                "model": model, "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn", "stop_sequence": null})
            .to_string();
        }
        [
            event_text(
                Some("message_start"),
                &json!({"type": "message_start", "message": {"id": "msg_replay",
                    "type": "message", "role": "assistant", "model": model, "content": [],
                    "stop_reason": null, "stop_sequence": null}}),
            ),
            event_text(
                Some("content_block_start"),
                &json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
            ),
            event_text(
                Some("content_block_delta"),
                &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": text}}),
            ),
            event_text(
                Some("content_block_stop"),
                &json!({"type": "content_block_stop", "index": 0}),
            ),
            event_text(
                Some("message_delta"),
                &json!({"type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": null}}),
            ),
            event_text(Some("message_stop"), &json!({"type": "message_stop"})),
        ]
        .concat()
    }
}

/// Anthropic events of one stream.
#[derive(Debug, Default)]
struct MessagesEvents {
    /// This round's blocks by upstream index, with their partial tool input.
    blocks: BTreeMap<u64, (Value, String)>,
}

impl Events for MessagesEvents {
    fn event(&mut self, s: &mut Stream, mut event: Value) -> Option<Value> {
        let kind = event["type"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "message_start" => {
                s.usage = event["message"].get("usage").cloned();
                (s.round_no == 0).then_some(event)
            }
            "content_block_start" => {
                let index = event["index"].as_u64().unwrap_or(0);
                let block = event["content_block"].clone();
                let is_read = is_read_call(&block, &s.read);
                self.blocks.insert(index, (block, String::new()));
                let client = s.index(index, is_read)?;
                s.set_index(&mut event, "index", index, client);
                Some(event)
            }
            "content_block_delta" => {
                let index = event["index"].as_u64().unwrap_or(0);
                if let Some((block, partial)) = self.blocks.get_mut(&index) {
                    apply_delta(block, partial, &event["delta"]);
                }
                let client = s.index(index, false)?;
                s.set_index(&mut event, "index", index, client);
                Some(event)
            }
            "content_block_stop" => {
                let index = event["index"].as_u64().unwrap_or(0);
                if let Some((block, partial)) = self.blocks.get_mut(&index) {
                    if block["type"] == "tool_use" {
                        let input = if partial.trim().is_empty() {
                            block.get("input").cloned().unwrap_or_else(|| json!({}))
                        } else {
                            serde_json::from_str(partial).unwrap_or_else(|_| json!({}))
                        };
                        json::set(block, "input", input);
                    }
                }
                let client = s.index(index, false)?;
                s.set_index(&mut event, "index", index, client);
                Some(event)
            }
            "message_delta" => {
                if let Some(usage) = event.get("usage") {
                    let mut total = s.usage.clone().unwrap_or_else(|| json!({}));
                    // message_delta's counts are cumulative for the message: they replace.
                    if let (Some(t), Some(u)) = (total.as_object_mut(), usage.as_object()) {
                        for (k, v) in u {
                            if !v.is_null() {
                                t.insert(k.clone(), v.clone());
                            }
                        }
                    }
                    s.usage = Some(total);
                }
                s.hold(Some(kind), event);
                None
            }
            "message_stop" => {
                s.hold(Some(kind), event);
                s.complete = true;
                None
            }
            _ => Some(event),
        }
    }

    fn output(&self, s: &Stream) -> Output {
        let content: Vec<Value> = self.blocks.values().map(|(b, _)| b.clone()).collect();
        Output {
            calls: calls(&content),
            items: vec![json!({"role": "assistant", "content": content})],
            usage: s.usage.clone(),
        }
    }

    fn next_round(&mut self) {
        self.blocks.clear();
    }

    fn closing(&mut self, c: Closing<'_>, out: &mut Vec<u8>) {
        let mut data = c.data;
        if data["type"] == "message_delta" {
            if let Some(total) = c.total {
                json::set(&mut data, "usage", total.clone());
            }
        }
        emit(out, c.name, &data);
    }

    fn error(&mut self, message: &str, out: &mut Vec<u8>) {
        emit(
            out,
            Some("error"),
            &json!({"type": "error", "error": {"type": "api_error", "message": message}}),
        );
    }
}

/// Applies a content delta to the block being built, so the block that goes back to the model
/// is exactly what it produced (thinking and signatures included).
fn apply_delta(block: &mut Value, partial: &mut String, delta: &Value) {
    let append = |block: &mut Value, key: &str, more: &str| {
        let mut s = block[key].as_str().unwrap_or_default().to_string();
        s.push_str(more);
        json::set(block, key, s);
    };
    match delta["type"].as_str() {
        Some("text_delta") => append(block, "text", delta["text"].as_str().unwrap_or_default()),
        Some("thinking_delta") => append(
            block,
            "thinking",
            delta["thinking"].as_str().unwrap_or_default(),
        ),
        Some("signature_delta") => append(
            block,
            "signature",
            delta["signature"].as_str().unwrap_or_default(),
        ),
        Some("input_json_delta") => {
            partial.push_str(delta["partial_json"].as_str().unwrap_or_default())
        }
        Some("citations_delta") => {
            match json::member_mut(block, "citations").and_then(Value::as_array_mut) {
                Some(list) => list.push(delta["citation"].clone()),
                None => {
                    json::set(block, "citations", json!([delta["citation"].clone()]));
                }
            }
        }
        _ => {}
    }
}
