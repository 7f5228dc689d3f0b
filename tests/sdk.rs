//! The official OpenAI and Anthropic Python SDKs, streamed and not, through sluice against the
//! mock provider (foundation issue, SPEC P1-P4; text exit, section 3). Needs the SDK virtualenv: run
//! `tests/sdk/run.sh`, which creates it and runs this test; `.ci/run` does.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use common::{
    b64, client, config_for, guard_routes, metric, picture, tool_output, MockUpstream, Sluice,
};
use serde_json::Value;

/// Runs tests/sdk/check.py against `sluice` with `extra` arguments; panics with its output if
/// any check failed.
fn run_script(sluice: &Sluice, extra: &[&str]) {
    let python = std::env::var("SLUICE_SDK_PYTHON")
        .expect("SLUICE_SDK_PYTHON names the virtualenv's python (tests/sdk/run.sh sets it)");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/check.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .arg("--openai-base")
        .arg(sluice.url("/v1"))
        .arg("--anthropic-base")
        .arg(sluice.url(""))
        .args(extra)
        .output()
        .expect("run the SDK script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "SDK checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all SDK checks passed"));
}

#[test]
#[ignore = "needs the SDK virtualenv: run tests/sdk/run.sh"]
fn official_sdks_work_through_sluice() {
    let mock = MockUpstream::start();
    // OpenAI models limited to gpt-*, so the script can meet sluice's own 404 (P4).
    let config =
        config_for(&mock.base_url(), "").replacen("models = [\"*\"]", "models = [\"gpt-*\"]", 1);
    let sluice = Sluice::start(&config);
    run_script(&sluice, &[]);
    // Every SDK call reached the mock, through the dialect's own path, with the SDK's headers.
    let requests = mock.requests();
    let count = |path: &str| requests.iter().filter(|r| r.uri.starts_with(path)).count();
    assert_eq!(count("/v1/chat/completions"), 6);
    assert_eq!(count("/v1/responses"), 5);
    assert_eq!(count("/v1/messages/count_tokens"), 1);
    assert_eq!(count("/v1/messages"), 7);
    // The credential arrives as the SDK sent it (newer Anthropic SDKs use a bearer token).
    let anthropic_key = |r: &&common::mock::Recorded| {
        r.headers
            .get("x-api-key")
            .is_some_and(|v| v == "sk-ant-test")
            || r.headers
                .get("authorization")
                .is_some_and(|v| v == "Bearer sk-ant-test")
    };
    assert!(requests
        .iter()
        .filter(|r| r.uri.starts_with("/v1/messages"))
        .all(|r| anthropic_key(&r) && r.headers.contains_key("anthropic-version")));
    assert!(requests
        .iter()
        .filter(|r| r.uri.starts_with("/v1/chat") || r.uri.starts_with("/v1/responses"))
        .all(|r| r.headers["authorization"] == "Bearer sk-test"));
}

/// The tool result text each request carried, by dialect.
fn tool_text(uri: &str, body: &Value) -> String {
    let v = match uri {
        "/v1/chat/completions" => &body["messages"][2]["content"],
        "/v1/responses" => &body["input"][2]["output"],
        _ => &body["messages"][2]["content"][0]["content"],
    };
    v.as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

/// Text exit (SPEC section 3) with the official SDKs: a 350 KB tool output reaches the mock
/// within budget with a working cursor, the artifact endpoint returns it whole, another tenant
/// gets 404, and the projection is identical after a restart.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the SDK virtualenv: run tests/sdk/run.sh"]
async fn official_sdks_see_long_tool_output_as_a_page_and_a_cursor() {
    let mock = MockUpstream::start();
    let dir = tempfile::tempdir().unwrap();
    let output = tool_output(350_000);
    let file = dir.path().join("output.txt");
    std::fs::write(&file, &output).unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let config = config_for(&mock.base_url(), "");
    let env = [("SLUICE_STORE__DATA_DIR", data)];
    let file = file.to_str().unwrap().to_string();
    let first = {
        let sluice = Sluice::start_with(&config, &env);
        let s = &sluice;
        tokio::task::block_in_place(|| run_script(s, &["--text-exit", &file]));
        let requests = mock.requests();
        assert_eq!(requests.len(), 5);
        for r in &requests {
            let shown = tool_text(&r.uri, &r.json());
            assert!(
                shown.encode_utf16().count() <= 30_000,
                "{}: {} units",
                r.uri,
                shown.encode_utf16().count()
            );
            assert!(shown.lines().count() <= 2000);
            assert!(
                shown.contains("{\"cursor\":\""),
                "{}: a cursor to read on",
                r.uri
            );
            let at = shown.rfind("artifact://").unwrap() + 11;
            let id: String = shown[at..].chars().take(33).collect();
            let key = if r.uri.starts_with("/v1/messages") {
                "sk-ant-test"
            } else {
                "sk-test"
            };
            let whole = client()
                .get(sluice.url(&format!("/v1/sluice/artifacts/{id}")))
                .bearer_auth(key)
                .send()
                .await
                .unwrap();
            assert_eq!(whole.status(), 200);
            assert_eq!(
                whole.text().await.unwrap(),
                output,
                "the artifact is the whole output"
            );
            let other = client()
                .get(sluice.url(&format!("/v1/sluice/artifacts/{id}")))
                .bearer_auth("sk-other")
                .send()
                .await
                .unwrap();
            assert_eq!(other.status(), 404, "S3");
            let cursor = shown[shown.rfind("{\"cursor\":\"").unwrap() + 11..]
                .split('"')
                .next()
                .unwrap()
                .to_string();
            let next = client()
                .get(sluice.url(&format!("/v1/sluice/read?cursor={cursor}")))
                .bearer_auth(key)
                .send()
                .await
                .unwrap();
            assert_eq!(next.status(), 200, "the cursor works");
        }
        requests
    };
    let sluice = Sluice::start_with(&config, &env);
    let s = &sluice;
    tokio::task::block_in_place(|| run_script(s, &["--text-exit", &file]));
    let again = &mock.requests()[5..];
    for (a, b) in first.iter().zip(again) {
        assert_eq!(
            tool_text(&a.uri, &a.json()),
            tool_text(&b.uri, &b.json()),
            "{}: identical after a restart",
            a.uri
        );
    }
}

/// Delivery state (SPEC A3, A9) with the official SDKs' streaming helpers: a `once` image is
/// shown in the first successful response, and the second run sees its placeholder.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the SDK virtualenv: run tests/sdk/run.sh"]
async fn official_sdks_see_a_once_image_exactly_once() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(&mock.base_url(), ""));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("image.b64");
    std::fs::write(&file, b64(&picture(32, 24, image::ImageFormat::Png))).unwrap();
    let file = file.to_str().unwrap().to_string();
    let images = |r: &common::mock::Recorded| {
        r.json().to_string().matches("image/png;base64,").count()
            + r.json()
                .to_string()
                .matches("\"media_type\":\"image/png\"")
                .count()
    };
    let s = &sluice;
    tokio::task::block_in_place(|| run_script(s, &["--delivery", &file]));
    let first = mock.requests();
    assert_eq!(first.len(), 2);
    assert!(first.iter().all(|r| images(r) == 1), "shown the first time");
    for _ in 0..300 {
        let m = sluice.metrics().await;
        if metric(
            &m,
            "sluice_store_seconds_count{backend=\"embedded\",op=\"commit\"}",
        ) >= 2.0
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::task::block_in_place(|| run_script(s, &["--delivery", &file]));
    let second = &mock.requests()[2..];
    assert!(
        second.iter().all(|r| images(r) == 0),
        "a placeholder the second time"
    );
    assert!(second.iter().all(|r| r
        .json()
        .to_string()
        .contains("shown earlier and no longer attached")));
}

/// Audio with the official SDKs (docs/audio.md): on a route with `audio`, an MCP audio item in
/// a chat tool result is sent as `input_audio` once (the mock refuses it anywhere but a user
/// message), then a placeholder; Responses and Anthropic get a placeholder, never the base64.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the SDK virtualenv: run tests/sdk/run.sh"]
async fn official_sdks_send_audio_once_where_the_api_takes_it() {
    let mock = MockUpstream::start();
    mock.record(true);
    let config = config_for(&mock.base_url(), "").replace(
        "models = [\"*\"]\n",
        "models = [\"*\"]\ninput_modalities = [\"text\", \"image\", \"audio\"]\n",
    );
    let sluice = Sluice::start(&config);
    let dir = tempfile::tempdir().unwrap();
    let mut wav = b"RIFF\x24\x0f\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0\x40\x1f\0\0\x80\x3e\0\0\x02\0\x10\0data\0\x0f\0\0".to_vec();
    wav.extend((0..3840u32).map(|i| (i % 200) as u8));
    let data = b64(&wav);
    let file = dir.path().join("audio.b64");
    std::fs::write(&file, &data).unwrap();
    let file = file.to_str().unwrap().to_string();
    let s = &sluice;
    let sent = |r: &common::mock::Recorded| {
        r.json()
            .to_string()
            .matches(r#""type":"input_audio""#)
            .count()
    };
    tokio::task::block_in_place(|| run_script(s, &["--audio", &file]));
    let first = mock.requests();
    assert_eq!(first.len(), 3);
    for r in &first {
        let body = r.json().to_string();
        assert!(
            !body.contains(&data[..200]) || r.uri == "/v1/chat/completions",
            "{}",
            r.uri
        );
        let expected = usize::from(r.uri == "/v1/chat/completions");
        assert_eq!(sent(r), expected, "{}", r.uri);
    }
    for _ in 0..300 {
        let m = sluice.metrics().await;
        if metric(&m, "sluice_commits_total{outcome=\"committed\"}") >= 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::task::block_in_place(|| run_script(s, &["--audio", &file]));
    let second = &mock.requests()[3..];
    assert!(second.iter().all(|r| sent(r) == 0), "sent once");
    let chat = second
        .iter()
        .find(|r| r.uri == "/v1/chat/completions")
        .unwrap();
    assert!(chat
        .json()
        .to_string()
        .contains("sent earlier and no longer attached"));
    assert!(second
        .iter()
        .all(|r| !r.json().to_string().contains(&data[..200])));
}

/// The read tool through the official SDKs (SPEC C1-C3): three pages read, one response per
/// request, parsed by each SDK's own stream helpers, and the next turn sees the pages read.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the SDK virtualenv: run tests/sdk/run.sh"]
async fn official_sdks_get_one_response_while_the_model_reads_on() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("output.txt");
    std::fs::write(&file, tool_output(150_000)).unwrap();
    let file = file.to_str().unwrap().to_string();
    // Uncompressed, then with the provider compressing as the SDKs' Accept-Encoding allows.
    for coding in [None, Some("gzip"), Some("deflate")] {
        let mock = MockUpstream::start();
        mock.compress(coding);
        // The script checks that the rounds' usage is summed: each round reports the mock's
        // fixed usage (10 in, 5 out), not a prompt cache's count.
        mock.prompt_cache(false);
        let sluice = Sluice::start(&config_for(&mock.base_url(), ""));
        let s = &sluice;
        tokio::task::block_in_place(|| run_script(s, &["--read", &file]));
        let m = sluice.metrics().await;
        // 3 dialects x (non-streamed, streamed) x 3 pages.
        assert_eq!(
            metric(&m, "sluice_read_calls_total{outcome=\"page\"}"),
            18.0,
            "{coding:?}"
        );
        if let Some(coding) = coding {
            let accepts = |r: &common::mock::Recorded| {
                r.headers
                    .get("accept-encoding")
                    .is_some_and(|v| v.to_str().unwrap().contains(coding))
            };
            assert!(
                mock.requests().iter().all(accepts),
                "the mock answered {coding}"
            );
        }
    }
}

/// The context guard with the official SDKs as clients (docs/context-guard.md): a 200-turn agent
/// session per dialect, streamed and not, against a mock that enforces a 48,000-token window with
/// each provider's error. Without the guard the SDKs get that error once the history passes the
/// window; with it every turn completes.
#[test]
#[ignore = "needs the SDK virtualenv: run tests/sdk/run.sh"]
fn official_sdks_run_a_200_turn_session_under_the_context_guard() {
    let mock = MockUpstream::start();
    mock.context_window(Some(48_000));
    let off = Sluice::start(&config_for(&mock.base_url(), ""));
    run_script(&off, &["--context-turns", "60", "--expect-context-failure"]);
    let config = guard_routes(
        &config_for(&mock.base_url(), ""),
        "window_tokens = 48000\noutput_tokens = 4096\n",
    );
    assert_eq!(
        config.matches("window_tokens").count(),
        2,
        "both routes guarded"
    );
    let sluice = Sluice::start(&config);
    run_script(&sluice, &["--context-turns", "200"]);
    let retired = |r: &common::mock::Recorded| {
        String::from_utf8_lossy(&r.body)
            .matches("tool output retired")
            .count()
    };
    let requests = mock.requests();
    let last = |path: &str| {
        requests
            .iter()
            .rev()
            .find(|r| r.uri.starts_with(path))
            .unwrap()
    };
    for path in ["/v1/chat/completions", "/v1/responses", "/v1/messages"] {
        assert!(
            retired(last(path)) > 100,
            "{path}: most of the history retired"
        );
    }
}

/// Google's `google-genai` SDK through sluice (#40): generate and stream, a function-calling
/// loop, a long function response spilled and read on (C2, whole and streamed), a provider's
/// refusal as the SDK's own error.
#[test]
#[ignore = "needs the SDK virtualenv: run tests/sdk/run.sh"]
fn google_genai_sdk_works_through_sluice() {
    let mock = MockUpstream::start();
    let config = format!(
        "{}\n[[routes]]\nname = \"gemini\"\ndialects = [\"gemini-generate\"]\nmodels = [\"*\"]\nupstream = \"{}\"\n",
        config_for(&mock.base_url(), ""),
        mock.base_url()
    );
    let sluice = Sluice::start(&config);
    let dir = tempfile::tempdir().unwrap();
    let long = dir.path().join("output.txt");
    std::fs::write(&long, tool_output(150_000)).unwrap();
    let python = std::env::var("SLUICE_SDK_PYTHON")
        .expect("SLUICE_SDK_PYTHON names the virtualenv's python (tests/sdk/run.sh sets it)");
    let out = std::process::Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/sdk/gemini_check.py"
        ))
        .arg("--base")
        .arg(sluice.url(""))
        .arg("--long-output")
        .arg(&long)
        .output()
        .expect("run the Gemini SDK script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "Gemini SDK checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all Gemini SDK checks passed"));
    // google-genai 3 calls the API's `/v1/` paths (Gemini CLI calls `/v1beta/`).
    let requests = mock.requests();
    assert!(requests
        .iter()
        .all(|r| r.uri.starts_with("/v1/models/gemini-2.5-flash:")));
    assert!(requests
        .iter()
        .all(|r| r.headers["x-goog-api-key"] == "gemini-sdk-key"));
    // Two read rounds, one whole and one streamed, each answered by sluice.
    let reads = requests
        .iter()
        .filter(|r| {
            String::from_utf8_lossy(&r.body).contains("\"name\":\"sluice_read\",\"response\"")
        })
        .count();
    assert_eq!(reads, 2);
}
