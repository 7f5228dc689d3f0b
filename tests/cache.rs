//! What the provider bills (docs/cache.md, WIRE.md "Prompt caches, exactly"): sessions through
//! sluice to a mock that bills by the providers' exact cache rules, beside the same requests
//! sent straight to another. Edits to history sluice already forwarded are made when they pay
//! (A4 economic), every pending one at once on a cold cache; Anthropic breakpoints are added in
//! the slots the client leaves free, never past four; the inspector's bill is the mock's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use common::mock::MockUpstream;
use common::{b64, client, config_for, get_as, on_every_route, Sluice};
use serde_json::{json, Value};

/// A plain 1280×800 PNG screenshot, different for each `seed` (a few KB: one colour).
fn screenshot(seed: u32) -> String {
    let img = image::RgbImage::from_pixel(
        1280,
        800,
        image::Rgb([(seed * 37 % 256) as u8, (seed * 11 % 256) as u8, 200]),
    );
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    b64(&out.into_inner())
}

/// Claude Code's request after `turns` screenshot turns: two system blocks with breakpoints and
/// one on the newest block (WIRE.md "How real clients call").
fn claude_code(turns: u32) -> Value {
    let mut messages = vec![json!({"role": "user", "content": [
        {"type": "text", "text": "Check the page and fix what looks wrong."}]})];
    for t in 1..=turns {
        let id = format!("toolu_{t}");
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("Looking again ({t}).")},
            {"type": "tool_use", "id": id, "name": "mcp__browser__take_screenshot", "input": {}}]}));
        messages.push(
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id,
            "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                "data": screenshot(t)}}]}]}),
        );
    }
    let last = messages.len() - 1;
    messages[last]["content"][0]["cache_control"] = json!({"type": "ephemeral"});
    json!({"model": "claude-sonnet-4-5", "max_tokens": 1024,
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": common::tool_output(6_000), "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "mcp__browser__take_screenshot", "description": "A screenshot.",
            "input_schema": {"type": "object"}}],
        "messages": messages})
}

/// A build log of about `bytes` bytes that a tokenizer cannot fold (numbers vary line by line).
fn log(seed: u64, bytes: usize) -> String {
    let mut out = String::new();
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005) | 1;
    while out.len() < bytes {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        out.push_str(&format!(
            "test case_{} ... ok ({} ms, seed {:x})\n",
            x % 9973,
            x % 997,
            x >> 40
        ));
    }
    out
}

/// POSTs `body` to `/v1/messages` at `base` in `session`; returns the status and the
/// projection header.
async fn send(base: &str, session: &str, body: &Value) -> (u16, String) {
    let resp = client()
        .post(format!("{base}/v1/messages"))
        .header("x-api-key", "sk-cache")
        .header("anthropic-version", "2023-06-01")
        .header("x-sluice-session", session)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let projection = resp
        .headers()
        .get("x-sluice-projection")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let _ = resp.bytes().await;
    (status, projection)
}

/// The base64 images each tool result of a forwarded Anthropic body holds, in order.
fn images_per_result(body: &Value) -> Vec<usize> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|b| b["type"] == "tool_result")
        .map(|b| {
            b["content"]
                .as_array()
                .map_or(0, |c| c.iter().filter(|p| p["type"] == "image").count())
        })
        .collect()
}

fn field(projection: &str, key: &str) -> usize {
    projection
        .split("; ")
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .map_or(0, |v| v.parse().unwrap())
}

fn cost(billed: &[common::mock::prompt_cache::Counted]) -> f64 {
    billed.iter().map(|c| c.cost(0.1)).sum()
}

fn cache_markers(body: &[u8]) -> usize {
    memchr::memmem::find_iter(body, b"\"cache_control\"").count()
}

