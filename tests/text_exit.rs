//! End-to-end: the text exit (SPEC section 3) through the real binary. Long tool results are
//! spilled to artifacts and shown as a page and a notice; pages are read on with the cursor.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use common::{client, config_for, get_as, metric, post_as, tool_output, MockUpstream, Sluice};
use serde_json::{json, Value};

const KEY: &str = "sk-tenant-a";

fn chat_with(output: &str) -> Value {
    json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "build it"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\":\"cargo test\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": output}
    ]})
}

fn utf16(s: &str) -> usize {
    s.encode_utf16().count()
}

/// The cursor in a notice: `{"cursor":"…"}`.
fn cursor_in(text: &str) -> Option<String> {
    let at = text.rfind("{\"cursor\":\"")? + 11;
    Some(text[at..].split('"').next()?.to_string())
}

fn artifact_in(text: &str) -> String {
    let at = text.rfind("artifact://").unwrap() + 11;
    text[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect()
}

/// Follows cursors from the first page to the end through the read endpoint; returns the pages.
async fn read_all(sluice: &Sluice, key: &str, first_cursor: String) -> Vec<String> {
    let mut pages = Vec::new();
    let mut cursor = Some(first_cursor);
    while let Some(c) = cursor.take() {
        let resp = get_as(sluice, &format!("/v1/sluice/read?cursor={c}"), key).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "text/plain; charset=utf-8");
        let next = resp
            .headers()
            .get("x-sluice-next-cursor")
            .map(|v| v.to_str().unwrap().to_string());
        let page = resp.text().await.unwrap();
        assert_eq!(
            next,
            cursor_in(&page),
            "the header and the notice name the same cursor"
        );
        pages.push(page);
        cursor = next;
        assert!(pages.len() < 1000);
    }
    pages
}

/// The page bodies put back together (each page's notice line removed).
fn join_pages(first: &str, rest: &[String]) -> String {
    let mut text = String::new();
    for page in std::iter::once(first).chain(rest.iter().map(String::as_str)) {
        let cut = page.rfind("\n[sluice: ").unwrap();
        text.push_str(&page[..=cut]);
        // A page that ends inside a line did not end with a newline of its own.
        if page[cut..].contains("continues)") {
            text.pop();
        }
    }
    text
}

#[tokio::test]
async fn a_long_result_is_spilled_paged_and_read_back_whole_t1_t8() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let output = tool_output(350_000);
    let resp = post_as(&sluice, "/v1/chat/completions", KEY, &chat_with(&output)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-sluice-projection"],
        "spilled=1; embedded=0; deferred=0; refused=0; placeholders=0"
    );
    let seen = mock.last().json();
    let shown = seen["messages"][2]["content"].as_str().unwrap().to_string();
    // T1: within 2000 lines and 30,000 UTF-16 units, body and notice together.
    assert!(utf16(&shown) <= 30_000, "{} units", utf16(&shown));
    assert!(shown.lines().count() <= 2000);
    assert!(output.starts_with(&shown[..shown.rfind("\n[sluice: ").unwrap()]));
    // Everything else in the request is as the client sent it.
    assert_eq!(seen["messages"][1], chat_with(&output)["messages"][1]);
    let notice = shown.lines().last().unwrap();
    assert!(notice.starts_with("[sluice: lines 1-"), "{notice}");
    assert!(
        notice.contains("call sluice_read with {\"cursor\":\""),
        "{notice}"
    );
    // The whole output is the artifact.
    let id = artifact_in(&shown);
    let whole = get_as(&sluice, &format!("/v1/sluice/artifacts/{id}"), KEY).await;
    assert_eq!(whole.status(), 200);
    assert_eq!(whole.headers()["content-type"], "text/plain; charset=utf-8");
    assert_eq!(whole.text().await.unwrap(), output);
    // Reading on: every page within budget, the last without a cursor, the text exact.
    let pages = read_all(&sluice, KEY, cursor_in(&shown).unwrap()).await;
    assert!(pages.len() >= 10, "{} pages", pages.len());
    for page in &pages {
        assert!(utf16(page) <= 30_000 && page.lines().count() <= 2000);
    }
    assert!(pages
        .last()
        .unwrap()
        .ends_with(&format!("end of artifact://{id}]")));
    assert_eq!(join_pages(&shown, &pages), output);
    let metrics = sluice.metrics().await;
    assert_eq!(metric(&metrics, "sluice_spills_total{"), 1.0);
    assert!(metric(&metrics, "sluice_spilled_bytes_total{") >= 350_000.0);
    // T6: reading made no new artifact.
    assert_eq!(metric(&metrics, "sluice_spills_total{"), 1.0);
}

