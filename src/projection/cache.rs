//! The providers' prompt caches as they bill them (WIRE.md "Prompt caches, exactly"), one model
//! for the inspector's cost, the edit decision and the benches: a request is its blocks in cache
//! order, each with the running hash of everything up to it, its tokens and its breakpoint; the
//! cache is the entries earlier requests left; [`bill`] says what the provider charges and
//! leaves the entries as the provider would.
//!
//! - Anthropic writes an entry only at a `cache_control` breakpoint. A read looks at each
//!   breakpoint, last first, and walks back at most [`LOOKBACK`] blocks (the breakpoint
//!   included) for an entry; the first one found is the hit `A`. The request pays `A` at the
//!   read price, `C − A` at the write price of the breakpoints that close it (`C`: the last
//!   breakpoint), the rest in full. A breakpoint below the model's minimum caches nothing.
//! - OpenAI caches every prompt by itself; a request reads the longest prefix an earlier one
//!   left, from 1,024 tokens in 128-token steps, and pays no write premium (GPT-5.6 and later:
//!   the uncached part at the write price).
//! - Gemini (2.5 and later) caches every prompt by itself too ("implicit caching"): a request
//!   reads the longest prefix an earlier one left, from the model's minimum (2,048 tokens for
//!   2.5, 4,096 from 3 on), counted exactly (Google publishes no step), at a tenth of the input
//!   price, with no write premium. Models before 2.5 cache nothing implicitly.

use serde::{Deserialize, Serialize};

/// Blocks an Anthropic read walks back from a breakpoint, the breakpoint included.
pub const LOOKBACK: usize = 20;
/// The most breakpoints an Anthropic request may carry (a fifth is refused with a 400).
pub const MAX_BREAKPOINTS: usize = 4;
/// OpenAI serves cached prefixes in steps of this many tokens.
pub const OPENAI_STEP: u64 = 128;
/// Entries kept per cache (a session's side): the oldest to expire go first. An Anthropic
/// session leaves at most four per request, an OpenAI one a block each; entries past this
/// belong to prefixes long gone.
pub const MAX_ENTRIES: usize = 4096;

/// Whose cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    Anthropic,
    OpenAi,
    Gemini,
}

/// How long an entry lives after the request that wrote or read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Ttl {
    /// Anthropic's default (`{"type":"ephemeral"}`) and OpenAI's in-memory retention: 5 min.
    #[serde(rename = "5m")]
    Short,
    /// Anthropic's `"ttl":"1h"`.
    #[serde(rename = "1h")]
    Long,
}

/// A 1-hour entry lives twelve times as long as a 5-minute one, on a shortened clock too.
pub const LONG_PER_SHORT: u64 = 12;

impl Ttl {
    pub fn seconds(self) -> u64 {
        match self {
            Ttl::Short => 300,
            Ttl::Long => 3600,
        }
    }
}

/// A provider's prices for one model, as multiples of its uncached input price, and its
/// smallest cached prefix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub read: f64,
    /// A token written under a 5-minute breakpoint (OpenAI: any token written).
    pub write_short: f64,
    /// A token written under a 1-hour breakpoint.
    pub write_long: f64,
    pub min_tokens: u64,
    /// When set, a 5-minute entry lives this long, and a 1-hour entry [`LONG_PER_SHORT`]
    /// times as long: the providers' two TTLs on a shorter clock (a test's or a bench's;
    /// `[routes.cache] ttl_seconds`).
    pub ttl_seconds: Option<u64>,
}

impl Rates {
    /// The published prices of `model` (WIRE.md): Anthropic reads at 0.1×, writes at 1.25×
    /// (5 min) and 2× (1 h), from 1,024 to 4,096 tokens by model; OpenAI reads at 0.1× (GPT-5
    /// family), 0.25× (GPT-4.1, o3, o4-mini) or 0.5× (GPT-4o), writes at 1.25× from GPT-5.6 on.
    pub fn published(provider: Provider, model: &str) -> Rates {
        let m = model.to_ascii_lowercase();
        let has = |s: &str| m.contains(s);
        match provider {
            Provider::Anthropic => Rates {
                read: 0.1,
                write_short: 1.25,
                write_long: 2.0,
                min_tokens: if has("opus-4-5") || has("opus-4-6") || has("haiku-4-5") {
                    4096
                } else if has("opus-4-7") || has("haiku-3-5") || has("3-5-haiku") {
                    2048
                } else {
                    1024
                },
                ttl_seconds: None,
            },
            Provider::OpenAi => Rates {
                read: if has("gpt-4o") {
                    0.5
                } else if has("gpt-4.1") || has("o3") || has("o4-mini") {
                    0.25
                } else {
                    0.1
                },
                write_short: if writes_at_premium(&m) { 1.25 } else { 1.0 },
                write_long: if writes_at_premium(&m) { 1.25 } else { 1.0 },
                min_tokens: 1024,
                ttl_seconds: None,
            },
            Provider::Gemini => Rates {
                read: 0.1,
                write_short: 1.0,
                write_long: 1.0,
                min_tokens: gemini_minimum(&m),
                ttl_seconds: None,
            },
        }
    }

