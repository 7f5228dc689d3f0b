//! What the provider bills (issue #38, docs/cache.md): agent sessions priced by the providers'
//! exact prompt-cache rules on both sides. The agent's own requests go straight to one mock
//! provider; the same requests go through an in-process sluice to another. Each mock bills its
//! requests as the provider would (`tests/common/prompt_cache.rs`: Anthropic writes only at
//! breakpoints, 20-block lookback, TTLs; OpenAI's automatic prefix in 128-token steps), so the
//! ratio of the two bills is what the agent would pay through sluice for what it pays alone.
//!
//! Pacing: `brisk` sends each turn right after the last; `gaps` waits past the cache's TTL every
//! eight turns (a person reading). The TTL is scaled down to two seconds on both mocks and in
//! sluice's `[routes.cache] ttl_seconds`, so a gap takes seconds, not minutes.
//!
//! Run: `cargo bench --bench cache_bill` (release; a few minutes). `CACHE_BILL_ONLY=name` runs one
//! session shape. `CACHE_BILL_GUARD_TARGET=0.4` sets the context guard's `target` (default 0.6)
//! on the sessions that run under it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // benchmark code: fail loudly

#[path = "../tests/common/mock.rs"]
#[allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod mock;

use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use sluice::config::Config;
use sluice::projection::policy::{Breakpoints, EditPolicy};
use sluice::server::Server;

/// The providers' 5-minute TTL, scaled down.
const TTL_SECONDS: u64 = 2;
/// Turns between idle gaps in the `gaps` pacing.
const GAP_EVERY: usize = 8;

/// A 1280×800 PNG screenshot, different for each `seed`: a page of blocks and lines, about
/// 30-60 KB as a browser's screenshot of a plain page compresses.
fn screenshot(seed: u32) -> String {
    let img = image::RgbImage::from_fn(1280, 800, |x, y| {
        let band = (y / 40 + seed) % 7;
        let line = (x / 8 + y / 20 + seed * 3) % 11 == 0;
        if line {
            image::Rgb([30, 30, 30])
        } else {
            image::Rgb([240 - band as u8 * 12, 244, 250 - ((x / 160) as u8) * 5])
        }
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    base64::engine::general_purpose::STANDARD.encode(out.into_inner())
}

/// Prose of about `bytes` bytes, varied by `seed` (a system prompt, a build log).
fn prose(bytes: usize, seed: usize) -> String {
    let words = [
        "the", "agent", "reads", "files", "build", "error", "module", "function", "returns",
        "value", "when", "test", "passes", "config", "server", "request", "cache", "token",
    ];
    let mut out = String::with_capacity(bytes + 16);
    let mut i = seed.wrapping_mul(2_654_435_761);
    while out.len() < bytes {
        i = i
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        out.push_str(words[(i >> 33) % words.len()]);
        out.push(if (i >> 20) % 13 == 0 { '\n' } else { ' ' });
    }
    out
}

/// One session shape: the requests an agent sends, turn by turn.
struct Shape {
    name: &'static str,
    path: &'static str,
    turns: usize,
    /// The context guard's window (0: off).
    window: u64,
    request: fn(turn: usize) -> Value,
}

/// Claude Code's shape: two system blocks with breakpoints, a breakpoint on the newest block
/// moved every request, tools without one.
fn claude_code(system: Vec<Value>, tools: Value, mut messages: Vec<Value>) -> Value {
    if let Some(last) = messages
        .last_mut()
        .and_then(|m| m["content"].as_array_mut())
        .and_then(|c| c.last_mut())
    {
        last["cache_control"] = json!({"type": "ephemeral"});
    }
    json!({"model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": true,
        "system": system, "tools": tools, "messages": messages})
}

fn cc_system() -> Vec<Value> {
    vec![
        json!({"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
            "cache_control": {"type": "ephemeral"}}),
        json!({"type": "text", "text": prose(36_000, 1), "cache_control": {"type": "ephemeral"}}),
    ]
}

fn tools(names: &[&str]) -> Value {
    Value::Array(
        names
            .iter()
            .map(|n| {
                json!({"name": n, "description": prose(1_500, n.len()),
                "input_schema": {"type": "object", "properties": {}}})
            })
            .collect(),
    )
}

/// The screenshots of a session, encoded once.
fn shots() -> &'static Vec<String> {
    static SHOTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    SHOTS.get_or_init(|| (0..120).map(screenshot).collect())
}

fn cc_screenshots(turns: usize) -> Value {
    let mut messages = vec![json!({"role": "user", "content": [
        {"type": "text", "text": "Check the checkout page in the browser and fix what looks wrong."}]})];
    for t in 0..turns {
        let id = format!("toolu_{t:04}");
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("Step {t}: looking at the page again.")},
            {"type": "tool_use", "id": id, "name": "mcp__browser__take_screenshot", "input": {}}]}));
        messages.push(
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id,
            "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                "data": shots()[t % shots().len()]}}]}]}),
        );
    }
    claude_code(
        cc_system(),
        tools(&[
            "Bash",
            "Read",
            "Edit",
            "mcp__browser__take_screenshot",
            "mcp__browser__click",
        ]),
        messages,
    )
}