/// T5, #39: a result over 8 MiB is paged from ranges of its file, never read whole: the text's
/// index is built from two 8 MiB ranges, then each page costs one range of about 150 KB; every
/// page is the one the whole text gives, and the pages put together are the output.
#[tokio::test]
async fn a_text_over_8_mib_is_paged_from_ranges_t5() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let output = tool_output(9_000_000);
    let resp = post_as(&sluice, "/v1/chat/completions", KEY, &chat_with(&output)).await;
    assert_eq!(resp.status(), 200);
    let shown = mock.last().json()["messages"][2]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let pages = read_all(&sluice, KEY, cursor_in(&shown).unwrap()).await;
    assert!(
        join_pages(&shown, &pages) == output,
        "the pages are the output"
    );
    let count = |metrics: &str, op: &str| {
        metric(
            metrics,
            &format!("sluice_artifact_store_seconds_count{{op=\"{op}\",result=\"ok\"}}"),
        )
    };
    let metrics = sluice.metrics().await;
    assert_eq!(count(&metrics, "get"), 0.0, "never read whole");
    assert_eq!(count(&metrics, "range"), 2.0 + pages.len() as f64);
    common::pages_match_the_whole_text(&sluice, KEY, &output, &cursor_in(&shown).unwrap()).await;
}

#[tokio::test]
async fn the_same_result_projects_identically_every_turn_and_after_a_restart_t7() {
    let mock = MockUpstream::start();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_string();
    let config = config_for(&mock.base_url(), "");
    let env = [("SLUICE_STORE__DATA_DIR", data.as_str())];
    let output = tool_output(120_000);
    let body = chat_with(&output);
    let first = {
        let sluice = Sluice::start_with(&config, &env);
        post_as(&sluice, "/v1/chat/completions", KEY, &body).await;
        post_as(&sluice, "/v1/chat/completions", KEY, &body).await;
        let requests = mock.requests();
        assert_eq!(
            requests[0].body, requests[1].body,
            "byte-identical turn to turn"
        );
        requests[0].body.clone()
    };
    let sluice = Sluice::start_with(&config, &env);
    post_as(&sluice, "/v1/chat/completions", KEY, &body).await;
    assert_eq!(mock.last().body, first, "byte-identical after a restart");
    let metrics = sluice.metrics().await;
    assert_eq!(
        metric(&metrics, "sluice_spills_total{"),
        1.0,
        "stored again, same id"
    );
}

#[tokio::test]
async fn results_within_budget_and_requests_without_spills_are_untouched_t3() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    // 2000 lines exactly, each with escapes (quotes) that make the raw JSON longer than the text.
    let output: String = (0..2000).map(|i| format!("\"q{i}\"\n")).collect();
    let body = serde_json::to_vec(&chat_with(&output)).unwrap();
    let resp = client()
        .post(sluice.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.headers()["x-sluice-projection"],
        "spilled=0; embedded=0; deferred=0; refused=0; placeholders=0"
    );
    assert_eq!(&mock.last().body[..], &body[..], "P1: byte-identical");
}

#[tokio::test]
async fn responses_and_anthropic_results_are_spilled_in_their_own_shapes() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let output = tool_output(80_000);
    let responses = json!({"model": "gpt-5", "input": [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "fc1", "name": "bash", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "fc1", "output": [{"type": "input_text", "text": output}]}
    ]});
    post_as(&sluice, "/v1/responses", KEY, &responses).await;
    let seen = mock.last().json();
    let out = &seen["input"][2]["output"];
    assert_eq!(out.as_array().unwrap().len(), 1);
    assert_eq!(out[0]["type"], "input_text");
    assert!(utf16(out[0]["text"].as_str().unwrap()) <= 30_000);
    let anthropic = json!({"model": "claude-x", "max_tokens": 10, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "tu1", "name": "bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": output, "cache_control": {"type": "ephemeral"}}]}
    ]});
    let resp = post_as(&sluice, "/v1/messages", KEY, &anthropic).await;
    assert_eq!(resp.status(), 200);
    let seen = mock.last().json();
    let block = &seen["messages"][2]["content"][0];
    assert_eq!(
        block["cache_control"]["type"], "ephemeral",
        "P2: markers survive"
    );
    let shown = block["content"].as_str().unwrap();
    assert!(utf16(shown) <= 30_000);
    // One text, two dialects, one tenant: one artifact.
    assert_eq!(
        artifact_in(shown),
        artifact_in(out[0]["text"].as_str().unwrap())
    );
}

