//! Prefix chains and the cache-weighted cost of a request (docs/inspector.md). A provider's
//! prompt cache serves the longest prefix a request shares with one it saw recently, in its
//! own order: tools, then the system prompt, then the messages. A chain is that order cut at
//! each of those parts, with a running hash and the tokens of each part, so two requests'
//! shared prefix is found without keeping either body.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use xxhash_rust::xxh3::Xxh3;

pub use crate::config::inspector::Price;
use crate::dialect::Dialect;
use crate::tokens::Tokenizer;

/// The longest chain kept: a history of more parts is cut there (its tail counts as one part).
pub const MAX_LINKS: usize = 4096;

/// One part of a request in cache order: the hash of everything up to and including it, and
/// its own tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link(pub u64, pub u64);

/// A request's chain, and when it was sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    pub at_ms: u64,
    pub links: Vec<Link>,
    /// The request marks cache breakpoints (Anthropic `cache_control`).
    pub breakpoints: bool,
}

impl Chain {
    pub fn tokens(&self) -> u64 {
        self.links.iter().map(|l| l.1).sum()
    }

    /// Tokens of this chain's prefix that `before` shares.
    pub fn shared(&self, before: &Chain) -> u64 {
        self.links
            .iter()
            .zip(&before.links)
            .take_while(|(a, b)| a.0 == b.0)
            .map(|(a, _)| a.1)
            .sum()
    }
}

/// The cost of sending `now` after `before`, in uncached input tokens, and the tokens the
/// cache serves. Anthropic caches only where a request marks a breakpoint: without one,
/// nothing is read or written.
pub fn cost(dialect: Dialect, price: &Price, now: &Chain, before: Option<&Chain>) -> (f64, u64) {
    let total = now.tokens();
    let caching = dialect != Dialect::AnthropicMessages || now.breakpoints;
    if !caching {
        return (total as f64, 0);
    }
    let fresh =
        before.filter(|b| now.at_ms.saturating_sub(b.at_ms) <= price.cache_ttl_seconds * 1000);
    let cached = fresh
        .map(|b| now.shared(b))
        .filter(|&n| n >= price.min_cached_tokens)
        .unwrap_or(0);
    let uncached = total - cached;
    (
        cached as f64 * price.cache_read + uncached as f64 * price.cache_write,
        cached,
    )
}

#[derive(serde::Deserialize)]
struct Parts<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    system: Option<&'a RawValue>,
    #[serde(borrow)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Option<&'a RawValue>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
}

/// A body's parts in cache order: tools, system prompt, each message (or input item). `None`
/// when it is not a JSON object.
pub fn parts(body: &[u8]) -> Option<(Vec<&str>, Option<&str>)> {
    let p: Parts = serde_json::from_slice(body).ok()?;
    let mut out = Vec::new();
    out.extend(p.tools.map(RawValue::get));
    out.extend(p.system.or(p.instructions).map(RawValue::get));
    for list in [p.messages, p.input].into_iter().flatten() {
        match serde_json::from_str::<Vec<&RawValue>>(list.get()) {
            Ok(items) => out.extend(items.into_iter().map(RawValue::get)),
            Err(_) => out.push(list.get()),
        }
    }
    Some((out, p.model.map(RawValue::get)))
}

/// The chain of a body, counting each part with `count` (memoized by the caller).
pub fn chain(body: &[u8], at_ms: u64, count: &mut dyn FnMut(&str) -> u64) -> Chain {
    let Some((parts, model)) = parts(body) else {
        return Chain {
            at_ms,
            links: vec![Link(
                0,
                count(std::str::from_utf8(body).unwrap_or_default()),
            )],
            breakpoints: false,
        };
    };
    let mut h = Xxh3::new();
    h.update(model.unwrap_or("").as_bytes());
    let mut links = Vec::with_capacity(parts.len().min(MAX_LINKS));
    let mut tail = 0;
    for (i, part) in parts.iter().enumerate() {
        let part = without_breakpoints(part);
        h.update(part.as_bytes());
        h.update(b"\0");
        let n = count(&part);
        if i + 1 < MAX_LINKS {
            links.push(Link(h.digest(), n));
        } else {
            tail += n;
        }
    }
    if tail > 0 || parts.len() >= MAX_LINKS {
        links.push(Link(h.digest(), tail));
    }
    Chain {
        at_ms,
        links,
        breakpoints: memchr::memmem::find(body, b"\"cache_control\"").is_some(),
    }
}

/// A part as a provider's cache sees it: a `cache_control` marker says where to cache, it is
/// not content (Claude Code moves its breakpoint to the newest message every turn and still
/// reads the rest from the cache).
fn without_breakpoints(part: &str) -> std::borrow::Cow<'_, str> {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.remove("cache_control");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    if !part.contains("\"cache_control\"") {
        return std::borrow::Cow::Borrowed(part);
    }
    match serde_json::from_str::<serde_json::Value>(part) {
        Ok(mut v) => {
            strip(&mut v);
            std::borrow::Cow::Owned(v.to_string())
        }
        Err(_) => std::borrow::Cow::Borrowed(part),
    }
}