fn codex_screenshots(turns: usize) -> Value {
    let mut input = vec![json!({"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "Check the checkout page in the browser and fix what looks wrong."}]})];
    for t in 0..turns {
        let id = format!("call_{t:04}");
        input.push(json!({"type": "function_call", "call_id": id,
            "name": "mcp__browser__take_screenshot", "arguments": "{}"}));
        input.push(
            json!({"type": "function_call_output", "call_id": id, "output": [
            {"type": "input_image", "detail": "high",
             "image_url": format!("data:image/png;base64,{}", shots()[t % shots().len()])}]}),
        );
    }
    json!({"model": "gpt-5.2-codex", "instructions": prose(30_000, 2), "stream": true,
        "store": false, "prompt_cache_key": "thread-1",
        "tools": [{"type": "function", "name": "exec_command", "description": prose(2_000, 3),
            "parameters": {"type": "object", "properties": {}}},
            {"type": "function", "name": "mcp__browser__take_screenshot", "description": "screenshot",
            "parameters": {"type": "object", "properties": {}}}],
        "input": input})
}

/// A raw SDK loop on Anthropic: no `cache_control` anywhere, long command output each turn.
fn sdk_long_outputs(turns: usize, breakpoints: bool, output: fn(usize) -> usize) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Make the test suite pass."})];
    for t in 0..turns {
        let id = format!("toolu_{t:04}");
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("Running step {t}.")},
            {"type": "tool_use", "id": id, "name": "bash", "input": {"command": format!("make test-{t}")}}]}));
        messages.push(
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id,
            "content": prose(output(t), t + 10)}]}),
        );
    }
    if breakpoints {
        return claude_code(
            cc_system(),
            tools(&["Bash", "Read", "Edit", "Grep"]),
            messages,
        );
    }
    json!({"model": "claude-sonnet-4-5", "max_tokens": 8000,
        "system": prose(8_000, 4), "tools": tools(&["bash", "read_file", "write_file"]),
        "messages": messages})
}

/// Long outputs: most 40-60 KB (past the 30,000-unit page), some short.
fn long_output(t: usize) -> usize {
    if t % 3 == 2 {
        2_000
    } else {
        40_000 + (t % 5) * 5_000
    }
}

/// Claude Code's own cut: it keeps a command's output under 30,000 characters itself.
fn cut_output(t: usize) -> usize {
    [4_000, 29_000, 12_000, 1_500][t % 4]
}

fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "claude-code-screenshots",
            path: "/v1/messages",
            turns: 40,
            window: 0,
            request: |t| cc_screenshots(t + 1),
        },
        Shape {
            name: "codex-screenshots",
            path: "/v1/responses",
            turns: 40,
            window: 0,
            request: |t| codex_screenshots(t + 1),
        },
        Shape {
            name: "sdk-no-breakpoints-long-outputs",
            path: "/v1/messages",
            turns: 60,
            window: 0,
            request: |t| sdk_long_outputs(t + 1, false, long_output),
        },
        Shape {
            name: "claude-code-coding-guard",
            path: "/v1/messages",
            turns: 120,
            window: 200_000,
            request: |t| sdk_long_outputs(t + 1, true, cut_output),
        },
        Shape {
            name: "sdk-coding-guard",
            path: "/v1/messages",
            turns: 120,
            window: 200_000,
            request: |t| sdk_long_outputs(t + 1, false, long_output),
        },
    ]
}

/// The totals of one side of a session.
#[derive(Default, Debug, Clone, Copy)]
struct Side {
    tokens: u64,
    cost: f64,
}

/// The cache-read price of both sessions' models: Claude Sonnet 4.5 and GPT-5.2 read at 0.1×.
const READ_PRICE: f64 = 0.1;

