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

/// An HTTP/1.1 provider on raw sockets (plain, or TLS offering only `http/1.1`) that counts the
/// connections it accepted and keeps each request's head as it came. With `hang_up` it closes
/// every connection right after its answer, without saying so: the race a kept connection
/// loses when the provider's keep-alive timer fires.
struct Counting {
    addr: SocketAddr,
    tls: Option<Tls>,
    connections: Arc<AtomicUsize>,
    /// Connections still open (the provider's side has not seen them end).
    open: Arc<AtomicUsize>,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Counting {
    #[allow(clippy::disallowed_methods)] // its tasks end with the test's runtime
    async fn start(tls: bool, hang_up: bool) -> Counting {
        let (tls, acceptor) = if tls {
            let (tls, config) = Tls::new(&[b"http/1.1"]);
            (Some(tls), Some(tokio_rustls::TlsAcceptor::from(config)))
        } else {
            (None, None)
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let (c, o, h) = (connections.clone(), open.clone(), heads.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                o.fetch_add(1, Ordering::SeqCst);
                let (acceptor, open, heads) = (acceptor.clone(), o.clone(), h.clone());
                tokio::spawn(async move {
                    match acceptor {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(tcp).await {
                                answer_all(stream, heads, hang_up).await;
                            }
                        }
                        None => answer_all(tcp, heads, hang_up).await,
                    }
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Counting {
            addr,
            tls,
            connections,
            open,
            heads,
        }
    }

    fn base_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.addr.port())
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Answers each request of one connection with a chat completion, reading its body by its
/// `content-length`.
async fn answer_all<S>(mut stream: S, heads: Arc<Mutex<Vec<String>>>, hang_up: bool)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::new();
    loop {
        let end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut chunk = [0u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        let length: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        while buf.len() < end + length {
            let mut chunk = [0u8; 65536];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..end + length);
        heads.lock().unwrap().push(head);
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: keep-alive\r\nkeep-alive: timeout=5\r\ncontent-length: {}\r\n\r\n{ANSWER}",
            ANSWER.len()
        );
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        let _ = stream.flush().await;
        if hang_up {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

/// A small chat request, streamed or not.
fn small_turn(stream: bool) -> Value {
    json!({"model": "gpt-4o", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn upstream_connections_are_kept_and_used_again_over_http_and_https() {
    for tls in [false, true] {
        let provider = Counting::start(tls, false).await;
        // One worker: every request shares its connections.
        let config = config_for(&provider.base_url(), "worker_threads = 1");
        let sluice = match &provider.tls {
            Some(t) => Sluice::start_with(&config, &[("SSL_CERT_FILE", t.ca.to_str().unwrap())]),
            None => Sluice::start(&config),
        };
        // One after another: every request on the first connection.
        for i in 0..5 {
            let resp = post(&sluice, CHAT, &small_turn(i % 2 == 1)).await;
            assert_eq!(resp.status(), 200);
            let v: Value = resp.json().await.unwrap();
            assert_eq!(v["choices"][0]["message"]["content"], "Hello", "tls {tls}");
        }
        assert_eq!(provider.connections(), 1, "tls {tls}");
        // HTTP/1.1 takes the path alone on the request line, and the provider's own Host.
        let host = format!("host: 127.0.0.1:{}", provider.addr.port());
        for head in provider.heads.lock().unwrap().iter() {
            assert!(
                head.starts_with("POST /v1/chat/completions HTTP/1.1\r\n"),
                "{head}"
            );
            assert_eq!(
                head.to_ascii_lowercase().matches("\r\nhost:").count(),
                1,
                "{head}"
            );
            assert!(head.to_ascii_lowercase().contains(&host), "{head}");
            assert!(
                !head.to_ascii_lowercase().contains("connection: close"),
                "{head}"
            );
        }
        // Eight at once need eight connections; eight more at once use them again.
        let (large, small) = (spilled_turn(false), small_turn(false));
        for round in 0..2 {
            let sends = (0..8).map(|_| post(&sluice, CHAT, &large));
            for resp in futures_util::future::join_all(sends).await {
                assert_eq!(resp.status(), 200, "tls {tls} round {round}");
                resp.bytes().await.unwrap();
            }
        }
        let opened = provider.connections();
        assert!(
            opened <= 8,
            "tls {tls}: {opened} connections for 8 at a time"
        );
        let sends = (0..8).map(|_| post(&sluice, CHAT, &small));
        for resp in futures_util::future::join_all(sends).await {
            assert_eq!(resp.status(), 200);
        }
        // The warm rounds may have needed fewer than eight at their peak (a connection handed
        // back before the last request of a round took one): up to eight in all, never more.
        let now = provider.connections();
        assert!(
            now <= 8,
            "tls {tls}: {now} connections after {opened} warm ones"
        );
    }
}

#[tokio::test]
async fn a_provider_that_hangs_up_after_each_answer_costs_no_request() {
    // Its connections close as soon as they answer: sluice must notice, or send again a request
    // a closed connection did not take, never fail one.
    let provider = Counting::start(false, true).await;
    let sluice = Sluice::start(&config_for(&provider.base_url(), ""));
    for i in 0..20 {
        let resp = post(&sluice, CHAT, &small_turn(i % 2 == 0)).await;
        assert_eq!(resp.status(), 200, "request {i}");
        resp.bytes().await.unwrap();
    }
    assert_eq!(provider.heads.lock().unwrap().len(), 20);
    assert_eq!(provider.connections(), 20);
    let metrics = sluice.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "sluice_requests_total{dialect=\"openai-chat\",route=\"openai\",status=\"200\"}"
        ),
        20.0
    );
}

#[tokio::test]
async fn a_kept_connection_idle_past_the_pool_timeout_is_closed_and_not_used() {
    let provider = Counting::start(false, false).await;
    // One worker, whose pool every request uses.
    let config = config_for(&provider.base_url(), "worker_threads = 1").replace(
        "idle_timeout_seconds = 10",
        "idle_timeout_seconds = 10\npool_idle_timeout_seconds = 0.3",
    );
    let sluice = Sluice::start(&config);
    for _ in 0..2 {
        assert_eq!(post(&sluice, CHAT, &small_turn(false)).await.status(), 200);
    }
    assert_eq!(provider.connections(), 1);
    // Closed once idle past the timeout, with no request to notice it.
    tokio::time::sleep(std::time::Duration::from_millis(900)).await;
    assert_eq!(provider.open.load(Ordering::SeqCst), 0);
    assert_eq!(post(&sluice, CHAT, &small_turn(false)).await.status(), 200);
    assert_eq!(provider.connections(), 2);
    assert_eq!(provider.open.load(Ordering::SeqCst), 1);
}
