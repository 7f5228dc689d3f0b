//! Artifacts in S3-compatible object storage (`[store.blobs] backend = "s3"`, issue #39) with
//! the embedded state store: a sidecar whose disk holds only session state. Needs an S3
//! endpoint in `SLUICE_TEST_S3` with a bucket `sluice` and the credentials in the AWS
//! environment (`.ci/run` starts SeaweedFS on 127.0.0.1:8333): run with
//! `cargo test --test blobs -- --ignored`. Covered: the object in the bucket before the
//! reference goes out (T3), read by any sidecar, written once, tenant-scoped (S3); the bucket
//! down or hung (bounded wait, 503, nothing forwarded); idle expiry and its refresh (S2); a
//! large download streamed. The shared-mode suite (tests/shared.rs) runs on S3 blobs too.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::time::{Duration, Instant};

use common::{client, config_for, tool_output, MockUpstream, Sluice};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use serde_json::{json, Value};

fn endpoint() -> String {
    std::env::var("SLUICE_TEST_S3").unwrap_or_else(|_| "http://127.0.0.1:8333".into())
}

/// A config with the embedded state in its own data dir and artifacts under `prefix` at
/// `endpoint`.
fn config(mock: &MockUpstream, endpoint: &str, prefix: &str) -> String {
    config_for(
        &mock.base_url(),
        &format!("[store.blobs]\nbackend = \"s3\"\nendpoint = \"{endpoint}\"\nbucket = \"sluice\"\nprefix = \"{prefix}\"\n"),
    )
}

/// The test's own view of the bucket, with the same credentials.
fn bucket() -> object_store::aws::AmazonS3 {
    AmazonS3Builder::from_env()
        .with_bucket_name("sluice")
        .with_region("us-east-1")
        .with_endpoint(endpoint())
        .with_allow_http(true)
        .build()
        .unwrap()
}

