//! One tenant cannot starve the others (`[limits]`, docs/reliability.md "Tenants"): a request
//! over its tenant's share gets 429 in its dialect's shape with `retry-after`, before its body
//! is read, while another tenant's requests go through; sluice's own endpoints refuse a bearer
//! with nothing after it (401, S3).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::time::Duration;

use common::mock::{MockUpstream, Reply};
use common::{client, config_for, metric, Sluice};
use futures_util::StreamExt;
use serde_json::{json, Value};

const MESSAGES: &str = "/v1/messages";
const CHAT: &str = "/v1/chat/completions";

fn messages(stream: bool) -> Value {
    json!({"model": "claude-x", "max_tokens": 5, "stream": stream,
        "messages": [{"role": "user", "content": "hi"}]})
}

async fn send(sluice: &Sluice, path: &str, key: &str, body: &Value) -> reqwest::Response {
    client()
        .post(sluice.url(path))
        .bearer_auth(key)
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap()
}

fn retry_after(resp: &reqwest::Response) -> u64 {
    resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// SPEC 9.1 `tenant_concurrency = 4`: four streams of one tenant held open upstream; its fifth
/// request gets 429 (Anthropic's `rate_limit_error`, OpenAI's `requests`) with `retry-after`
/// and never reaches the provider, while another tenant is served; once the streams end the
/// tenant is served again.
#[tokio::test]
async fn a_fifth_concurrent_request_of_one_tenant_gets_429_and_another_tenant_is_served() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(
        &mock.base_url(),
        "[limits]\ntenant_concurrency = 4",
    ));
    mock.script((0..4).map(|_| Reply::Gate { events: 1 }));
    let mut open = Vec::new();
    for _ in 0..4 {
        let resp = send(&sluice, MESSAGES, "sk-noisy", &messages(true)).await;
        assert_eq!(resp.status(), 200);
        let mut body = resp.bytes_stream();
        // The first event is here: the request is under way, its head long since answered.
        assert!(body.next().await.unwrap().is_ok());
        open.push(body);
    }
    assert_eq!(mock.requests().len(), 4);
    // docs/metrics.md: the busy tenant has its own series while its requests are in flight.
    let m = sluice.metrics().await;
    assert_eq!(metric(&m, "sluice_tenant_inflight_requests{tenant=\""), 4.0);
    let refused = send(&sluice, MESSAGES, "sk-noisy", &messages(false)).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(retry_after(&refused), 1);
    // Anthropic's own request-limit headers: the share, none left, free again at an RFC 3339
    // time a second or so from now.
    let h = refused.headers();
    assert_eq!(h["anthropic-ratelimit-requests-limit"], "4");
    assert_eq!(h["anthropic-ratelimit-requests-remaining"], "0");
    let reset = h["anthropic-ratelimit-requests-reset"].to_str().unwrap();
    assert!(
        reset.len() == 20 && reset.ends_with('Z') && reset.as_bytes()[10] == b'T',
        "{reset}"
    );
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    let refused = send(
        &sluice,
        CHAT,
        "sk-noisy",
        &json!({"model": "gpt-x",
        "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(refused.status(), 429);
    // OpenAI's: the wait as a duration.
    let h = refused.headers();
    assert_eq!(h["x-ratelimit-limit-requests"], "4");
    assert_eq!(h["x-ratelimit-remaining-requests"], "0");
    assert_eq!(h["x-ratelimit-reset-requests"], "1s");
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["error"]["type"], "requests", "{v}");
    assert_eq!(v["error"]["code"], "tenant_limited", "{v}");
    assert_eq!(
        mock.requests().len(),
        4,
        "refused requests reach no provider"
    );
    // Another tenant is not held back.
    let quiet = send(&sluice, MESSAGES, "sk-quiet", &messages(false)).await;
    assert_eq!(quiet.status(), 200);
    // The streams end; their places are given back.
    for _ in 0..4 {
        mock.release();
    }
    for mut body in open {
        while let Some(chunk) = body.next().await {
            chunk.unwrap();
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let again = send(&sluice, MESSAGES, "sk-noisy", &messages(false)).await;
    assert_eq!(again.status(), 200);
    let m = sluice.metrics().await;
    assert_eq!(
        metric(&m, "sluice_tenant_rejected_total{reason=\"concurrency\"}"),
        2.0
    );
    assert_eq!(metric(&m, "sluice_tenant_inflight_requests{"), 0.0, "{m}");
    assert_eq!(
        metric(&m, "sluice_tenant_rejected_total{reason=\"rate\"}"),
        0.0
    );
}

/// SPEC 9.1 `tenant_requests_per_second` and `tenant_burst`: a burst of two at once, then the
/// third is refused with the seconds until the bucket has a token; another tenant has its own.
#[tokio::test]
async fn a_tenant_over_its_rate_is_told_when_to_come_back() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(
        &mock.base_url(),
        "[limits]\ntenant_requests_per_second = 0.2\ntenant_burst = 2",
    ));
    for _ in 0..2 {
        let resp = send(&sluice, MESSAGES, "sk-loop", &messages(false)).await;
        assert_eq!(resp.status(), 200);
    }
    let refused = send(&sluice, MESSAGES, "sk-loop", &messages(false)).await;
    assert_eq!(refused.status(), 429);
    // At 0.2 per second an empty bucket has its next token within five seconds.
    let wait = retry_after(&refused);
    assert!((4..=5).contains(&wait), "retry-after {wait}");
    let other = send(&sluice, MESSAGES, "sk-other", &messages(false)).await;
    assert_eq!(other.status(), 200);
    assert_eq!(mock.requests().len(), 3);
    let m = sluice.metrics().await;
    assert_eq!(
        metric(&m, "sluice_tenant_rejected_total{reason=\"rate\"}"),
        1.0
    );
}

/// S3: `Authorization: Bearer ` with nothing after it names no tenant: sluice's artifact and
/// read endpoints answer 401, as without the header, never 404 as if it were a key.
#[tokio::test]
async fn an_empty_bearer_gets_401_on_sluices_own_endpoints() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    for path in [
        "/v1/sluice/artifacts/t_0123456789abcdef0123456789abcdef",
        "/v1/sluice/read?cursor=abc",
    ] {
        for value in ["Bearer ", "Bearer", "bearer \t"] {
            let resp = client()
                .get(sluice.url(path))
                .header("authorization", value)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 401, "{path} with {value:?}");
        }
    }
}

