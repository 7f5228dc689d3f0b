//! End-to-end: delivery state (SPEC section 5, A3, A4, A9, A10; S1) through the real binary.
//! What the model was shown is remembered per session, committed only when the response
//! completed, and survives restarts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::time::Duration;

use common::{
    b64, client, config_for, get_as, metric, picture, post, post_as, MockUpstream, Reply, Sluice,
};
use futures_util::StreamExt;
use image::ImageFormat;
use serde_json::{json, Value};

/// An Anthropic conversation with one tool turn per image: turn `t` calls `tool` and gets
/// image `t` back. `upto` turns are in the history.
fn history(tool: &str, upto: usize, stream: bool) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "watch the screen"})];
    for t in 1..=upto {
        let id = format!("tu{t}");
        messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": tool, "input": {}}]}));
        let png = b64(&picture(8 + t as u32, 8, ImageFormat::Png));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": [
            {"type": "text", "text": format!("frame {t}")},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}]}]}));
    }
    json!({"model": "claude-x", "max_tokens": 10, "stream": stream, "messages": messages})
}

/// The credential of tests that read artifacts back (an anonymous request has no tenant).
const KEY: &str = "sk-delivery";

/// Images the last forwarded request embedded.
fn embedded(mock: &MockUpstream) -> usize {
    mock.last()
        .json()
        .to_string()
        .matches("\"type\":\"image\"")
        .count()
}

/// Waits until `n` commits have been written.
async fn committed(sluice: &Sluice, n: f64) {
    for _ in 0..200 {
        let m = sluice.metrics().await;
        if metric(
            &m,
            "sluice_store_seconds_count{backend=\"embedded\",op=\"commit\"}",
        ) >= n
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} commits were not written");
}

fn config(mock: &MockUpstream, extra: &str) -> String {
    format!(
        "{}\n[routes.images]\n{extra}\n",
        config_for(&mock.base_url(), "")
    )
}

/// [`config`] with A4's pruning as written (`policy = "eager"`) and no breakpoints of sluice's:
/// for the tests of A4 and A8 themselves; docs/cache.md has when the economic policy prunes.
fn eager(mock: &MockUpstream, extra: &str) -> String {
    format!(
        "{}\n[routes.images]\n{extra}\n",
        common::on_every_route(
            &config_for(&mock.base_url(), ""),
            "cache.policy = \"eager\"\ncache.breakpoints = \"off\""
        )
    )
}

#[tokio::test]
async fn once_shows_an_image_in_exactly_one_successful_response_a3() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, ""));
    let body = history("render_chart", 1, false);
    post(&sluice, "/v1/messages", &body).await;
    assert_eq!(embedded(&mock), 1);
    committed(&sluice, 1.0).await;
    let resp = post(&sluice, "/v1/messages", &body).await;
    assert_eq!(
        resp.headers()["x-sluice-projection"],
        "spilled=0; embedded=0; deferred=0; refused=0; placeholders=1"
    );
    assert_eq!(embedded(&mock), 0);
    let text = mock.last().json()["messages"][2]["content"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.contains(
            r#"shown earlier and no longer attached; it can be read again with the read tool: {"url":"artifact://m"#
        ),
        "{text}"
    );
}

/// A body of a megabyte or more runs its whole front (view, session, plan) on the blocking
/// pool, its session read and written from there: once holds the same (A3, A9).
#[tokio::test]
async fn once_holds_for_a_body_over_a_megabyte_planned_on_the_pool_a3() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, ""));
    let mut body = history("render_chart", 2, false);
    // A long first message (not a tool result: nothing to spill) makes the body 1.5 MB.
    body["messages"][0]["content"] = json!("watch the screen ".repeat(90_000));
    assert!(body.to_string().len() > 1_500_000);
    post(&sluice, "/v1/messages", &body).await;
    assert_eq!(embedded(&mock), 2);
    committed(&sluice, 1.0).await;
    let resp = post(&sluice, "/v1/messages", &body).await;
    assert_eq!(
        resp.headers()["x-sluice-projection"],
        "spilled=0; embedded=0; deferred=0; refused=0; placeholders=2"
    );
    assert_eq!(embedded(&mock), 0);
    // The same session without the long message is another conversation root: shown again.
    let other = history("render_chart", 2, false);
    post(&sluice, "/v1/messages", &other).await;
    assert_eq!(embedded(&mock), 2);
}

