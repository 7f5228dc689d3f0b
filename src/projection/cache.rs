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
    /// When set, every entry lives this long whatever its breakpoint asks (a test's or a
    /// bench's short clock; `[routes.cache] ttl_seconds`).
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
        }
    }

    fn ttl_ms(&self, ttl: Ttl) -> u64 {
        self.ttl_seconds
            .unwrap_or(ttl.seconds())
            .saturating_mul(1000)
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
        Provider::OpenAi => openai(rates, blocks, &prefix, entries, now_ms),
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

fn openai(
    rates: &Rates,
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
        common / OPENAI_STEP * OPENAI_STEP
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ANTHROPIC: Rates = Rates {
        read: 0.1,
        write_short: 1.25,
        write_long: 2.0,
        min_tokens: 1024,
        ttl_seconds: None,
    };

    /// Bills blocks of `tokens` each (labelled, with breakpoints at `marks`) at `at` ms.
    fn anthropic(
        cache: &mut Entries,
        labels: &[&str],
        tokens: u64,
        marks: &[usize],
        at: u64,
    ) -> Bill {
        bill(
            Provider::Anthropic,
            &ANTHROPIC,
            &blocks(labels, tokens, marks),
            cache,
            at,
        )
    }

    /// Blocks of `tokens` each, hashed by their labels' running concatenation, with breakpoints.
    fn blocks(labels: &[&str], tokens: u64, marks: &[usize]) -> Vec<Block> {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        labels
            .iter()
            .enumerate()
            .map(|(i, l)| {
                h.update(l.as_bytes());
                h.update(b"\0");
                Block {
                    hash: h.digest(),
                    tokens,
                    mark: marks.contains(&i).then_some(Ttl::Short),
                }
            })
            .collect()
    }

    #[test]
    fn anthropic_reads_the_previous_tail_and_writes_only_the_new_blocks() {
        let mut cache = Entries::default();
        // Claude Code's shape: a breakpoint on the system block and on the newest block.
        let first = blocks(&["sys", "u1", "a1", "u2"], 1000, &[0, 3]);
        let b = bill(Provider::Anthropic, &ANTHROPIC, &first, &mut cache, 0);
        // The system block alone is under the minimum: the whole prefix is written at the tail.
        assert_eq!(
            b,
            Bill {
                write_short: 4000,
                ..Bill::default()
            }
        );
        let second = blocks(&["sys", "u1", "a1", "u2", "a2", "u3"], 1000, &[0, 5]);
        let b = bill(Provider::Anthropic, &ANTHROPIC, &second, &mut cache, 1000);
        assert_eq!(
            b,
            Bill {
                read: 4000,
                write_short: 2000,
                ..Bill::default()
            }
        );
        assert!((b.cost(&ANTHROPIC) - (400.0 + 2500.0)).abs() < 1e-9);
    }

    #[test]
    fn an_edit_before_the_last_entry_falls_back_to_an_earlier_breakpoint() {
        let mut cache = Entries::default();
        let labels = ["sys", "u1", "a1", "img", "a2", "u3"];
        anthropic(&mut cache, &labels, 1000, &[1, 5], 0);
        // The image is pruned: no entry at or after it matches; the one at u1 does.
        let pruned = ["sys", "u1", "a1", "placeholder", "a2", "u3", "a3", "u4"];
        let b = anthropic(&mut cache, &pruned, 1000, &[1, 7], 1);
        assert_eq!(
            b,
            Bill {
                read: 2000,
                write_short: 6000,
                ..Bill::default()
            }
        );
    }

    #[test]
    fn the_lookback_stops_after_twenty_blocks() {
        let labels: Vec<String> = (0..30).map(|i| format!("b{i}")).collect();
        let l: Vec<&str> = labels.iter().map(String::as_str).collect();
        let mut cache = Entries::default();
        anthropic(&mut cache, &l[..5], 500, &[4], 0);
        // Breakpoint 24 blocks later (index 24, 20 back reaches index 5): no hit.
        let far = anthropic(&mut cache, &l[..25], 500, &[24], 1);
        assert_eq!(far.read, 0);
        let mut cache2 = Entries::default();
        anthropic(&mut cache2, &l[..5], 500, &[4], 0);
        // 20 blocks from index 23 reach index 4: a hit.
        let near = anthropic(&mut cache2, &l[..24], 500, &[23], 1);
        assert_eq!(near.read, 2500);
    }

    #[test]
    fn no_breakpoint_no_cache_and_ttls_lapse_and_price_by_breakpoint() {
        let mut cache = Entries::default();
        let l = ["a", "b", "c"];
        let none = anthropic(&mut cache, &l, 1000, &[], 0);
        assert_eq!(
            none,
            Bill {
                uncached: 3000,
                ..Bill::default()
            }
        );
        assert!(cache.0.is_empty());
        anthropic(&mut cache, &l, 1000, &[2], 0);
        // Read at 4:59, which refreshes the entry; read again 4:59 later.
        let again = anthropic(&mut cache, &l, 1000, &[2], 299_000);
        assert_eq!(again.read, 3000);
        let later = anthropic(&mut cache, &l, 1000, &[2], 598_000);
        assert_eq!(later.read, 3000);
        assert!(cache.warm(598_000) && !cache.warm(898_000));
        let cold = anthropic(&mut cache, &l, 1000, &[2], 898_000);
        assert_eq!(
            cold,
            Bill {
                write_short: 3000,
                ..Bill::default()
            }
        );
        // A 1-hour breakpoint before a 5-minute one: each span at its own price.
        let mut fresh = Entries::default();
        let mut bs = blocks(&l, 1000, &[1, 2]);
        bs[1].mark = Some(Ttl::Long);
        let b = bill(Provider::Anthropic, &ANTHROPIC, &bs, &mut fresh, 0);
        assert_eq!(
            b,
            Bill {
                write_long: 2000,
                write_short: 1000,
                ..Bill::default()
            }
        );
        assert!((b.cost(&ANTHROPIC) - 5250.0).abs() < 1e-9);
    }

    #[test]
    fn openai_reads_in_steps_and_writes_at_a_premium_only_from_gpt_5_6() {
        let rates = Rates::published(Provider::OpenAi, "gpt-5.2");
        let mut cache = Entries::default();
        let l = ["tools", "sys", "u1", "a1", "u2"];
        bill(
            Provider::OpenAi,
            &rates,
            &blocks(&l[..3], 700, &[]),
            &mut cache,
            0,
        );
        let b = bill(
            Provider::OpenAi,
            &rates,
            &blocks(&l, 700, &[]),
            &mut cache,
            1,
        );
        assert_eq!(
            b,
            Bill {
                read: 2048,
                uncached: 1452,
                ..Bill::default()
            }
        );
        let premium = Rates::published(Provider::OpenAi, "gpt-5.6-codex");
        assert_eq!(premium.write_short, 1.25);
        assert_eq!(Rates::published(Provider::OpenAi, "gpt-4o").read, 0.5);
        assert_eq!(
            Rates::published(Provider::OpenAi, "gpt-4.1-mini").read,
            0.25
        );
        assert_eq!(
            Rates::published(Provider::Anthropic, "claude-opus-4-5").min_tokens,
            4096
        );
        assert_eq!(
            Rates::published(Provider::Anthropic, "claude-sonnet-4-5").min_tokens,
            1024
        );
    }

    #[test]
    fn an_edit_pays_when_its_saving_outlasts_its_rewrite() {
        // Two 1.4k-token screenshots out of 7.5k tokens after the point: 2 × 1.4k × 0.1 × 20
        // = 5.6k saved against 1.25 × 4.7k − 0.75k = 5.1k spent.
        assert!(edit_pays(&ANTHROPIC, 7500, 2800, 20, true));
        assert!(!edit_pays(&ANTHROPIC, 9000, 2800, 20, true));
        assert!(edit_pays(&ANTHROPIC, 90_000, 1, 20, false));
    }

    proptest! {
        /// Whatever the requests, a bill accounts for every token once, reads only what an
        /// earlier request could have written, and the entries stay bounded.
        #[test]
        fn a_bill_counts_every_token_once(
            requests in prop::collection::vec(
                (prop::collection::vec((0u8..4, 1u64..3000, prop::bool::ANY), 1..30), 0u64..600_000),
                1..12,
            ),
            openai in prop::bool::ANY,
        ) {
            let provider = if openai { Provider::OpenAi } else { Provider::Anthropic };
            let rates = if openai { Rates::published(provider, "gpt-5") } else { ANTHROPIC };
            let mut cache = Entries::default();
            let mut now = 0;
            for (i, (parts, gap)) in requests.iter().enumerate() {
                now += gap;
                let mut h = xxhash_rust::xxh3::Xxh3::new();
                let bs: Vec<Block> = parts.iter().map(|&(label, tokens, mark)| {
                    h.update(&[label]);
                    Block { hash: h.digest(), tokens, mark: mark.then_some(Ttl::Short) }
                }).collect();
                let total: u64 = bs.iter().map(|b| b.tokens).sum();
                let b = bill(provider, &rates, &bs, &mut cache, now);
                prop_assert_eq!(b.tokens(), total);
                if i == 0 {
                    prop_assert_eq!(b.read, 0);
                }
                prop_assert!(cache.0.len() <= MAX_ENTRIES);
            }
        }
    }
}
