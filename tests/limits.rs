//! End-to-end: limits on what a client controls (issue "reliability"; SPEC P4, S5, 9.1). A body
//! that trickles gets 408 and its connection closed; past `max_connections` sluice stops
//! accepting instead of failing accepts; config values outside what sluice can honour are
//! refused at `check-config`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::time::{Duration, Instant};

use common::{client, config_for, metric, MockUpstream, Sluice};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Opens a connection and sends a request head announcing `length` body bytes, then `sent` of
/// them, and stalls.
async fn trickle(sluice: &Sluice, path: &str, length: usize, sent: usize) -> TcpStream {
    let mut stream = TcpStream::connect(sluice.proxy).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&b"{".repeat(sent)).await.unwrap();
    stream
}

/// Everything the server sends until it closes the connection (or `limit` passes).
async fn read_to_close(stream: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut out = Vec::new();
    let closed = tokio::time::timeout(limit, stream.read_to_end(&mut out))
        .await
        .is_ok();
    (String::from_utf8_lossy(&out).to_string(), closed)
}

#[tokio::test]
async fn a_trickled_body_gets_408_in_the_dialects_shape_and_the_connection_closes() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(
        &mock.base_url(),
        "request_body_timeout_seconds = 1",
    ));
    for (path, anthropic) in [
        ("/v1/messages", true),
        ("/v1/chat/completions", false),
        ("/v1/models", false),
    ] {
        let started = Instant::now();
        let mut stream = trickle(&sluice, path, 1000, 10).await;
        let (text, closed) = read_to_close(&mut stream, Duration::from_secs(10)).await;
        assert!(closed, "{path}: the connection is closed");
        assert!(started.elapsed() < Duration::from_secs(8), "{path}");
        assert!(text.starts_with("HTTP/1.1 408"), "{path}: {text}");
        let body: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        if anthropic {
            assert_eq!(body["type"], "error");
            assert_eq!(body["error"]["type"], "invalid_request_error");
        } else {
            assert_eq!(body["error"]["code"], "body_timeout");
        }
    }
    assert!(mock.requests().iter().all(|r| r.uri != "/v1/messages"));
    let m = sluice.metrics().await;
    assert_eq!(
        metric(&m, "sluice_errors_total{kind=\"body_timeout\"}"),
        3.0
    );
}

#[tokio::test]
async fn past_max_connections_sluice_stops_accepting_and_serves_in_turn() {
    let mock = MockUpstream::start();
    let config = config_for(
        &mock.base_url(),
        "max_connections = 4\nrequest_body_timeout_seconds = 2",
    );
    let sluice = Sluice::start(&config);
    // Eight slow bodies: four are served (and cut after 2 s), four wait to be accepted.
    let mut slow = Vec::new();
    for _ in 0..8 {
        slow.push(trickle(&sluice, "/v1/chat/completions", 1000, 1).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = sluice.metrics().await;
    assert_eq!(metric(&m, "sluice_connections_open"), 4.0, "{m}");
    // A normal request is served once the slow ones are cut, not refused.
    let started = Instant::now();
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    let resp = client()
        .post(sluice.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    let logs = sluice.logs().join("\n");
    assert!(!logs.contains("accept failed"), "{logs}");
    for mut stream in slow {
        let (text, _) = read_to_close(&mut stream, Duration::from_secs(10)).await;
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    }
}

/// Sends a whole request (head and a JSON body of `length` bytes) on a new connection, then
/// reads the answer to the end: (status line and headers, body).
async fn send_whole(sluice: &Sluice, length: usize) -> (String, String) {
    let mut stream = TcpStream::connect(sluice.proxy).await.unwrap();
    let text = "x".repeat(length - 60);
    let body = format!(r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"{text}"}}]}}"#);
    let body = format!("{body}{}", " ".repeat(length - body.len()));
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // Fails with a broken pipe if sluice stops reading and closes before the body is in.
    stream.write_all(body.as_bytes()).await.unwrap();
    let (text, closed) = read_to_close(&mut stream, Duration::from_secs(30)).await;
    assert!(closed, "{text}");
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

#[tokio::test]
async fn a_body_with_no_room_waits_then_gets_503_with_retry_after_and_can_read_it() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(
        &mock.base_url(),
        "max_body_bytes = 40000000\nmax_inflight_body_bytes = 40000000\nrequest_body_timeout_seconds = 60",
    ));
    // A body declared at 30 MB takes its room before it arrives, and keeps arriving (at 2 KiB/s,
    // above the pace rule) for longer than a waiting body's 10 s.
    let mut holder = trickle(&sluice, "/v1/messages", 30_000_000, 10).await;
    let feed = async move {
        for _ in 0..24 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if holder.write_all(&[b' '; 1024]).await.is_err() {
                break;
            }
        }
        holder
    };
    let probe = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        let (head, body) = send_whole(&sluice, 20_000_000).await;
        (head, body, started.elapsed())
    };
    let (holder, (head, body, waited)) = tokio::join!(feed, probe);
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    assert!(waited >= Duration::from_secs(9), "{waited:?}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "api_error");
    assert!(mock.requests().iter().all(|r| r.uri != "/v1/messages"));
    // Once the room is free again, the same request goes through.
    drop(holder);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (head, _) = send_whole(&sluice, 20_000_000).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let m = sluice.metrics().await;
    assert_eq!(metric(&m, "sluice_errors_total{kind=\"overloaded\"}"), 1.0);
}

