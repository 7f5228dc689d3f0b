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
    let (content_type, bytes) = match Dialect::from_path(&path) {
        _ if path.ends_with("/count_tokens") => json_of(&json!({"input_tokens": 0})),
        Some(dialect) if asked.stream => {
            ("text/event-stream", Bytes::from(events(dialect, &model)))
        }
        Some(dialect) => json_of(&whole(dialect, &model)),
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

fn response_object(model: &str) -> Value {
    json!({"id": "resp_replay", "object": "response", "created_at": 0, "status": "completed",
        "model": model, "output": [{"type": "message", "id": "msg_replay", "status": "completed",
        "role": "assistant", "content": [{"type": "output_text", "text": "ok", "annotations": []}]}]})
}

fn whole(dialect: Dialect, model: &str) -> Value {
    match dialect {
        Dialect::OpenAiChat => json!({"id": "chatcmpl-replay", "object": "chat.completion",
            "created": 0, "model": model, "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}),
        Dialect::OpenAiResponses => response_object(model),
        Dialect::AnthropicMessages => json!({"id": "msg_replay", "type": "message",
            "role": "assistant", "model": model, "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn", "stop_sequence": null}),
    }
}

fn events(dialect: Dialect, model: &str) -> String {
    let event = |name: Option<&str>, data: Value| match name {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    };
    match dialect {
        Dialect::OpenAiChat => {
            let chunk = json!({"id": "chatcmpl-replay", "object": "chat.completion.chunk",
                "created": 0, "model": model, "choices": [{"index": 0,
                "delta": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]});
            format!("{}data: [DONE]\n\n", event(None, chunk))
        }
        Dialect::OpenAiResponses => event(
            Some("response.completed"),
            json!({"type": "response.completed", "response": response_object(model)}),
        ),
        Dialect::AnthropicMessages => [
            event(
                Some("message_start"),
                json!({"type": "message_start", "message": {
                "id": "msg_replay", "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": null, "stop_sequence": null}}),
            ),
            event(
                Some("message_delta"),
                json!({"type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": null}}),
            ),
            event(Some("message_stop"), json!({"type": "message_stop"})),
        ]
        .concat(),
    }
}
