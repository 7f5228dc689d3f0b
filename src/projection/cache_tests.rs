//! The exact cache model against hand-priced sessions (WIRE.md "Prompt caches, exactly").

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
fn anthropic(cache: &mut Entries, labels: &[&str], tokens: u64, marks: &[usize], at: u64) -> Bill {
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

/// Gemini's implicit cache: the longest prefix an earlier request left, counted exactly, from
/// the model's minimum; nothing before 2.5.
#[test]
fn gemini_reads_the_exact_shared_prefix_from_the_models_minimum() {
    let rates = Rates::published(Provider::Gemini, "gemini-3-pro-preview");
    assert_eq!(
        (rates.read, rates.write_short, rates.min_tokens),
        (0.1, 1.0, 4096)
    );
    let mut cache = Entries::default();
    let l = ["sys", "u1", "m1", "u2", "m2", "u3"];
    let first = bill(
        Provider::Gemini,
        &rates,
        &blocks(&l[..4], 1100, &[]),
        &mut cache,
        0,
    );
    assert_eq!(
        first,
        Bill {
            uncached: 4400,
            ..Bill::default()
        }
    );
    let b = bill(
        Provider::Gemini,
        &rates,
        &blocks(&l, 1100, &[]),
        &mut cache,
        1,
    );
    // 4,400 shared tokens, not rounded to a step; the rest at the full price, no premium.
    assert_eq!(
        b,
        Bill {
            read: 4400,
            uncached: 2200,
            ..Bill::default()
        }
    );
    assert!((b.cost(&rates) - (440.0 + 2200.0)).abs() < 1e-9);
    // Under the minimum nothing is read; 2.5 models cache from 2,048; older ones never.
    let mut short = Entries::default();
    bill(
        Provider::Gemini,
        &rates,
        &blocks(&l[..3], 1100, &[]),
        &mut short,
        0,
    );
    let b = bill(
        Provider::Gemini,
        &rates,
        &blocks(&l[..4], 1100, &[]),
        &mut short,
        1,
    );
    assert_eq!(b.read, 0);
    let flash = Rates::published(Provider::Gemini, "models/gemini-2.5-flash");
    assert_eq!(flash.min_tokens, 2048);
    for (rates, read) in [(flash, 2200), (rates, 0)] {
        let mut fresh = Entries::default();
        bill(
            Provider::Gemini,
            &rates,
            &blocks(&l[..2], 1100, &[]),
            &mut fresh,
            0,
        );
        let b = bill(
            Provider::Gemini,
            &rates,
            &blocks(&l[..3], 1100, &[]),
            &mut fresh,
            1,
        );
        assert_eq!(b.read, read);
    }
    assert_eq!(
        Rates::published(Provider::Gemini, "gemini-2.0-flash").min_tokens,
        u64::MAX
    );
    assert_eq!(
        Rates::published(Provider::Gemini, "gemini-1.5-pro-002").min_tokens,
        u64::MAX
    );
    assert_eq!(
        Rates::published(Provider::Gemini, "gemini-flash-latest").min_tokens,
        4096
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
        which in 0u8..3,
    ) {
        let provider = [Provider::Anthropic, Provider::OpenAi, Provider::Gemini][which as usize];
        let rates = match provider {
            Provider::Anthropic => ANTHROPIC,
            Provider::OpenAi => Rates::published(provider, "gpt-5"),
            Provider::Gemini => Rates::published(provider, "gemini-2.5-pro"),
        };
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

/// How long sluice's own breakpoints ask (docs/cache.md): 5 minutes until the session comes
/// back after a pause the short TTL did not outlast and the long one would have; an hour from
/// then on, and the cache counts as warm for that hour. A pause longer than the hour is no
/// reason to pay the 1-hour premium; neither is a brisk session.
#[test]
fn a_pause_within_the_hour_turns_sluices_breakpoints_to_an_hour() {
    use crate::projection::attach::state::SessionState;
    use crate::projection::edits::{warm, Keep};
    use crate::projection::policy::CacheLimits;
    let limits = CacheLimits::default();
    let at = |last_ms, paused| SessionState {
        last_ms,
        paused,
        ..SessionState::default()
    };
    let minute = 60_000;
    let now = 100 * minute;
    let keep = |s: &SessionState| Keep::of(s, now, &limits);
    let no = Keep {
        long: false,
        paused: false,
    };
    assert_eq!(keep(&at(0, false)), no, "never forwarded");
    assert_eq!(keep(&at(now - 2 * minute, false)), no, "brisk");
    assert_eq!(keep(&at(now - 61 * minute, false)), no, "past the hour");
    let first = Keep {
        long: true,
        paused: true,
    };
    assert_eq!(keep(&at(now - 6 * minute, false)), first);
    let since = Keep {
        long: true,
        paused: false,
    };
    assert_eq!(keep(&at(now - minute, true)), since);
    assert!(warm(&at(now - 30 * minute, true), now, &limits));
    assert!(!warm(&at(now - 30 * minute, false), now, &limits));
    assert!(!warm(&at(now - 61 * minute, true), now, &limits));
    // On a shortened clock the hour shrinks with it.
    let short = CacheLimits {
        ttl_seconds: 2,
        ..CacheLimits::default()
    };
    assert_eq!(Keep::of(&at(now - 3_000, false), now, &short), first);
    assert_eq!(Keep::of(&at(now - 25_000, false), now, &short), no);
    assert_eq!(lifetime_ms(Some(2), Ttl::Long), 24_000);
}