#[tokio::test]
async fn failed_cut_and_abandoned_responses_consume_nothing_a9() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, ""));
    // An upstream 500.
    mock.script([Reply::Status(
        500,
        "{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"boom\"}}".into(),
    )]);
    let resp = post(&sluice, "/v1/messages", &history("render_chart", 1, false)).await;
    assert_eq!(resp.status(), 500);
    // A stream cut before its final event.
    mock.script([Reply::CutStream { events: 3 }]);
    let resp = post(&sluice, "/v1/messages", &history("render_chart", 1, true)).await;
    assert!(resp.bytes().await.is_err());
    // A client that hangs up mid-stream.
    mock.script([Reply::Gate { events: 2 }]);
    let resp = post(&sluice, "/v1/messages", &history("render_chart", 1, true)).await;
    let mut stream = resp.bytes_stream();
    let _ = stream.next().await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(200)).await;
    mock.release();
    let m = sluice.metrics().await;
    assert_eq!(
        metric(&m, "sluice_commits_total{outcome=\"discarded\"}"),
        3.0
    );
    assert_eq!(
        metric(&m, "sluice_commits_total{outcome=\"committed\"}"),
        0.0
    );
    // So the image is still unviewed: shown again, and a completed stream consumes it.
    let resp = post(&sluice, "/v1/messages", &history("render_chart", 1, true)).await;
    let text = String::from_utf8(resp.bytes().await.unwrap().to_vec()).unwrap();
    assert!(text.contains("message_stop"));
    assert_eq!(embedded(&mock), 1, "nothing was consumed by the failures");
    committed(&sluice, 1.0).await;
    post(&sluice, "/v1/messages", &history("render_chart", 1, false)).await;
    assert_eq!(embedded(&mock), 0, "a completed stream consumed it");
}

#[tokio::test]
async fn state_survives_a_restart_s1() {
    let mock = MockUpstream::start();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_string();
    let env = [("SLUICE_STORE__DATA_DIR", data.as_str())];
    let body = history("render_chart", 1, false);
    {
        let sluice = Sluice::start_with(&config(&mock, ""), &env);
        post_as(&sluice, "/v1/messages", KEY, &body).await;
        committed(&sluice, 1.0).await;
    }
    let sluice = Sluice::start_with(&config(&mock, ""), &env);
    post_as(&sluice, "/v1/messages", KEY, &body).await;
    assert_eq!(embedded(&mock), 0, "still shown once, after a restart");
    // The image was written while its request was forwarded; its commit waited for the write,
    // so the placeholder's artifact is on disk.
    let text = mock.last().json()["messages"][2]["content"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let at = text.find("artifact://").unwrap() + 11;
    let id: String = text[at..].chars().take(33).collect();
    let stored = get_as(&sluice, &format!("/v1/sluice/artifacts/{id}"), KEY).await;
    assert_eq!(stored.status(), 200);
    assert_eq!(
        stored.bytes().await.unwrap().to_vec(),
        picture(9, 8, ImageFormat::Png)
    );
}

#[tokio::test]
async fn recent_prunes_in_batches_over_eight_screenshot_turns_a4() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&eager(&mock, "recent_count = 3\nprune_batch = 2"));
    let mut shown = Vec::new();
    for turn in 1..=8 {
        post(
            &sluice,
            "/v1/messages",
            &history("take_screenshot", turn, false),
        )
        .await;
        shown.push(embedded(&mock));
        committed(&sluice, turn as f64).await;
    }
    assert_eq!(shown, [1, 2, 3, 2, 3, 2, 3, 2]);
}

#[tokio::test]
async fn retain_keeps_every_image_and_the_history_byte_stable_a8() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(
        &config(&mock, "default_lifetime = \"retain\"")
            .replace("\"*screenshot*\" = \"recent\"", ""),
    );
    let mut previous: Option<Vec<u8>> = None;
    for turn in 1..=5 {
        post(
            &sluice,
            "/v1/messages",
            &history("render_chart", turn, false),
        )
        .await;
        assert_eq!(embedded(&mock), turn);
        committed(&sluice, turn as f64).await;
        let body = mock.last().body.to_vec();
        if let Some(prev) = &previous {
            // The previous request, minus its closing brackets, is a prefix of this one.
            let cut = prev.len() - 3;
            assert_eq!(
                &body[..cut],
                &prev[..cut],
                "turn {turn}: the shared history is byte-identical"
            );
        }
        previous = Some(body);
    }
}

#[tokio::test]
async fn a_dropped_tool_result_releases_its_image_for_good_a10() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, "default_lifetime = \"retain\""));
    let full = history("render_chart", 2, false);
    post(&sluice, "/v1/messages", &full).await;
    assert_eq!(embedded(&mock), 2);
    committed(&sluice, 1.0).await;
    // The agent trims the first tool turn from its history.
    let mut trimmed = full.clone();
    trimmed["messages"].as_array_mut().unwrap().drain(1..3);
    post(&sluice, "/v1/messages", &trimmed).await;
    assert_eq!(embedded(&mock), 1);
    committed(&sluice, 2.0).await;
    // It comes back: the released image does not.
    post(&sluice, "/v1/messages", &full).await;
    assert_eq!(embedded(&mock), 1);
    let first = mock.last().json()["messages"][2]["content"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(first.contains("no longer attached"), "{first}");
}