/// A4 under `policy = "economic"` (docs/cache.md): while the cache is warm, viewed screenshots
/// are kept until pruning pays, then pruned together; every request still shows the newest
/// `recent_count`; the anchor keeps each rewrite short; the bill is below the agent's own.
#[tokio::test]
async fn screenshots_are_pruned_when_it_pays_and_the_bill_falls_below_the_agents_own_a4() {
    let direct = MockUpstream::start();
    let through = MockUpstream::start();
    let sluice = Sluice::in_front_of(&through);
    let turns = 30;
    let mut deferred_turns = 0;
    for t in 1..=turns {
        let body = claude_code(t);
        let (status, _) = send(&direct.base_url(), "direct", &body).await;
        assert_eq!(status, 200);
        let (status, projection) = send(&sluice.url(""), "cc-shots", &body).await;
        assert_eq!(status, 200, "turn {t}: {projection}");
        if field(&projection, "deferred_edits") > 0 {
            deferred_turns += 1;
        }
    }
    let forwarded: Vec<Value> = through.requests().iter().map(|r| r.json()).collect();
    assert_eq!(forwarded.len(), turns as usize);
    let mut prunes = Vec::new();
    let mut before = 0;
    for (t, body) in forwarded.iter().enumerate() {
        let shown = images_per_result(body);
        // The newest three (recent_count) are on every request.
        let newest = shown.iter().rev().take(3).filter(|&&n| n == 1).count();
        assert_eq!(newest, shown.len().min(3), "turn {}: {shown:?}", t + 1);
        let embedded: usize = shown.iter().sum();
        if embedded < before {
            prunes.push(before + 1 - embedded);
        }
        before = embedded;
        let raw = serde_json::to_vec(body).unwrap();
        assert!(
            cache_markers(&raw) <= 4,
            "turn {}: at most four breakpoints",
            t + 1
        );
    }
    assert!(
        deferred_turns > 0,
        "some prunes were put off while the cache was warm"
    );
    assert!(!prunes.is_empty(), "pruning paid at last");
    assert!(
        prunes.iter().all(|&n| n > 2),
        "pruned in batches larger than prune_batch: {prunes:?}"
    );
    // An anchor in the free fourth slot, on a tool result before the screenshots still shown.
    let last = serde_json::to_vec(forwarded.last().unwrap()).unwrap();
    assert_eq!(cache_markers(&last), 4);
    let (agent, ours) = (cost(&direct.billed()), cost(&through.billed()));
    assert!(
        ours < agent * 0.95,
        "billed through sluice {ours:.0} against {agent:.0} alone"
    );
}

/// A cold cache (the session's last request older than the TTL) rewrites everything anyway:
/// every pending prune is made at once (docs/cache.md).
#[tokio::test]
async fn a_cold_cache_takes_every_pending_prune_at_once() {
    let mock = MockUpstream::start();
    let config = on_every_route(&config_for(&mock.base_url(), ""), "cache.ttl_seconds = 3");
    let sluice = Sluice::start(&config);
    let mut last = String::new();
    for t in 1..=6 {
        let (status, projection) = send(&sluice.url(""), "cold", &claude_code(t)).await;
        assert_eq!(status, 200);
        last = projection;
    }
    assert_eq!(field(&last, "embedded"), 6, "{last}");
    assert_eq!(field(&last, "deferred_edits"), 3, "{last}");
    // Commits land behind the response; then the idle gap.
    tokio::time::sleep(std::time::Duration::from_millis(3300)).await;
    let (status, projection) = send(&sluice.url(""), "cold", &claude_code(7)).await;
    assert_eq!(status, 200);
    assert_eq!(field(&projection, "embedded"), 3, "{projection}");
    assert_eq!(field(&projection, "deferred_edits"), 0, "{projection}");
    assert_eq!(field(&projection, "placeholders"), 4, "{projection}");
}

/// A raw SDK loop that marks no breakpoint gets the one a careful client sets (the newest
/// block), so the provider's cache serves its history; an OpenAI request is left as sent.
#[tokio::test]
async fn a_conversation_without_breakpoints_gets_one_and_reads_the_cache() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let mut messages = vec![json!({"role": "user", "content": "Make the tests pass."})];
    for t in 1..=3 {
        let id = format!("toolu_{t}");
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "bash", "input": {"command": "make"}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": log(t, 12_000)}]}));
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 100,
            "system": "You fix builds.", "messages": messages});
        let (status, _) = send(&sluice.url(""), "sdk", &body).await;
        assert_eq!(status, 200);
    }
    let sent = mock.requests();
    for r in &sent {
        assert_eq!(cache_markers(&r.body), 1, "one breakpoint, top-level");
        assert!(r.json()["cache_control"].is_object());
    }
    let billed = mock.billed();
    assert_eq!(billed[0].cached, 0);
    assert!(billed[0].written() > 0, "the first turn writes");
    assert!(
        billed[1].cached > 0 && billed[2].cached > billed[1].cached,
        "{billed:?}"
    );
    // OpenAI caches by itself: nothing added (P1).
    let chat = json!({"model": "gpt-5", "messages": [
        {"role": "user", "content": common::tool_output(8_000)}]});
    common::post(&sluice, "/v1/chat/completions", &chat).await;
    assert_eq!(mock.last().body, serde_json::to_vec(&chat).unwrap());
}