#[tokio::test]
async fn other_tenants_and_bad_cursors_get_clear_errors_s3() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    post_as(
        &sluice,
        "/v1/chat/completions",
        KEY,
        &chat_with(&tool_output(60_000)),
    )
    .await;
    let shown = mock.last().json()["messages"][2]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let (id, cursor) = (artifact_in(&shown), cursor_in(&shown).unwrap());
    let base = sluice.url("");
    let get = |path: String, key: &'static str| {
        let url = format!("{base}{path}");
        async move {
            client()
                .get(url)
                .header("x-api-key", key)
                .send()
                .await
                .unwrap()
        }
    };
    // Another tenant: 404 for the artifact and for the cursor.
    assert_eq!(
        get(format!("/v1/sluice/artifacts/{id}"), "sk-tenant-b")
            .await
            .status(),
        404
    );
    assert_eq!(
        get(format!("/v1/sluice/read?cursor={cursor}"), "sk-tenant-b")
            .await
            .status(),
        404
    );
    // The owner, by either header.
    assert_eq!(
        get(format!("/v1/sluice/artifacts/{id}"), KEY)
            .await
            .status(),
        200
    );
    // A malformed cursor: 400 in the caller's dialect shape.
    let resp = get("/v1/sluice/read?cursor=not-a-cursor".into(), KEY).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        v["type"], "error",
        "x-api-key callers get Anthropic's shape"
    );
    let resp = get_as(&sluice, "/v1/sluice/read", KEY).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "bad_cursor");
    // A forged cursor (one character changed): 404, like a foreign one.
    let mut forged: Vec<char> = cursor.chars().collect();
    forged[10] = if forged[10] == 'A' { 'B' } else { 'A' };
    let forged: String = forged.into_iter().collect();
    assert_eq!(
        get(format!("/v1/sluice/read?cursor={forged}"), KEY)
            .await
            .status(),
        404
    );
    // Unknown and malformed artifact ids.
    assert_eq!(
        get(format!("/v1/sluice/artifacts/t{}", "A".repeat(32)), KEY)
            .await
            .status(),
        404
    );
    assert_eq!(
        get("/v1/sluice/artifacts/..%2F..%2Fetc".into(), KEY)
            .await
            .status(),
        404
    );
}

#[tokio::test]
async fn a_missing_artifact_is_404_not_a_crash() {
    let mock = MockUpstream::start();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_string();
    let config = config_for(&mock.base_url(), "");
    let env = [("SLUICE_STORE__DATA_DIR", data.as_str())];
    let cursor = {
        let sluice = Sluice::start_with(&config, &env);
        post_as(
            &sluice,
            "/v1/chat/completions",
            KEY,
            &chat_with(&tool_output(60_000)),
        )
        .await;
        cursor_in(
            mock.last().json()["messages"][2]["content"]
                .as_str()
                .unwrap(),
        )
        .unwrap()
    };
    std::fs::remove_dir_all(dir.path().join("artifacts")).unwrap();
    let sluice = Sluice::start_with(&config, &env);
    let resp = get_as(&sluice, &format!("/v1/sluice/read?cursor={cursor}"), KEY).await;
    assert_eq!(resp.status(), 404);
}

#[test]
fn an_unusable_data_dir_stops_startup_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let config = config_for("http://127.0.0.1:9", "");
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, config).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(&path)
        .env("SLUICE_STORE__DATA_DIR", &file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(
        log.contains("store.data_dir") && log.contains("a-file"),
        "{log}"
    );
}

#[tokio::test]
async fn a_full_disk_fails_the_request_cleanly() {
    // A 256 KiB tmpfs as the data dir: the spill of a 1 MB output cannot be written. Needs root
    // (CI runs as root); elsewhere this test says so and checks nothing.
    let dir = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(dir.path())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs here (not root)");
        return;
    }
    let mock = MockUpstream::start();
    let data = dir.path().to_str().unwrap().to_string();
    let sluice = Sluice::start_with(
        &config_for(&mock.base_url(), ""),
        &[("SLUICE_STORE__DATA_DIR", data.as_str())],
    );
    let resp = post_as(
        &sluice,
        "/v1/chat/completions",
        KEY,
        &chat_with(&tool_output(1_000_000)),
    )
    .await;
    assert_eq!(resp.status(), 503);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "store_unavailable");
    assert!(
        mock.requests().is_empty(),
        "nothing forwarded with a broken reference"
    );
    // A request with nothing to spill still goes through.
    let resp = post_as(&sluice, "/v1/chat/completions", KEY, &chat_with("short")).await;
    assert_eq!(resp.status(), 200);
    drop(sluice);
    let _ = std::process::Command::new("umount")
        .arg(dir.path())
        .status();
}
