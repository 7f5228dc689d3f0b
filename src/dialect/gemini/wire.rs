//! Gemini's shapes for the read tool's rounds (`crate::dialect::wire::Wire`): a round is the
//! first candidate's `model` content (its parts, `thoughtSignature`s and thought parts kept as
//! they came), calls are `functionCall` parts, results `functionResponse` parts of one `user`
//! content. A stream is `data:` chunks of parts with no event names and no `[DONE]`: the chunk
//! with a `finishReason` ends it, usually with the last parts and the `usageMetadata`.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::dialect::span_of;
use crate::dialect::stitch::{emit, Closing, Events, Stream};
use crate::dialect::wire::{event_text, into_list, push_text, Answer, Call, Output, Wire};
use crate::json;
use crate::projection::Edit;

use super::Gemini;

/// A part's `functionCall`, by either spelling.
fn call_of(part: &Value) -> Option<&Value> {
    part.get("functionCall")
        .or_else(|| part.get("function_call"))
}

fn is_read_call(part: &Value, read: &str) -> bool {
    call_of(part).is_some_and(|c| c["name"] == read)
}

fn calls(parts: &[Value]) -> Vec<Call> {
    parts
        .iter()
        .filter_map(call_of)
        .map(|c| Call {
            id: c["id"].as_str().unwrap_or_default().to_string(),
            name: c["name"].as_str().unwrap_or_default().to_string(),
            arguments: c.get("args").cloned().unwrap_or_else(|| json!({})),
        })
        .collect()
}

/// The usage of a response or chunk.
fn usage_of(value: &Value) -> Option<Value> {
    value
        .get("usageMetadata")
        .or_else(|| value.get("usage_metadata"))
        .cloned()
}