/// Tokens of one part: its text by `tokenizer`, each image and audio file it carries by formula
/// (`Tokenizer::image`, `Tokenizer::audio`).
pub fn part_tokens(tokenizer: Tokenizer, part: &str) -> u64 {
    let text = tokenizer.count(&crate::tokens::json_text(part));
    let media: u64 = crate::tokens::json_payloads(part)
        .filter_map(|payload| media_tokens(tokenizer, payload))
        .sum();
    text + media
}

/// Base64 characters of a payload decoded to read an image's header (48 KiB of bytes: a JPEG's
/// size marker may follow its metadata).
const HEADER_BASE64: usize = 64 * 1024;

/// The tokens of an image or audio file sent as base64, a `data:` URL or bare, from its header.
fn media_tokens(tokenizer: Tokenizer, payload: &str) -> Option<u64> {
    use base64::Engine;
    let (_, data) = crate::projection::attach::extract::split_data_url(payload);
    let head = data.get(..data.len().min(HEADER_BASE64) / 4 * 4)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(head.as_bytes())
        .ok()?;
    if let Some((w, h)) = crate::image::header_size(&bytes) {
        return Some(tokenizer.image(w, h));
    }
    crate::audio::AudioType::sniff(&bytes)?;
    let size = data.len() as u64 / 4 * 3;
    Some(Tokenizer::audio(crate::audio::header_millis(&bytes), size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain_of(body: &str, at_ms: u64) -> Chain {
        chain(body.as_bytes(), at_ms, &mut |p| p.len() as u64 * 100)
    }

    /// An audio file a part carries costs its length at 10 tokens a second (docs/audio.md),
    /// read from a WAV's header; its base64 is no text.
    #[test]
    fn audio_in_a_part_is_counted_by_its_length() {
        use base64::Engine;
        let wav = crate::audio::tests::wav(2500);
        let data = base64::engine::general_purpose::STANDARD.encode(&wav);
        let part = |data: &str| {
            format!(
                r#"{{"role":"user","content":[{{"type":"input_audio","input_audio":{{"data":"{data}","format":"wav"}}}}]}}"#
            )
        };
        let t = Tokenizer::O200k;
        let bare = part_tokens(t, &part(""));
        assert_eq!(part_tokens(t, &part(&data)), bare + 25);
        let url = format!(r#"{{"text":"data:audio/wav;base64,{data}"}}"#);
        assert_eq!(part_tokens(t, &url), part_tokens(t, r#"{"text":""}"#) + 25);
    }

    #[test]
    fn a_shared_prefix_is_found_in_cache_order_whatever_the_key_order() {
        let a = r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"tools":[{"name":"t"}]}"#;
        let b = r#"{"tools":[{"name":"t"}],"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#;
        let (ca, cb) = (chain_of(a, 0), chain_of(b, 1000));
        assert_eq!(cb.links.len(), 4);
        assert_eq!(cb.shared(&ca), ca.tokens());
        // A changed tool list changes everything after it.
        let c = b.replace("\"t\"", "\"t2\"");
        assert_eq!(chain_of(&c, 0).shared(&cb), 0);
        // A moved cache breakpoint is not a change.
        let marked = b.replace(
            r#""content":"b"}"#,
            r#""content":"b","cache_control":{"type":"ephemeral"}}"#,
        );
        assert_ne!(marked, b);
        assert_eq!(chain_of(&marked, 0).shared(&cb), cb.tokens());
        // Another model shares nothing.
        assert_eq!(chain_of(&b.replace("\"m\"", "\"n\""), 0).shared(&cb), 0);
    }

    #[test]
    fn cost_weighs_cached_tokens_and_honours_breakpoints_minimum_and_ttl() {
        let a = chain_of(
            r#"{"model":"m","messages":[{"role":"user","content":"aaaaaaaaaaaaaaaaaaaaa"}]}"#,
            0,
        );
        let b = chain_of(
            r#"{"model":"m","messages":[{"role":"user","content":"aaaaaaaaaaaaaaaaaaaaa"},{"role":"user","content":"b"}]}"#,
            1000,
        );
        let shared = b.shared(&a);
        assert!(shared >= 1024);
        let (openai, cached) = cost(Dialect::OpenAiChat, &Price::OPENAI, &b, Some(&a));
        assert_eq!(cached, shared);
        let expected = shared as f64 * 0.1 + (b.tokens() - shared) as f64;
        assert!((openai - expected).abs() < 1e-6);
        // Anthropic without cache_control: no caching at all.
        let (anthropic, cached) = cost(Dialect::AnthropicMessages, &Price::ANTHROPIC, &b, Some(&a));
        assert_eq!((anthropic, cached), (b.tokens() as f64, 0));
        // Past the cache's lifetime: nothing cached.
        let late = Chain {
            at_ms: 3_600_000,
            ..b.clone()
        };
        assert_eq!(
            cost(Dialect::OpenAiChat, &Price::OPENAI, &late, Some(&a)).1,
            0
        );
        // Below the provider's minimum: nothing cached.
        let strict = Price {
            min_cached_tokens: shared + 1,
            ..Price::OPENAI
        };
        assert_eq!(cost(Dialect::OpenAiChat, &strict, &b, Some(&a)).1, 0);
    }
}
