//! End-to-end: the cases a hostile client and a misbehaving provider found (issue
//! "reliability"; SPEC P4, T1, A9, S3), each through the real binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use common::{b64, client, config_for, metric, picture, tool_output, MockUpstream, Reply, Sluice};
use image::ImageFormat;
use serde_json::{json, Value};

fn anthropic_tool_result(content: &str, stream: bool) -> Value {
    json!({"model": "claude-x", "max_tokens": 50, "stream": stream, "messages": [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": content}]}]})
}

fn chat_tool_result(content: &str, stream: bool) -> Value {
    json!({"model": "gpt-4o", "stream": stream, "messages": [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": content}]})
}

/// The artifact id and the cursor of the page the last forwarded Anthropic request showed.
fn spilled(mock: &MockUpstream) -> (String, String) {
    let shown = mock.last().json()["messages"][2]["content"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let at = shown.rfind("artifact://").unwrap() + 11;
    let id = shown[at..].chars().take(33).collect();
    let cursor = shown[shown.rfind("{\"cursor\":\"").unwrap() + 11..]
        .split('"')
        .next()
        .unwrap()
        .to_string();
    (id, cursor)
}

async fn raw(sluice: &Sluice, path: &str, body: Vec<u8>) -> (u16, Value) {
    let resp = client()
        .post(sluice.url(path))
        .bearer_auth("sk-bad")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_lone_surrogate_does_not_bypass_the_budget_t1() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let output = tool_output(1_000_000);
    for (path, body) in [
        ("/v1/messages", anthropic_tool_result(&output, false)),
        ("/v1/chat/completions", chat_tool_result(&output, false)),
    ] {
        // A JS tool that cut a string mid-emoji: one lone high surrogate, escaped.
        let text = serde_json::to_string(&body).unwrap().replacen(
            "test tests::case_",
            "\\ud83d tests::case_",
            1,
        );
        let (status, _) = raw(&sluice, path, text.into_bytes()).await;
        assert_eq!(status, 200, "{path}");
        let sent = mock.last();
        assert!(
            sent.body.len() < 100_000,
            "{path}: {} bytes went upstream",
            sent.body.len()
        );
        let forwarded = String::from_utf8_lossy(&sent.body);
        assert!(forwarded.contains("[sluice: lines 1-"), "{path}: paged");
    }
}

#[tokio::test]
async fn duplicate_keys_and_non_utf8_bodies_get_bad_json_p4() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let big = tool_output(200_000);
    for (path, body) in [
        ("/v1/messages", anthropic_tool_result(&big, false)),
        ("/v1/chat/completions", chat_tool_result(&big, false)),
    ] {
        let text = serde_json::to_string(&body).unwrap();
        // A second `messages` that the provider would read, unprojected.
        let twice = text.replacen(
            '{',
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],",
            1,
        );
        let (status, v) = raw(&sluice, path, twice.into_bytes()).await;
        assert_eq!(status, 400, "{path}");
        assert!(v.to_string().contains("duplicate field"), "{path}: {v}");
        let model_twice = text.replacen('{', "{\"model\":\"other\",", 1);
        assert_eq!(raw(&sluice, path, model_twice.into_bytes()).await.0, 400);
        let mut latin1 = text.into_bytes();
        latin1.splice(20..20, [0xe9, 0xff]);
        let (status, v) = raw(&sluice, path, latin1).await;
        assert_eq!(status, 400, "{path}");
        assert!(
            v.to_string().contains("bad_json") || v.to_string().contains("UTF-8"),
            "{v}"
        );
    }
    assert!(mock.requests().is_empty(), "nothing reached the provider");
}

#[tokio::test]
async fn uppercase_data_urls_are_images_m1() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let png = b64(&picture(10, 10, ImageFormat::Png));
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": format!("DATA:IMAGE/PNG;BASE64,{png}")}}]}]});
    let resp = common::post(&sluice, "/v1/chat/completions", &body).await;
    assert_eq!(resp.status(), 200);
    let projection = resp.headers()["x-sluice-projection"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        projection.contains("embedded=1") && projection.contains("refused=0"),
        "{projection}"
    );
    // Read as an image (checked and embedded), not passed on as a remote URL.
    let m = sluice.metrics().await;
    let images = |reason: &str| {
        metric(
            &m,
            &format!("sluice_images_total{{outcome=\"embedded\",reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(images(""), 1.0, "{m}");
    assert_eq!(images("remote"), 0.0);
}

#[tokio::test]
async fn without_a_credential_sluices_endpoints_answer_401_s3() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let body = anthropic_tool_result(&tool_output(100_000), false);
    // Projected as usual without a credential.
    let resp = client()
        .post(sluice.url("/v1/messages"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (id, cursor) = spilled(&mock);
    for path in [
        format!("/v1/sluice/artifacts/{id}"),
        format!("/v1/sluice/read?cursor={cursor}"),
    ] {
        let resp = client().get(sluice.url(&path)).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{path}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "unauthorized");
        // An empty key does not make a credential either.
        let resp = client()
            .get(sluice.url(&path))
            .header("x-api-key", "")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401);
    }
    // An empty x-api-key never wins over a bearer token: that tenant reads its artifact.
    let resp = client()
        .post(sluice.url("/v1/messages"))
        .header("x-api-key", "")
        .bearer_auth("sk-real")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (id, _) = spilled(&mock);
    let resp = common::get_as(&sluice, &format!("/v1/sluice/artifacts/{id}"), "sk-real").await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn a_route_can_name_the_tenant_of_requests_without_a_credential() {
    let mock = MockUpstream::start();
    std::env::set_var("SLUICE_TEST_SIDECAR_KEY", "sk-provider");
    let upstream = format!("upstream = \"{}\"", mock.base_url());
    let config = config_for(&mock.base_url(), "").replace(
        &upstream,
        &format!("{upstream}\napi_key_env = \"SLUICE_TEST_SIDECAR_KEY\"\ntenant = \"agent-7\""),
    );
    let sluice = Sluice::start_with(&config, &[("SLUICE_TEST_SIDECAR_KEY", "sk-provider")]);
    let body = anthropic_tool_result(&tool_output(100_000), false);
    let resp = client()
        .post(sluice.url("/v1/messages"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(mock.last().headers["x-api-key"], "sk-provider");
    let (id, _) = spilled(&mock);
    let resp = client()
        .get(sluice.url(&format!("/v1/sluice/artifacts/{id}")))
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "the named tenant reads its artifact");
    let other = common::get_as(&sluice, &format!("/v1/sluice/artifacts/{id}"), "sk-someone").await;
    assert_eq!(other.status(), 404);
}

/// A provider that misbehaves: events that are not objects, a missing `choices`, a
/// `content_block` that is a number, a final answer of the wrong shape; streamed and not, on
/// the read tool's path (which parses every event). The client gets an answer or a cut
/// stream, never a dropped connection, and sluice keeps serving.
#[tokio::test]
async fn a_misbehaving_provider_never_takes_sluice_down_p4() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let big = tool_output(100_000);
    let sse = |events: &[&str]| {
        events
            .iter()
            .map(|e| format!("{e}\n\n"))
            .collect::<Vec<_>>()
    };
    let cases: Vec<(&str, Value, Reply)> = vec![
        ("/v1/responses", json!({"model": "gpt-4o", "stream": true, "input": [
            {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": big}]}),
            Reply::RawSse(sse(&["event: response.created\ndata: 1", "data: [1,2]", "data: \"x\"", "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":7}"]))),
        ("/v1/chat/completions", chat_tool_result(&big, true),
            Reply::RawSse(sse(&["data: {\"choices\":[1]}", "data: {\"choices\":\"x\"}", "data: {\"choices\":[{\"delta\":7,\"finish_reason\":\"stop\"}]}", "data: [DONE]"]))),
        ("/v1/messages", anthropic_tool_result(&big, true),
            Reply::RawSse(sse(&["event: message_start\ndata: {\"type\":\"message_start\",\"message\":1}",
                "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":5}",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"citations_delta\",\"citation\":1}}",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}",
                "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}",
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":3}",
                "event: message_stop\ndata: {\"type\":\"message_stop\"}"]))),
        ("/v1/chat/completions", chat_tool_result(&big, false), Reply::RawJson("{\"id\":\"x\"}".into())),
        ("/v1/chat/completions", chat_tool_result(&big, false), Reply::RawJson("{\"choices\":[1],\"usage\":5}".into())),
        ("/v1/messages", anthropic_tool_result(&big, false), Reply::RawJson("{\"content\":{\"a\":1},\"usage\":[]}".into())),
        ("/v1/responses", json!({"model": "gpt-4o", "input": [
            {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": big}]}),
            Reply::RawJson("[1,2,3]".into())),
    ];
    for (i, (path, body, reply)) in cases.into_iter().enumerate() {
        mock.script([reply]);
        let resp = client()
            .post(sluice.url(path))
            .bearer_auth("sk-bad")
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("case {i} {path}: no response: {e}"));
        assert!(
            resp.status().as_u16() < 500 || resp.status() == 502,
            "case {i}: {}",
            resp.status()
        );
        let _ = resp.bytes().await; // a cut stream is an answer too
    }
    let resp = common::post(
        &sluice,
        "/v1/chat/completions",
        &chat_tool_result("ok", false),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert!(!sluice.logs().join("\n").contains("panicked"));
}

/// A9: a provider stream that just ends, before its final event, reaches the client cut,
/// never as a clean end; nothing is committed.
#[tokio::test]
async fn a_stream_that_ends_without_its_final_event_is_cut_a9() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let png = b64(&picture(10, 10, ImageFormat::Png));
    let body = json!({"model": "claude-x", "max_tokens": 50, "stream": true, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "look"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}]}]});
    mock.script([Reply::RawSse(vec![
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":1}}}\n\n".into(),
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n".into(),
    ])]);
    let resp = client()
        .post(sluice.url("/v1/messages"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.bytes().await.is_err(),
        "the client sees the stream cut"
    );
    let m = sluice.metrics().await;
    assert_eq!(
        metric(&m, "sluice_commits_total{outcome=\"discarded\"}"),
        1.0
    );
    assert_eq!(
        metric(
            &m,
            "sluice_streams_total{dialect=\"anthropic-messages\",outcome=\"upstream_error\"}"
        ),
        1.0
    );
}
