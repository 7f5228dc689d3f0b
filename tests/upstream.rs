//! End-to-end: how sluice reaches a provider. Over TLS it trusts the platform's roots (here a
//! test CA named by `SSL_CERT_FILE`) and speaks HTTP/2 when the provider offers it (ALPN); a
//! request an HTTP/2 provider refused unread is sent again; a proxy the environment names
//! carries the requests it covers. Whatever the transport, the bytes are the projected ones.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::mock::Tls;
use common::{client, config_for, metric, post, tool_output, MockUpstream, Sluice};
use futures_util::StreamExt;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";

/// A chat turn whose tool output is spilled: the forwarded body is projected.
fn spilled_turn(stream: bool) -> Value {
    json!({"model": "gpt-4o", "stream": stream, "messages": [
        {"role": "user", "content": "build it"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": tool_output(150_000)}]})
}

/// Sluice in front of `upstream`, trusting the test CA of `tls` as the platform's roots.
fn trusting(upstream: &str, tls: &Tls) -> Sluice {
    let ca = tls.ca.to_str().unwrap();
    Sluice::start_with(&config_for(upstream, ""), &[("SSL_CERT_FILE", ca)])
}

#[tokio::test]
async fn an_https_provider_is_reached_over_h2_with_the_platforms_roots() {
    let mock = MockUpstream::start_tls();
    let sluice = trusting(&mock.base_url(), mock.tls.as_ref().unwrap());
    // Projected, whole and streamed.
    let resp = post(&sluice, CHAT, &spilled_turn(false)).await;
    assert_eq!(resp.status(), 200, "{}", sluice.logs().join("\n"));
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["object"], "chat.completion");
    let seen = mock.last();
    assert_eq!(seen.version, http::Version::HTTP_2, "ALPN chose h2");
    let forwarded = seen.json();
    let content = forwarded["messages"][2]["content"].as_str().unwrap();
    assert!(
        content.contains("artifact://") && content.len() < 150_000,
        "projected: {} bytes",
        content.len()
    );
    // The body arrived whole with its length (pieces or not, over TLS too).
    assert_eq!(
        seen.headers["content-length"].to_str().unwrap(),
        seen.body.len().to_string()
    );
    let resp = post(&sluice, CHAT, &spilled_turn(true)).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // Pass-through over the same transport.
    let resp = client()
        .get(sluice.url("/v1/models"))
        .header("authorization", "Bearer sk-test")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(mock.last().method, "GET");
    assert_eq!(mock.last().headers["authorization"], "Bearer sk-test");
}

#[tokio::test]
async fn a_provider_whose_certificate_is_not_trusted_gets_no_request() {
    let mock = MockUpstream::start_tls();
    // No SSL_CERT_FILE: the test CA is in no root store the platform has.
    let sluice = Sluice::start(&config_for(&mock.base_url(), ""));
    let resp = post(
        &sluice,
        MESSAGES,
        &json!({"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(resp.status(), 502);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error", "Anthropic's shape: {v}");
    assert!(mock.requests().is_empty(), "nothing was sent");
    let logs = sluice.logs().join("\n");
    assert!(logs.contains("certificate"), "the log says why: {logs}");
}

#[tokio::test]
async fn a_provider_that_never_answers_tls_gets_the_connect_timeout() {
    // The kernel takes the connection (the backlog); nobody ever answers the client's hello.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    // config_for: connect timeout 2 s, first-byte timeout 10 s.
    let sluice = Sluice::start(&config_for(&format!("https://127.0.0.1:{port}"), ""));
    let resp = post(&sluice, CHAT, &spilled_turn(false)).await;
    assert_eq!(resp.status(), 504);
    let v: Value = resp.json().await.unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("the connect timeout"), "{message}");
    drop(silent);
}

/// An HTTP/2 provider over TLS that refuses its first `refuse` streams unread (REFUSED_STREAM,
/// RFC 9113 section 8.7) and answers the others with a chat completion, keeping their bodies.
struct Refusing {
    addr: SocketAddr,
    tls: Tls,
    refused: Arc<AtomicUsize>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

const ANSWER: &str = r#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}]}"#;

impl Refusing {
    #[allow(clippy::disallowed_methods)] // its tasks end with the test's runtime
    async fn start(refuse: usize) -> Refusing {
        let (tls, config) = Tls::new(&[b"h2"]);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let refused = Arc::new(AtomicUsize::new(0));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let (r, b) = (refused.clone(), bodies.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, refused, bodies) = (acceptor.clone(), r.clone(), b.clone());
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut conn) = h2::server::handshake(stream).await else {
                        return;
                    };
                    while let Some(Ok((request, mut respond))) = conn.accept().await {
                        if refused.fetch_add(1, Ordering::SeqCst) < refuse {
                            respond.send_reset(h2::Reason::REFUSED_STREAM);
                            continue;
                        }
                        refused.fetch_sub(1, Ordering::SeqCst);
                        let bodies = bodies.clone();
                        tokio::spawn(async move {
                            let mut body = request.into_body();
                            let mut all = Vec::new();
                            while let Some(chunk) = body.data().await {
                                let chunk = chunk.unwrap();
                                let _ = body.flow_control().release_capacity(chunk.len());
                                all.extend_from_slice(&chunk);
                            }
                            bodies.lock().unwrap().push(Bytes::from(all));
                            let head = http::Response::builder()
                                .status(200)
                                .header("content-type", "application/json")
                                .body(())
                                .unwrap();
                            let mut send = respond.send_response(head, false).unwrap();
                            let _ = send.send_data(Bytes::from_static(ANSWER.as_bytes()), true);
                        });
                    }
                });
            }
        });
        Refusing {
            addr,
            tls,
            refused,
            bodies,
        }
    }
}

