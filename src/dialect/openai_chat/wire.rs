//! OpenAI chat's shapes for the read tool's rounds (`super::super::wire::Wire`): one assistant
//! message with `tool_calls`, tool messages that take text only (a read image or audio goes in
//! a user message after them), and chunks closed by a usage chunk and `[DONE]`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::dialect::stitch::{emit, Closing, Events, Stream};
use crate::dialect::wire::{arguments, event_text, push_text, Answer, Call, Kind, Output, Wire};
use crate::json;

/// OpenAI Chat Completions.
#[derive(Debug)]
pub struct Chat;

/// Between the texts of two rounds in chat's one content string: the rounds read as the
/// separate paragraphs they are.
pub const ROUND_SEPARATOR: &str = "\n\n";

/// An assistant message of chat, as it goes back into the history.
fn assistant(content: &Value, tool_calls: &[Value]) -> Value {
    let mut m = Map::new();
    m.insert("role".into(), "assistant".into());
    m.insert("content".into(), content.clone());
    if !tool_calls.is_empty() {
        m.insert("tool_calls".into(), Value::Array(tool_calls.to_vec()));
    }
    Value::Object(m)
}

fn is_read_call(call: &Value, read: &str) -> bool {
    call["function"]["name"] == read
}

impl Wire for Chat {
    fn tool(&self, name: &str, description: &str, parameters: Value) -> Value {
        json!({"type": "function", "function": {
            "name": name, "description": description, "parameters": parameters}})
    }

    fn tool_names(&self, tool: &RawValue) -> Vec<String> {
        #[derive(Deserialize)]
        struct Named {
            name: Option<String>,
        }
        #[derive(Deserialize)]
        struct Tool {
            function: Option<Named>,
            custom: Option<Named>,
        }
        serde_json::from_str::<Tool>(tool.get())
            .ok()
            .and_then(|t| t.function.or(t.custom)?.name)
            .into_iter()
            .collect()
    }