/// One request on a raw keep-alive connection: its response head has arrived, so the
/// connection is open and served, and stays open for what follows.
async fn hold_connection(addr: &str) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: sluice\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    assert!(head.starts_with(b"HTTP/1.1 "), "{head:?}");
    stream
}

/// SPEC 9.1 `address_connections = 2`: before a tenant is known, a source address holding two
/// connections has its third answered with a bare 429 and `retry-after` (a client reads it,
/// no reset), counted as `reason="address"`; once one of the two closes, it is served again.
#[tokio::test]
async fn a_source_address_past_its_connections_is_answered_429_and_closed() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(
        &mock.base_url(),
        "[limits]\naddress_connections = 2",
    ));
    let url = sluice.url("");
    let addr = url.trim_start_matches("http://");
    let first = hold_connection(addr).await;
    let _second = hold_connection(addr).await;
    let refused = send(&sluice, MESSAGES, "sk-any", &messages(false)).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(retry_after(&refused), 1);
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    assert!(mock.requests().is_empty());
    drop(first);
    // The closed connection's place comes back once sluice has seen it close.
    let mut status = 0;
    for _ in 0..50 {
        status = send(&sluice, MESSAGES, "sk-any", &messages(false))
            .await
            .status()
            .as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 200);
    let m = sluice.metrics().await;
    assert!(metric(&m, "sluice_tenant_rejected_total{reason=\"address\"}") >= 1.0);
}

