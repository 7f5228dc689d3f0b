//! End-to-end: the real `sluice` binary in front of the mock provider. Pass-through (P1-P5),
//! errors (P4), streaming (P3), credentials (S4), metrics and operation (O2-O5).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::time::Duration;

use common::{client, config_for, metric, post, MockUpstream, Reply, Sluice};
use futures_util::StreamExt;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const RESPONSES: &str = "/v1/responses";
const MESSAGES: &str = "/v1/messages";

/// A chat request with unknown fields, odd whitespace, unusual key order and number formats.
const ODD_CHAT: &str = "{\n  \"messages\" :[ {\"content\":\"hi \\u00e9\\ud83d\\ude00\",\"role\":\"user\"} ,\n\t{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"ls\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"a\\nb\"}],\n  \"x_unknown\": {\"n\": 1.50e3, \"z\": -0.0},\n  \"model\":\"gpt-4o\" ,\"temperature\":0.70 }";

#[tokio::test]
async fn unprojected_bodies_reach_the_upstream_byte_identical_p1() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let anthropic = r#"{"model":"claude-x","max_tokens":5,  "messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}],"metadata":{"user_id":"u"} }"#;
    let responses = r#"{"input":[{"role":"user","content":"hi"},{"type":"function_call_output","call_id":"x","output":"ok"}],"model":"gpt-5","store":false}"#;
    for (path, body) in [
        (CHAT, ODD_CHAT),
        (MESSAGES, anthropic),
        (RESPONSES, responses),
        ("/v1/messages/count_tokens", anthropic),
    ] {
        let resp = client()
            .post(sluice.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert!(resp.headers().contains_key("x-sluice-request-id"));
        assert_eq!(
            resp.headers()["x-sluice-projection"],
            "spilled=0; embedded=0; deferred=0; refused=0; placeholders=0"
        );
        assert_eq!(
            resp.headers()["x-mock"],
            "1",
            "upstream headers pass through"
        );
        let got = mock.last();
        assert_eq!(got.uri, path);
        assert_eq!(
            &got.body[..],
            body.as_bytes(),
            "P1: byte-identical body for {path}"
        );
    }
}

#[tokio::test]
async fn responses_pass_through_unchanged_with_status_and_error_bodies_p3() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let provider_error = r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"},"request_id":"req_1"}"#;
    mock.script([
        Reply::Text("exact answer".into()),
        Reply::Status(429, provider_error.into()),
    ]);
    let body = json!({"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    let resp = post(&sluice, MESSAGES, &body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["content"][0]["text"], "exact answer");
    let resp = post(&sluice, MESSAGES, &body).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(
        resp.text().await.unwrap(),
        provider_error,
        "provider error body untouched"
    );
}

#[tokio::test]
async fn streams_arrive_chunk_by_chunk_with_done_kept_p3() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    mock.script([Reply::Gate { events: 2 }]);
    let body =
        json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let resp = post(&sluice, CHAT, &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut stream = resp.bytes_stream();
    // The mock holds the rest of the stream until released: the first events must arrive first.
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("Hel") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("first events arrive before the stream ends")
            .unwrap()
            .unwrap();
        seen.extend_from_slice(&chunk);
    }
    assert!(!String::from_utf8_lossy(&seen).contains("[DONE]"));
    mock.release();
    while let Some(chunk) = stream.next().await {
        seen.extend_from_slice(&chunk.unwrap());
    }
    let text = String::from_utf8(seen).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(text.matches("data: ").count(), 6);
    let metrics = sluice.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "sluice_streams_total{dialect=\"openai-chat\",outcome=\"completed\"}"
        ),
        1.0
    );
}

#[tokio::test]
async fn bad_json_is_400_in_each_dialect_shape_p4() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    for (path, anthropic_shape) in [(CHAT, false), (RESPONSES, false), (MESSAGES, true)] {
        for bad in ["{\"model\": \"x\", ", "not json", "\u{0}", ""] {
            let resp = client()
                .post(sluice.url(path))
                .body(bad)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 400, "{path} {bad:?}");
            let v: Value = resp.json().await.unwrap();
            if anthropic_shape {
                assert_eq!(v["type"], "error");
                assert_eq!(v["error"]["type"], "invalid_request_error");
            } else {
                assert_eq!(v["error"]["type"], "invalid_request_error");
                assert_eq!(v["error"]["code"], "bad_json");
            }
        }
    }
    assert!(
        mock.requests().is_empty(),
        "nothing bad reached the upstream"
    );
}

