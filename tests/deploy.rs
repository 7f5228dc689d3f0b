//! deploy/: the configs it ships are valid, and the monitoring it ships works against a real
//! sluice — promtool lints the live /metrics, every metric a rule or the dashboard uses exists,
//! and a real Prometheus scrapes sluice and evaluates the alert rules over real samples.
//!
//! The tests needing promtool and prometheus (Debian's `prometheus` package, installed by
//! deploy/check.sh) are ignored by default; `.ci/run` runs them with `--ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    b64, client, config_for, guard_routes, picture, post, tool_output, MockUpstream, Sluice,
};
use serde_json::{json, Value};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Every sluice config file under deploy/ passes `sluice check-config` (O1): a typo in a key
/// would otherwise only show when a pod starts.
#[test]
fn deploy_configs_pass_check_config() {
    let files = [
        "deploy/container.toml",
        "deploy/kubernetes/base/sluice.toml",
        "deploy/kubernetes/overlays/sidecar/sluice.toml",
        "deploy/kubernetes/overlays/shared/sluice.toml",
    ];
    for file in files {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["check-config", "--config"])
            .arg(repo(file))
            .env_remove("SLUICE_CONFIG")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let effective = String::from_utf8_lossy(&out.stdout);
        // A sidecar's proxy is for its own pod only; everything else faces the pod network.
        let listen = if file.contains("sidecar") {
            "127.0.0.1:8787"
        } else {
            "0.0.0.0:8787"
        };
        let line = format!("listen = \"{listen}\"");
        assert!(effective.lines().any(|l| l == line), "{file}: {effective}");
        assert!(
            effective.contains("admin_listen = \"0.0.0.0:9464\""),
            "{file}: {effective}"
        );
    }
}

/// The `sluice_*` and `process_*` metric names a rule file or dashboard mentions.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    for prefix in ["sluice_", "process_"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(prefix).map(|i| i + from) {
            let starts_word =
                at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
            let end = text[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(text.len(), |i| i + at);
            if starts_word {
                names.insert(text[at..end].to_string());
            }
            from = end;
        }
    }
    names
}

/// Sample names in a Prometheus text exposition.
fn exposed(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// One request of each kind the dashboard shows: a spill, an image with delivery state, a
/// stream, a provider error.
async fn traffic(sluice: &Sluice) {
    let png = picture(64, 48, image::ImageFormat::Png);
    let anthropic = json!({"model": "claude-x", "max_tokens": 10, "messages": [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}},
            {"type": "tool_use", "id": "t2", "name": "build", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(&png)}}]},
            {"type": "tool_result", "tool_use_id": "t2", "content": tool_output(200_000)}]}
    ]});
    assert_eq!(post(sluice, "/v1/messages", &anthropic).await.status(), 200);
    let stream = json!({"model": "gpt-4o", "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let streamed = post(sluice, "/v1/chat/completions", &stream).await;
    assert_eq!(streamed.status(), 200);
    streamed.bytes().await.unwrap();
    assert_eq!(fail_and_succeed(sluice).await, (500, 200));
}

/// A request the provider fails with 500, then one it answers.
async fn fail_and_succeed(sluice: &Sluice) -> (u16, u16) {
    let fail =
        json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "mock:status=500"}]});
    let ok = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    (
        post(sluice, "/v1/chat/completions", &fail)
            .await
            .status()
            .as_u16(),
        post(sluice, "/v1/chat/completions", &ok)
            .await
            .status()
            .as_u16(),
    )
}

/// `promtool check metrics` on sluice's live /metrics, after traffic, and every metric name the
/// alert rules and the Grafana dashboard use is in that output (a renamed metric fails here,
/// not silently in production).
#[tokio::test]
#[ignore = "needs promtool (Debian package prometheus); run by .ci/run"]
async fn live_metrics_pass_promtool_and_cover_rules_and_dashboard() {
    let mock = MockUpstream::start();
    // The context guard, the inspector and a tenant share on, so their series are exposed too.
    let guarded = guard_routes(
        &config_for(
            &mock.base_url(),
            "[inspector]\nenabled = true\n[limits]\ntenant_concurrency = 1000\n",
        ),
        "window_tokens = 1000000\n",
    );
    let sluice = Sluice::start(&guarded);
    traffic(&sluice).await;
    let metrics = sluice.metrics().await;

    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let linted = promtool.wait_with_output().unwrap();
    assert!(
        linted.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&linted.stdout),
        String::from_utf8_lossy(&linted.stderr)
    );

    let exposed = exposed(&metrics);
    for file in [
        "deploy/prometheus/sluice-rules.yml",
        "deploy/grafana/sluice-dashboard.json",
    ] {
        let used = metric_names(&std::fs::read_to_string(repo(file)).unwrap());
        assert!(used.len() >= 5, "{file} uses too few metrics: {used:?}");
        let missing: Vec<_> = used.difference(&exposed).collect();
        assert!(
            missing.is_empty(),
            "{file} uses metrics sluice does not export: {missing:?}"
        );
    }
}