#[tokio::test]
async fn a_request_an_h2_provider_refused_unread_is_sent_again() {
    let provider = Refusing::start(2).await;
    let sluice = trusting(&format!("https://{}", provider.addr), &provider.tls);
    let turn = spilled_turn(false);
    let resp = post(&sluice, CHAT, &turn).await;
    assert_eq!(resp.status(), 200, "{}", sluice.logs().join("\n"));
    assert_eq!(provider.refused.load(Ordering::SeqCst), 2);
    let bodies = provider.bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 1, "answered once");
    let forwarded: Value = serde_json::from_slice(&bodies[0]).unwrap();
    let content = forwarded["messages"][2]["content"].as_str().unwrap();
    assert!(content.contains("artifact://"), "the projected body, whole");
    // Refused three times: the client gets the provider's refusal as a 502, and no retry loop.
    let provider = Refusing::start(3).await;
    let sluice = trusting(&format!("https://{}", provider.addr), &provider.tls);
    let resp = post(&sluice, CHAT, &turn).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(provider.refused.load(Ordering::SeqCst), 3);
    assert!(provider.bodies.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_proxy_the_environment_names_carries_the_requests_it_covers() {
    let proxy = MockUpstream::start();
    let proxy_url = proxy.base_url();
    // The provider's host does not resolve: only the proxy can reach it.
    let sluice = Sluice::start_with(
        &config_for("http://provider.invalid", ""),
        &[
            ("HTTP_PROXY", proxy_url.as_str()),
            ("NO_PROXY", "127.0.0.1"),
        ],
    );
    let resp = post(&sluice, CHAT, &spilled_turn(false)).await;
    assert_eq!(resp.status(), 200, "{}", sluice.logs().join("\n"));
    let seen = proxy.last();
    assert_eq!(seen.uri, "http://provider.invalid/v1/chat/completions");
    assert!(seen.json()["messages"][2]["content"]
        .as_str()
        .unwrap()
        .contains("artifact://"));
    // Streamed through the proxy, whole.
    let resp = post(&sluice, CHAT, &spilled_turn(true)).await;
    let mut body = resp.bytes_stream();
    let mut text = Vec::new();
    while let Some(chunk) = body.next().await {
        text.extend_from_slice(&chunk.unwrap());
    }
    assert!(String::from_utf8(text).unwrap().contains("[DONE]"));
    // A destination NO_PROXY names is reached directly.
    let direct = MockUpstream::start();
    let sluice = Sluice::start_with(
        &config_for(&direct.base_url(), ""),
        &[
            ("HTTP_PROXY", proxy_url.as_str()),
            ("NO_PROXY", "127.0.0.1"),
        ],
    );
    let before = proxy.requests().len();
    let resp = post(&sluice, CHAT, &spilled_turn(false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(direct.requests().len(), 1);
    assert_eq!(proxy.requests().len(), before);
    let metrics = sluice.metrics().await;
    assert_eq!(
        metric(&metrics, "sluice_requests_total{dialect=\"openai-chat\""),
        1.0
    );
}
