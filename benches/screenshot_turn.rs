//! A screenshot session's turns in-process (runtime issue): a Claude-Code-shaped Anthropic
//! session where each turn's tool result brings one new 1280×800 JPEG and the history keeps
//! the earlier ones, delivered once and remembered (so shown as placeholders). Each turn is
//! projected with its session's state and the process's memos, as the front does, and each
//! stage timed: reading the view (resumed from the previous turn's reading; the whole reading is
//! timed beside it), finding and checking the images (`prepare`), planning, and
//! splicing (into pieces, as a body for an `http` upstream is; joining them, as for `https`, is
//! timed beside it). Printed: each stage's median over turns 2 to 30, their sum, and the baseline of
//! the same run, decoding the new image's base64 twice with the `base64` crate's scalar decoder.
//!
//! Run: `cargo bench --bench screenshot_turn` (`TURNS`, `ROUNDS` to change the session's length
//! and how many sessions are run).

#![allow(clippy::unwrap_used)] // benchmark code: fail loudly

/// The binary's allocator (src/main.rs), so fresh buffers cost here what they cost in service.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::hint::black_box;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use serde_json::json;
use sluice::config::RouteConfig;
use sluice::dialect::resume::{Receiving, Resumes};
use sluice::dialect::Dialect;
use sluice::memo::Memo;
use sluice::projection::attach::state::{apply, SessionState};
use sluice::projection::{project_prepared, splice_shared, Context, Prepared};
use sluice::tenant::Tenant;

/// A screenshot-like JPEG: coarse noise scaled up (flat areas and edges, as a page has), a
/// different one for every `seed`.
fn screenshot(seed: u32) -> String {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state
    };
    let small = image::RgbImage::from_fn(320, 200, |_, _| {
        let v = next();
        image::Rgb([(v >> 24) as u8, (v >> 16) as u8, (v >> 8) as u8])
    });
    let big = image::imageops::resize(&small, 1280, 800, image::imageops::FilterType::Triangle);
    let mut out = std::io::Cursor::new(Vec::new());
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 92)
        .encode_image(&big)
        .unwrap();
    base64::engine::general_purpose::STANDARD.encode(out.into_inner())
}

/// The request at turn `turns`: one tool call per turn, each returning a screenshot.
fn request(turns: usize, shots: &[String]) -> Bytes {
    let mut messages = vec![json!({"role": "user", "content": "Look at the page."})];
    for (k, shot) in shots.iter().enumerate().take(turns) {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": format!("t{k}"), "name": "screenshot", "input": {}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("t{k}"),
            "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": shot}}]}]}));
    }
    Bytes::from(
        json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages}).to_string(),
    )
}

/// The stages' times of one turn, and the baseline's.
#[derive(Default, Clone, Copy)]
struct Times {
    /// The view read whole, as before the resumed view (not used further).
    whole: Duration,
    /// Receiving the body chunk by chunk: copied only, and copied, checked and hashed.
    copied: Duration,
    receipt: Duration,
    view: Duration,
    prepare: Duration,
    plan: Duration,
    splice: Duration,
    /// Joining the spliced pieces into one buffer, as a body for an `https` upstream is.
    joined: Duration,
    baseline: Duration,
}

