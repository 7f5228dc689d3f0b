//! The provider `sluice replay` forwards to: on localhost, it answers every request with the
//! shortest successful response of its dialect (a whole body, or an event stream when the
//! request asks for one), so each recorded request counts as delivered (A9).

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio_util::task::TaskTracker;

use crate::dialect::Dialect;

/// The running stub.
pub struct Stub {
    pub addr: SocketAddr,
    tasks: TaskTracker,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Stub {
    /// Stops accepting and waits for the connections to close (sluice's, once it stopped).
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Starts the stub on a free port of 127.0.0.1.
pub async fn start() -> std::io::Result<Stub> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let tasks = TaskTracker::new();
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let connections = tasks.clone();
    tasks.spawn(async move {
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => continue,
                },
                _ = &mut stopped => return,
            };
            connections.spawn(async move {
                let service = hyper::service::service_fn(answer);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(Stub { addr, tasks, stop })
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct Asked {
    stream: bool,
    model: Option<String>,
}

async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let asked: Asked = serde_json::from_slice(&body).unwrap_or_default();
    let model = asked.model.unwrap_or_default();
    let (content_type, bytes) = match Dialect::endpoint(&path).map(|e| (e.dialect, e.counts)) {
        Some((dialect, true)) => (
            "application/json",
            Bytes::from(dialect.wire().token_count(0)),
        ),
        Some((dialect, false)) if asked.stream => (
            "text/event-stream",
            Bytes::from(dialect.wire().answer(&model, "ok", true)),
        ),
        Some((dialect, false)) => (
            "application/json",
            Bytes::from(dialect.wire().answer(&model, "ok", false)),
        ),
        None => json_of(&json!({"object": "replay"})),
    };
    let response = Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(Full::new(bytes))
        .unwrap_or_default();
    Ok(response)
}

fn json_of(value: &Value) -> (&'static str, Bytes) {
    ("application/json", Bytes::from(value.to_string()))
}
