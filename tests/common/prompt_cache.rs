//! The mock provider's prompt cache, billed as the providers bill (WIRE.md "Prompt caches,
//! exactly"), written apart from sluice's own model (`sluice::projection::cache`) so each checks
//! the other:
//!
//! - Anthropic: positions are tools, system blocks and each message's content blocks. Entries
//!   are written only at `cache_control` breakpoints (a top-level one marks the last block), at
//!   most four per request (a fifth is the provider's 400), 1-hour ones before 5-minute ones; a
//!   read walks back at most 20 blocks from each breakpoint, last first; prefixes under the
//!   model's minimum are not cached. Usage as Anthropic reports it, split by TTL.
//! - OpenAI: every request is cached by itself; a read is the longest cached prefix of whole
//!   messages, from 1,024 tokens in 128-token steps.
//! - Gemini (implicit caching, 2.5 and later): as OpenAI's but counted exactly, from 2,048
//!   tokens (2.5) or 4,096 (3 and later); models before 2.5 cache nothing.
//!
//! The cache is shared by every session, as a provider's is by an organisation's. Its clock can
//! be moved on ([`PromptCache::advance`]) so a test or bench can let entries lapse without
//! waiting, and its TTLs shortened ([`PromptCache::ttl_seconds`]).

#![allow(dead_code)]

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};

/// Tokens a message adds besides its blocks (role and framing).
const MESSAGE_FRAMING: u64 = 4;

/// The cache's entries and clock.
#[derive(Debug)]
pub struct PromptCache {
    /// Prefix hash → (expires at, in ms on the cache's clock; whether it is a 1-hour entry).
    entries: HashMap<u64, (u64, bool)>,
    started: Instant,
    offset: Duration,
    /// A 5-minute entry lives this long when set, and a 1-hour entry twelve times as long (the
    /// providers' two TTLs on a shorter clock, as `[routes.cache] ttl_seconds` reads them).
    pub ttl_seconds: Option<u64>,
}

impl Default for PromptCache {
    fn default() -> Self {
        PromptCache {
            entries: HashMap::new(),
            started: Instant::now(),
            offset: Duration::ZERO,
            ttl_seconds: None,
        }
    }
}

impl PromptCache {
    /// Moves the cache's clock on, as if that much time had passed.
    pub fn advance(&mut self, by: Duration) {
        self.offset += by;
    }

    fn now_ms(&self) -> u64 {
        (self.started.elapsed() + self.offset).as_millis() as u64
    }

    fn ttl_ms(&self, long: bool) -> u64 {
        let seconds = match (self.ttl_seconds, long) {
            (None, false) => 300,
            (None, true) => 3600,
            (Some(short), false) => short,
            (Some(short), true) => short * 12,
        };
        1000 * seconds
    }

    fn live(&self, hash: u64, now: u64) -> Option<bool> {
        self.entries
            .get(&hash)
            .filter(|(expires, _)| *expires > now)
            .map(|(_, long)| *long)
    }

    fn put(&mut self, hash: u64, long: bool, now: u64) {
        let expires = now + self.ttl_ms(long);
        let e = self.entries.entry(hash).or_insert((0, long));
        e.0 = e.0.max(expires);
        e.1 |= long;
    }
}

/// Whose rules a request is billed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Anthropic,
    OpenAi,
    Gemini,
}

/// What the cache did for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counted {
    pub total: u64,
    /// Read from the cache.
    pub cached: u64,
    /// Written under 5-minute breakpoints (Anthropic).
    pub created: u64,
    /// Written under 1-hour breakpoints (Anthropic).
    pub created_1h: u64,
}

/// One position: its tokens, its breakpoint (`Some(true)` for 1 hour), whether it can carry
/// one, and the value hashed for it.
struct Position {
    tokens: u64,
    mark: Option<bool>,
    hash: u64,
}

fn marker(v: &Value) -> Option<bool> {
    v.get("cache_control")
        .map(|c| c.get("ttl").and_then(Value::as_str) == Some("1h"))
}