/// SPEC 9.1 `tenant_inflight_body_bytes`: a tenant whose bodies already hold its share has its
/// next body refused with 429 (`reason="body"`) as soon as its declared length says it would
/// pass it, without waiting for room; another tenant's body of the same size is served.
#[tokio::test]
async fn a_tenant_holding_its_body_share_gets_429_and_another_tenant_is_served() {
    use tokio::io::AsyncWriteExt;
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(
        &mock.base_url(),
        "max_body_bytes = 1048576\nmax_inflight_body_bytes = 8388608\n\
         [limits]\ntenant_inflight_body_bytes = 1048576",
    ));
    // One body of a megabyte declared and only begun: it holds the tenant's whole share.
    let url = sluice.url("");
    let mut slow = tokio::net::TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap();
    slow.write_all(
        b"POST /v1/messages HTTP/1.1\r\nhost: sluice\r\nauthorization: Bearer sk-big\r\n\
          anthropic-version: 2023-06-01\r\ncontent-type: application/json\r\n\
          content-length: 1048576\r\n\r\n{\"model\":",
    )
    .await
    .unwrap();
    // Its head read, it is in flight, and its share was taken in the same step: from here no
    // other body of the tenant can take part of the share first.
    let mut admitted = false;
    for _ in 0..200 {
        let m = sluice.metrics().await;
        if metric(&m, "sluice_tenant_inflight_requests{tenant=\"") == 1.0 {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(admitted, "the slow body is in flight");
    let padded = |n: usize| {
        let mut body = messages(false);
        body["metadata"] = json!({"user_id": "x".repeat(n)});
        body
    };
    let refused = send(&sluice, MESSAGES, "sk-big", &padded(300_000)).await;
    assert_eq!(
        refused.status(),
        429,
        "a body past the tenant's share is refused"
    );
    assert_eq!(retry_after(&refused), 1);
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    let other = send(&sluice, MESSAGES, "sk-small", &padded(300_000)).await;
    assert_eq!(other.status(), 200);
    let m = sluice.metrics().await;
    assert!(metric(&m, "sluice_tenant_rejected_total{reason=\"body\"}") >= 1.0);
    // The slow body's share comes back once its connection ends.
    drop(slow);
    let mut status = 0;
    for _ in 0..50 {
        status = send(&sluice, MESSAGES, "sk-big", &padded(300_000))
            .await
            .status()
            .as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 200);
}

/// Connections past `max_connections` (docs/reliability.md "Tenants"): at the cap, a newcomer is
/// served once the connection idle the longest has been idle for the shedder's grace (1 s) and
/// is closed for it, not the newer idle one; without shedding the newcomer would wait in the
/// listen queue for as long as the idle clients keep their connections.
#[tokio::test]
async fn at_the_connection_cap_the_oldest_idle_connection_makes_room() {
    use tokio::io::AsyncReadExt;
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(&mock.base_url(), "max_connections = 2"));
    let url = sluice.url("");
    let addr = url.trim_start_matches("http://");
    let mut oldest = hold_connection(addr).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut newer = hold_connection(addr).await;
    let served = tokio::time::timeout(
        Duration::from_secs(10),
        send(&sluice, MESSAGES, "sk-new", &messages(false)),
    )
    .await
    .expect("the newcomer is served without waiting for the idle clients");
    assert_eq!(served.status(), 200);
    // The oldest idle connection was closed: what is left of its answer, then the end.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), oldest.read_to_end(&mut rest)).await;
    assert!(
        matches!(read, Ok(Ok(_))),
        "the oldest idle connection is closed"
    );
    // The newer one is still open: the rest of its answer, then no end.
    let mut byte = [0u8; 256];
    let open = loop {
        match tokio::time::timeout(Duration::from_millis(300), newer.read(&mut byte)).await {
            Err(_) => break true,
            Ok(Ok(0)) | Ok(Err(_)) => break false,
            Ok(Ok(_)) => continue,
        }
    };
    assert!(open, "the newer idle connection is kept");
    let m = sluice.metrics().await;
    assert_eq!(metric(&m, "sluice_connections_shed_total"), 1.0);
}
