//! OpenAI Responses' shapes for the read tool's rounds (`crate::dialect::wire::Wire`): output
//! items with `function_call`s, `function_call_output` results (a read image inside them), and
//! events numbered by `sequence_number` and closed by `response.completed`.

use std::collections::BTreeMap;

use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::dialect::stitch::{emit, Closing, Events, Stream};
use crate::dialect::wire::{
    arguments, event_text, push_text, top_name, Answer, Call, Kind, Output, Wire,
};
use crate::json;

/// OpenAI Responses.
#[derive(Debug)]
pub struct Responses;

fn calls(items: &[Value]) -> Vec<Call> {
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

fn is_read_call(item: &Value, read: &str) -> bool {
    item["type"] == "function_call" && item["name"] == read
}

impl Wire for Responses {
    fn tool(&self, name: &str, description: &str, parameters: Value) -> Value {
        json!({"type": "function", "name": name, "description": description,
            "parameters": parameters})
    }

    fn tool_names(&self, tool: &RawValue) -> Vec<String> {
        top_name(tool)
    }

    fn history_key(&self) -> &'static str {
        "input"
    }

    fn history_may_be_text(&self) -> bool {
        true
    }

    fn answer_in_text(&self) -> (&'static str, &'static str) {
        ("tool_choice", r#""none""#)
    }

    fn output(&self, response: &Value) -> Output {
        let items = response["output"].as_array().cloned().unwrap_or_default();
        Output {
            calls: calls(&items),
            items,
            usage: response.get("usage").cloned(),
        }
    }

    fn results(&self, answers: &[Answer]) -> Vec<Value> {
        answers
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
            .collect()
    }

    fn visible(&self, rounds: &[Output], read: &str) -> Vec<Value> {
        rounds
            .iter()
            .flat_map(|r| &r.items)
            .filter(|i| !is_read_call(i, read))
            .cloned()
            .collect()
    }

    fn show(&self, last: &mut Value, shown: Vec<Value>, usage: Option<Value>) {
        if let Some(usage) = usage {
            json::set(last, "usage", usage);
        }
        json::set(last, "output", Value::Array(shown));
    }

    fn item_text(&self, item: &Value, out: &mut String) {
        for key in ["role", "call_id"] {
            if let Some(s) = item[key].as_str() {
                push_text(out, s);
            }
        }
        for key in ["content", "output", "text"] {
            match &item[key] {
                Value::String(s) => push_text(out, s),
                Value::Array(parts) => {
                    for part in parts.iter().filter(|p| p["type"] != "reasoning") {
                        self.item_text(part, out);
                    }
                }
                _ => {}
            }
        }
    }

    fn is_model_item(&self, raw: &RawValue) -> bool {
        Kind::of(raw).is_some_and(|k| {
            k.role.as_deref() == Some("assistant")
                || matches!(k.kind.as_deref(), Some("function_call" | "reasoning"))
        })
    }

    fn events(&self) -> Box<dyn Events> {
        Box::<ResponsesEvents>::default()
    }

    fn answer(&self, model: &str, text: &str, streamed: bool) -> String {
        let response = json!({"id": "resp_replay", "object": "response", "created_at": 0,
            "status": "completed", "model": model, "output": [{"type": "message",
            "id": "msg_replay", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}]});
        match streamed {
            true => event_text(
                Some("response.completed"),
                &json!({"type": "response.completed", "sequence_number": 0, "response": response}),
            ),
            false => response.to_string(),
        }
    }
}

/// Responses events of one stream.
#[derive(Debug, Default)]
struct ResponsesEvents {
    /// This round's finished items by upstream output index.
    items: BTreeMap<u64, Value>,
    /// Next sequence number the client sees.
    seq: u64,
    /// The first round's response id; the client's stream keeps it to the end (SDKs refuse a
    /// stream whose lifecycle events change response id).
    first_response_id: Option<Value>,
}

impl Events for ResponsesEvents {
    fn event(&mut self, s: &mut Stream, mut event: Value) -> Option<Value> {
        let kind = event["type"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "response.created" | "response.in_progress" | "response.queued" => {
                if s.round_no > 0 {
                    return None;
                }
                if self.first_response_id.is_none() {
                    self.first_response_id =
                        event.get("response").and_then(|r| r.get("id")).cloned();
                }
                Some(event)
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                s.usage = event["response"].get("usage").cloned();
                s.complete = kind == "response.completed";
                s.hold(Some(kind), event);
                None
            }
            _ => {
                let Some(index) = event["output_index"].as_u64() else {
                    return Some(event);
                };
                if kind == "response.output_item.done" {
                    self.items.insert(index, event["item"].clone());
                }
                let item = &event["item"];
                let is_read = kind == "response.output_item.added" && is_read_call(item, &s.read);
                let client = s.index(index, is_read)?;
                s.set_index(&mut event, "output_index", index, client);
                Some(event)
            }
        }
    }

    fn passing(&mut self, s: &mut Stream, event: &mut Value) {
        if event["sequence_number"].as_u64() != Some(self.seq) {
            s.touched |= json::set(event, "sequence_number", self.seq);
        }
        self.seq += 1;
    }

    fn output(&self, s: &Stream) -> Output {
        let completed = s
            .held_closing()
            .iter()
            .find(|(_, d)| d["type"] == "response.completed")
            .map(|(_, d)| &d["response"]);
        let items: Vec<Value> = match completed.and_then(|c| c["output"].as_array()) {
            Some(output) if !output.is_empty() => output.clone(),
            _ => self.items.values().cloned().collect(),
        };
        Output {
            calls: calls(&items),
            items,
            usage: completed
                .and_then(|c| c.get("usage").cloned())
                .or_else(|| s.usage.clone()),
        }
    }

    fn next_round(&mut self) {
        self.items.clear();
    }

    fn closing(&mut self, c: Closing<'_>, out: &mut Vec<u8>) {
        let mut data = c.data;
        let completed = data["type"] == "response.completed";
        if let Some(response) = json::member_mut(&mut data, "response") {
            if let Some(id) = &self.first_response_id {
                json::set(response, "id", id.clone());
            }
            if completed {
                let shown = Responses.visible(c.rounds, c.read);
                json::set(response, "output", Value::Array(shown));
                if let Some(total) = c.total {
                    json::set(response, "usage", total.clone());
                }
            }
        }
        json::set(&mut data, "sequence_number", self.seq);
        self.seq += 1;
        emit(out, c.name, &data);
    }

    fn error(&mut self, message: &str, out: &mut Vec<u8>) {
        let event = json!({"type": "error", "code": "upstream_error", "message": message,
            "param": null, "sequence_number": self.seq});
        self.seq += 1;
        emit(out, Some("error"), &event);
    }
}