/// The request's positions in cache order, or the provider's 400 for its breakpoints.
fn positions(
    anthropic: bool,
    request: &Value,
    tokens: &impl Fn(&Value) -> u64,
) -> Result<Vec<Position>, String> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    request["model"].to_string().hash(&mut h);
    let mut out = Vec::new();
    let mut push = |h: &mut std::collections::hash_map::DefaultHasher,
                    v: &Value,
                    extra: u64,
                    mark: Option<bool>| {
        let mut unmarked = v.clone();
        strip(&mut unmarked);
        unmarked.to_string().hash(h);
        out.push(Position {
            tokens: tokens(v) + extra,
            mark,
            hash: h.finish(),
        });
    };
    if !anthropic {
        for key in ["tools", "system", "instructions", "systemInstruction"] {
            if let Some(v) = request.get(key).filter(|v| !v.is_null()) {
                push(&mut h, v, 0, None);
            }
        }
        for key in ["messages", "input", "contents"] {
            match request.get(key) {
                Some(Value::Array(items)) => {
                    for item in items {
                        push(&mut h, item, MESSAGE_FRAMING, None);
                    }
                }
                Some(v) if !v.is_null() => push(&mut h, v, MESSAGE_FRAMING, None),
                _ => {}
            }
        }
        return Ok(out);
    }
    let blocks = |v: Option<&Value>| -> Vec<Value> {
        match v {
            Some(Value::Array(items)) => items.clone(),
            Some(Value::Null) | None => Vec::new(),
            Some(other) => vec![other.clone()],
        }
    };
    for key in ["tools", "system"] {
        for block in blocks(request.get(key)) {
            let mark = marker(&block);
            check_carrier(&block, mark)?;
            push(&mut h, &block, 0, mark);
        }
    }
    for message in blocks(request.get("messages")) {
        message["role"].to_string().hash(&mut h);
        let content = message.get("content").cloned().unwrap_or(Value::Null);
        let parts = match content {
            Value::Array(items) => items,
            other => vec![other],
        };
        for (i, block) in parts.iter().enumerate() {
            let mark = marker(block);
            check_carrier(block, mark)?;
            let framing = if i == 0 { MESSAGE_FRAMING } else { 0 };
            push(&mut h, block, framing, mark);
        }
    }
    if let Some(top) = marker(request) {
        if let Some(last) = out.last_mut() {
            last.mark = Some(last.mark.unwrap_or(false) || top);
        }
    }
    let marks: Vec<bool> = out.iter().filter_map(|p| p.mark).collect();
    if marks.len() > 4 {
        return Err(format!(
            "A maximum of 4 blocks with cache_control may be provided. Found {}.",
            marks.len()
        ));
    }
    if marks.windows(2).any(|w| !w[0] && w[1]) {
        return Err(
            "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block"
                .into(),
        );
    }
    Ok(out)
}

/// Anthropic refuses a breakpoint on a block that cannot carry one.
fn check_carrier(block: &Value, mark: Option<bool>) -> Result<(), String> {
    if mark.is_none() {
        return Ok(());
    }
    match block["type"].as_str() {
        Some("thinking" | "redacted_thinking") => {
            Err("cache_control cannot be set on thinking blocks".into())
        }
        Some("text") if block["text"].as_str() == Some("") => {
            Err("cache_control cannot be set for empty text blocks".into())
        }
        _ => Ok(()),
    }
}

/// The smallest prefix `model` caches (Anthropic's and Gemini's tables; 1,024 for OpenAI).
fn minimum(kind: Kind, model: &str) -> u64 {
    match kind {
        Kind::OpenAi => return 1024,
        Kind::Gemini => {
            let name = model.trim_start_matches("models/");
            return if ["gemini-1.", "gemini-2.0"]
                .iter()
                .any(|v| name.starts_with(v))
            {
                u64::MAX
            } else if name.starts_with("gemini-2.5") {
                2048
            } else {
                4096
            };
        }
        Kind::Anthropic => {}
    }
    if ["opus-4-5", "opus-4-6", "haiku-4-5"]
        .iter()
        .any(|m| model.contains(m))
    {
        4096
    } else if ["opus-4-7", "haiku-3-5", "3-5-haiku"]
        .iter()
        .any(|m| model.contains(m))
    {
        2048
    } else {
        1024
    }
}