fn sum(billed: &[mock::prompt_cache::Counted]) -> Side {
    billed.iter().fold(Side::default(), |s, c| Side {
        tokens: s.tokens + c.total,
        cost: s.cost + c.cost(READ_PRICE),
    })
}

/// Runs `shape` once at `pacing` through a sluice with `policy` and `breakpoints`; returns the
/// agent's side, sluice's side and the requests sluice refused or failed.
fn run(
    runtime: &tokio::runtime::Runtime,
    shape: &Shape,
    gaps: bool,
    policy: EditPolicy,
    breakpoints: Breakpoints,
) -> (Side, Side, usize) {
    let direct = mock::MockUpstream::start();
    let through = mock::MockUpstream::start();
    for m in [&direct, &through] {
        m.record(false);
        m.cache_ttl(Some(TTL_SECONDS));
    }
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config {
        listen: "127.0.0.1:0".into(),
        admin_listen: "127.0.0.1:0".into(),
        ..Config::default()
    };
    config.store.data_dir = dir.path().to_path_buf();
    for route in &mut config.routes {
        route.upstream = through.base_url();
        route.cache.policy = policy;
        route.cache.breakpoints = breakpoints;
        route.cache.ttl_seconds = TTL_SECONDS;
        route.context.window_tokens = shape.window;
        if let Some(target) = std::env::var("CACHE_BILL_GUARD_TARGET")
            .ok()
            .and_then(|t| t.parse().ok())
        {
            route.context.target = target;
        }
    }
    let server = runtime.block_on(Server::bind(config)).unwrap();
    let base = format!("http://{}", server.proxy_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = runtime.spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let failed = runtime.block_on(async {
        let client = reqwest::Client::new();
        let mut failed = 0;
        for t in 0..shape.turns {
            if gaps && t > 0 && t % GAP_EVERY == 0 {
                tokio::time::sleep(Duration::from_millis(TTL_SECONDS * 1000 + 300)).await;
            }
            let body = (shape.request)(t).to_string();
            for (url, session) in [
                (format!("{}{}", direct.base_url(), shape.path), false),
                (format!("{base}{}", shape.path), true),
            ] {
                let mut req = client
                    .post(url)
                    .header("content-type", "application/json")
                    .header("x-api-key", "bench-key")
                    .header("anthropic-version", "2023-06-01")
                    .header("authorization", "Bearer bench-key")
                    .body(body.clone());
                if session {
                    req = req.header("x-sluice-session", shape.name);
                }
                let resp = req.send().await.unwrap();
                let ok = resp.status().is_success();
                let text = resp.text().await.unwrap_or_default();
                if !ok && session {
                    failed += 1;
                    eprintln!("turn {t}: {}", text.chars().take(300).collect::<String>());
                }
            }
        }
        failed
    });
    let _ = stop.send(());
    runtime.block_on(serving).unwrap();
    if std::env::var("CACHE_BILL_TRACE").is_ok() {
        for (t, (a, b)) in direct.billed().iter().zip(through.billed()).enumerate() {
            eprintln!(
                "turn {t:3}: agent total {:6} read {:6} write {:6} | sluice total {:6} read {:6} write {:6}",
                a.total, a.cached, a.written(), b.total, b.cached, b.written()
            );
        }
    }
    (sum(&direct.billed()), sum(&through.billed()), failed)
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let only = std::env::var("CACHE_BILL_ONLY").ok();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "| session | pacing | sluice | tokens forwarded ÷ sent | bill forwarded ÷ agent's own | failed |"
    );
    println!("|---|---|---|---|---|---|");
    for shape in shapes() {
        if only.as_deref().is_some_and(|o| o != shape.name) {
            continue;
        }
        for gaps in [false, true] {
            for (label, policy, breakpoints) in [
                (
                    "before (eager, no breakpoints)",
                    EditPolicy::Eager,
                    Breakpoints::Off,
                ),
                ("eager + breakpoints", EditPolicy::Eager, Breakpoints::Auto),
                (
                    "economic + breakpoints",
                    EditPolicy::Economic,
                    Breakpoints::Auto,
                ),
            ] {
                let (agent, ours, failed) = run(&runtime, &shape, gaps, policy, breakpoints);
                println!(
                    "| {} | {} | {label} | {:.2} | {:.2} | {failed} |",
                    shape.name,
                    if gaps { "gaps" } else { "brisk" },
                    ours.tokens as f64 / agent.tokens.max(1) as f64,
                    ours.cost / agent.cost.max(1.0),
                );
            }
        }
    }
}