/// The parts of the first candidate's content.
fn candidate_parts(value: &Value) -> Vec<Value> {
    value["candidates"][0]["content"]["parts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// `functionResponse` parts answering read calls.
fn response_parts(answers: &[Answer]) -> Vec<Value> {
    answers
        .iter()
        .map(|a| {
            let mut response = json!({"name": a.name, "response": {"output": a.text}});
            if !a.id.is_empty() {
                json::set(&mut response, "id", a.id.clone());
            }
            let image = a.media.as_ref().filter(|m| m.audio_format().is_none());
            if let Some(m) = image {
                json::set(
                    &mut response,
                    "parts",
                    json!([{"inlineData": {"mimeType": m.mime, "data": m.base64}}]),
                );
            }
            json!({"functionResponse": response})
        })
        .collect()
}

impl Wire for Gemini {
    fn tool(&self, name: &str, description: &str, parameters: Value) -> Value {
        json!({"functionDeclarations": [{"name": name, "description": description,
            "parametersJsonSchema": parameters}]})
    }

    fn tool_names(&self, tool: &RawValue) -> Vec<String> {
        #[derive(Deserialize)]
        struct Declared {
            name: Option<String>,
        }
        #[derive(Deserialize)]
        struct Tool {
            #[serde(rename = "functionDeclarations", alias = "function_declarations")]
            declarations: Option<Vec<Declared>>,
        }
        serde_json::from_str::<Tool>(tool.get())
            .ok()
            .and_then(|t| t.declarations)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|d| d.name)
            .collect()
    }

    fn history_key(&self) -> &'static str {
        "contents"
    }

    fn answer_in_text(&self) -> (&'static str, &'static str) {
        ("toolConfig", r#"{"functionCallingConfig":{"mode":"NONE"}}"#)
    }

    fn output(&self, response: &Value) -> Output {
        let parts = candidate_parts(response);
        Output {
            calls: calls(&parts),
            items: vec![json!({"role": "model", "parts": parts})],
            usage: usage_of(response),
        }
    }

    fn results(&self, answers: &[Answer]) -> Vec<Value> {
        vec![json!({"role": "user", "parts": response_parts(answers)})]
    }

    fn results_first_in_next(&self, answers: &[Answer]) -> Option<Vec<Value>> {
        Some(response_parts(answers))
    }

    fn visible(&self, rounds: &[Output], read: &str) -> Vec<Value> {
        let parts: Vec<Value> = rounds
            .iter()
            .flat_map(|r| &r.items)
            .flat_map(|c| c["parts"].as_array().cloned().unwrap_or_default())
            .filter(|p| !is_read_call(p, read))
            .collect();
        vec![json!({"role": "model", "parts": parts})]
    }

    fn show(&self, last: &mut Value, shown: Vec<Value>, usage: Option<Value>) {
        if let Some(usage) = usage {
            json::set(last, "usageMetadata", usage);
        }
        let candidate = json::first_mut(last, "candidates");
        if let (Some(candidate), Some(content)) = (candidate, shown.into_iter().next()) {
            json::set(candidate, "content", content);
        }
    }

    fn item_text(&self, item: &Value, out: &mut String) {
        if let Some(role) = item["role"].as_str() {
            push_text(out, role);
        }
        // The text parts as one text: a client may join a streamed answer's deltas into one
        // part (Gemini CLI does) or keep them apart.
        // Each call or response once: Gemini CLI 0.61 sends a resumed turn's function
        // response twice.
        let mut text = String::new();
        let mut named: Vec<(&str, &str)> = Vec::new();
        for part in item["parts"].as_array().into_iter().flatten() {
            if part["thought"] == true {
                continue;
            }
            if let Some(t) = part["text"].as_str() {
                text.push_str(t);
            }
            let answered = part
                .get("functionResponse")
                .or_else(|| part.get("function_response"));
            for call in [call_of(part), answered].into_iter().flatten() {
                let pair = (
                    call["name"].as_str().unwrap_or_default(),
                    call["id"].as_str().unwrap_or_default(),
                );
                if !named.contains(&pair) {
                    named.push(pair);
                }
            }
        }
        push_text(out, &text);
        for (name, id) in named {
            push_text(out, name);
            push_text(out, id);
        }
    }

    fn is_model_item(&self, raw: &RawValue) -> bool {
        #[derive(Deserialize)]
        struct Role<'a> {
            #[serde(borrow)]
            role: Option<std::borrow::Cow<'a, str>>,
        }
        serde_json::from_str::<Role>(raw.get()).is_ok_and(|r| r.role.as_deref() == Some("model"))
    }

    fn put_first(&self, body: &str, next: &RawValue, prefix: &str) -> Option<Edit> {
        #[derive(Deserialize)]
        struct Parts<'a> {
            #[serde(borrow)]
            parts: Option<&'a RawValue>,
        }
        let parts = serde_json::from_str::<Parts>(next.get()).ok()?.parts?;
        into_list(span_of(body, parts), parts.get(), prefix, true)
    }

    fn events(&self) -> Box<dyn Events> {
        Box::<GeminiEvents>::default()
    }

    fn answer(&self, model: &str, text: &str, streamed: bool) -> String {
        let response = json!({"candidates": [{"content": {"role": "model",
            "parts": [{"text": text}]}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 0, "candidatesTokenCount": 0,
            "totalTokenCount": 0}, "modelVersion": model});
        match streamed {
            true => event_text(None, &response),
            false => response.to_string(),
        }
    }

    fn token_count(&self, tokens: u64) -> String {
        format!(r#"{{"totalTokens":{tokens}}}"#)
    }
}

/// Gemini chunks of one stream.
#[derive(Debug, Default)]
struct GeminiEvents {
    /// This round's parts, as they came (a read call's included).
    parts: Vec<Value>,
    /// A read call was held back in this round.
    read_held: bool,
}

impl Events for GeminiEvents {
    fn event(&mut self, s: &mut Stream, mut chunk: Value) -> Option<Value> {
        if let Some(usage) = usage_of(&chunk) {
            // Each chunk's counts are the response's so far: the last replaces.
            s.usage = Some(usage);
        }
        let parts = candidate_parts(&chunk);
        self.parts.extend(parts.iter().cloned());
        let shown: Vec<Value> = parts
            .iter()
            .filter(|p| !is_read_call(p, &s.read))
            .cloned()
            .collect();
        if shown.len() < parts.len() {
            self.read_held = true;
            s.hold_read();
            if let Some(content) = json::first_mut(&mut chunk, "candidates")
                .and_then(|c| json::member_mut(c, "content"))
            {
                s.touched |= json::set(content, "parts", Value::Array(shown.clone()));
            }
        }
        let finished = chunk["candidates"][0]
            .get("finishReason")
            .or_else(|| chunk["candidates"][0].get("finish_reason"))
            .is_some_and(|f| !f.is_null());
        if !finished {
            return (!shown.is_empty() || parts.is_empty() || !s.touched).then_some(chunk);
        }
        s.complete = true;
        if !self.read_held {
            // A round with no read call is the last: its closing chunk goes as it came.
            s.hold(None, chunk);
            return None;
        }
        // Another round follows: the parts shown now, the closing chunk held without them.
        let mut closing = chunk.clone();
        if let Some(content) =
            json::first_mut(&mut closing, "candidates").and_then(|c| json::member_mut(c, "content"))
        {
            json::set(content, "parts", json!([]));
        }
        s.hold(None, closing);
        if shown.is_empty() {
            return None;
        }
        if let Some(candidate) = json::first_mut(&mut chunk, "candidates") {
            if let Some(c) = candidate.as_object_mut() {
                c.remove("finishReason");
                c.remove("finish_reason");
            }
        }
        if let Some(c) = chunk.as_object_mut() {
            c.remove("usageMetadata");
            c.remove("usage_metadata");
        }
        s.touched = true;
        Some(chunk)
    }

    fn output(&self, s: &Stream) -> Output {
        Output {
            calls: calls(&self.parts),
            items: vec![json!({"role": "model", "parts": self.parts})],
            usage: s.usage.clone(),
        }
    }

    fn next_round(&mut self) {
        self.parts.clear();
        self.read_held = false;
    }

    fn closing(&mut self, c: Closing<'_>, out: &mut Vec<u8>) {
        let mut data = c.data;
        if let Some(total) = c.total {
            json::set(&mut data, "usageMetadata", total.clone());
        }
        emit(out, c.name, &data);
    }

    fn error(&mut self, message: &str, out: &mut Vec<u8>) {
        emit(
            out,
            None,
            &json!({"error": {"code": 500, "message": message, "status": "INTERNAL"}}),
        );
    }
}
