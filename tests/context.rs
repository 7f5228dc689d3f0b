//! End-to-end: the context-window guard (docs/context-guard.md, `[routes.context]`) through the
//! real binary, against a mock that refuses a request over its token window with each
//! provider's own error. A scripted 200-turn agent session, whose raw history grows to about
//! five windows, completes every turn with the guard, in all three dialects, streamed and not;
//! without it, it fails from the turn the window is passed. Between retirement batches each
//! forwarded request starts with the one before it, byte for byte; a retired result reads back
//! exactly through the read endpoint.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use common::mock::Reply;
use common::{
    client, config_for, get_as, guard_routes, metric, on_every_route, MockUpstream, Sluice,
};
use serde_json::{json, Value};

const KEY: &str = "sk-context";
const WINDOW: u64 = 48_000;
const MAX_TOKENS: u64 = 1_000;
const TURNS: usize = 200;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Dialect {
    Chat,
    Responses,
    Anthropic,
}

impl Dialect {
    fn path(self) -> &'static str {
        match self {
            Dialect::Chat => "/v1/chat/completions",
            Dialect::Responses => "/v1/responses",
            Dialect::Anthropic => "/v1/messages",
        }
    }
}

/// Every route to `upstream`, with the guard at `window` tokens (0: off).
fn config(upstream: &str, window: u64) -> String {
    guard_routes(
        &config_for(upstream, ""),
        &format!("window_tokens = {window}\noutput_tokens = 4096\n"),
    )
}

