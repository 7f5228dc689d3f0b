//! Prefix chains and what a provider bills for a request (docs/inspector.md). A provider's
//! prompt cache works on a request's blocks in its own order: tools, then the system prompt,
//! then the messages (Anthropic: each content block; OpenAI: each message or input item). A
//! chain is that order with a running hash and the tokens of each block and the breakpoints the
//! request marks, so a request is billed by the exact model (`projection::cache`) without
//! keeping its body.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

pub use crate::config::inspector::Price;
use crate::dialect::blocks::{segments, without_breakpoints};
use crate::dialect::Dialect;
use crate::projection::cache::{self, Bill, Block, Entries, Provider, Rates, Ttl};
use crate::tokens::Tokenizer;

/// The longest chain kept: a history of more blocks is cut there (its tail counts as one).
pub const MAX_LINKS: usize = 4096;

/// One block of a request in cache order: the hash of everything up to and including it, and
/// its own tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link(pub u64, pub u64);

/// A request's chain, and when it was sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    pub at_ms: u64,
    pub links: Vec<Link>,
    /// The cache breakpoints the request marks (Anthropic `cache_control`), by link.
    #[serde(default)]
    pub marks: Vec<(u32, Ttl)>,
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

    /// The blocks as the cache model takes them.
    pub fn blocks(&self) -> Vec<Block> {
        let mut blocks: Vec<Block> = self
            .links
            .iter()
            .map(|l| Block {
                hash: l.0,
                tokens: l.1,
                mark: None,
            })
            .collect();
        for &(i, ttl) in &self.marks {
            if let Some(b) = blocks.get_mut(i as usize) {
                b.mark = Some(b.mark.map_or(ttl, |t| t.max(ttl)));
            }
        }
        blocks
    }
}

/// Whose cache a dialect's requests meet.
pub fn provider(dialect: Dialect) -> Provider {
    dialect.shapes().cache_provider()
}

/// What the provider bills for `now`, its cache holding `entries` (left as the provider
/// leaves them).
pub fn bill(dialect: Dialect, rates: &Rates, now: &Chain, entries: &mut Entries) -> Bill {
    cache::bill(provider(dialect), rates, &now.blocks(), entries, now.at_ms)
}