    fn history_key(&self) -> &'static str {
        "messages"
    }

    fn answer_in_text(&self) -> (&'static str, &'static str) {
        ("tool_choice", r#""none""#)
    }

    fn output(&self, response: &Value) -> Output {
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
            items: vec![assistant(&message["content"], &tool_calls)],
            calls,
            usage: response.get("usage").cloned(),
        }
    }

    fn results(&self, answers: &[Answer]) -> Vec<Value> {
        let mut items: Vec<Value> = answers
            .iter()
            .map(|a| json!({"role": "tool", "tool_call_id": a.id, "content": a.text}))
            .collect();
        let media: Vec<Value> = answers
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
        if !media.is_empty() {
            items.push(json!({"role": "user", "content": media}));
        }
        items
    }

    fn visible(&self, rounds: &[Output], read: &str) -> Vec<Value> {
        let mut text: Option<String> = None;
        let mut calls = Vec::new();
        for item in rounds.iter().flat_map(|r| &r.items) {
            if let Some(t) = item["content"].as_str() {
                let text = text.get_or_insert_with(String::new);
                if !text.is_empty() && !t.is_empty() {
                    text.push_str(ROUND_SEPARATOR);
                }
                text.push_str(t);
            }
            for call in item["tool_calls"].as_array().into_iter().flatten() {
                if !is_read_call(call, read) {
                    calls.push(call.clone());
                }
            }
        }
        let content = text.map_or(Value::Null, Value::String);
        vec![assistant(&content, &calls)]
    }

    fn show(&self, last: &mut Value, shown: Vec<Value>, usage: Option<Value>) {
        if let Some(usage) = usage {
            json::set(last, "usage", usage);
        }
        let message = json::first_mut(last, "choices")
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

    fn item_text(&self, item: &Value, out: &mut String) {
        for key in ["role", "tool_call_id"] {
            if let Some(s) = item[key].as_str() {
                push_text(out, s);
            }
        }
        match &item["content"] {
            Value::String(s) => push_text(out, s),
            Value::Array(parts) => {
                for part in parts {
                    if let Some(s) = part["text"].as_str() {
                        push_text(out, s);
                    }
                }
            }
            _ => {}
        }
        for call in item["tool_calls"].as_array().into_iter().flatten() {
            if let Some(id) = call["id"].as_str() {
                push_text(out, id);
            }
        }
    }

    fn is_model_item(&self, raw: &RawValue) -> bool {
        Kind::of(raw).is_some_and(|k| k.role.as_deref() == Some("assistant"))
    }

    fn events(&self) -> Box<dyn Events> {
        Box::<ChatEvents>::default()
    }

    fn answer(&self, model: &str, text: &str, streamed: bool) -> String {
        if !streamed {
            return json!({"id": "chatcmpl-replay", "object": "chat.completion",
                "created": 0, "model": model, "choices": [{"index": 0,
                "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})
            .to_string();
        }
        let chunk = json!({"id": "chatcmpl-replay", "object": "chat.completion.chunk",
            "created": 0, "model": model, "choices": [{"index": 0,
            "delta": {"role": "assistant", "content": text}, "finish_reason": "stop"}]});
        format!("{}data: [DONE]\n\n", event_text(None, &chunk))
    }
}

/// Chat chunks of one stream.
#[derive(Debug, Default)]
struct ChatEvents {
    /// This round's text so far.
    text: Option<String>,
    /// This round's tool calls by upstream index: (id, name, arguments).
    calls: BTreeMap<u64, (String, String, String)>,
    /// This round's text has begun reaching the client.
    text_sent: bool,
    /// An earlier round's text reached the client (the next round's text is set apart).
    text_shown: bool,
    /// The first round's chunk id, so every chunk carries one id.
    first_id: Option<String>,
}

/// Gives a chunk the stream's first id (remembered from the first chunk); whether it changed.
fn keep_id(first: &mut Option<String>, data: &mut Value) -> bool {
    match first {
        Some(id) if data["id"].as_str() == Some(id.as_str()) => false,
        Some(id) => json::set(data, "id", id.clone()),
        None => {
            *first = data["id"].as_str().map(str::to_string);
            false
        }
    }
}

impl Events for ChatEvents {
    fn is_end_marker(&self, data: &str) -> bool {
        data == "[DONE]"
    }

    fn event(&mut self, s: &mut Stream, mut chunk: Value) -> Option<Value> {
        if chunk.get("usage").is_some_and(|u| !u.is_null()) {
            s.usage = chunk.get("usage").cloned();
        }
        let Some(choice) = chunk["choices"].get(0).cloned() else {
            // The usage chunk closes the round.
            s.hold(None, chunk);
            return None;
        };
        let mut delta = choice["delta"].clone();
        if let Some(t) = delta["content"].as_str().map(str::to_string) {
            self.text.get_or_insert_with(String::new).push_str(&t);
            if !t.is_empty() {
                if self.text_shown && !self.text_sent {
                    // As the merged response joins them (`visible`).
                    let set_apart = format!("{ROUND_SEPARATOR}{t}");
                    s.touched |= json::set(&mut delta, "content", set_apart);
                }
                self.text_sent = true;
            }
        }
        if let Some(calls) = delta["tool_calls"].as_array().cloned() {
            let mut shown = Vec::new();
            for mut call in calls {
                let index = call["index"].as_u64().unwrap_or(0);
                let name = call["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let entry = self.calls.entry(index).or_default();
                if let Some(id) = call["id"].as_str() {
                    entry.0 = id.to_string();
                }
                entry.1.push_str(&name);
                if let Some(args) = call["function"]["arguments"].as_str() {
                    entry.2.push_str(args);
                }
                let is_read = entry.1 == s.read;
                match s.index(index, is_read) {
                    Some(client) => {
                        if client != index {
                            s.touched |= json::set(&mut call, "index", client);
                        }
                        shown.push(call);
                    }
                    None => s.touched = true,
                }
            }
            if shown.is_empty() {
                if let Some(d) = delta.as_object_mut() {
                    d.remove("tool_calls");
                }
            } else {
                json::set(&mut delta, "tool_calls", Value::Array(shown));
            }
        }
        let removed =
            delta.get("tool_calls").is_none() && choice["delta"].get("tool_calls").is_some();
        if let Some(choice) = json::first_mut(&mut chunk, "choices") {
            json::set(choice, "delta", delta.clone());
        }
        if !choice["finish_reason"].is_null() {
            s.hold(None, chunk);
            return None;
        }
        let later = s.round_no > 0;
        let empty = delta.as_object().is_none_or(|d| {
            d.iter()
                .all(|(k, v)| v.is_null() || v == "" || (k == "role" && later))
        });
        // A chunk that only carried a read call, or a later round's opening chunk, is dropped.
        if empty && (removed || later) {
            return None;
        }
        s.touched |= keep_id(&mut self.first_id, &mut chunk);
        Some(chunk)
    }

    fn output(&self, s: &Stream) -> Output {
        let calls: Vec<Value> = self
            .calls
            .values()
            .map(|(id, name, args)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
            })
            .collect();
        let content = self.text.clone().map_or(Value::Null, Value::String);
        Output {
            items: vec![assistant(&content, &calls)],
            calls: self
                .calls
                .values()
                .map(|(id, name, args)| Call {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: serde_json::from_str(args).unwrap_or(Value::Null),
                })
                .collect(),
            usage: s.usage.clone(),
        }
    }

    fn next_round(&mut self) {
        self.text_shown |= self.text_sent;
        self.text = None;
        self.calls.clear();
        self.text_sent = false;
    }

    fn closing(&mut self, c: Closing<'_>, out: &mut Vec<u8>) {
        let mut data = c.data;
        if data.is_null() {
            out.extend_from_slice(b"data: [DONE]\n\n");
            return;
        }
        if data.get("usage").is_some_and(|u| !u.is_null()) {
            if let Some(total) = c.total {
                json::set(&mut data, "usage", total.clone());
            }
        }
        keep_id(&mut self.first_id, &mut data);
        emit(out, c.name, &data);
    }

    fn error(&mut self, message: &str, out: &mut Vec<u8>) {
        emit(
            out,
            None,
            &json!({"error": {"message": message, "type": "api_error", "param": null, "code": "upstream_error"}}),
        );
    }
}
