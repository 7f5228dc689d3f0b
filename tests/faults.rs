//! The fault matrix (issue "reliability"; SPEC A9, P3, P4): every way a provider or a client can
//! fail a request, in all three dialects, streamed and not. Each must leave the session's
//! delivery state untouched (nothing consumed: the `once` image is shown again next time) and
//! give the client a clear outcome. SIGKILL mid-commit is `delivery.rs`'s crash test; a Redis
//! restart is `shared.rs`'s; both run in `.ci/run`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::time::Duration;

use common::{b64, client, config_for, metric, picture, MockUpstream, Reply, Sluice, D, DIALECTS};
use futures_util::StreamExt;
use image::ImageFormat;
use serde_json::{json, Value};

impl D {
    /// A user message with one picture: a `once` attachment.
    fn request(self, stream: bool) -> Value {
        let png = b64(&picture(12, 12, ImageFormat::Png));
        let url = format!("data:image/png;base64,{png}");
        let (key, message) = match self {
            D::Chat => (
                "messages",
                json!({"role": "user", "content": [{"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": url}}]}),
            ),
            D::Responses => (
                "input",
                json!({"role": "user", "content": [{"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": url}]}),
            ),
            D::Anthropic => (
                "messages",
                json!({"role": "user", "content": [{"type": "text", "text": "look"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}]}),
            ),
        };
        let mut body = json!({"model": "m", "max_tokens": 20, "stream": stream});
        body[key] = json!([message]);
        body
    }
}

/// What a fault leaves the client with.
#[derive(Debug, PartialEq)]
enum Seen {
    /// This status, with a whole body.
    Status(u16),
    /// The body broke off (a cut stream).
    Cut,
    /// The client itself went away.
    HungUp,
}

async fn run_fault(sluice: &Sluice, mock: &MockUpstream, d: D, stream: bool, fault: &str) -> Seen {
    let reply = match fault {
        "500" => Reply::Status(
            500,
            json!({"error": {"message": "boom", "type": "server_error"}}).to_string(),
        ),
        "429" => Reply::Status(
            429,
            json!({"error": {"message": "slow down", "type": "rate_limit"}}).to_string(),
        ),
        "529" => Reply::Status(
            529,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
                .to_string(),
        ),
        "timeout" => Reply::StallHead(Duration::from_secs(5)),
        "reset mid-stream" => Reply::CutStream { events: 2 },
        "stall mid-stream" => Reply::StallBody {
            events: 2,
            pause: Duration::from_secs(5),
        },
        "client hang-up" => Reply::Gate { events: 2 },
        other => panic!("no fault {other}"),
    };
    mock.script([reply]);
    let request = client()
        .post(sluice.url(d.path()))
        .bearer_auth("sk-faults")
        .header("x-sluice-session", format!("faults-{d:?}-{stream}"))
        .json(&d.request(stream))
        .send();
    let resp = request.await.unwrap();
    let status = resp.status().as_u16();
    if fault == "client hang-up" {
        let mut body = resp.bytes_stream();
        let _ = body.next().await;
        drop(body);
        // The provider's stream goes away with sluice's upstream connection (no release: a
        // stored release would open the next gate at once).
        tokio::time::sleep(Duration::from_millis(200)).await;
        return Seen::HungUp;
    }
    match resp.bytes().await {
        Ok(_) => Seen::Status(status),
        Err(_) => Seen::Cut,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fault_consumes_delivery_state_a9() {
    let mock = MockUpstream::start();
    let config = config_for(&mock.base_url(), "")
        .replace(
            "first_byte_timeout_seconds = 10",
            "first_byte_timeout_seconds = 1",
        )
        .replace("idle_timeout_seconds = 10", "idle_timeout_seconds = 1");
    let sluice = Sluice::start(&config);
    let faults = [
        ("500", false),
        ("429", false),
        ("529", false),
        ("timeout", false),
        ("reset mid-stream", true),
        ("stall mid-stream", true),
        ("client hang-up", true),
    ];
    let mut cases = 0.0;
    let done = "sluice_commits_total{outcome=\"committed\"}";
    let mut committed = 0.0;
    for d in DIALECTS {
        for (fault, streamed_only) in faults {
            for stream in [false, true] {
                if streamed_only && !stream {
                    continue;
                }
                let seen = run_fault(&sluice, &mock, d, stream, fault).await;
                let case = format!("{d:?} stream={stream} {fault}");
                let want = match fault {
                    "500" => Seen::Status(500),
                    "429" => Seen::Status(429),
                    "529" => Seen::Status(529),
                    "timeout" => Seen::Status(504),
                    "client hang-up" => Seen::HungUp,
                    _ => Seen::Cut,
                };
                assert_eq!(seen, want, "{case}");
                cases += 1.0;
                let m = sluice.metrics().await;
                assert_eq!(
                    metric(&m, done),
                    committed,
                    "{case}: a failed request consumed delivery state"
                );
            }
        }
        // Nothing was consumed: the next successful request still shows the image.
        let resp = client()
            .post(sluice.url(d.path()))
            .bearer_auth("sk-faults")
            .header("x-sluice-session", format!("faults-{d:?}-false"))
            .json(&d.request(false))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let projection = resp.headers()["x-sluice-projection"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(projection.contains("embedded=1"), "{d:?}: {projection}");
        committed += 1.0;
        for _ in 0..200 {
            if metric(&sluice.metrics().await, done) >= committed {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(metric(&sluice.metrics().await, done), committed, "{d:?}");
    }
    let m = sluice.metrics().await;
    assert_eq!(
        metric(&m, "sluice_commits_total{outcome=\"discarded\"}"),
        cases,
        "every fault discarded its delta"
    );
}