/// The breakpoint sluice sets for a loop that marks none asks for 5 minutes while the loop is
/// brisk; once the session comes back after a pause 5-minute entries did not outlast, for an
/// hour (docs/cache.md, "How long sluice's breakpoints ask"): the next pause then reads the
/// conversation instead of writing it again. On a clock where 5 minutes are 1 s (an hour 12 s).
#[tokio::test]
async fn a_session_that_pauses_gets_hour_long_breakpoints_and_reads_across_the_next_pause() {
    let mock = MockUpstream::start();
    mock.cache_ttl(Some(1));
    let config = on_every_route(&config_for(&mock.base_url(), ""), "cache.ttl_seconds = 1");
    let sluice = Sluice::start(&config);
    let pause = || tokio::time::sleep(std::time::Duration::from_millis(1400));
    let mut messages = vec![json!({"role": "user", "content": "Make the tests pass."})];
    for t in 1..=5 {
        if t == 3 || t == 5 {
            pause().await;
        }
        let id = format!("toolu_{t}");
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "bash", "input": {"command": "make"}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": log(t, 9_000)}]}));
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 100,
            "system": "You fix builds.", "messages": messages});
        let (status, _) = send(&sluice.url(""), "paused", &body).await;
        assert_eq!(status, 200);
    }
    let ttls: Vec<Option<String>> = mock
        .requests()
        .iter()
        .map(|r| r.json()["cache_control"]["ttl"].as_str().map(str::to_owned))
        .collect();
    let hour = Some("1h".to_string());
    assert_eq!(
        ttls,
        [None, None, hour.clone(), hour.clone(), hour],
        "one top-level marker"
    );
    let billed = mock.billed();
    assert!(billed[1].cached > 0, "brisk: read {billed:?}");
    assert_eq!(
        billed[2].cached, 0,
        "the first pause outlasts 5-minute entries"
    );
    assert!(
        billed[2].created_1h > 0 && billed[2].created == 0,
        "{billed:?}"
    );
    assert!(
        billed[4].cached > billed[2].total,
        "the second pause reads what the turns before it wrote: {billed:?}"
    );
}

/// A client that already uses all four breakpoints gets none of sluice's (a fifth is the
/// provider's 400).
#[tokio::test]
async fn four_client_breakpoints_leave_no_slot() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let mut body = claude_code(5);
    body["messages"][1]["content"][1]["cache_control"] = json!({"type": "ephemeral"});
    for _ in 0..2 {
        let (status, projection) = send(&sluice.url(""), "full", &body).await;
        assert_eq!(status, 200, "{projection}");
        assert_eq!(cache_markers(&mock.last().body), 4);
    }
    // The mock refuses a fifth as the provider does.
    let mut five = body.clone();
    five["messages"][2]["content"][0]["cache_control"] = json!({"type": "ephemeral"});
    let (status, _) = send(&mock.base_url(), "direct", &five).await;
    assert_eq!(status, 400);
}

/// The inspector bills each turn by the exact model; a session's bill is the mock's, within
/// ±2 % (their token counts differ a little: the mock frames each message its own way).
#[tokio::test]
async fn the_inspectors_bill_is_the_providers() {
    let mock = MockUpstream::start();
    let config = config_for(&mock.base_url(), "[inspector]\nenabled = true");
    let sluice = Sluice::start(&config);
    for t in 1..=16 {
        let (status, _) = send(&sluice.url(""), "inspected", &claude_code(t)).await;
        assert_eq!(status, 200);
    }
    let id = common::newest_session(&sluice, "sk-cache").await;
    let record: Value = get_as(&sluice, &format!("/v1/sluice/sessions/{id}"), "sk-cache")
        .await
        .json()
        .await
        .unwrap();
    let turns = record["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 16);
    let inspected: f64 = turns
        .iter()
        .map(|t| t["cost"]["forwarded"].as_f64().unwrap())
        .sum();
    let billed = cost(&mock.billed());
    let ratio = inspected / billed;
    assert!(
        (0.98..=1.02).contains(&ratio),
        "inspector {inspected:.0} against the mock's {billed:.0} ({ratio:.3})"
    );
    // Each turn says what it read and wrote.
    let reads: u64 = turns
        .iter()
        .map(|t| t["bill"]["forwarded"]["read"].as_u64().unwrap())
        .sum();
    assert!(reads > 0);
}