/// Bills `request` against the cache and leaves the cache as the provider would; `Err` is the
/// provider's 400 for the request's breakpoints.
pub fn count(
    kind: Kind,
    model: &str,
    request: &Value,
    cache: &mut PromptCache,
    tokens: impl Fn(&Value) -> u64,
) -> Result<Counted, String> {
    let anthropic = kind == Kind::Anthropic;
    let positions = positions(anthropic, request, &tokens)?;
    let min = minimum(kind, model);
    let now = cache.now_ms();
    let mut prefix = Vec::with_capacity(positions.len());
    let mut total = 0;
    for p in &positions {
        total += p.tokens;
        prefix.push(total);
    }
    if !anthropic {
        let shared = positions
            .iter()
            .take_while(|p| cache.live(p.hash, now).is_some())
            .count();
        let common = if shared == 0 { 0 } else { prefix[shared - 1] };
        for p in &positions {
            cache.put(p.hash, false, now);
        }
        let step = if kind == Kind::Gemini { 1 } else { 128 };
        let cached = if common >= min {
            common / step * step
        } else {
            0
        };
        return Ok(Counted {
            total,
            cached,
            ..Counted::default()
        });
    }
    let marks: Vec<usize> = (0..positions.len())
        .filter(|&i| positions[i].mark.is_some())
        .collect();
    // The read: the last breakpoint first, each looking back 20 blocks, itself included.
    let mut read = 0;
    'found: for &m in marks.iter().rev() {
        let mut j = m as i64;
        while j >= 0 && j > m as i64 - 20 {
            let i = j as usize;
            if let Some(long) = cache.live(positions[i].hash, now) {
                read = prefix[i];
                cache.put(positions[i].hash, long, now);
                break 'found;
            }
            j -= 1;
        }
    }
    let mut counted = Counted {
        total,
        cached: read,
        ..Counted::default()
    };
    let mut written_to = read;
    for &m in &marks {
        if prefix[m] < min {
            continue;
        }
        let long = positions[m].mark == Some(true);
        cache.put(positions[m].hash, long, now);
        if prefix[m] > written_to {
            if long {
                counted.created_1h += prefix[m] - written_to;
            } else {
                counted.created += prefix[m] - written_to;
            }
            written_to = prefix[m];
        }
    }
    Ok(counted)
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
    /// Everything written to the cache.
    pub fn written(&self) -> u64 {
        self.created + self.created_1h
    }

    /// The bill in uncached input tokens at the published prices (`read` the provider's
    /// cache-read multiplier; Anthropic writes at 1.25× and 2×).
    pub fn cost(&self, read: f64) -> f64 {
        let uncached = self.total - self.cached - self.written();
        uncached as f64
            + self.cached as f64 * read
            + self.created as f64 * 1.25
            + self.created_1h as f64 * 2.0
    }

    /// The `usage` object of `dialect` (`chat`, `responses`, `anthropic`).
    pub fn usage(&self, dialect: &str) -> Value {
        match dialect {
            "chat" => json!({"prompt_tokens": self.total, "completion_tokens": 5,
                "total_tokens": self.total + 5,
                "prompt_tokens_details": {"cached_tokens": self.cached}}),
            "gemini" => json!({"promptTokenCount": self.total, "candidatesTokenCount": 5,
                "totalTokenCount": self.total + 5, "cachedContentTokenCount": self.cached}),
            "responses" => json!({"input_tokens": self.total, "output_tokens": 5,
                "total_tokens": self.total + 5,
                "input_tokens_details": {"cached_tokens": self.cached},
                "output_tokens_details": {"reasoning_tokens": 0}}),
            _ => json!({"input_tokens": self.total - self.cached - self.written(),
                "cache_read_input_tokens": self.cached,
                "cache_creation_input_tokens": self.written(),
                "cache_creation": {"ephemeral_5m_input_tokens": self.created,
                    "ephemeral_1h_input_tokens": self.created_1h},
                "output_tokens": 5}),
        }
    }

    /// A reply body with this usage.
    pub fn onto_json(&self, dialect: &str, mut body: Value) -> Value {
        if body.get("usage").is_some() {
            body["usage"] = self.usage(dialect);
        }
        if body.get("usageMetadata").is_some() {
            body["usageMetadata"] = self.usage(dialect);
        }
        body
    }

    /// Stream events with this usage where the provider reports it: Anthropic's
    /// `message_start`, Responses' `response.completed`, and for chat a last chunk with
    /// `usage` before `[DONE]` (as `stream_options.include_usage` asks).
    pub fn onto_events(&self, dialect: &str, events: Vec<Bytes>) -> Vec<Bytes> {
        let mut out = Vec::with_capacity(events.len() + 1);
        // The usage chunk carries the stream's own id, as every chunk of one stream does.
        let mut id = Value::from("chatcmpl-usage");
        for event in events {
            let text = String::from_utf8_lossy(&event).into_owned();
            if dialect == "chat" {
                if let Some(chunk) = text
                    .strip_prefix("data: ")
                    .and_then(|d| serde_json::from_str::<Value>(d.trim_end()).ok())
                {
                    if let Some(known) = chunk.get("id").filter(|v| v.is_string()) {
                        id = known.clone();
                    }
                }
            }
            if dialect == "chat" && text.starts_with("data: [DONE]") {
                let chunk = json!({"id": id, "object": "chat.completion.chunk",
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
                None if dialect == "gemini" && v.get("usageMetadata").is_some() => {
                    v["usageMetadata"] = self.usage(dialect);
                }
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
