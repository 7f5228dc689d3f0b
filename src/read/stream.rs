//! Streamed rounds stitched into one client stream (C2). Text and other tools' events pass at
//! once; a read call's own events are held back; the round's closing events are held until
//! sluice knows whether another round follows. Later rounds continue the same client stream:
//! their opening events are dropped and block indices, output indices, chunk ids and sequence
//! numbers continue where the client's stream stands, so its SDK sees one well-formed message.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Value};

use super::reply::{self, Output};
use super::Call;
use crate::dialect::sse::{Event, Framer, MAX_EVENT_BYTES};
use crate::dialect::Dialect;
use crate::json;

#[derive(Debug, Default)]
struct Round {
    /// chat: text so far; tool calls by upstream index (id, name, arguments).
    text: Option<String>,
    chat_calls: BTreeMap<u64, (String, String, String)>,
    /// Anthropic: blocks by upstream index, with their partial tool input.
    blocks: BTreeMap<u64, (Value, String)>,
    /// Responses: finished items by upstream output index.
    items: BTreeMap<u64, Value>,
    /// Upstream index → client index; `None` for a read call, held back.
    map: HashMap<u64, Option<u64>>,
    usage: Option<Value>,
    /// The round's closing events, held back: (event name, data).
    closing: Vec<(Option<String>, Value)>,
    /// The closing events' bytes as the provider sent them.
    closing_raw: Vec<u8>,
    /// The closing event arrived (the round completed).
    complete: bool,
    /// chat: this round's text has begun reaching the client.
    text_sent: bool,
}

/// Stitches the rounds of one streamed request into the client's stream.
#[derive(Debug)]
pub struct Stitcher {
    dialect: Dialect,
    read: String,
    /// Frames the current round's bytes into events (an over-long event ends the stitched
    /// stream as a failure rather than grow without bound).
    framer: Framer,
    round_no: usize,
    round: Round,
    /// Next client index for a block (Anthropic), output item (Responses) or tool call (chat).
    next_index: u64,
    /// Next Responses sequence number.
    seq: u64,
    /// The first round's chunk id (chat), so every chunk carries one id.
    first_id: Option<String>,
    failed: bool,
    /// The event being handled was changed; an unchanged one is passed on as its raw bytes.
    touched: bool,
    /// A read call's events were held back in this stream.
    held: bool,
    /// chat: an earlier round's text reached the client (the next round's text is set apart).
    chat_text_shown: bool,
    /// Responses: the first round's response id; the client's stream keeps it to the end
    /// (SDKs refuse a stream whose lifecycle events change response id).
    first_response_id: Option<Value>,
}

impl Stitcher {
    pub fn new(dialect: Dialect, read: &str) -> Self {
        Self {
            dialect,
            read: read.to_string(),
            framer: Framer::new(MAX_EVENT_BYTES),
            round_no: 0,
            round: Round::default(),
            next_index: 0,
            seq: 0,
            first_id: None,
            failed: false,
            touched: false,
            held: false,
            chat_text_shown: false,
            first_response_id: None,
        }
    }