#[tokio::test]
async fn body_over_the_limit_is_413_while_reading_p4() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(&mock.base_url(), "max_body_bytes = 1000"));
    let big = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(5000)
    );
    // Declared length over the limit.
    let resp = client()
        .post(sluice.url(MESSAGES))
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "request_too_large");
    // Chunked, no declared length: refused once the limit is passed.
    let chunks: Vec<Result<String, std::io::Error>> = big
        .as_bytes()
        .chunks(100)
        .map(|c| Ok(String::from_utf8_lossy(c).into_owned()))
        .collect();
    let resp = client()
        .post(sluice.url(CHAT))
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "body_too_large");
    assert!(mock.requests().is_empty());
}

#[tokio::test]
async fn unknown_model_is_404_no_route_p4() {
    let mock = MockUpstream::start();
    let config = format!(
        r#"listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[[routes]]
name = "only-claude"
dialects = ["anthropic-messages"]
models = ["claude-*"]
upstream = "{}""#,
        mock.base_url()
    );
    let sluice = Sluice::start(&config);
    let resp = post(
        &sluice,
        MESSAGES,
        &json!({"model": "gpt-4o", "messages": []}),
    )
    .await;
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "not_found_error");
    let resp = post(&sluice, CHAT, &json!({"model": "claude-x", "messages": []})).await;
    assert_eq!(resp.status(), 404, "no route serves openai-chat");
    let resp = client().get(sluice.url("/nope")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    assert!(mock.requests().is_empty());
}

#[tokio::test]
async fn unreachable_upstream_is_502_p4() {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sluice = Sluice::start(&config_for(&format!("http://127.0.0.1:{port}"), ""));
    let resp = post(&sluice, CHAT, &json!({"model": "gpt-4o", "messages": []})).await;
    assert_eq!(resp.status(), 502);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_unreachable");
    let metrics = sluice.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "sluice_errors_total{kind=\"upstream_unreachable\"}"
        ),
        1.0
    );
}

#[tokio::test]
async fn stalled_upstream_is_504_and_a_silent_stream_is_cut_p4() {
    let mock = MockUpstream::start();
    let config = config_for(&mock.base_url(), "").replace(
        "first_byte_timeout_seconds = 10\nidle_timeout_seconds = 10",
        "first_byte_timeout_seconds = 0.5\nidle_timeout_seconds = 0.5",
    );
    let sluice = Sluice::start(&config);
    mock.script([
        Reply::StallHead(Duration::from_secs(3)),
        Reply::StallBody {
            events: 2,
            pause: Duration::from_secs(3),
        },
    ]);
    let body = json!({"model": "claude-x", "max_tokens": 5, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let resp = post(&sluice, MESSAGES, &body).await;
    assert_eq!(resp.status(), 504);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error");
    // Mid-stream silence: the head was sent, so the stream is cut and the client sees an error.
    let resp = post(&sluice, MESSAGES, &body).await;
    assert_eq!(resp.status(), 200);
    let result = resp.bytes().await;
    assert!(
        result.is_err(),
        "a cut stream must not look complete: {result:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let metrics = sluice.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "sluice_streams_total{dialect=\"anthropic-messages\",outcome=\"upstream_error\"}"
        ),
        1.0
    );
}

#[tokio::test]
async fn a_stream_cut_upstream_reaches_the_client_cut() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    mock.script([Reply::CutStream { events: 3 }]);
    let body = json!({"model": "gpt-5", "stream": true, "input": "hi"});
    let resp = post(&sluice, RESPONSES, &body).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.bytes().await.is_err());
}

