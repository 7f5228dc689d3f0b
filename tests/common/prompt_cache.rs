//! The mock provider's prompt cache, for the inspector's tests: like the providers' own, it
//! serves the longest prefix of a request (tools, system prompt, then each message or input
//! item) that any earlier request had, from 1,024 tokens on; Anthropic only where the request
//! marks a `cache_control` breakpoint. Its counts go into the reply's `usage` as each provider
//! reports them, so sluice reads them as it would a real provider's.

#![allow(dead_code)]

use std::collections::HashSet;
use std::hash::{Hash, Hasher};

use bytes::Bytes;
use serde_json::{json, Value};

/// The shortest prefix the providers cache.
const MIN_CACHED: u64 = 1024;

/// What the cache did for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counted {
    pub total: u64,
    pub cached: u64,
    /// Written to the cache (Anthropic, where the request marks breakpoints).
    pub created: u64,
}

/// The request's parts in cache order.
fn parts(request: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for key in ["tools", "system", "instructions"] {
        if let Some(v) = request.get(key).filter(|v| !v.is_null()) {
            out.push(v);
        }
    }
    for key in ["messages", "input"] {
        match request.get(key) {
            Some(Value::Array(items)) => out.extend(items),
            Some(v) if !v.is_null() => out.push(v),
            _ => {}
        }
    }
    out
}

/// Counts `request` against the prefixes `seen` holds, and remembers its own.
pub fn count(
    anthropic: bool,
    request: &Value,
    seen: &mut HashSet<u64>,
    tokens: impl Fn(&Value) -> u64,
) -> Counted {
    let breakpoints = request.to_string().contains("\"cache_control\"");
    let caching = !anthropic || breakpoints;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    request["model"].to_string().hash(&mut h);
    let mut total = 0;
    let mut cached = 0;
    let mut hit = true;
    let mut prefixes = Vec::new();
    for part in parts(request) {
        // A breakpoint says where to cache; it is not content.
        let mut unmarked = part.clone();
        strip(&mut unmarked);
        unmarked.to_string().hash(&mut h);
        let n = tokens(part) + 4;
        total += n;
        let prefix = h.finish();
        hit = hit && seen.contains(&prefix);
        if hit {
            cached = total;
        }
        prefixes.push(prefix);
    }
    if !caching {
        return Counted {
            total,
            ..Counted::default()
        };
    }
    seen.extend(prefixes);
    let cached = if cached >= MIN_CACHED { cached } else { 0 };
    Counted {
        total,
        cached,
        created: if anthropic { total - cached } else { 0 },
    }
}

fn strip(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.remove("cache_control");
            map.values_mut().for_each(strip);
        }
        Value::Array(items) => items.iter_mut().for_each(strip),
        _ => {}
    }
}

impl Counted {
    /// The `usage` object of `dialect` (`chat`, `responses`, `anthropic`).
    pub fn usage(&self, dialect: &str) -> Value {
        match dialect {
            "chat" => json!({"prompt_tokens": self.total, "completion_tokens": 5,
                "total_tokens": self.total + 5,
                "prompt_tokens_details": {"cached_tokens": self.cached}}),
            "responses" => json!({"input_tokens": self.total, "output_tokens": 5,
                "total_tokens": self.total + 5,
                "input_tokens_details": {"cached_tokens": self.cached},
                "output_tokens_details": {"reasoning_tokens": 0}}),
            _ => json!({"input_tokens": self.total - self.cached - self.created,
                "cache_read_input_tokens": self.cached,
                "cache_creation_input_tokens": self.created, "output_tokens": 5}),
        }
    }

    /// A reply body with this usage.
    pub fn onto_json(&self, dialect: &str, mut body: Value) -> Value {
        if body.get("usage").is_some() {
            body["usage"] = self.usage(dialect);
        }
        body
    }

    /// Stream events with this usage where the provider reports it: Anthropic's
    /// `message_start`, Responses' `response.completed`, and for chat a last chunk with
    /// `usage` before `[DONE]` (as `stream_options.include_usage` asks).
    pub fn onto_events(&self, dialect: &str, events: Vec<Bytes>) -> Vec<Bytes> {
        let mut out = Vec::with_capacity(events.len() + 1);
        for event in events {
            let text = String::from_utf8_lossy(&event).into_owned();
            if dialect == "chat" && text.starts_with("data: [DONE]") {
                let chunk = json!({"id": "chatcmpl-usage", "object": "chat.completion.chunk",
                    "choices": [], "usage": self.usage(dialect)});
                out.push(Bytes::from(format!("data: {chunk}\n\n")));
                out.push(event);
                continue;
            }
            let Some((head, data)) = text.split_once("data: ") else {
                out.push(event);
                continue;
            };
            let Ok(mut v) = serde_json::from_str::<Value>(data.trim_end()) else {
                out.push(event);
                continue;
            };
            match v["type"].as_str() {
                Some("message_start") if dialect == "anthropic" => {
                    v["message"]["usage"] = self.usage(dialect);
                }
                Some("response.completed") if dialect == "responses" => {
                    v["response"]["usage"] = self.usage(dialect);
                }
                _ => {
                    out.push(event);
                    continue;
                }
            }
            out.push(Bytes::from(format!("{head}data: {v}\n\n")));
        }
        out
    }
}