#[tokio::test]
async fn sessions_are_separate_by_header_and_by_tenant() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, ""));
    let body = history("render_chart", 1, false);
    let send = |session: &'static str, key: &'static str| {
        let url = sluice.url("/v1/messages");
        let body = body.clone();
        async move {
            client()
                .post(url)
                .header("x-sluice-session", session)
                .header("x-api-key", key)
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    send("s1", "k1").await;
    committed(&sluice, 1.0).await;
    send("s1", "k1").await;
    assert_eq!(embedded(&mock), 0, "same session: shown once");
    send("s2", "k1").await;
    assert_eq!(embedded(&mock), 1, "another session");
    send("s1", "k2").await;
    assert_eq!(embedded(&mock), 1, "another tenant");
    assert!(mock
        .requests()
        .iter()
        .all(|r| !r.headers.contains_key("x-sluice-session")));
}

/// Crash safety: SIGKILL while commits stream in, restart, and every request's delta is either
/// wholly there or wholly absent (no half-commit), and the store still opens.
#[tokio::test]
async fn a_kill_during_commits_leaves_no_half_commit() {
    let mock = MockUpstream::start();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_string();
    let env = [("SLUICE_STORE__DATA_DIR", data.as_str())];
    // Each request carries two new `once` images of its own session (a pair).
    let pair = |n: usize| {
        let a = b64(&picture(5 + n as u32, 5, ImageFormat::Png));
        let b = b64(&picture(5, 5 + n as u32, ImageFormat::Png));
        json!({"model": "claude-x", "max_tokens": 10, "metadata": {"user_id": format!("crash-{n}")}, "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "render", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": a}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b}}]}]}]})
    };
    let sluice = Sluice::start_with(&config(&mock, ""), &env);
    let pid = sluice.pid();
    let url = sluice.url("/v1/messages");
    #[allow(clippy::disallowed_methods)] // awaited below
    let sender = tokio::spawn(async move {
        for n in 0..200 {
            let _ = client().post(&url).json(&pair(n)).send().await;
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    let _ = sender.await;
    drop(sluice);
    let sluice = Sluice::start_with(&config(&mock, ""), &env);
    let mut consumed = 0;
    for n in 0..200 {
        post(&sluice, "/v1/messages", &pair(n)).await;
        match embedded(&mock) {
            0 => consumed += 1,
            2 => {}
            other => panic!("request {n}: {other} of 2 images consumed: a half commit"),
        }
    }
    assert!(consumed > 0, "some commits landed before the kill");
}

/// S2: idle artifacts and sessions expire (embedded store; Redis expires keys itself).
#[tokio::test]
async fn idle_sessions_and_artifacts_expire_s2() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(&mock.base_url(), "").replace(
        "drain_timeout_seconds = 5",
        "drain_timeout_seconds = 5\n[store]\nidle_ttl_seconds = 1",
    ));
    let body = history("render_chart", 1, false);
    common::post_as(&sluice, "/v1/messages", "key-ttl", &body).await;
    committed(&sluice, 1.0).await;
    let text = mock.last().json()["messages"][2]["content"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let at = text.find("artifact://").unwrap() + 11;
    let id: String = text[at..].chars().take(33).collect();
    common::post_as(&sluice, "/v1/messages", "key-ttl", &body).await;
    assert_eq!(embedded(&mock), 0, "shown once within the TTL");
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let gone = client()
        .get(sluice.url(&format!("/v1/sluice/artifacts/{id}")))
        .bearer_auth("key-ttl")
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404, "the idle artifact expired");
    common::post_as(&sluice, "/v1/messages", "key-ttl", &body).await;
    assert_eq!(
        embedded(&mock),
        1,
        "the idle session expired: a new session"
    );
}

/// A8: over a 30-turn screenshot session, every turn without a lifetime event sends the
/// previous request's projected history again, byte for byte.
#[tokio::test]
async fn thirty_turns_stay_byte_stable_between_lifetime_events_a8() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&eager(&mock, "recent_count = 3\nprune_batch = 2"));
    let mut previous: Option<Vec<u8>> = None;
    let mut stable = 0;
    for turn in 1..=30 {
        post(
            &sluice,
            "/v1/messages",
            &history("take_screenshot", turn, false),
        )
        .await;
        committed(&sluice, turn as f64).await;
        let body = mock.last().body.to_vec();
        let pruned_now = turn >= 4 && turn % 2 == 0; // 3 kept, 2 at a time, one new per turn
        if let Some(prev) = &previous {
            let cut = prev.len() - 3;
            if !pruned_now {
                assert_eq!(
                    &body[..cut],
                    &prev[..cut],
                    "turn {turn}: no lifetime event, same bytes"
                );
                stable += 1;
            } else {
                assert_ne!(
                    body.get(..cut),
                    Some(&prev[..cut]),
                    "turn {turn}: a prune changes the history"
                );
            }
        }
        previous = Some(body);
    }
    assert_eq!(stable, 15, "29 turns after the first, 14 of them prunes");
}