    /// How long an entry of `ttl` lives, in ms.
    pub fn ttl_ms(&self, ttl: Ttl) -> u64 {
        lifetime_ms(self.ttl_seconds, ttl)
    }
}

/// How long an entry of `ttl` lives, in ms, on the providers' clock or (`short` set) on one
/// where a 5-minute entry lives `short` seconds.
pub fn lifetime_ms(short: Option<u64>, ttl: Ttl) -> u64 {
    match (short, ttl) {
        (None, ttl) => ttl.seconds(),
        (Some(short), Ttl::Short) => short,
        (Some(short), Ttl::Long) => short.saturating_mul(LONG_PER_SHORT),
    }
    .saturating_mul(1000)
}

/// The smallest prefix a Gemini model caches implicitly (Google's caching page): 2,048 tokens
/// for 2.5, 4,096 from 3 on (a name without a version is taken as current); before 2.5, none.
fn gemini_minimum(model: &str) -> u64 {
    let name = model.rsplit('/').next().unwrap_or(model);
    let version = name
        .strip_prefix("gemini-")
        .map(|rest| rest.split('-').next().unwrap_or(""))
        .and_then(|v| {
            let mut it = v.splitn(2, '.');
            let major = it.next()?.parse::<u32>().ok()?;
            let minor = it.next().map_or(Some(0), |m| m.parse::<u32>().ok())?;
            Some((major, minor))
        });
    match version {
        Some(v) if v < (2, 5) => u64::MAX,
        Some(v) if v < (3, 0) => 2048,
        _ => 4096,
    }
}

/// GPT-5.6 and later bill cache writes.
fn writes_at_premium(model: &str) -> bool {
    let Some(rest) = model.strip_prefix("gpt-5.") else {
        return false;
    };
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    minor.parse::<u32>().is_ok_and(|n| n >= 6)
}

/// One position of a request in cache order: the hash of everything up to and including it,
/// its own tokens, and the breakpoint it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub hash: u64,
    pub tokens: u64,
    pub mark: Option<Ttl>,
}

/// What a provider bills for one request's input, in tokens of each kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bill {
    pub read: u64,
    /// Written under 5-minute breakpoints (OpenAI from GPT-5.6: every token written).
    pub write_short: u64,
    pub write_long: u64,
    pub uncached: u64,
}

impl Bill {
    pub fn tokens(&self) -> u64 {
        self.read + self.write_short + self.write_long + self.uncached
    }

    /// The bill in uncached input tokens.
    pub fn cost(&self, rates: &Rates) -> f64 {
        self.read as f64 * rates.read
            + self.write_short as f64 * rates.write_short
            + self.write_long as f64 * rates.write_long
            + self.uncached as f64
    }
}

/// The entries a cache holds: by a prefix's hash, when it expires (ms) and its TTL. Looked up
/// once per block of every request billed, so by key, not by scanning.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entries(pub std::collections::BTreeMap<u64, (u64, Ttl)>);

impl Entries {
    /// The TTL of the live entry at `hash`.
    fn live(&self, hash: u64, now_ms: u64) -> Option<Ttl> {
        self.0
            .get(&hash)
            .filter(|(expires, _)| *expires > now_ms)
            .map(|&(_, ttl)| ttl)
    }

    /// Writes (or refreshes) an entry; the longer of two TTLs stays.
    fn put(&mut self, hash: u64, now_ms: u64, ttl: Ttl, rates: &Rates) {
        let expires = now_ms.saturating_add(rates.ttl_ms(ttl));
        let e = self.0.entry(hash).or_insert((expires, ttl));
        e.0 = e.0.max(expires);
        e.1 = e.1.max(ttl);
    }

    /// Drops what expired by `now_ms`, then the soonest to expire past [`MAX_ENTRIES`].
    fn expire(&mut self, now_ms: u64) {
        self.0.retain(|_, e| e.0 > now_ms);
        if self.0.len() > MAX_ENTRIES {
            let mut by_expiry: Vec<(u64, u64)> = self.0.iter().map(|(h, e)| (e.0, *h)).collect();
            by_expiry.sort_unstable();
            for (_, hash) in by_expiry.into_iter().take(self.0.len() - MAX_ENTRIES) {
                self.0.remove(&hash);
            }
        }
    }