    /// Feeds upstream bytes of the current round; returns what the client gets now.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        if self.failed {
            return out;
        }
        let mut framer = std::mem::replace(&mut self.framer, Framer::new(0));
        let fed = framer.feed(bytes, &mut |event| self.event(event, &mut out));
        self.framer = framer;
        if fed.is_err() {
            self.failed = true;
        }
        out
    }

    /// The current round's upstream stream ended: a last event whose closing blank line never
    /// came is handled now; returns what the client gets of it.
    pub fn upstream_ended(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut framer = std::mem::replace(&mut self.framer, Framer::new(0));
        if !self.failed {
            framer.finish(&mut |event| self.event(event, &mut out));
        }
        self.framer = framer;
        out
    }

    /// Whether the current round ended with its closing event.
    pub fn round_complete(&self) -> bool {
        self.round.complete && !self.failed
    }

    /// The current round's output.
    pub fn output(&self) -> Output {
        let r = &self.round;
        match self.dialect {
            Dialect::OpenAiChat => {
                let calls: Vec<Value> = r
                    .chat_calls
                    .values()
                    .map(|(id, name, args)| {
                        json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
                    })
                    .collect();
                let content = r.text.clone().map_or(Value::Null, Value::String);
                Output {
                    items: vec![reply::chat_message(&content, &calls)],
                    calls: r
                        .chat_calls
                        .values()
                        .map(|(id, name, args)| Call {
                            id: id.clone(),
                            name: name.clone(),
                            arguments: serde_json::from_str(args).unwrap_or(Value::Null),
                        })
                        .collect(),
                    usage: r.usage.clone(),
                }
            }
            Dialect::AnthropicMessages => {
                let content: Vec<Value> = r.blocks.values().map(|(b, _)| b.clone()).collect();
                Output {
                    calls: reply::anthropic_calls(&content),
                    items: vec![json!({"role": "assistant", "content": content})],
                    usage: r.usage.clone(),
                }
            }
            Dialect::OpenAiResponses => {
                let completed = r
                    .closing
                    .iter()
                    .find(|(_, d)| d["type"] == "response.completed")
                    .map(|(_, d)| &d["response"]);
                let items: Vec<Value> = match completed.and_then(|c| c["output"].as_array()) {
                    Some(output) if !output.is_empty() => output.clone(),
                    _ => r.items.values().cloned().collect(),
                };
                Output {
                    calls: reply::responses_calls(&items),
                    items,
                    usage: completed
                        .and_then(|c| c.get("usage").cloned())
                        .or_else(|| r.usage.clone()),
                }
            }
        }
    }

    /// Starts the next round: its events continue the client's stream.
    pub fn next_round(&mut self) {
        self.chat_text_shown |= self.round.text_sent;
        self.round = Round::default();
        self.round_no += 1;
        self.framer = Framer::new(MAX_EVENT_BYTES);
    }

    /// The held closing events of the last round, with the usage of all `rounds` and (for
    /// Responses) the output of all rounds the client sees.
    pub fn finish(&mut self, rounds: &[Output]) -> Vec<u8> {
        let mut out = Vec::new();
        if rounds.len() <= 1 && !self.held {
            // Nothing was hidden: the closing events go as the provider sent them.
            self.round.closing.clear();
            return std::mem::take(&mut self.round.closing_raw);
        }
        let total = reply::total_usage(rounds);
        for (name, mut data) in std::mem::take(&mut self.round.closing) {
            match self.dialect {
                Dialect::OpenAiChat => {
                    if data.is_null() {
                        out.extend_from_slice(b"data: [DONE]\n\n");
                        continue;
                    }
                    if data.get("usage").is_some_and(|u| !u.is_null()) {
                        if let Some(total) = &total {
                            json::set(&mut data, "usage", total.clone());
                        }
                    }
                    self.chat_id(&mut data);
                }
                Dialect::AnthropicMessages => {
                    if data["type"] == "message_delta" {
                        if let Some(total) = &total {
                            json::set(&mut data, "usage", total.clone());
                        }
                    }
                }
                Dialect::OpenAiResponses => {
                    let completed = data["type"] == "response.completed";
                    if let Some(response) = json::member_mut(&mut data, "response") {
                        if let Some(id) = &self.first_response_id {
                            json::set(response, "id", id.clone());
                        }
                        if completed {
                            let shown = reply::visible(self.dialect, rounds, &self.read);
                            json::set(response, "output", Value::Array(shown));
                            if let Some(total) = &total {
                                json::set(response, "usage", total.clone());
                            }
                        }
                    }
                    json::set(&mut data, "sequence_number", self.seq);
                    self.seq += 1;
                }
            }
            emit(&mut out, name.as_deref(), &data);
        }
        out
    }

    /// An error event in the dialect's shape, ending the client's stream when a later round
    /// failed (the client's SDK raises it as an API error).
    pub fn error(&mut self, message: &str) -> Vec<u8> {
        let mut out = Vec::new();
        match self.dialect {
            Dialect::OpenAiChat => emit(
                &mut out,
                None,
                &json!({"error": {"message": message, "type": "api_error", "param": null, "code": "upstream_error"}}),
            ),
            Dialect::AnthropicMessages => emit(
                &mut out,
                Some("error"),
                &json!({"type": "error", "error": {"type": "api_error", "message": message}}),
            ),
            Dialect::OpenAiResponses => {
                let event = json!({"type": "error", "code": "upstream_error", "message": message,
                    "param": null, "sequence_number": self.seq});
                self.seq += 1;
                emit(&mut out, Some("error"), &event);
            }
        }
        out
    }

    fn chat_id(&mut self, data: &mut Value) {
        match &self.first_id {
            Some(id) if data["id"].as_str() == Some(id) => {}
            Some(id) => {
                self.touched |= json::set(data, "id", id.clone());
            }
            None => self.first_id = data["id"].as_str().map(str::to_string),
        }
    }

    fn event(&mut self, event: Event<'_>, out: &mut Vec<u8>) {
        let Event { name, data, raw } = event;
        let Some(data) = data.filter(|d| !d.is_empty()) else {
            // Comments and keep-alives pass as they are.
            out.extend_from_slice(raw);
            return;
        };
        if self.dialect == Dialect::OpenAiChat && data.trim() == "[DONE]" {
            self.round.closing.push((None, Value::Null));
            self.round.closing_raw.extend_from_slice(raw);
            self.round.complete = true;
            return;
        }
        // Only an object is an event sluice reads; anything else passes as it came.
        let Some(value) = serde_json::from_str::<Value>(data)
            .ok()
            .filter(Value::is_object)
        else {
            out.extend_from_slice(raw);
            return;
        };
        self.touched = false;
        let closing = self.round.closing.len();
        let forward = match self.dialect {
            Dialect::OpenAiChat => self.chat(value),
            Dialect::AnthropicMessages => self.anthropic(value),
            Dialect::OpenAiResponses => self.responses(value),
        };
        if self.round.closing.len() > closing {
            self.round.closing_raw.extend_from_slice(raw);
        }
        if let Some(mut value) = forward {
            if self.dialect == Dialect::OpenAiResponses {
                if value["sequence_number"].as_u64() != Some(self.seq) {
                    self.touched |= json::set(&mut value, "sequence_number", self.seq);
                }
                self.seq += 1;
            }
            if self.touched {
                emit(out, name, &value);
            } else {
                out.extend_from_slice(raw);
            }
        }
    }

    fn set_index(&mut self, event: &mut Value, key: &str, upstream: u64, client: u64) {
        if upstream != client {
            self.touched |= json::set(event, key, client);
        }
    }

    /// Client index for upstream `index`, deciding at its first sight whether it is held.
    fn index(&mut self, index: u64, read: bool) -> Option<u64> {
        if let Some(known) = self.round.map.get(&index) {
            return *known;
        }
        self.held |= read;
        let client = (!read).then(|| {
            let i = self.next_index;
            self.next_index += 1;
            i
        });
        self.round.map.insert(index, client);
        client
    }

    fn chat(&mut self, mut chunk: Value) -> Option<Value> {
        if chunk.get("usage").is_some_and(|u| !u.is_null()) {
            self.round.usage = chunk.get("usage").cloned();
        }
        let Some(choice) = chunk["choices"].get(0).cloned() else {
            // The usage chunk closes the round.
            self.round.closing.push((None, chunk));
            return None;
        };
        let mut delta = choice["delta"].clone();
        if let Some(t) = delta["content"].as_str().map(str::to_string) {
            self.round.text.get_or_insert_with(String::new).push_str(&t);
            if !t.is_empty() {
                if self.chat_text_shown && !self.round.text_sent {
                    // As the merged response joins them (reply::visible).
                    let set_apart = format!("{}{t}", reply::CHAT_ROUND_SEPARATOR);
                    self.touched |= json::set(&mut delta, "content", set_apart);
                }
                self.round.text_sent = true;
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
                let entry = self.round.chat_calls.entry(index).or_default();
                if let Some(id) = call["id"].as_str() {
                    entry.0 = id.to_string();
                }
                entry.1.push_str(&name);
                if let Some(args) = call["function"]["arguments"].as_str() {
                    entry.2.push_str(args);
                }
                let is_read = entry.1 == self.read;
                match self.index(index, is_read) {
                    Some(client) => {
                        if client != index {
                            self.touched |= json::set(&mut call, "index", client);
                        }
                        shown.push(call);
                    }
                    None => self.touched = true,
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
            self.round.closing.push((None, chunk));
            return None;
        }
        let empty = delta.as_object().is_none_or(|d| {
            d.iter()
                .all(|(k, v)| v.is_null() || v == "" || (k == "role" && self.round_no > 0))
        });
        // A chunk that only carried a read call, or a later round's opening chunk, is dropped.
        if empty && (removed || self.round_no > 0) {
            return None;
        }
        self.chat_id(&mut chunk);
        Some(chunk)
    }

    fn anthropic(&mut self, mut event: Value) -> Option<Value> {
        let kind = event["type"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "message_start" => {
                self.round.usage = event["message"].get("usage").cloned();
                (self.round_no == 0).then_some(event)
            }
            "content_block_start" => {
                let index = event["index"].as_u64().unwrap_or(0);
                let block = event["content_block"].clone();
                let is_read = block["type"] == "tool_use" && block["name"] == self.read.as_str();
                self.round.blocks.insert(index, (block, String::new()));
                let client = self.index(index, is_read)?;
                self.set_index(&mut event, "index", index, client);
                Some(event)
            }
            "content_block_delta" => {
                let index = event["index"].as_u64().unwrap_or(0);
                if let Some((block, partial)) = self.round.blocks.get_mut(&index) {
                    apply_delta(block, partial, &event["delta"]);
                }
                let client = self.index(index, false)?;
                self.set_index(&mut event, "index", index, client);
                Some(event)
            }
            "content_block_stop" => {
                let index = event["index"].as_u64().unwrap_or(0);
                if let Some((block, partial)) = self.round.blocks.get_mut(&index) {
                    if block["type"] == "tool_use" {
                        let input = if partial.trim().is_empty() {
                            block.get("input").cloned().unwrap_or_else(|| json!({}))
                        } else {
                            serde_json::from_str(partial).unwrap_or_else(|_| json!({}))
                        };
                        json::set(block, "input", input);
                    }
                }
                let client = self.index(index, false)?;
                self.set_index(&mut event, "index", index, client);
                Some(event)
            }
            "message_delta" => {
                if let Some(usage) = event.get("usage") {
                    let mut total = self.round.usage.clone().unwrap_or_else(|| json!({}));
                    // message_delta's counts are cumulative for the message: they replace.
                    if let (Some(t), Some(u)) = (total.as_object_mut(), usage.as_object()) {
                        for (k, v) in u {
                            if !v.is_null() {
                                t.insert(k.clone(), v.clone());
                            }
                        }
                    }
                    self.round.usage = Some(total);
                }
                self.round.closing.push((Some(kind), event));
                None
            }
            "message_stop" => {
                self.round.closing.push((Some(kind), event));
                self.round.complete = true;
                None
            }
            _ => Some(event),
        }
    }

    fn responses(&mut self, mut event: Value) -> Option<Value> {
        let kind = event["type"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "response.created" | "response.in_progress" | "response.queued" => {
                if self.round_no > 0 {
                    return None;
                }
                if self.first_response_id.is_none() {
                    self.first_response_id =
                        event.get("response").and_then(|r| r.get("id")).cloned();
                }
                Some(event)
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                self.round.usage = event["response"].get("usage").cloned();
                self.round.complete = kind == "response.completed";
                self.round.closing.push((Some(kind), event));
                None
            }
            _ => {
                let Some(index) = event["output_index"].as_u64() else {
                    return Some(event);
                };
                if kind == "response.output_item.done" {
                    self.round.items.insert(index, event["item"].clone());
                }
                let item = &event["item"];
                let is_read = kind == "response.output_item.added"
                    && item["type"] == "function_call"
                    && item["name"] == self.read.as_str();
                let client = self.index(index, is_read)?;
                self.set_index(&mut event, "output_index", index, client);
                Some(event)
            }
        }
    }
}

/// Applies an Anthropic content delta to the block being built, so the block that goes back to
/// the model is exactly what it produced (thinking and signatures included).
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

fn emit(out: &mut Vec<u8>, name: Option<&str>, data: &Value) {
    if let Some(name) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