fn spilling(output: &str) -> Value {
    json!({"model": "gpt-4o", "messages": [
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": output}]})
}

/// The artifact id the forwarded request names.
fn artifact_of(mock: &MockUpstream) -> String {
    let shown = mock.last().json()["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let at = shown.rfind("artifact://").unwrap() + 11;
    shown[at..].chars().take(33).collect()
}

async fn post(sluice: &Sluice, key: &str, body: &Value) -> reqwest::Response {
    client()
        .post(sluice.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap()
}

/// Where the artifact `id` of the tenant of `key` lives in the bucket, under `prefix`.
fn object_of(prefix: &str, key: &str, id: &str) -> Path {
    let tenant = sluice::tenant::Tenant::from_credential(key.as_bytes());
    Path::from(format!("{prefix}{}/{id}", tenant.namespace()))
}

/// `GET /v1/sluice/artifacts/{id}` from `sluice` as the tenant of `key`.
async fn download(sluice: &Sluice, key: &str, id: &str) -> reqwest::Response {
    client()
        .get(sluice.url(&format!("/v1/sluice/artifacts/{id}")))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
}

/// T3, S1-S3 on S3: a spilled output is an object in the bucket before the request goes out
/// (nothing under the data dir), read back through this sidecar and through another with a
/// data dir of its own; a second write of the same content uploads nothing; another tenant
/// sees nothing.
#[tokio::test]
#[ignore = "needs an S3 endpoint: cargo test --test blobs -- --ignored"]
async fn spilled_outputs_live_in_the_bucket_and_any_sidecar_reads_them() {
    let prefix = format!("blobs-{}/", uuid::Uuid::new_v4().simple());
    let mock = MockUpstream::start();
    let one = Sluice::start(&config(&mock, &endpoint(), &prefix));
    let key = "sk-blobs";
    let output = tool_output(120_000);
    let resp = post(&one, key, &spilling(&output)).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["x-sluice-projection"]
        .to_str()
        .unwrap()
        .starts_with("spilled=1"));
    let id = artifact_of(&mock);
    let object = object_of(&prefix, key, &id);
    let store = bucket();
    let first = store
        .head(&object)
        .await
        .expect("the artifact is in the bucket");
    assert_eq!(first.size, output.len() as u64);
    let local = one.data_dir().join("artifacts");
    let files = walk(&local);
    assert!(
        files.is_empty(),
        "no artifact on the sidecar's disk: {files:?}"
    );

    let other = Sluice::start(&config(&mock, &endpoint(), &prefix));
    for sluice in [&one, &other] {
        let got = download(sluice, key, &id).await;
        assert_eq!(got.status(), 200);
        assert!(got.text().await.unwrap() == output);
    }
    let stranger = download(&other, "sk-stranger", &id).await;
    assert_eq!(stranger.status(), 404, "S3: another tenant sees nothing");
    // The other sidecar has never written it: its spill of the same output finds the object.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(post(&other, key, &spilling(&output)).await.status(), 200);
    let again = store.head(&object).await.unwrap();
    assert_eq!(again.last_modified, first.last_modified, "no second upload");
    assert_eq!(again.e_tag, first.e_tag);
}

/// Object storage down (a port nothing listens on) or hung (a server that accepts and never
/// answers): a request that needs a new artifact fails within the bounded wait with the
/// documented 503 `store_unavailable` in its dialect's shape, and nothing is forwarded; a
/// request that spills nothing goes on as before.
#[tokio::test]
#[ignore = "needs an S3 endpoint: cargo test --test blobs -- --ignored"]
async fn with_the_bucket_down_or_hung_a_spill_fails_cleanly_and_the_rest_goes_on() {
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_at = format!("http://{}", hung.local_addr().unwrap());
    let held = std::thread::spawn(move || {
        // Accepts and keeps every connection open, answering nothing.
        let mut open = Vec::new();
        for conn in hung.incoming().take(8) {
            open.push(conn);
        }
    });
    for endpoint in ["http://127.0.0.1:9", hung_at.as_str()] {
        bucket_unavailable(endpoint).await;
    }
    drop(held);
}

async fn bucket_unavailable(endpoint: &str) {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, endpoint, "down/"));
    let before = mock.requests().len();
    let started = Instant::now();
    let resp = post(&sluice, "sk-down", &spilling(&tool_output(120_000))).await;
    let waited = started.elapsed();
    assert_eq!(resp.status(), 503);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    assert!(
        waited < sluice::store::s3::S3_WAIT + Duration::from_secs(3),
        "{endpoint}: {waited:?}"
    );
    assert_eq!(mock.requests().len(), before, "nothing was forwarded");
    let small = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]});
    assert_eq!(post(&sluice, "sk-down", &small).await.status(), 200);
    if endpoint.ends_with(":9") {
        let ready = client()
            .get(sluice.admin_url("/readyz"))
            .send()
            .await
            .unwrap();
        assert_eq!(ready.status(), 503, "not ready while the bucket is down");
    }
    let text = body.to_string();
    assert!(!text.contains("AWS_SECRET") && !text.contains("sluice-test-secret"));
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// S2 on S3: an artifact still read keeps its object (a read reaching the bucket for one older
/// than a quarter of the idle TTL writes it again); one nobody uses is deleted by sluice's sweep once idle for the
/// TTL. A 3 s TTL stands for the week.
#[tokio::test]
#[ignore = "needs an S3 endpoint: cargo test --test blobs -- --ignored"]
async fn used_artifacts_stay_and_idle_ones_are_swept() {
    let prefix = format!("sweep-{}/", uuid::Uuid::new_v4().simple());
    let mock = MockUpstream::start();
    let sluice = Sluice::start_with(
        &config(&mock, &endpoint(), &prefix),
        &[("SLUICE_STORE__IDLE_TTL_SECONDS", "3")],
    );
    let key = "sk-sweep";
    let mut ids = Vec::new();
    for size in [60_000, 70_000] {
        assert_eq!(
            post(&sluice, key, &spilling(&tool_output(size)))
                .await
                .status(),
            200
        );
        ids.push(artifact_of(&mock));
    }
    let object = |id: &str| object_of(&prefix, key, id);
    let store = bucket();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(7) {
        let got = download(&sluice, key, &ids[0]).await;
        assert_eq!(
            got.status(),
            200,
            "a used artifact is kept ({:?})",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        store.head(&object(&ids[0])).await.is_ok(),
        "still used: kept"
    );
    assert!(
        store.head(&object(&ids[1])).await.is_err(),
        "idle past the TTL: swept"
    );
}

/// A download too large for the in-process cache (here a 12 MB log) is passed on from the
/// bucket as it arrives, with its length, rather than read whole first; a streamed read keeps
/// the object alive as a whole one does (S2: past a quarter of the TTL, here 8 s, it is written
/// again, server-side).
#[tokio::test]
#[ignore = "needs an S3 endpoint: cargo test --test blobs -- --ignored"]
async fn a_large_artifact_is_streamed_from_the_bucket() {
    let prefix = format!("stream-{}/", uuid::Uuid::new_v4().simple());
    let mock = MockUpstream::start();
    let sluice = Sluice::start_with(
        &config(&mock, &endpoint(), &prefix),
        &[("SLUICE_STORE__IDLE_TTL_SECONDS", "8")],
    );
    let key = "sk-stream";
    let output = tool_output(12_000_000);
    assert_eq!(post(&sluice, key, &spilling(&output)).await.status(), 200);
    let id = artifact_of(&mock);
    let got = download(&sluice, key, &id).await;
    assert_eq!(got.status(), 200);
    assert_eq!(got.headers()["content-type"], "text/plain; charset=utf-8");
    assert_eq!(got.content_length(), Some(output.len() as u64));
    assert!(got.text().await.unwrap() == output);
    let streamed = common::metric(
        &sluice.metrics().await,
        "sluice_artifact_store_seconds_count{op=\"stream\",result=\"ok\"}",
    );
    assert_eq!(streamed, 1.0, "read from the bucket as a stream");

    let object = object_of(&prefix, key, &id);
    let store = bucket();
    let written = store.head(&object).await.unwrap().last_modified;
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let again = download(&sluice, key, &id).await;
    assert_eq!(again.content_length(), Some(output.len() as u64));
    assert!(again.text().await.unwrap() == output);
    let renewed = store.head(&object).await.unwrap();
    assert!(
        renewed.last_modified > written,
        "a streamed read renews the object ({written} then {})",
        renewed.last_modified
    );
    assert_eq!(renewed.size, output.len() as u64);
    let sibling = Path::from(format!("{object}.refresh"));
    assert!(store.head(&sibling).await.is_err(), "no copy left behind");
}

/// T5 on S3 (#39): a text over 8 MiB is never fetched whole to be paged. Another sidecar,
/// which has never seen it, builds the text's index from 8 MiB ranges and cuts every page from
/// a window read as a range; each page is the one the whole text gives.
#[tokio::test]
#[ignore = "needs an S3 endpoint: cargo test --test blobs -- --ignored"]
async fn pages_of_a_large_text_are_cut_from_ranges_of_the_object() {
    let prefix = format!("pages-{}/", uuid::Uuid::new_v4().simple());
    let mock = MockUpstream::start();
    let one = Sluice::start(&config(&mock, &endpoint(), &prefix));
    let key = "sk-pages";
    let output = tool_output(12_000_000);
    assert_eq!(post(&one, key, &spilling(&output)).await.status(), 200);
    let cursor = common::cursor_in(
        mock.last().json()["messages"][1]["content"]
            .as_str()
            .unwrap(),
    );
    let other = Sluice::start(&config(&mock, &endpoint(), &prefix));
    common::pages_match_the_whole_text(&other, key, &output, &cursor).await;
    let metrics = other.metrics().await;
    let count = |op: &str| {
        common::metric(
            &metrics,
            &format!("sluice_artifact_store_seconds_count{{op=\"{op}\",result=\"ok\"}}"),
        )
    };
    assert_eq!(count("get"), 0.0, "never read whole");
    // Two ranges build the index (12 MB in 8 MiB), then one a page: 7 pages.
    assert_eq!(count("range"), 2.0 + 7.0);
}