/// What a build tool prints on step `i`: about 4.5 KB of varied lines (some 1,100-1,300
/// tokens), each step's different; 200 of them are five windows.
fn output(i: usize) -> String {
    (0..60)
        .map(|j| {
            format!(
                "src/module_{i}/file_{j}.rs:{}:{}: warning: unused variable `value_{}` in step {i}",
                (i * 7 + j * 13) % 997,
                j % 80,
                i * 31 + j
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The agent's request after `turns` tool calls, `messages`/`input` last so that a request
/// starts with the one before it.
fn request(dialect: Dialect, turns: usize, stream: bool) -> Value {
    let args = |i: usize| format!("{{\"cmd\":\"cargo build --step {i}\"}}");
    match dialect {
        Dialect::Chat => {
            let mut messages = vec![
                json!({"role": "system", "content": "You are a coding agent."}),
                json!({"role": "user", "content": "Fix the warnings."}),
            ];
            for i in 0..turns {
                messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": format!("call_{i}"), "type": "function", "function": {"name": "bash", "arguments": args(i)}}]}));
                messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": output(i)}));
            }
            json!({"model": "gpt-4o", "max_tokens": MAX_TOKENS, "stream": stream,
                   "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
                   "messages": messages})
        }
        Dialect::Responses => {
            let mut input = vec![json!({"role": "user", "content": "Fix the warnings."})];
            for i in 0..turns {
                input.push(json!({"type": "function_call", "call_id": format!("call_{i}"), "name": "bash", "arguments": args(i)}));
                input.push(json!({"type": "function_call_output", "call_id": format!("call_{i}"), "output": output(i)}));
            }
            json!({"model": "gpt-5", "max_output_tokens": MAX_TOKENS, "stream": stream,
                   "tools": [{"type": "function", "name": "bash", "parameters": {"type": "object"}}],
                   "input": input})
        }
        Dialect::Anthropic => {
            let mut messages = vec![json!({"role": "user", "content": "Fix the warnings."})];
            for i in 0..turns {
                messages.push(json!({"role": "assistant", "content": [
                    {"type": "tool_use", "id": format!("toolu_{i}"), "name": "bash", "input": {"cmd": format!("cargo build --step {i}")}}]}));
                messages.push(json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": output(i)}]}));
            }
            json!({"model": "claude-sonnet-4-5", "max_tokens": MAX_TOKENS, "stream": stream,
                   "system": "You are a coding agent.",
                   "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
                   "messages": messages})
        }
    }
}

/// One turn's outcome: its status, `x-sluice-projection`, and the response body.
struct Turn {
    status: u16,
    projection: String,
    body: String,
}

async fn send(sluice: &Sluice, dialect: Dialect, body: &Value) -> Turn {
    send_as(sluice, dialect, &format!("context-{dialect:?}"), body).await
}

/// `body` sent as session `id`.
async fn send_as(sluice: &Sluice, dialect: Dialect, id: &str, body: &Value) -> Turn {
    let response = client()
        .post(sluice.url(dialect.path()))
        .bearer_auth(KEY)
        .header("x-sluice-session", id)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let projection = response
        .headers()
        .get("x-sluice-projection")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    Turn {
        status,
        projection,
        body: response.text().await.unwrap(),
    }
}

fn retired_of(projection: &str) -> usize {
    projection
        .split(';')
        .find_map(|kv| kv.trim().strip_prefix("retired="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no retired= in {projection:?}"))
}

/// The forwarded body without its closing brackets: what the next turn's must start with.
fn open_prefix(body: &[u8]) -> &[u8] {
    let end = body
        .iter()
        .rposition(|b| *b != b']' && *b != b'}')
        .map_or(0, |i| i + 1);
    &body[..end]
}

/// The cursors of retired placeholders in a forwarded body, with their artifact ids.
fn retired_cursors(body: &str) -> Vec<(String, String)> {
    body.split("tool output retired to save context")
        .skip(1)
        .map(|rest| {
            let artifact = rest.split("artifact://").nth(1).unwrap();
            let artifact: String = artifact
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            let cursor = rest.split("{\\\"cursor\\\":\\\"").nth(1).unwrap();
            (artifact, cursor.split('\\').next().unwrap().to_string())
        })
        .collect()
}

/// Runs the 200-turn session with the guard on; returns what the report needs.
async fn guarded_session(dialect: Dialect, stream: bool) -> (usize, usize) {
    let mock = MockUpstream::start();
    mock.context_window(Some(WINDOW));
    let sluice = Sluice::start(&config(&mock.base_url(), WINDOW));
    let mut batches = 0;
    let mut stable = 0;
    let mut previous_retired = 0;
    let mut previous: Option<bytes::Bytes> = None;
    for turn in 0..TURNS {
        let sent = send(&sluice, dialect, &request(dialect, turn + 1, stream)).await;
        if sent.status != 200 {
            let estimates: Vec<String> = sluice
                .logs()
                .into_iter()
                .filter(|l| l.contains("context estimate"))
                .collect();
            panic!(
                "{dialect:?} stream={stream}: turn {turn} failed: {}\nlast estimates: {:?}",
                sent.body,
                &estimates[estimates.len().saturating_sub(3)..]
            );
        }
        if stream {
            assert!(sent.body.contains("data: "), "{dialect:?}: streamed");
        }
        let retired = retired_of(&sent.projection);
        assert!(
            retired >= previous_retired,
            "a retired result stays retired"
        );
        let forwarded = mock.last().body;
        let batch = retired > previous_retired;
        if let Some(before) = &previous {
            let prefix_stable = forwarded.starts_with(open_prefix(before));
            if batch {
                batches += 1;
            } else {
                assert!(
                    prefix_stable,
                    "{dialect:?} stream={stream}: turn {turn} changed the prefix without a batch"
                );
            }
            stable += usize::from(prefix_stable);
        }
        previous_retired = retired;
        previous = Some(forwarded);
    }
    assert!(previous_retired > 100, "most of the history was retired");
    let route = if dialect == Dialect::Anthropic {
        "anthropic"
    } else {
        "openai"
    };
    // Counted when committed, once per result: the last commit may still be on its way.
    let counted = format!("sluice_context_retired_total{{route=\"{route}\"}}");
    let mut metrics = sluice.metrics().await;
    for _ in 0..50 {
        if metric(&metrics, &counted) as usize == previous_retired {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        metrics = sluice.metrics().await;
    }
    assert_eq!(metric(&metrics, &counted) as usize, previous_retired);
    assert_eq!(metric(&metrics, "sluice_context_overflows_total"), 0.0);
    assert!(metric(&metrics, "sluice_input_tokens_estimated_count") >= (TURNS / 2) as f64);
    // The retired results of the last request read back exactly.
    let last = String::from_utf8(previous.unwrap().to_vec()).unwrap();
    let cursors = retired_cursors(&last);
    assert_eq!(cursors.len(), previous_retired);
    for (i, (artifact, cursor)) in cursors.iter().enumerate().step_by(37) {
        let page = get_as(&sluice, &format!("/v1/sluice/read?cursor={cursor}"), KEY).await;
        assert_eq!(page.status(), 200);
        assert!(
            page.headers().get("x-sluice-next-cursor").is_none(),
            "one page"
        );
        let text = page.text().await.unwrap();
        let (body, notice) = text.rsplit_once('\n').unwrap();
        assert_eq!(
            body,
            output(i),
            "{dialect:?}: retired result {i} reads back exactly"
        );
        assert!(
            notice.contains(&format!("end of artifact://{artifact}")),
            "{notice}"
        );
        let whole = get_as(&sluice, &format!("/v1/sluice/artifacts/{artifact}"), KEY).await;
        assert_eq!(whole.text().await.unwrap(), output(i));
    }
    (batches, stable)
}

/// Without the guard the same session fails from the turn its input passes the window, with the
/// provider's own error passed through.
async fn unguarded_session(dialect: Dialect) -> usize {
    let mock = MockUpstream::start();
    mock.context_window(Some(WINDOW));
    let sluice = Sluice::start(&config(&mock.base_url(), 0));
    let mut first_failure = None;
    for turn in 0..TURNS {
        let sent = send(&sluice, dialect, &request(dialect, turn + 1, false)).await;
        match first_failure {
            None if sent.status == 200 => {
                assert!(
                    !sent.projection.contains("retired"),
                    "guard off: no retired="
                );
            }
            None => {
                assert_eq!(sent.status, 400);
                let error = match dialect {
                    Dialect::Anthropic => "prompt is too long",
                    _ => "context_length_exceeded",
                };
                assert!(sent.body.contains(error), "{}", sent.body);
                first_failure = Some(turn);
            }
            Some(_) => assert_eq!(
                sent.status, 400,
                "{dialect:?}: turn {turn} after the window"
            ),
        }
        if first_failure.is_some_and(|f| turn > f + 5) {
            break;
        }
    }
    first_failure.expect("the raw history passes the window")
}

/// The whole check for one dialect: without the guard, then with it, streamed and not.
async fn dialect_session(dialect: Dialect) {
    {
        let failed_at = unguarded_session(dialect).await;
        assert!(
            (20..80).contains(&failed_at),
            "{dialect:?}: failed at {failed_at}"
        );
        for stream in [false, true] {
            let (batches, stable) = guarded_session(dialect, stream).await;
            let turns = TURNS - 1;
            println!(
                "{dialect:?} stream={stream}: without the guard fails from turn {failed_at}; with it all {TURNS} turns complete, {batches} retirement batches, {stable}/{turns} turns prefix-stable ({:.1} %)",
                stable as f64 * 100.0 / turns as f64
            );
            assert!(
                (3..=TURNS / 5).contains(&batches),
                "{dialect:?}: {batches} batches"
            );
            assert_eq!(
                stable + batches,
                turns,
                "every turn but a batch is prefix-stable"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_turn_chat_session_completes_under_the_window() {
    dialect_session(Dialect::Chat).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_turn_responses_session_completes_under_the_window() {
    dialect_session(Dialect::Responses).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_turn_anthropic_session_completes_under_the_window() {
    dialect_session(Dialect::Anthropic).await;
}

/// The model reads a retired result again through the read tool: sluice answers the call with
/// the result's text, exactly, and the client sees one answer (C2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_result_reads_back_through_the_read_tool() {
    let mock = MockUpstream::start();
    // Batches from 95 % down to 90 %: each request stays close to its trigger, so what the
    // front adds after planning would pass the window if the guard did not budget for it.
    let close = config(&mock.base_url(), 16_000).replace(
        "output_tokens = 4096\n",
        "output_tokens = 4096\ntrigger = 0.95\ntarget = 0.9\n",
    );
    let sluice = Sluice::start(&close);
    let mut turns = 1;
    loop {
        let sent = send(
            &sluice,
            Dialect::Chat,
            &request(Dialect::Chat, turns, false),
        )
        .await;
        assert_eq!(sent.status, 200);
        if retired_of(&sent.projection) > 0 {
            break;
        }
        turns += 1;
        assert!(turns < 40, "no batch");
    }
    // The next turn: the model calls the read tool with the newest cursor (the last retired
    // result's), then answers.
    mock.script([
        Reply::Read {
            before: None,
            also: None,
            answer: String::new(),
        },
        Reply::Text("Read it.".into()),
    ]);
    let sent = send(
        &sluice,
        Dialect::Chat,
        &request(Dialect::Chat, turns + 1, false),
    )
    .await;
    assert_eq!(sent.status, 200);
    assert!(sent.body.contains("Read it."), "{}", sent.body);
    let requests = mock.requests();
    let (first, round) = (
        requests[requests.len() - 2].json(),
        requests[requests.len() - 1].json(),
    );
    let content = |v: &Value, id: &str| -> String {
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
            .map(|m| m["content"].as_str().unwrap().to_string())
            .unwrap_or_default()
    };
    // The last retired result in the first request, and the read round's answer.
    let last_retired = (0..turns)
        .rev()
        .find(|i| content(&first, &format!("call_{i}")).starts_with("[sluice: tool output retired"))
        .unwrap();
    let answer = round["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    let (text, notice) = answer.rsplit_once('\n').unwrap();
    assert_eq!(text, output(last_retired), "the retired result, exactly");
    assert!(notice.contains("end of artifact://"), "{notice}");
    // The next turn: sluice splices the hidden round back (C3); the guard budgets for it (and
    // for the read tool's definition), so the provider, its window enforced now, takes it.
    mock.context_window(Some(16_000));
    let mut next = request(Dialect::Chat, turns + 1, false);
    let messages = next["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "Read it."}));
    messages.push(json!({"role": "user", "content": "Go on."}));
    let sent = send(&sluice, Dialect::Chat, &next).await;
    assert_eq!(sent.status, 200, "{}", sent.body);
    let forwarded = mock.last().json();
    let spliced = forwarded["messages"].as_array().unwrap().iter().any(|m| {
        m["role"] == "tool"
            && m["content"]
                .as_str()
                .is_some_and(|c| c.starts_with(&output(last_retired)))
    });
    assert!(spliced, "the hidden read round is spliced back");
}

/// A9 for retirements: a batch whose request failed upstream is not remembered (counted 0,
/// the session unchanged); the same request sent again retires the same batch and commits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_retires_nothing_for_good() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock.base_url(), 16_000));
    let body = request(Dialect::Anthropic, 30, false);
    mock.script([Reply::Status(
        500,
        json!({"type": "error", "error": {"type": "api_error", "message": "boom"}}).to_string(),
    )]);
    let failed = send(&sluice, Dialect::Anthropic, &body).await;
    assert_eq!(failed.status, 500);
    let batch = retired_of(&failed.projection);
    assert!(batch > 0, "the request was over the trigger");
    let first = mock.last().body;
    // An earlier, smaller history (below the trigger) holding the results that batch chose:
    // shown whole, since the failed request left the session as it was.
    let earlier = request(Dialect::Anthropic, 6, false);
    let before = send(&sluice, Dialect::Anthropic, &earlier).await;
    assert_eq!((before.status, retired_of(&before.projection)), (200, 0));
    let counted = "sluice_context_retired_total{route=\"anthropic\"}";
    let sent = send(&sluice, Dialect::Anthropic, &body).await;
    assert_eq!(sent.status, 200);
    assert_eq!(
        retired_of(&sent.projection),
        batch,
        "chosen again, the same"
    );
    assert_eq!(mock.last().body, first, "byte for byte");
    let mut metrics = sluice.metrics().await;
    for _ in 0..50 {
        if metric(&metrics, counted) as usize == batch {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        metrics = sluice.metrics().await;
    }
    assert_eq!(
        metric(&metrics, counted) as usize,
        batch,
        "counted once, when committed"
    );
    assert_eq!(
        metric(&metrics, "sluice_commits_total{outcome=\"discarded\"}"),
        1.0,
        "the failed request's delta"
    );
    // Now the session remembers them: the smaller history shows them retired.
    let after = send(&sluice, Dialect::Anthropic, &earlier).await;
    assert_eq!((after.status, retired_of(&after.projection)), (200, 6));
}

/// A session `id` of `sluice` after `turns` tool calls: its status and the results shown
/// retired.
async fn turn_of(sluice: &Sluice, id: &str, turns: usize) -> (u16, usize) {
    let body = request(Dialect::Anthropic, turns, false);
    let turn = send_as(sluice, Dialect::Anthropic, id, &body).await;
    (turn.status, retired_of(&turn.projection))
}

/// Issue #38 (docs/context-guard.md, "When a batch goes"): under the economic policy a
/// request between the target and the trigger retires down to the target when the session's
/// provider cache has gone cold (its last request older than `ttl_seconds`), since the provider
/// writes the prefix again anyway; the same request on a warm cache, or under `eager`, waits for
/// the trigger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_cache_takes_the_guards_batch_before_the_trigger() {
    let mock = MockUpstream::start();
    let guard = "[routes.context]\nwindow_tokens = 16000\noutput_tokens = 4096\n";
    let economic = Sluice::start(&on_every_route(
        &config_for(&mock.base_url(), ""),
        &format!("cache.ttl_seconds = 1\n{guard}"),
    ));
    let eager = Sluice::start(&on_every_route(
        &config_for(&mock.base_url(), ""),
        &format!("cache.ttl_seconds = 1\ncache.policy = \"eager\"\n{guard}"),
    ));
    // Four turns stamp the session (past half the target); six are between the target and
    // the trigger (the trigger is passed later, see a_failed_request_retires_nothing_for_good).
    assert_eq!(turn_of(&economic, "warm", 4).await, (200, 0));
    assert_eq!(turn_of(&economic, "warm", 6).await, (200, 0), "warm: waits");
    for (sluice, id) in [(&economic, "cold"), (&eager, "eager")] {
        assert_eq!(turn_of(sluice, id, 4).await, (200, 0));
    }
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let (status, retired) = turn_of(&economic, "cold", 6).await;
    assert_eq!(status, 200);
    assert!(retired > 0, "cold: the batch goes now");
    assert_eq!(
        turn_of(&eager, "eager", 6).await,
        (200, 0),
        "eager: the trigger only"
    );
    // Committed like any batch: the next turn, warm again, shows the same results retired.
    assert_eq!(turn_of(&economic, "cold", 7).await, (200, retired));
}
