//! `sluice replay --config FILE TRACE.jsonl [--json]` (SPEC 9.1, docs/inspector.md): recorded
//! agent requests — one JSON object per line, `{"path", "session"?, "headers"?, "body"}` — sent
//! through a real sluice with a throwaway embedded store, to a stub provider on localhost that
//! answers each one successfully, so each projects as if its response had completed. The
//! report comes from the inspector's own turn records: per turn and in total, input tokens as
//! sent and as forwarded, their cache-weighted cost, spills, images by fate, retirements.

mod report;
mod stub;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::{Config, StoreBackend};
use crate::inspect::SessionRecord;
use crate::server::Server;
pub use report::{render, Report};

/// The credential every replayed request carries: the trace's own are never sent anywhere.
const CREDENTIAL: &str = "sluice-replay";

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot read {path}: {source}")]
    Trace {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} line {line}: {message}")]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("cannot start sluice: {0}")]
    Start(String),
    #[error("the session API answered {0}")]
    Api(String),
}

/// One recorded request.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    path: String,
    session: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    body: Box<RawValue>,
}

/// Headers a replayed request keeps: not the credential (replaced), not the session (given by
/// `session`), nothing hop-by-hop.
fn kept(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    !matches!(
        name.as_str(),
        "authorization"
            | "x-api-key"
            | "api-key"
            | "host"
            | "content-length"
            | "content-encoding"
            | "connection"
            | "transfer-encoding"
    )
}

fn read_trace(path: &Path) -> Result<Vec<Line>, ReplayError> {
    let file = std::fs::File::open(path).map_err(|source| ReplayError::Trace {
        path: path.to_owned(),
        source,
    })?;
    let mut lines = Vec::new();
    for (n, text) in std::io::BufReader::new(file).lines().enumerate() {
        let text = text.map_err(|source| ReplayError::Trace {
            path: path.to_owned(),
            source,
        })?;
        if text.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(&text).map_err(|e| ReplayError::Line {
            path: path.to_owned(),
            line: n + 1,
            message: e.to_string(),
        })?;
        if !line.path.starts_with("/v1/") {
            return Err(ReplayError::Line {
                path: path.to_owned(),
                line: n + 1,
                message: format!("path {:?} is not a /v1/ path", line.path),
            });
        }
        lines.push(line);
    }
    Ok(lines)
}

/// Replays `trace` under `config` and reports what sluice did to it. `progress` draws a bar on
/// a terminal.
pub async fn run(mut config: Config, trace: &Path, progress: bool) -> Result<Report, ReplayError> {
    let lines = read_trace(trace)?;
    let dir = std::env::temp_dir().join(format!("sluice-replay-{}", uuid::Uuid::new_v4()));
    let stub = stub::start()
        .await
        .map_err(|e| ReplayError::Start(e.to_string()))?;
    config.listen = "127.0.0.1:0".into();
    config.admin_listen = "127.0.0.1:0".into();
    config.store.backend = StoreBackend::Embedded;
    config.store.data_dir = dir.clone();
    config.inspector.enabled = true;
    config.inspector.keep_turns = crate::config::inspector::MAX_KEEP_TURNS;
    for route in &mut config.routes {
        route.upstream = format!("http://{}", stub.addr);
        route.api_key_env.clear();
    }
    let report = replay(config, &lines, trace, progress).await;
    stub.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    report
}

async fn replay(
    config: Config,
    lines: &[Line],
    trace: &Path,
    progress: bool,
) -> Result<Report, ReplayError> {
    let server = Server::bind(config)
        .await
        .map_err(|e| ReplayError::Start(e.to_string()))?;
    let proxy = server
        .proxy_addr()
        .map_err(|e| ReplayError::Start(e.to_string()))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = server.run(async {
        let _ = stopped.await;
    });
    let driving = async move {
        let report = drive(proxy, lines, trace, progress).await;
        let _ = stop.send(());
        report
    };
    let ((), report) = tokio::join!(serving, driving);
    report
}

/// Sends every line to sluice at `proxy`, then reads the sessions back.
async fn drive(
    proxy: std::net::SocketAddr,
    lines: &[Line],
    trace: &Path,
    progress: bool,
) -> Result<Report, ReplayError> {
    let client = reqwest::Client::builder()
        .build()
        .map_err(|e| ReplayError::Start(e.to_string()))?;
    let bar = if progress {
        indicatif::ProgressBar::new(lines.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} requests {msg}")
    {
        bar.set_style(style);
    }
    let mut report = Report::new(trace, lines.len());
    for (n, line) in lines.iter().enumerate() {
        let mut request = client
            .post(format!("http://{proxy}{}", line.path))
            .bearer_auth(CREDENTIAL)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(line.body.get().to_owned());
        for (name, value) in line.headers.iter().filter(|(k, _)| kept(k)) {
            request = request.header(name, value);
        }
        if let Some(session) = &line.session {
            request = request.header("x-sluice-session", session);
        }
        match request.send().await {
            Ok(response) => {
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                if !status.is_success() {
                    report.failed(n + 1, status.as_u16(), &text);
                }
            }
            Err(e) => report.failed(n + 1, 0, &e.to_string()),
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    collect(&client, proxy, &mut report).await?;
    Ok(report)
}

/// Reads every session the replay made back from the session API.
async fn collect(
    client: &reqwest::Client,
    proxy: std::net::SocketAddr,
    report: &mut Report,
) -> Result<(), ReplayError> {
    let get = |path: String| async move {
        let response = client
            .get(format!("http://{proxy}{path}"))
            .bearer_auth(CREDENTIAL)
            .send()
            .await
            .map_err(|e| ReplayError::Api(e.to_string()))?;
        if !response.status().is_success() {
            return Err(ReplayError::Api(response.status().to_string()));
        }
        let bytes = response
            .bytes()
            .await
            .map_err(|e| ReplayError::Api(e.to_string()))?;
        serde_json::from_slice::<serde_json::Value>(&bytes)
            .map_err(|e| ReplayError::Api(e.to_string()))
    };
    let list = get("/v1/sluice/sessions".into()).await?;
    let mut records: Vec<SessionRecord> = Vec::new();
    for id in list["sessions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("id").and_then(|v| v.as_str()))
    {
        let record = get(format!("/v1/sluice/sessions/{id}")).await?;
        records.push(serde_json::from_value(record).map_err(|e| ReplayError::Api(e.to_string()))?);
    }
    records.sort_by_key(|r| r.session.first_ms);
    for record in records {
        report.add(record);
    }
    Ok(())
}
