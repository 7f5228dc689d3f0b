//! The official OpenAI and Anthropic Python SDKs, streamed and not, through sluice against the
//! mock provider (foundation issue; SPEC P1-P4). Needs the SDK virtualenv: run
//! `tests/sdk/run.sh`, which creates it and runs this test; `.ci/run` does.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use common::{config_for, MockUpstream, Sluice};

#[test]
#[ignore = "needs the SDK virtualenv: run tests/sdk/run.sh"]
fn official_sdks_work_through_sluice() {
    let python = std::env::var("SLUICE_SDK_PYTHON")
        .expect("SLUICE_SDK_PYTHON names the virtualenv's python (tests/sdk/run.sh sets it)");
    let mock = MockUpstream::start();
    // OpenAI models limited to gpt-*, so the script can meet sluice's own 404 (P4).
    let config =
        config_for(&mock.base_url(), "").replacen("models = [\"*\"]", "models = [\"gpt-*\"]", 1);
    let sluice = Sluice::start(&config);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/check.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .arg("--openai-base")
        .arg(sluice.url("/v1"))
        .arg("--anthropic-base")
        .arg(sluice.url(""))
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