/// The chain of a body, counting each block with `count` (memoized by the caller).
pub fn chain(
    dialect: Dialect,
    body: &[u8],
    at_ms: u64,
    count: &mut dyn FnMut(&str) -> u64,
) -> Chain {
    let Some((segments, model)) = segments(dialect, body) else {
        return Chain {
            at_ms,
            links: vec![Link(
                0,
                count(std::str::from_utf8(body).unwrap_or_default()),
            )],
            marks: Vec::new(),
        };
    };
    let mut h = Xxh3::new();
    h.update(model.unwrap_or("").as_bytes());
    let mut links = Vec::with_capacity(segments.len().min(MAX_LINKS));
    let mut marks = Vec::new();
    let mut tail = 0;
    for (i, segment) in segments.iter().enumerate() {
        let text = without_breakpoints(segment.text);
        h.update(segment.head.as_bytes());
        h.update(b"\x01");
        h.update(text.as_bytes());
        h.update(b"\0");
        let n = count(&text);
        if let Some(ttl) = segment.mark {
            marks.push((i.min(MAX_LINKS - 1) as u32, ttl));
        }
        if i + 1 < MAX_LINKS {
            links.push(Link(h.digest(), n));
        } else {
            tail += n;
        }
    }
    if tail > 0 || segments.len() >= MAX_LINKS {
        links.push(Link(h.digest(), tail));
    }
    Chain {
        at_ms,
        links,
        marks,
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
        chain(Dialect::OpenAiChat, body.as_bytes(), at_ms, &mut |p| {
            p.len() as u64 * 100
        })
    }

    fn anthropic_of(body: &str, at_ms: u64) -> Chain {
        chain(
            Dialect::AnthropicMessages,
            body.as_bytes(),
            at_ms,
            &mut |p| p.len() as u64 * 100,
        )
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

    /// Anthropic's blocks: each tool, system block and content block is a position; markers
    /// (on a block or top-level) are where entries are written, and not content.
    #[test]
    fn anthropic_chains_are_blocks_with_their_breakpoints() {
        let a = r#"{"model":"m","system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral","ttl":"1h"}}],"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b","cache_control":{"type":"ephemeral"}}]},{"role":"assistant","content":"c"}]}"#;
        let c = anthropic_of(a, 0);
        assert_eq!(c.links.len(), 4);
        assert_eq!(c.marks, vec![(0, Ttl::Long), (2, Ttl::Short)]);
        // The same blocks under one top-level marker: same hashes, the mark on the last block.
        let top = r#"{"model":"m","cache_control":{"type":"ephemeral"},"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":"c"}]}"#;
        let t = anthropic_of(top, 0);
        assert_eq!(t.marks, vec![(3, Ttl::Short)]);
        assert_eq!(t.shared(&c), c.tokens());
        // A role is part of the hash: the same text from the assistant is another block.
        let swapped = top.replace(r#""role":"user""#, r#""role":"assistant""#);
        assert_eq!(anthropic_of(&swapped, 0).shared(&t), t.links[0].1);
    }

    /// A marker sluice inserted into a block the client sent is not content: the marked block
    /// hashes as the block sent unmarked, byte for byte, whatever escapes its text uses.
    #[test]
    fn an_inserted_marker_leaves_the_blocks_bytes_as_sent() {
        let bare = r#"{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"caf\u00e9 \/ x"},{"type":"text","text":"go"}]}]}"#;
        let marked = bare.replace(r#"x"}"#, r#"x","cache_control":{"type":"ephemeral"}}"#);
        assert_ne!(marked, bare);
        let (a, b) = (anthropic_of(bare, 0), anthropic_of(&marked, 0));
        assert_eq!(a.links, b.links);
        assert_eq!(b.marks, vec![(0, Ttl::Short)]);
    }

    /// The bill follows the exact model: Anthropic without a breakpoint caches nothing; with
    /// one it writes there and the next request reads it; OpenAI reads by itself.
    #[test]
    fn a_chain_is_billed_by_the_exact_model() {
        let long = "x".repeat(20);
        let first = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"text","text":"{long}","cache_control":{{"type":"ephemeral"}}}}]}}]}}"#
        );
        let second = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"text","text":"{long}"}}]}},{{"role":"assistant","content":[{{"type":"text","text":"ok","cache_control":{{"type":"ephemeral"}}}}]}}]}}"#
        );
        let rates = Rates::published(Provider::Anthropic, "m");
        let (a, b) = (anthropic_of(&first, 0), anthropic_of(&second, 1000));
        let mut cache = Entries::default();
        let one = bill(Dialect::AnthropicMessages, &rates, &a, &mut cache);
        assert_eq!(one.write_short, a.tokens());
        let two = bill(Dialect::AnthropicMessages, &rates, &b, &mut cache);
        assert_eq!(two.read, a.tokens());
        assert_eq!(two.write_short, b.tokens() - a.tokens());
        let bare = second.replace(r#","cache_control":{"type":"ephemeral"}"#, "");
        let mut cold = Entries::default();
        let none = bill(
            Dialect::AnthropicMessages,
            &rates,
            &anthropic_of(&bare, 0),
            &mut cold,
        );
        assert_eq!(none.uncached, none.tokens());
        let openai = Rates::published(Provider::OpenAi, "gpt-5");
        let mut cache = Entries::default();
        let opening = chain_of(&first, 0);
        bill(Dialect::OpenAiChat, &openai, &opening, &mut cache);
        let hit = bill(
            Dialect::OpenAiChat,
            &openai,
            &chain_of(&second, 1),
            &mut cache,
        );
        assert_eq!(hit.read, opening.tokens() / 128 * 128);
    }
}