fn session(turns: usize, seed: u32, route: &RouteConfig) -> Vec<Times> {
    let shots: Vec<String> = (0..turns as u32)
        .map(|k| screenshot(seed * 1000 + k))
        .collect();
    let tenant = Tenant::from_credential(b"bench");
    let memo = Memo::default();
    let mut state = SessionState::default();
    let resumes = Resumes::default();
    let mut out = Vec::new();
    for turn in 1..=turns {
        let body = request(turn, &shots);
        let engine = base64::engine::general_purpose::STANDARD;
        let at = Instant::now();
        black_box(engine.decode(black_box(&shots[turn - 1])).unwrap());
        black_box(engine.decode(black_box(&shots[turn - 1])).unwrap());
        let baseline = at.elapsed();

        // Each reading gets its own copy, written chunk by chunk as the server receives a body:
        // a buffer read for the first time costs more than one read again.
        let received = |body: &Bytes| {
            let mut copy = Vec::with_capacity(body.len());
            for chunk in body.chunks(64 * 1024) {
                copy.extend_from_slice(chunk);
            }
            Bytes::from(copy)
        };
        let at = Instant::now();
        let other = received(&body);
        let copied = at.elapsed();
        // As the server receives a long body: checked and hashed chunk by chunk.
        let at = Instant::now();
        let mut receiving = Receiving::with_capacity(body.len());
        for at in (0..body.len()).step_by(64 * 1024) {
            receiving.push(body.slice(at..body.len().min(at + 64 * 1024)));
        }
        let (body, checked) = receiving.finish();
        let receipt = at.elapsed();
        let at = Instant::now();
        black_box(Dialect::AnthropicMessages.read_view(&other).unwrap());
        let whole = at.elapsed();

        let at = Instant::now();
        let view = Dialect::AnthropicMessages
            .read_view_resumed(&body, checked.as_ref(), &resumes)
            .unwrap()
            .0;
        let viewed = at.elapsed();
        let prepared = Prepared::new(&view, &tenant, &memo);
        let prepared_at = at.elapsed();
        // The clock just after the last turn: the provider's cache is warm, so the economic
        // decision prices every pending prune.
        let ctx = Context {
            tenant: &tenant,
            policy: route.policy(&route.read_tool),
            memo: &memo,
            state: &state,
            now_ms: turn as u64,
        };
        let projection = project_prepared(&view, &ctx, prepared);
        let planned = at.elapsed();
        // As forwarded to an `http` upstream: pieces of the received body.
        let forwarded = splice_shared(&body, projection.edits).unwrap();
        let spliced = at.elapsed();
        let joining = Instant::now();
        black_box(forwarded.to_bytes());
        let joined = joining.elapsed();
        black_box(forwarded);
        drop(view);
        for (k, v) in projection.memos {
            memo.insert_page(k, v);
        }
        apply(&mut state, &projection.delta, turn as u64);
        out.push(Times {
            whole,
            copied,
            receipt,
            view: viewed,
            prepare: prepared_at - viewed,
            plan: planned - prepared_at,
            splice: spliced - planned,
            joined,
            baseline,
        });
    }
    out
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let number = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (turns, rounds) = (number("TURNS", 30), number("ROUNDS", 3));
    println!(
        "jpeg base64 bytes: {} (1280x800, quality 92)",
        screenshot(0).len()
    );
    for round in 0..rounds {
        let times = session(turns, round as u32 + 1, &RouteConfig::default());
        let later = &times[1.min(times.len())..];
        let stage = |f: fn(&Times) -> Duration| median(later.iter().map(f).collect());
        let totals = median(
            later
                .iter()
                .map(|t| t.view + t.prepare + t.plan + t.splice)
                .collect(),
        );
        let baseline = stage(|t| t.baseline);
        println!(
            "screenshot_turn round {round}: median of turns 2-{turns}: view {:.2} ms (read whole {:.2} ms), \
             prepare {:.2} ms, plan {:.2} ms, splice {:.2} ms (joined for https {:.2} ms more); total {:.2} ms; base64 decoded twice {:.2} ms \
             (total {:.1}x, prepare {:.1}x); receiving the body: copied {:.2} ms, copied, checked and hashed {:.2} ms",
            ms(stage(|t| t.view)),
            ms(stage(|t| t.whole)),
            ms(stage(|t| t.prepare)),
            ms(stage(|t| t.plan)),
            ms(stage(|t| t.splice)),
            ms(stage(|t| t.joined)),
            ms(totals),
            ms(baseline),
            totals.as_secs_f64() / baseline.as_secs_f64(),
            stage(|t| t.prepare).as_secs_f64() / baseline.as_secs_f64(),
            ms(stage(|t| t.copied)),
            ms(stage(|t| t.receipt)),
        );
        decision(turns, round);
        if std::env::var_os("EACH").is_some() {
            for (k, t) in times.iter().enumerate() {
                println!(
                    "  turn {}: view {:.2} prepare {:.2} plan {:.2} splice {:.2}",
                    k + 1,
                    ms(t.view),
                    ms(t.prepare),
                    ms(t.plan),
                    ms(t.splice)
                );
            }
        }
    }
}

/// What the edit decision costs (docs/cache.md, issue #38): the same session with its
/// screenshots `recent` (3 kept, so from turn 5 on every request has pending prunes), planned
/// as A4 is written with no breakpoints of sluice's (`eager`, `off`) and through the decision
/// with its breakpoints (`economic`, `auto`), one after the other in each round. Printed: the
/// plan stage's median over turns 2 to `turns` under each, and the per-request total's.
fn decision(turns: usize, round: usize) {
    use sluice::config::Lifetime;
    use sluice::projection::policy::{Breakpoints, EditPolicy};
    let mut eager = RouteConfig::default();
    eager.images.default_lifetime = Lifetime::Recent;
    eager.cache.policy = EditPolicy::Eager;
    eager.cache.breakpoints = Breakpoints::Off;
    let mut economic = RouteConfig::default();
    economic.images.default_lifetime = Lifetime::Recent;
    let seed = 100 + round as u32;
    let (a, b) = (
        session(turns, seed, &eager),
        session(turns, seed, &economic),
    );
    let median_of = |times: &[Times], f: fn(&Times) -> Duration| {
        median(times[1.min(times.len())..].iter().map(f).collect())
    };
    let total = |t: &Times| t.view + t.prepare + t.plan + t.splice;
    let (plan_a, plan_b) = (median_of(&a, |t| t.plan), median_of(&b, |t| t.plan));
    let (total_a, total_b) = (median_of(&a, total), median_of(&b, total));
    println!(
        "decision round {round}: recent screenshots, median of turns 2-{turns}: plan eager/off {:.3} ms, \
         economic/auto {:.3} ms ({:.2}x); request total {:.2} ms and {:.2} ms ({:.3}x)",
        ms(plan_a),
        ms(plan_b),
        plan_b.as_secs_f64() / plan_a.as_secs_f64(),
        ms(total_a),
        ms(total_b),
        total_b.as_secs_f64() / total_a.as_secs_f64(),
    );
}