#[tokio::test]
async fn credentials_pass_through_and_sluice_headers_stay_home_s4() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let resp = client()
        .post(sluice.url(MESSAGES))
        .header("x-api-key", "sk-ant-client-secret")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "prompt-caching-2024-07-31")
        .header("x-sluice-session", "s1")
        .json(&json!({"model": "claude-x", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got = mock.last();
    assert_eq!(got.headers["x-api-key"], "sk-ant-client-secret");
    assert_eq!(got.headers["anthropic-version"], "2023-06-01");
    assert_eq!(got.headers["anthropic-beta"], "prompt-caching-2024-07-31");
    assert!(got.headers.get("x-sluice-session").is_none());
    assert!(
        !sluice.logs().join("\n").contains("sk-ant-client-secret"),
        "S4: never logged"
    );
    let metrics = sluice.metrics().await;
    assert!(!metrics.contains("sk-ant-client-secret"));
}

#[tokio::test]
async fn a_route_key_replaces_the_client_credential_s4() {
    let mock = MockUpstream::start();
    let config = config_for(&mock.base_url(), "").replace(
        "name = \"openai\"",
        "name = \"openai\"\napi_key_env = \"SLUICE_TEST_OPENAI_KEY\"",
    );
    let sluice = Sluice::start_with(&config, &[("SLUICE_TEST_OPENAI_KEY", "sk-route-secret")]);
    let resp = client()
        .post(sluice.url(CHAT))
        .bearer_auth("sk-client")
        .json(&json!({"model": "gpt-4o", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        mock.last().headers["authorization"],
        "Bearer sk-route-secret"
    );
    assert!(!sluice.logs().join("\n").contains("sk-route-secret"));
}

#[tokio::test]
async fn other_v1_paths_pass_through_unchanged_p5() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let resp = client()
        .get(sluice.url("/v1/models?limit=2&after=a%20b"))
        .bearer_auth("sk-client")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["uri"], "/v1/models?limit=2&after=a%20b");
    assert_eq!(v["method"], "GET");
    // A streamed upload is streamed on, byte for byte.
    let upload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let resp = client()
        .post(sluice.url("/v1/files"))
        .body(upload.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got = mock.last();
    assert_eq!(got.uri, "/v1/files");
    assert_eq!(&got.body[..], &upload[..]);
    assert!(!got.headers.contains_key("x-sluice-request-id"));
}

#[tokio::test]
async fn metrics_count_requests_and_overhead_o2() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    for _ in 0..3 {
        post(&sluice, CHAT, &json!({"model": "gpt-4o", "messages": []})).await;
    }
    client()
        .post(sluice.url(CHAT))
        .body("{")
        .send()
        .await
        .unwrap();
    let text = sluice.metrics().await;
    assert_eq!(
        metric(
            &text,
            r#"sluice_requests_total{dialect="openai-chat",route="openai",status="200"}"#
        ),
        3.0
    );
    assert_eq!(
        metric(
            &text,
            r#"sluice_requests_total{dialect="openai-chat",route="none",status="400"}"#
        ),
        1.0
    );
    assert_eq!(metric(&text, "sluice_overhead_seconds_count"), 3.0);
    assert_eq!(metric(&text, "sluice_upstream_duration_seconds_count"), 3.0);
    assert_eq!(metric(&text, "sluice_request_duration_seconds_count"), 4.0);
    assert_eq!(metric(&text, "sluice_inflight_requests"), 0.0);
    let health = client()
        .get(sluice.admin_url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let ready = client()
        .get(sluice.admin_url("/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_stream_is_counted_cancelled() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    mock.script([Reply::Gate { events: 2 }]);
    let body = json!({"model": "claude-x", "stream": true, "messages": []});
    let resp = post(&sluice, MESSAGES, &body).await;
    let mut stream = resp.bytes_stream();
    let _ = stream.next().await;
    drop(stream);
    let mut cancelled = 0.0;
    for _ in 0..100 {
        let text = sluice.metrics().await;
        cancelled = metric(
            &text,
            r#"sluice_streams_total{dialect="anthropic-messages",outcome="cancelled"}"#,
        );
        if cancelled > 0.0 {
            assert_eq!(metric(&text, "sluice_inflight_requests"), 0.0);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cancelled, 1.0);
    mock.release();
}

#[tokio::test]
async fn sigterm_lets_an_in_flight_stream_finish_o4() {
    let mock = MockUpstream::start();
    let mut sluice = Sluice::in_front_of(&mock);
    mock.script([Reply::Gate { events: 2 }]);
    let body = json!({"model": "gpt-4o", "stream": true, "messages": []});
    let resp = post(&sluice, CHAT, &body).await;
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    sluice.terminate();
    // Draining: not ready, and new connections are refused.
    let mut draining = false;
    for _ in 0..100 {
        if let Ok(r) = client().get(sluice.admin_url("/readyz")).send().await {
            if r.status() == 503 {
                draining = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(draining, "readyz reports 503 while draining");
    assert!(client()
        .post(sluice.url(CHAT))
        .json(&body)
        .send()
        .await
        .is_err());
    mock.release();
    let mut rest = first.to_vec();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.expect("the in-flight stream finishes"));
    }
    assert!(String::from_utf8(rest)
        .unwrap()
        .ends_with("data: [DONE]\n\n"));
    let status = tokio::task::spawn_blocking(move || sluice.wait_exit(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "exits 0 after draining: {status:?}"
    );
}

#[test]
fn check_config_names_a_misspelled_key_and_redacts_secrets_o1() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[store]\nbackend = \"redis\"\nredis_ur = \"redis://x\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check-config", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("store.redis_ur"), "{err}");
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[store]\nredis_url = \"redis://user:hunter2@10.0.0.1:6379/0\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check-config", "--config"])
        .arg(&good)
        .env("SLUICE_LISTEN", "0.0.0.0:9999")
        .output()
        .unwrap();
    assert!(out.status.success());
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("listen = \"0.0.0.0:9999\""),
        "env override applied: {shown}"
    );
    assert!(!shown.contains("hunter2"));
    assert!(shown.contains("[[routes]]"));
}