/// A Prometheus server, killed on drop.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts Prometheus scraping `target` every second as job `sluice`, with deploy's rules.
    fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {rules}\n\
                 scrape_configs:\n  - job_name: sluice\n    static_configs:\n      - targets: ['{target}']\n",
                rules = repo("deploy/prometheus/sluice-rules.yml").display()
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (apt-get install prometheus)");
        Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        }
    }

    /// GET an API path; `None` until Prometheus answers.
    async fn api(&self, path: &str, query: Option<&str>) -> Option<Value> {
        let mut url = url::Url::parse(&format!("{}{path}", self.url)).unwrap();
        if let Some(query) = query {
            url.query_pairs_mut().append_pair("query", query);
        }
        let body: Value = client().get(url).send().await.ok()?.json().await.ok()?;
        (body["status"] == "success").then(|| body["data"].clone())
    }

    /// The first sample value of an instant query.
    async fn value(&self, query: &str) -> Option<f64> {
        let data = self.api("/api/v1/query", Some(query)).await?;
        data["result"][0]["value"][1].as_str()?.parse().ok()
    }
}

/// A real Prometheus scrapes a running sluice: the request counter is visible through its HTTP
/// API, every shipped rule evaluates without error, the recording rules produce values, and
/// the error-rate alert goes pending on real samples while the provider fails half the requests.
#[tokio::test]
#[ignore = "needs prometheus (Debian package prometheus); run by .ci/run"]
async fn prometheus_scrapes_sluice_and_evaluates_the_rules() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(&mock.base_url(), ""));
    traffic(&sluice).await;
    let prometheus = Prometheus::start(&sluice.admin.to_string());

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = (false, false, false, false);
    while Instant::now() < deadline && seen != (true, true, true, true) {
        // Keep failing half the requests, so rates have samples that differ.
        assert_eq!(fail_and_succeed(&sluice).await, (500, 200));
        tokio::time::sleep(Duration::from_millis(250)).await;

        seen.0 = prometheus.value(r#"up{job="sluice"}"#).await == Some(1.0)
            && prometheus
                .value(r#"sluice_requests_total{route="openai",status="500"}"#)
                .await
                .is_some_and(|v| v >= 1.0);
        seen.1 = prometheus
            .value(r#"sluice:requests:rate5m{route="openai",status="500"}"#)
            .await
            .is_some_and(|v| v > 0.0);
        if let Some(rules) = prometheus.api("/api/v1/rules", None).await {
            let rules: Vec<&Value> = rules["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().into_iter().flatten())
                .collect();
            let healthy = rules.iter().filter(|r| r["health"] == "ok").count();
            let broken: Vec<_> = rules.iter().filter(|r| r["health"] == "err").collect();
            assert!(broken.is_empty(), "rules failing to evaluate: {broken:?}");
            seen.2 = !rules.is_empty() && healthy == rules.len();
        }
        if let Some(alerts) = prometheus.api("/api/v1/alerts", None).await {
            let alerts = alerts["alerts"].as_array().cloned().unwrap_or_default();
            seen.3 = alerts.iter().any(|a| {
                a["labels"]["alertname"] == "SluiceHighErrorRate"
                    && a["labels"]["route"] == "openai"
                    && a["state"] == "pending"
            });
            // Nothing else is wrong with this sluice: no other alert may fire.
            let others: Vec<_> = alerts
                .iter()
                .filter(|a| a["labels"]["alertname"] != "SluiceHighErrorRate")
                .collect();
            assert!(others.is_empty(), "unexpected alerts: {others:?}");
        }
    }
    assert_eq!(
        seen,
        (true, true, true, true),
        "(counter scraped, recording rule value, all rules healthy, error-rate alert pending)"
    );
}