    /// Whether any entry is still live at `now_ms`: the cache is warm.
    pub fn warm(&self, now_ms: u64) -> bool {
        self.0.values().any(|e| e.0 > now_ms)
    }
}

/// What the provider bills for `blocks` sent at `now_ms`, with the cache holding `entries`
/// (left as the provider leaves them).
pub fn bill(
    provider: Provider,
    rates: &Rates,
    blocks: &[Block],
    entries: &mut Entries,
    now_ms: u64,
) -> Bill {
    entries.expire(now_ms);
    let mut prefix = Vec::with_capacity(blocks.len());
    let mut total = 0u64;
    for b in blocks {
        total += b.tokens;
        prefix.push(total);
    }
    match provider {
        Provider::Anthropic => anthropic(rates, blocks, &prefix, entries, now_ms),
        Provider::OpenAi => implicit(rates, OPENAI_STEP, blocks, &prefix, entries, now_ms),
        Provider::Gemini => implicit(rates, 1, blocks, &prefix, entries, now_ms),
    }
}

fn anthropic(
    rates: &Rates,
    blocks: &[Block],
    prefix: &[u64],
    entries: &mut Entries,
    now_ms: u64,
) -> Bill {
    let total = prefix.last().copied().unwrap_or(0);
    let marks: Vec<usize> = (0..blocks.len())
        .filter(|&i| blocks[i].mark.is_some())
        .collect();
    let Some(&last) = marks.last() else {
        return Bill {
            uncached: total,
            ..Bill::default()
        };
    };
    // The read: from the last breakpoint back, LOOKBACK blocks each.
    let mut hit = None;
    'marks: for &m in marks.iter().rev() {
        for j in (m.saturating_sub(LOOKBACK - 1)..=m).rev() {
            if let Some(e) = entries.live(blocks[j].hash, now_ms) {
                hit = Some((j, e));
                break 'marks;
            }
        }
    }
    let read = match hit {
        Some((j, ttl)) => {
            entries.put(blocks[j].hash, now_ms, ttl, rates);
            prefix[j]
        }
        None => 0,
    };
    let mut bill = Bill {
        read,
        uncached: total - prefix[last].max(read),
        ..Bill::default()
    };
    // The writes: each breakpoint past the read closes a span at its own TTL; one below the
    // minimum writes nothing, its span going to the next.
    let mut start = read;
    for &m in &marks {
        let (end, ttl) = (prefix[m], blocks[m].mark.unwrap_or(Ttl::Short));
        if end < rates.min_tokens {
            continue;
        }
        entries.put(blocks[m].hash, now_ms, ttl, rates);
        if end > start {
            match ttl {
                Ttl::Short => bill.write_short += end - start,
                Ttl::Long => bill.write_long += end - start,
            }
            start = end;
        }
    }
    // A last breakpoint below the minimum: what it would have written is sent in full.
    bill.uncached += prefix[last].max(read) - start;
    bill
}

/// A cache the provider fills by itself: the longest prefix an earlier request left, in
/// `step`s of tokens, once it reaches the minimum.
fn implicit(
    rates: &Rates,
    step: u64,
    blocks: &[Block],
    prefix: &[u64],
    entries: &mut Entries,
    now_ms: u64,
) -> Bill {
    let total = prefix.last().copied().unwrap_or(0);
    let shared = blocks
        .iter()
        .take_while(|b| entries.live(b.hash, now_ms).is_some())
        .count();
    let common = shared.checked_sub(1).map_or(0, |i| prefix[i]);
    let read = if common >= rates.min_tokens {
        common / step * step
    } else {
        0
    };
    for b in blocks {
        entries.put(b.hash, now_ms, Ttl::Short, rates);
    }
    let rest = total - read;
    if rates.write_short > 1.0 {
        Bill {
            read,
            write_short: rest,
            ..Bill::default()
        }
    } else {
        Bill {
            read,
            uncached: rest,
            ..Bill::default()
        }
    }
}

/// Whether an edit to history the provider has cached pays back (WIRE.md): made at a point
/// with `after` tokens after it, removing `removed` of them, it costs `w·(after − removed) −
/// r·after` once (the rest written again instead of read) and saves `r·removed` on each of
/// the `horizon` requests that follow. A cold cache rewrites everything anyway: it pays.
pub fn edit_pays(rates: &Rates, after: u64, removed: u64, horizon: u64, warm: bool) -> bool {
    if !warm {
        return true;
    }
    rates.read * removed as f64 * horizon as f64 >= rewrite_cost(rates, after, removed)
}

/// What an edit costs once on a warm cache, in uncached input tokens: the `after − removed`
/// tokens that follow it written again instead of read.
pub fn rewrite_cost(rates: &Rates, after: u64, removed: u64) -> f64 {
    rates.write_short * after.saturating_sub(removed) as f64 - rates.read * after as f64
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
