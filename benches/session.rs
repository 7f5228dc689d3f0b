//! A 100-turn agent session with a screenshot every turn (`recent`, 3 kept, pruned 2 at a time),
//! projected turn after turn with its delivery state (delivery-state issue):
//! - the share of each projected request that is an exact prefix of the next one (what a
//!   provider's prompt cache can reuse), printed once;
//! - projection time at 10, 50 and 100 turns against a plain `RawValue` scan of the same bytes;
//! - a long session (architecture issue): the client keeps its last 10 turns, as a compacting
//!   agent does, and each request's whole state work (load the stored state, project, apply the
//!   delta, store it again) is timed at turn 10 and at turn 1,000, with the stored state's size
//!   printed for both.
//!
//! Run: `cargo bench --bench session`.

#![allow(clippy::unwrap_used)] // benchmark code: fail loudly

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use serde_json::json;
use sluice::config::RouteConfig;
use sluice::dialect::Dialect;
use sluice::memo::Memo;
use sluice::projection::attach::state::{apply, SessionState};
use sluice::projection::{project, splice, Context};
use sluice::tenant::Tenant;

/// A screenshot-like PNG (noise, so it does not compress away), different every turn.
fn screenshot(turn: u32) -> String {
    use base64::Engine;
    let img = image::RgbImage::from_fn(96, 64, |x, y| {
        let v = (x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503) ^ turn.wrapping_mul(97))
            .wrapping_mul(2_246_822_519);
        image::Rgb([(v >> 24) as u8, (v >> 16) as u8, (v >> 8) as u8])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    base64::engine::general_purpose::STANDARD.encode(out.into_inner())
}

/// The request an agent sends at `turns`: its whole history, every turn a tool call returning a
/// short log and a screenshot.
fn request(turns: u32, shots: &[String]) -> Bytes {
    window(turns, turns, shots)
}

/// The request at `turns` of an agent that keeps only its last `kept` turns.
fn window(turns: u32, kept: u32, shots: &[String]) -> Bytes {
    let mut messages = vec![json!({"role": "user", "content": "Fix the failing UI test."})];
    for t in turns.saturating_sub(kept) + 1..=turns {
        let id = format!("tu{t}");
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("Step {t}: taking a screenshot.")},
            {"type": "tool_use", "id": id, "name": "take_screenshot", "input": {"step": t}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": [
            {"type": "text", "text": format!("screenshot {t} taken\nconsole: 3 warnings")},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": shots[t as usize - 1]}}]}]}));
    }
    Bytes::from(json!({"model": "claude-x", "max_tokens": 1024, "system": "You are a UI agent.", "messages": messages}).to_string())
}

struct Session {
    tenant: Tenant,
    route: RouteConfig,
    memo: Memo,
    state: SessionState,
    turns: u32,
}

impl Session {
    fn new() -> Self {
        let mut route = RouteConfig::default();
        route.images.recent_count = 3;
        route.images.prune_batch = 2;
        Session {
            tenant: Tenant::from_credential(b"bench"),
            route,
            memo: Memo::default(),
            state: SessionState::default(),
            turns: 0,
        }
    }

    /// One request's whole state work, as the embedded store does it: the stored state read,
    /// the request projected, its delta applied and the state written back.
    fn stored_turn(&self, stored: &[u8], body: &Bytes) -> (Bytes, Vec<u8>) {
        let mut state: SessionState = serde_json::from_slice(stored).unwrap();
        let view = Dialect::AnthropicMessages.read_view(body).unwrap();
        let ctx = Context {
            tenant: &self.tenant,
            policy: self.route.policy(&self.route.read_tool),
            memo: &self.memo,
            state: &state,
            now_ms: 0,
        };
        let p = project(&view, &ctx);
        drop(view);
        let delta = p.delta;
        apply(&mut state, &delta, u64::from(self.turns));
        (
            splice(body, p.edits).unwrap(),
            serde_json::to_vec(&state).unwrap(),
        )
    }

    /// Projects one request; with `commit`, applies its delta as a completed response would.
    fn turn(&mut self, body: &Bytes, commit: bool) -> Bytes {
        let view = Dialect::AnthropicMessages.read_view(body).unwrap();
        let ctx = Context {
            tenant: &self.tenant,
            policy: self.route.policy(&self.route.read_tool),
            memo: &self.memo,
            state: &self.state,
            now_ms: 0,
        };
        let p = project(&view, &ctx);
        drop(view);
        for (k, v) in p.memos {
            self.memo.insert_page(k, v);
        }
        if commit {
            apply(&mut self.state, &p.delta, u64::from(self.turns));
            self.turns += 1;
        }
        splice(body, p.edits).unwrap()
    }
}

fn prefix_share() {
    let shots: Vec<String> = (1..=100).map(screenshot).collect();
    let mut session = Session::new();
    let mut previous: Option<Bytes> = None;
    let (mut shared, mut total, mut whole) = (0usize, 0usize, 0usize);
    for t in 1..=100 {
        let projected = session.turn(&request(t, &shots), true);
        if let Some(prev) = &previous {
            let common = prev
                .iter()
                .zip(projected.iter())
                .take_while(|(a, b)| a == b)
                .count();
            shared += common;
            total += prev.len();
            // All but the closing brackets of the previous request: the next one only appends.
            if common + 8 >= prev.len() {
                whole += 1;
            }
        }
        previous = Some(projected);
    }
    println!(
        "session/prefix_share: {:.1}% of each projected request (turns 1-99) is an exact prefix of the next one; \
         {whole} of 99 turns reuse the whole previous request (the others prune)",
        100.0 * shared as f64 / total as f64
    );
}

fn per_turn(c: &mut Criterion) {
    prefix_share();
    let shots: Vec<String> = (1..=100).map(screenshot).collect();
    let mut group = c.benchmark_group("session");
    for turns in [10u32, 50, 100] {
        let body = request(turns, &shots);
        group.bench_with_input(
            BenchmarkId::new("raw_value_scan", turns),
            &body,
            |b, body| {
                b.iter(|| {
                    let v: Box<serde_json::value::RawValue> =
                        serde_json::from_slice(black_box(body)).unwrap();
                    black_box(v);
                })
            },
        );
        // Steady state: the session has run up to this turn; project its request again.
        let mut session = Session::new();
        for t in 1..=turns {
            session.turn(&request(t, &shots), true);
        }
        group.bench_with_input(BenchmarkId::new("project", turns), &body, |b, body| {
            b.iter(|| black_box(session.turn(black_box(body), false)))
        });
    }
    group.finish();
}

fn long_session(c: &mut Criterion) {
    const KEPT: u32 = 10;
    let shots: Vec<String> = (1..=1_000).map(screenshot).collect();
    let mut group = c.benchmark_group("long_session");
    let mut session = Session::new();
    let mut done = 0;
    for turns in [10u32, 1_000] {
        while done < turns {
            done += 1;
            session.turn(&window(done, KEPT, &shots), true);
        }
        let stored = serde_json::to_vec(&session.state).unwrap();
        println!(
            "long_session/state: at turn {turns}: {} bytes stored, {} live records, {} released, {} links",
            stored.len(),
            session.state.records.len(),
            session.state.released.len(),
            session.state.links.len()
        );
        let body = window(turns, KEPT, &shots);
        group.bench_with_input(BenchmarkId::new("turn", turns), &body, |b, body| {
            b.iter(|| black_box(session.stored_turn(black_box(&stored), black_box(body))))
        });
    }
    group.finish();
}

criterion_group!(benches, per_turn, long_session);
criterion_main!(benches);