#[test]
fn values_sluice_cannot_honour_are_refused_by_check_config() {
    for (line, key) in [
        (
            "[store]\nidle_ttl_seconds = 40000000000",
            "store.idle_ttl_seconds",
        ),
        (
            "request_body_timeout_seconds = 0",
            "request_body_timeout_seconds",
        ),
        ("max_inflight_body_bytes = 1000", "max_inflight_body_bytes"),
        ("worker_threads = 100000", "worker_threads"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.toml");
        std::fs::write(&path, line).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("check-config")
            .arg("--config")
            .arg(&path)
            .env_remove("SLUICE_CONFIG")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{line}: {text}");
        assert!(text.contains(key), "{line}: {text}");
    }
}

#[tokio::test]
async fn a_body_slower_than_a_kib_per_second_is_cut_after_its_grace() {
    let mock = MockUpstream::start();
    // The default 60 s body timeout: the pace, not the timeout, ends this one.
    let sluice = Sluice::in_front_of(&mock);
    let started = Instant::now();
    let mut stream = trickle(&sluice, "/v1/responses", 100_000, 100).await;
    let (text, closed) = read_to_close(&mut stream, Duration::from_secs(30)).await;
    let took = started.elapsed();
    assert!(closed && text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(15),
        "{took:?}"
    );
    // A body that keeps coming at a real pace is read in full.
    let body = json!({"model": "gpt-4o", "input": "x".repeat(20_000)}).to_string();
    let mut stream = TcpStream::connect(sluice.proxy).await.unwrap();
    let head = format!(
        "POST /v1/responses HTTP/1.1\r\nhost: s\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for piece in body.as_bytes().chunks(4096) {
        stream.write_all(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await; // 8 KiB/s
    }
    let (text, _) = read_to_close(&mut stream, Duration::from_secs(30)).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text:.300}");
}

/// One request on an HTTP/1.1 connection kept open (`sender`): its status, whether its answer
/// said `connection: close`, and its whole body.
async fn on_connection(
    sender: &mut hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>,
    body: &Value,
) -> (u16, bool, String) {
    use http_body_util::BodyExt;
    sender.ready().await.unwrap();
    let request = http::Request::post("/v1/chat/completions")
        .header("host", "sluice")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let close = response
        .headers()
        .get("connection")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, close, String::from_utf8_lossy(&bytes).into_owned())
}

/// docs/runtime.md, "Connections recycled": an HTTP/1 connection serves
/// `max_requests_per_connection` requests; the last is answered in full (streamed or not) with
/// `connection: close`, and sluice then ends the connection, so the client's next request goes
/// on a new one, which is served as usual.
#[tokio::test]
async fn a_connection_ends_after_max_requests_per_connection_with_every_answer_whole() {
    let mock = MockUpstream::start();
    let config = config_for(
        &mock.base_url(),
        "max_requests_per_connection = 3\nworker_threads = 2",
    );
    let sluice = Sluice::start(&config);
    let plain = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    let streamed =
        json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    for round in 0..2 {
        let stream = TcpStream::connect(sluice.proxy).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        #[allow(clippy::disallowed_methods)] // awaited below
        let conn = tokio::spawn(conn);
        for n in 1..=3 {
            // The last answer of the second connection is a stream: it too arrives whole.
            let body = if round == 1 && n == 3 {
                &streamed
            } else {
                &plain
            };
            let (status, close, text) = on_connection(&mut sender, body).await;
            assert_eq!(status, 200, "round {round}, request {n}: {text}");
            assert_eq!(
                close,
                n == 3,
                "round {round}, request {n}: connection: close"
            );
            if body == &streamed {
                assert!(text.contains("data: [DONE]"), "{text}");
            } else {
                let answer: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(answer["object"], "chat.completion", "{text}");
            }
        }
        // sluice ends the connection after the third answer; nothing more is sent on it.
        let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
        assert!(ended.is_ok(), "round {round}: the connection was not ended");
        assert!(sender.ready().await.is_err(), "round {round}");
    }
    assert_eq!(mock.requests().len(), 6);
    let m = sluice.metrics().await;
    assert_eq!(metric(&m, "sluice_connections_recycled_total"), 2.0, "{m}");
    assert_eq!(
        metric(
            &m,
            "sluice_requests_total{dialect=\"openai-chat\",route=\"openai\",status=\"200\"}"
        ),
        6.0,
        "{m}"
    );
}
