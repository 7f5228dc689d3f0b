//! A mock LLM provider on 127.0.0.1:0 that records every request it receives (raw bytes
//! included) and answers in the dialect its path names: JSON or SSE, scripted text or tool
//! calls, or an injected failure (status, a stream cut mid-way, a stall).

/// The simulated prompt cache (its own file, so the benches that include this one get it too).
#[path = "prompt_cache.rs"]
pub mod prompt_cache;

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{stream, StreamExt};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::sync::{oneshot, Notify};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

/// One request as the mock received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// Path and query (absolute when the request came as to a proxy, or over h2).
    pub uri: String,
    /// HTTP/1.1, or HTTP/2 when a TLS client chose it (ALPN).
    pub version: http::Version,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Recorded {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// What the mock answers with.
#[derive(Debug, Clone)]
pub enum Reply {
    /// An assistant text answer in the dialect's shape (streamed if the request asked).
    Text(String),
    /// A call of the named tool with these JSON arguments.
    ToolCall { name: String, arguments: Value },
    /// This status with this body, as `application/json`.
    Status(u16, String),
    /// The first `events` SSE events of a text answer, then the connection is cut.
    CutStream { events: usize },
    /// Wait this long before sending the response head.
    StallHead(Duration),
    /// Send the first `events` events of a text answer, then go silent for this long.
    StallBody { events: usize, pause: Duration },
    /// Send the first `events` events, then wait until [`MockUpstream::release`], then the rest.
    Gate { events: usize },
    /// Text parts and tool calls, in order.
    Parts(Vec<Part>),
    /// These bytes as a 200 `text/event-stream`, chunk by chunk (a misbehaving provider).
    RawSse(Vec<String>),
    /// These bytes as a 200 `application/json` body (a misbehaving provider).
    RawJson(String),
    /// Like a model reading a spilled result: `before` (text), then a call of the request's
    /// read tool (its last tool) with the newest cursor in the request, then a call of `also`
    /// (an agent tool, for mixed calls). With no cursor left to read, the text `answer`.
    Read {
        before: Option<String>,
        also: Option<String>,
        answer: String,
    },
}

struct State {
    recording: bool,
    recorded: Vec<Recorded>,
    script: VecDeque<Reply>,
    /// The content coding the mock answers in when the request accepts it, as a provider does.
    encoding: Option<&'static str>,
    /// The model's context window: a request whose input and requested output pass it is
    /// refused with the provider's own error (see [`context_rules`]).
    window: Option<u64>,
    /// The provider's prompt cache ([`prompt_cache`]): on unless a test turns it off, so every
    /// reply's `usage` is what the provider would bill.
    cache: Option<prompt_cache::PromptCache>,
    /// What the cache billed for each request, in arrival order.
    billed: Vec<prompt_cache::Counted>,
}

impl Default for State {
    fn default() -> Self {
        Self {
            recording: true,
            recorded: Vec::new(),
            script: VecDeque::new(),
            encoding: None,
            window: None,
            cache: Some(Default::default()),
            billed: Vec::new(),
        }
    }
}

/// The TLS side of a mock provider: a test CA and a certificate it signed for 127.0.0.1.
pub struct Tls {
    /// The CA's certificate as a PEM file, for a client's `SSL_CERT_FILE`.
    pub ca: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Tls {
    /// A new test CA, and a server config for 127.0.0.1 offering `alpn` (in order).
    pub fn new(alpn: &[&[u8]]) -> (Tls, Arc<rustls::ServerConfig>) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "sluice test CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_cert.pem()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
            )
            .unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        (Tls { ca, _dir: dir }, Arc::new(config))
    }
}

/// A running mock provider. Dropping it stops it.
pub struct MockUpstream {
    pub addr: SocketAddr,
    /// Set when the mock is served over TLS ([`MockUpstream::start_tls`]).
    pub tls: Option<Tls>,
    state: Arc<Mutex<State>>,
    gate: Arc<Notify>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MockUpstream {
    pub fn start() -> MockUpstream {
        Self::serving(None)
    }

    /// The mock over TLS, offering h2 and HTTP/1.1 (ALPN, in that order) as providers do.
    pub fn start_tls() -> MockUpstream {
        let (tls, config) = Tls::new(&[b"h2", b"http/1.1"]);
        let mut mock = Self::serving(Some(tokio_rustls::TlsAcceptor::from(config)));
        mock.tls = Some(tls);
        mock
    }

    fn serving(tls: Option<tokio_rustls::TlsAcceptor>) -> MockUpstream {
        let state = Arc::new(Mutex::new(State::default()));
        let gate = Arc::new(Notify::new());
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (st, gt) = (state.clone(), gate.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("mock-upstream")
                .enable_all()
                .build()
                .expect("mock runtime");
            runtime.block_on(serve(st, gt, addr_tx, stop_rx, tls));
        });
        let addr = addr_rx.recv().expect("mock address");
        MockUpstream {
            addr,
            tls: None,
            state,
            gate,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    pub fn base_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Queue replies, used in order by the next requests; after them, text answers.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.state.lock().unwrap().script.extend(replies);
    }

    /// Stops (or resumes) keeping requests, for benchmarks that send thousands.
    pub fn record(&self, on: bool) {
        self.state.lock().unwrap().recording = on;
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().recorded.clone()
    }

    pub fn last(&self) -> Recorded {
        self.requests().pop().expect("the mock received no request")
    }

    /// Answers in `coding` (`gzip`, `deflate`, `br`, `zstd`) whenever the request's
    /// `Accept-Encoding` names it, streams flushed event by event; `None`: uncompressed.
    pub fn compress(&self, coding: Option<&'static str>) {
        self.state.lock().unwrap().encoding = coding;
    }

    /// Refuses requests whose input (counted as [`reference_tokens`] does) and requested
    /// output pass `window` tokens, as the providers do; `None`: no limit.
    pub fn context_window(&self, window: Option<u64>) {
        self.state.lock().unwrap().window = window;
    }

    /// Starts the prompt cache afresh ([`prompt_cache`]; on by default), or turns it off (usage
    /// then counts no cache).
    pub fn prompt_cache(&self, on: bool) {
        self.state.lock().unwrap().cache = on.then(Default::default);
    }

    /// Moves the prompt cache's clock on (an idle gap, without waiting for it).
    pub fn advance_cache(&self, by: std::time::Duration) {
        if let Some(cache) = self.state.lock().unwrap().cache.as_mut() {
            cache.advance(by);
        }
    }

    /// Every cache entry lives `seconds` instead of 5 min / 1 h.
    pub fn cache_ttl(&self, seconds: Option<u64>) {
        if let Some(cache) = self.state.lock().unwrap().cache.as_mut() {
            cache.ttl_seconds = seconds;
        }
    }

    /// What the prompt cache billed for each model request so far.
    pub fn billed(&self) -> Vec<prompt_cache::Counted> {
        self.state.lock().unwrap().billed.clone()
    }

    /// Lets a [`Reply::Gate`] stream go on.
    pub fn release(&self) {
        self.gate.notify_one();
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    state: Arc<Mutex<State>>,
    gate: Arc<Notify>,
    addr_tx: std::sync::mpsc::Sender<SocketAddr>,
    mut stop: oneshot::Receiver<()>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    addr_tx
        .send(listener.local_addr().expect("addr"))
        .expect("send addr");
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted { Ok(a) => a, Err(_) => continue },
            _ = &mut stop => return,
        };
        let (state, gate, tls) = (state.clone(), gate.clone(), tls.clone());
        #[allow(clippy::disallowed_methods)] // the mock's runtime ends with the test
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let (state, gate) = (state.clone(), gate.clone());
                async move { Ok::<_, Infallible>(answer(req, state, gate).await) }
            });
            let serving = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let _ = match tls {
                None => {
                    serving
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                }
                Some(tls) => match tls.accept(stream).await {
                    Ok(stream) => {
                        serving
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                    Err(_) => return,
                },
            };
        });
    }
}

async fn answer(
    req: Request<Incoming>,
    state: Arc<Mutex<State>>,
    gate: Arc<Notify>,
) -> Response<Body> {
    let accepted = req
        .headers()
        .get_all("accept-encoding")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.split(';').next().unwrap_or("").trim().to_string())
        .collect::<Vec<_>>();
    let coding = state
        .lock()
        .unwrap()
        .encoding
        .filter(|c| accepted.iter().any(|a| a == c));
    let response = respond(req, state, gate).await;
    match coding {
        Some(coding) => compressed(response, coding),
        None => response,
    }
}

/// A content encoder whose output is taken after every flush, so a stream stays a stream.
enum Packer {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Deflate(flate2::write::ZlibEncoder<Vec<u8>>),
    Brotli(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Packer {
    fn new(coding: &str) -> Packer {
        let level = flate2::Compression::default();
        match coding {
            "gzip" => Packer::Gzip(flate2::write::GzEncoder::new(Vec::new(), level)),
            "deflate" => Packer::Deflate(flate2::write::ZlibEncoder::new(Vec::new(), level)),
            "br" => Packer::Brotli(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                4096,
                5,
                22,
            ))),
            "zstd" => Packer::Zstd(zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap()),
            other => panic!("the mock cannot encode {other}"),
        }
    }

    fn chunk(&mut self, data: &[u8]) -> Bytes {
        use std::io::Write;
        let out = match self {
            Packer::Gzip(e) => {
                e.write_all(data).unwrap();
                e.flush().unwrap();
                e.get_mut()
            }
            Packer::Deflate(e) => {
                e.write_all(data).unwrap();
                e.flush().unwrap();
                e.get_mut()
            }
            Packer::Brotli(e) => {
                e.write_all(data).unwrap();
                e.flush().unwrap();
                e.get_mut()
            }
            Packer::Zstd(e) => {
                e.write_all(data).unwrap();
                e.flush().unwrap();
                e.get_mut()
            }
        };
        Bytes::from(std::mem::take(out))
    }

    fn finish(self) -> Bytes {
        Bytes::from(match self {
            Packer::Gzip(e) => e.finish().unwrap(),
            Packer::Deflate(e) => e.finish().unwrap(),
            Packer::Brotli(e) => e.into_inner(),
            Packer::Zstd(e) => e.finish().unwrap(),
        })
    }
}

/// `response` with its body in `coding`, chunk for chunk.
fn compressed(response: Response<Body>, coding: &'static str) -> Response<Body> {
    let (mut parts, body) = response.into_parts();
    parts
        .headers
        .insert("content-encoding", coding.parse().unwrap());
    parts.headers.remove("content-length");
    let frames = http_body_util::BodyStream::new(body);
    let packed = stream::unfold(
        (frames, Some(Packer::new(coding))),
        |(mut frames, mut packer)| async move {
            let p = packer.as_mut()?;
            match frames.next().await {
                Some(Ok(frame)) => {
                    let data = frame.into_data().unwrap_or_default();
                    let out = p.chunk(&data);
                    Some((Ok(Frame::data(out)), (frames, packer)))
                }
                Some(Err(e)) => Some((Err(e), (frames, None))),
                None => {
                    let out = packer.take()?.finish();
                    Some((Ok(Frame::data(out)), (frames, None)))
                }
            }
        },
    );
    Response::from_parts(parts, BodyExt::boxed(StreamBody::new(packed)))
}

async fn respond(
    req: Request<Incoming>,
    state: Arc<Mutex<State>>,
    gate: Arc<Notify>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let recorded = Recorded {
        method: parts.method.to_string(),
        uri: parts.uri.to_string(),
        version: parts.version,
        headers: parts.headers,
        body,
    };
    let request = recorded.json();
    let path = parts.uri.path().to_string();
    let (reply, window) = {
        let mut state = state.lock().unwrap();
        if state.recording {
            state.recorded.push(recorded.clone());
        }
        (state.script.pop_front(), state.window)
    };
    let gemini = gemini_method(&path);
    let stream = request["stream"] == json!(true)
        || gemini
            .as_ref()
            .is_some_and(|(_, m)| m == "streamGenerateContent");
    let model = request["model"]
        .as_str()
        .or(gemini.as_ref().map(|(m, _)| m.as_str()))
        .unwrap_or("mock-model")
        .to_string();
    let dialect = match path.as_str() {
        _ if gemini.as_ref().is_some_and(|(_, m)| m == "countTokens") => {
            return json_response(
                200,
                json!({"totalTokens": recorded.body.len() / 4}).to_string(),
            )
        }
        _ if gemini.is_some() => Dialect::Gemini,
        "/v1/chat/completions" => Dialect::Chat,
        "/v1/responses" => Dialect::Responses,
        "/v1/messages" => Dialect::Anthropic,
        "/v1/messages/count_tokens" => {
            return json_response(
                200,
                json!({"input_tokens": recorded.body.len() / 4}).to_string(),
            )
        }
        _ => {
            // Any other path (P5): echo what arrived.
            return json_response(
                200,
                json!({"object": "echo", "method": recorded.method, "uri": recorded.uri,
                       "body_bytes": recorded.body.len()})
                .to_string(),
            );
        }
    };
    if let Some(refusal) = provider_rules(dialect, &request) {
        if dialect == Dialect::Gemini {
            return json_response(
                400,
                json!({"error": {"code": 400, "message": refusal, "status": "INVALID_ARGUMENT"}})
                    .to_string(),
            );
        }
        return json_response(
            400,
            json!({"error": {"message": refusal, "type": "invalid_request_error"}}).to_string(),
        );
    }
    if let Some(refusal) = window.and_then(|w| context_rules(dialect, &request, w)) {
        return json_response(400, refusal);
    }
    let counted = {
        let mut state = state.lock().unwrap();
        let counted = state.cache.as_mut().map(|cache| {
            let kind = match dialect {
                Dialect::Anthropic => prompt_cache::Kind::Anthropic,
                Dialect::Gemini => prompt_cache::Kind::Gemini,
                Dialect::Chat | Dialect::Responses => prompt_cache::Kind::OpenAi,
            };
            prompt_cache::count(kind, &model, &request, cache, |part| {
                reference_tokens(dialect, part)
            })
        });
        match counted {
            Some(Err(refusal)) => {
                return json_response(
                    400,
                    json!({"type": "error", "error": {"type": "invalid_request_error",
                        "message": refusal}})
                    .to_string(),
                );
            }
            Some(Ok(c)) => {
                state.billed.push(c);
                Some(c)
            }
            None => None,
        }
    };
    let name = match dialect {
        Dialect::Chat => "chat",
        Dialect::Responses => "responses",
        Dialect::Anthropic => "anthropic",
        Dialect::Gemini => "gemini",
    };
    let reply = reply
        .or_else(|| agent_shell(&request, dialect, &recorded.body))
        .or_else(|| agent_shells(&request, dialect, &recorded.body))
        .or_else(|| agent_screenshots(&request, dialect, &recorded.body))
        .unwrap_or_else(|| directive(&recorded.body));
    let reply = match reply {
        Reply::Read {
            before,
            also,
            answer,
        } => read_on(&request, dialect, before, also, answer),
        other => other,
    };
    let content = match &reply {
        Reply::ToolCall { name, arguments } => {
            Content::new(vec![Part::Tool(name.clone(), arguments.clone())])
        }
        Reply::Text(text) => Content::text(text.clone()),
        Reply::Parts(parts) => Content::new(parts.clone()),
        _ => Content::text("Hello from the mock.".into()),
    };
    match reply {
        Reply::Status(code, body) => json_response(code, body),
        Reply::RawJson(body) => json_response(200, body),
        Reply::RawSse(chunks) => sse_response(stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, BoxError>(Bytes::from(c))),
        )),
        Reply::StallHead(pause) => {
            tokio::time::sleep(pause).await;
            json_response(200, dialect.json(&model, &content).to_string())
        }
        Reply::CutStream { events } => {
            let head: Vec<Result<Bytes, BoxError>> = dialect
                .events(&model, &content)
                .into_iter()
                .take(events)
                .map(Ok)
                .collect();
            // Let the events reach the wire before the connection is cut.
            let cut = stream::once(async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err::<Bytes, BoxError>("cut".into())
            });
            sse_response(stream::iter(head).chain(cut))
        }
        Reply::StallBody { events, pause } => {
            let all = dialect.events(&model, &content);
            let (head, tail) = all.split_at(events.min(all.len()));
            let (head, tail) = (head.to_vec(), tail.to_vec());
            let later = stream::once(async move {
                tokio::time::sleep(pause).await;
                Ok::<_, BoxError>(Bytes::from(tail.concat()))
            });
            sse_response(stream::iter(head.into_iter().map(Ok)).chain(later))
        }
        Reply::Gate { events } => {
            let all = dialect.events(&model, &content);
            let (head, tail) = all.split_at(events.min(all.len()));
            let (head, tail) = (head.to_vec(), tail.to_vec());
            let later = stream::once(async move {
                gate.notified().await;
                Ok::<_, BoxError>(Bytes::from(tail.concat()))
            });
            sse_response(stream::iter(head.into_iter().map(Ok)).chain(later))
        }
        Reply::Text(_) | Reply::ToolCall { .. } | Reply::Parts(_) | Reply::Read { .. }
            if stream =>
        {
            let mut events = dialect.events(&model, &content);
            if let Some(counted) = counted {
                events = counted.onto_events(name, events);
            }
            sse_response(stream::iter(events.into_iter().map(Ok::<_, BoxError>)))
        }
        Reply::Text(_) | Reply::ToolCall { .. } | Reply::Parts(_) | Reply::Read { .. } => {
            let mut body = dialect.json(&model, &content);
            if let Some(counted) = counted {
                body = counted.onto_json(name, body);
            }
            json_response(200, body.to_string())
        }
    }
}

/// The newest `{"cursor":"…"}` hint in a request (pages appended last come last).
pub fn newest_cursor(request: &Value) -> Option<String> {
    // The read tool's own description shows the hint's shape; only the history counts.
    let mut history = request.clone();
    if let Some(h) = history.as_object_mut() {
        h.remove("tools");
    }
    let text = history.to_string();
    let key = r#"{\"cursor\":\""#;
    let at = text.rfind(key)? + key.len();
    let rest = &text[at..];
    Some(rest[..rest.find('\\')?].to_string())
}

/// The request's read tool: the last tool it offers.
fn read_tool(request: &Value, dialect: Dialect) -> Option<String> {
    let last = request["tools"].as_array()?.last()?;
    let name = match dialect {
        Dialect::Chat => &last["function"]["name"],
        Dialect::Gemini => last["functionDeclarations"]
            .as_array()?
            .last()?
            .get("name")?,
        _ => &last["name"],
    };
    name.as_str().map(str::to_string)
}

fn read_on(
    request: &Value,
    dialect: Dialect,
    before: Option<String>,
    also: Option<String>,
    answer: String,
) -> Reply {
    let (Some(tool), Some(cursor)) = (read_tool(request, dialect), newest_cursor(request)) else {
        return Reply::Text(answer);
    };
    let mut parts: Vec<Part> = before.into_iter().map(Part::Text).collect();
    parts.push(Part::Tool(tool, json!({"cursor": cursor})));
    parts.extend(also.map(|name| Part::Tool(name, json!({"path": "."}))));
    Reply::Parts(parts)
}

/// For real agents, whose requests a test cannot script one by one: a request whose text holds
/// `mock:shell=N`, that offers the agent's shell tool (Claude Code's `Bash`, Codex's
/// `exec_command`, `shell_command` or `shell`) and holds no tool result yet, gets a call of that
/// tool running `seq 1 N`. Later requests go on with [`directive`].
fn agent_shell(request: &Value, dialect: Dialect, body: &[u8]) -> Option<Reply> {
    let text = String::from_utf8_lossy(body);
    let n = number_after(&text, text.find("mock:shell=")? + "mock:shell=".len())?;
    if tool_results(request, dialect) > 0 {
        return None;
    }
    shell_call(request, &format!("seq 1 {n}"), &format!("Count to {n}"))
}

/// A call of the agent's own shell tool (Claude Code's `Bash`, Codex's `exec_command`,
/// `shell_command` or `shell`) running `command`; `None` when the request offers none.
fn shell_call(request: &Value, command: &str, description: &str) -> Option<Reply> {
    let names = tool_names(request);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (name, arguments) = if names.contains(&"Bash") {
        (
            "Bash",
            json!({"command": command, "description": description}),
        )
    } else if names.contains(&"exec_command") {
        ("exec_command", json!({"cmd": command}))
    } else if names.contains(&"shell_command") {
        ("shell_command", json!({"command": command}))
    } else if names.contains(&"shell") {
        ("shell", json!({"command": ["bash", "-lc", command]}))
    } else if names.contains(&"bash") {
        (
            "bash",
            json!({"command": command, "description": description}),
        )
    } else if names.contains(&"run_shell_command") {
        (
            "run_shell_command",
            json!({"command": command, "description": description}),
        )
    } else {
        return None;
    };
    Some(Reply::ToolCall {
        name: name.to_string(),
        arguments,
    })
}

/// The names of the tools a request offers, in any dialect's shape (Gemini's inside
/// `functionDeclarations`).
fn tool_names(request: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for t in request["tools"].as_array().into_iter().flatten() {
        if let Some(name) = t["name"].as_str().or(t["function"]["name"].as_str()) {
            out.push(name.to_string());
        }
        for f in t["functionDeclarations"].as_array().into_iter().flatten() {
            out.extend(f["name"].as_str().map(str::to_string));
        }
    }
    out
}

/// For real agents over many turns (context guard): a request whose text holds
/// `mock:shells=N` and that offers a shell tool gets a call of it, counting 1,500 numbers (different
/// ones each time), while its history holds fewer than N tool results; then `Ran N commands.`.
fn agent_shells(request: &Value, dialect: Dialect, body: &[u8]) -> Option<Reply> {
    let text = String::from_utf8_lossy(body);
    let n = number_after(&text, text.find("mock:shells=")? + "mock:shells=".len())?;
    let done = tool_results(request, dialect);
    if done >= n {
        return Some(Reply::Text(format!("Ran {n} commands.")));
    }
    let from = (done + 1) * 100_000;
    shell_call(request, &format!("seq {from} {}", from + 1499), "Count")
}

/// The input tokens of an Anthropic request as the mock counts them when it enforces a window.
pub fn anthropic_tokens(request: &Value) -> u64 {
    reference_tokens(Dialect::Anthropic, request)
}

/// The input tokens of a Responses request as the mock counts them when it enforces a window.
pub fn responses_tokens(request: &Value) -> u64 {
    reference_tokens(Dialect::Responses, request)
}

/// The number written at byte `at` of a directive's text (`mock:shell=5000`).
fn number_after(text: &str, at: usize) -> Option<usize> {
    text.get(at..)?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// The tool results in a request's history.
fn tool_results(request: &Value, dialect: Dialect) -> usize {
    match dialect {
        Dialect::Anthropic => request["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["content"].as_array())
            .flatten()
            .filter(|b| b["type"] == "tool_result")
            .count(),
        Dialect::Responses => request["input"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["type"] == "function_call_output")
            .count(),
        Dialect::Chat => request["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] == "tool")
            .count(),
        Dialect::Gemini => request["contents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["parts"].as_array())
            .flatten()
            .filter(|p| p.get("functionResponse").is_some())
            .count(),
    }
}

/// A Gemini model method path: `/v1beta/models/{model}:{method}` (or `/v1/`): the model and
/// the method.
fn gemini_method(path: &str) -> Option<(String, String)> {
    let rest = path
        .strip_prefix("/v1beta/models/")
        .or_else(|| path.strip_prefix("/v1/models/"))?;
    let (model, method) = rest.rsplit_once(':')?;
    Some((model.to_string(), method.to_string()))
}

/// For real agents with an MCP screenshot server: a request whose text's last
/// `mock:screenshots=N` asks for N screenshots in the session, and that offers a tool whose name
/// ends in `browser_take_screenshot` (Codex: inside a `namespace` tool, called as
/// `namespace::name`), gets a call of it while
/// the history holds fewer than N tool results; then the text `Took N screenshots.`.
fn agent_screenshots(request: &Value, dialect: Dialect, body: &[u8]) -> Option<Reply> {
    let text = String::from_utf8_lossy(body);
    let n = number_after(
        &text,
        text.rfind("mock:screenshots=")? + "mock:screenshots=".len(),
    )?;
    let tools = request["tools"].as_array()?;
    let declared = tool_names(request)
        .into_iter()
        .find(|n| n.ends_with("browser_take_screenshot"));
    let name = declared.or_else(|| {
        tools.iter().find_map(|t| {
            let name = t["name"].as_str().or(t["function"]["name"].as_str())?;
            if name.ends_with("browser_take_screenshot") {
                return Some(name.to_string());
            }
            let inner = t["tools"].as_array()?;
            inner
                .iter()
                .filter_map(|i| i["name"].as_str())
                .find(|i| i.ends_with("browser_take_screenshot"))
                .map(|i| format!("{name}::{i}"))
        })
    })?;
    let taken = tool_results(request, dialect);
    if taken >= n {
        return Some(Reply::Text(format!("Took {n} screenshots.")));
    }
    Some(Reply::ToolCall {
        name,
        arguments: json!({"step": taken + 1}),
    })
}

/// The reply a request asks for in its own text (for clients the test cannot script, such as the
/// SDK script): `mock:tool=NAME` (arguments `{"path":"."}`), `mock:status=N`; else a text answer.
fn directive(body: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(body);
    let word = |key: &str| {
        let at = text.find(key)? + key.len();
        let rest = &text[at..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        Some(rest[..end].to_string())
    };
    if let Some(name) = word("mock:tool=") {
        return Reply::ToolCall {
            name,
            arguments: json!({"path": "."}),
        };
    }
    if let Some(n) = word("mock:read=").and_then(|c| c.parse::<usize>().ok()) {
        // Read `n` pages, then answer: stateless, counted from the read results in the request.
        let text = String::from_utf8_lossy(body);
        let reads = text.matches("sluice: lines ").count().saturating_sub(1);
        if reads < n {
            return Reply::Read {
                before: (reads == 0).then(|| "Reading on. ".to_string()),
                also: None,
                answer: String::new(),
            };
        }
        return Reply::Text(format!("Read {reads} pages."));
    }
    if let Some(code) = word("mock:status=").and_then(|c| c.parse().ok()) {
        return Reply::Status(
            code,
            json!({"error": {"message": "mock error", "type": "mock"}}).to_string(),
        );
    }
    Reply::Text("Hello from the mock.".into())
}

fn json_response(status: u16, body: String) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .header("x-mock", "1")
        .body(
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed(),
        )
        .expect("response")
}

fn sse_response<S>(events: S) -> Response<Body>
where
    S: futures_util::Stream<Item = Result<Bytes, BoxError>> + Send + Sync + 'static,
{
    let frames = events.map(|r| r.map(Frame::data));
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(BodyExt::boxed(StreamBody::new(frames)))
        .expect("response")
}

/// The input tokens of a request as the mock counts them, independently of sluice's estimate:
/// every string value (not the keys) counted on its own with the dialect's tokenizer (o200k;
/// Claude's estimate for Anthropic), base64 payloads left out, 4 tokens per message or input
/// item, 1,600 per image part.
/// An image part's tokens by the provider's published rule, from the size in its header:
/// Anthropic scales it into a 1568 px long edge and 1.15 megapixels and charges w·h/750;
/// OpenAI (detail high) fits 2048², scales the short side to 768 and charges 85 + 170 per
/// 512 px tile. An image whose size cannot be read costs 1,600.
fn image_tokens(tokenizer: sluice::tokens::Tokenizer, part: &Value) -> u64 {
    use base64::Engine;
    let data = part["source"]["data"]
        .as_str()
        .or_else(|| part["image_url"].as_str())
        .or_else(|| part["image_url"]["url"].as_str())
        .unwrap_or("");
    let data = data.split_once(";base64,").map_or(data, |(_, d)| d);
    let head = &data[..data.len().min(64 * 1024) / 4 * 4];
    let size = base64::engine::general_purpose::STANDARD
        .decode(head)
        .ok()
        .and_then(|bytes| {
            image::ImageReader::new(std::io::Cursor::new(bytes))
                .with_guessed_format()
                .ok()?
                .into_dimensions()
                .ok()
        });
    let Some((w, h)) = size else { return 1600 };
    let (w, h) = (f64::from(w), f64::from(h));
    if tokenizer == sluice::tokens::Tokenizer::Claude {
        let scale = (1568.0 / w.max(h))
            .min((1_150_000.0 / (w * h)).sqrt())
            .min(1.0);
        return ((w * scale).round() * (h * scale).round() / 750.0).ceil() as u64;
    }
    let fit = (2048.0 / w.max(h)).min(1.0);
    let short = (768.0 / (w.min(h) * fit)).min(1.0);
    let tiles = (w * fit * short / 512.0).ceil() * (h * fit * short / 512.0).ceil();
    85 + 170 * tiles as u64
}

fn reference_tokens(dialect: Dialect, request: &Value) -> u64 {
    use sluice::tokens::Tokenizer;
    let tokenizer = match dialect {
        Dialect::Anthropic => Tokenizer::Claude,
        Dialect::Gemini => Tokenizer::Gemini,
        _ => Tokenizer::O200k,
    };
    fn walk(v: &Value, tokenizer: Tokenizer, total: &mut u64) {
        match v {
            Value::String(s) => {
                let payload = s.len() >= 256
                    && (s.starts_with("data:")
                        || s.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b)));
                if !payload {
                    // Remembered per string: an agent's history repeats every turn.
                    static COUNTS: std::sync::OnceLock<Mutex<HashMap<(u8, u64), u64>>> =
                        std::sync::OnceLock::new();
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    std::hash::Hash::hash(s, &mut h);
                    let key = (tokenizer as u8, std::hash::Hasher::finish(&h));
                    let counts = COUNTS.get_or_init(Default::default);
                    let known = counts.lock().unwrap().get(&key).copied();
                    *total += known.unwrap_or_else(|| {
                        let n = tokenizer.count(s);
                        counts.lock().unwrap().insert(key, n);
                        n
                    });
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, tokenizer, total)),
            Value::Object(map) => {
                if matches!(
                    map.get("type").and_then(Value::as_str),
                    Some("image" | "image_url" | "input_image")
                ) {
                    *total += image_tokens(tokenizer, v);
                }
                map.values().for_each(|i| walk(i, tokenizer, total));
            }
            _ => {}
        }
    }
    let mut total = 0;
    walk(request, tokenizer, &mut total);
    let items = request["messages"]
        .as_array()
        .or(request["input"].as_array())
        .map_or(0, Vec::len);
    total + 4 * items as u64
}

/// The providers' context limit: input plus requested output over the window is a 400 with
/// each provider's own error (OpenAI's `context_length_exceeded`, Anthropic's `prompt is too
/// long`).
fn context_rules(dialect: Dialect, request: &Value, window: u64) -> Option<String> {
    let input = reference_tokens(dialect, request);
    let output = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
        .iter()
        .find_map(|k| request[k].as_u64())
        .unwrap_or(0);
    if input + output <= window {
        return None;
    }
    Some(match dialect {
        Dialect::Chat => json!({"error": {
            "message": format!("This model's maximum context length is {window} tokens. However, your messages resulted in {} tokens. Please reduce the length of the messages.", input + output),
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
        Dialect::Responses => json!({"error": {
            "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
            "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}}),
        Dialect::Anthropic => json!({"type": "error", "error": {
            "type": "invalid_request_error",
            "message": format!("prompt is too long: {input} tokens > {} maximum", window - output.min(window))}}),
        Dialect::Gemini => json!({"error": {"code": 400, "status": "INVALID_ARGUMENT",
            "message": format!("The input token count ({input}) exceeds the maximum number of tokens allowed ({window}).")}}),
    }
    .to_string())
}

/// The media rules the real providers enforce (WIRE.md), so a test sees the request a provider
/// would refuse: OpenAI chat takes images and audio (`input_audio`, wav or mp3) only in user
/// messages; Responses' tool output takes text, image and file parts; Anthropic takes no audio
/// block, measures an image's base64 text against 5 MiB, its long edge against 8000 px (2000 px
/// once a request holds more than 20 images), takes at most 100, and wants the media type to
/// match the bytes.
fn provider_rules(dialect: Dialect, request: &Value) -> Option<String> {
    match dialect {
        Dialect::Gemini => gemini_rules(request),
        Dialect::Chat => {
            for m in request["messages"].as_array()? {
                let has_image = m["content"]
                    .as_array()
                    .is_some_and(|parts| parts.iter().any(|p| p["type"] == "image_url"));
                if has_image && m["role"] != "user" {
                    return Some(format!(
                        "Image URLs are only allowed for messages with role 'user', but this message with role '{}' contains an image URL.",
                        m["role"].as_str().unwrap_or("")
                    ));
                }
                for part in m["content"].as_array().into_iter().flatten() {
                    if part["type"] == "input_audio" {
                        if let Some(refusal) = chat_audio_rules(m, part) {
                            return Some(refusal);
                        }
                    }
                }
            }
            None
        }
        Dialect::Anthropic => {
            let mut images = Vec::new();
            for m in request["messages"].as_array()? {
                for block in m["content"].as_array().into_iter().flatten() {
                    if block["type"] == "image" {
                        images.push(block.clone());
                    }
                    for inner in block["content"].as_array().into_iter().flatten() {
                        if inner["type"] == "image" {
                            images.push(inner.clone());
                        }
                    }
                }
            }
            if let Some(kind) = blocks_of(request, "messages")
                .into_iter()
                .find(|b| b["type"].as_str().is_some_and(|t| t.contains("audio")))
            {
                return Some(format!(
                    "messages: Input tag '{}' found using 'type' does not match any of the expected tags",
                    kind["type"].as_str().unwrap_or("")
                ));
            }
            if images.len() > 100 {
                return Some("too many images".into());
            }
            let limit = if images.len() > 20 { 2000 } else { 8000 };
            for image in &images {
                let source = &image["source"];
                if source["type"] != "base64" {
                    continue;
                }
                let data = source["data"].as_str().unwrap_or("");
                if data.len() > 5_242_880 {
                    return Some(format!(
                        "image exceeds 5 MB maximum: {} bytes > 5242880 bytes",
                        data.len()
                    ));
                }
                let Ok(bytes) =
                    base64::Engine::decode(&base64::engine::general_purpose::STANDARD, data)
                else {
                    return Some("image data is not valid base64".into());
                };
                let format = image::guess_format(&bytes).ok();
                let mime = match format {
                    Some(image::ImageFormat::Png) => "image/png",
                    Some(image::ImageFormat::Jpeg) => "image/jpeg",
                    Some(image::ImageFormat::Gif) => "image/gif",
                    Some(image::ImageFormat::WebP) => "image/webp",
                    _ => return Some("Could not process image".into()),
                };
                if source["media_type"] != mime {
                    return Some(format!(
                        "Image does not match the provided media type {}",
                        source["media_type"]
                    ));
                }
                let Some((w, h)) = format.and_then(|f| {
                    image::ImageReader::with_format(std::io::Cursor::new(&bytes), f)
                        .into_dimensions()
                        .ok()
                }) else {
                    return Some("Could not process image".into());
                };
                if w.max(h) > limit {
                    return Some(format!(
                        "image dimensions exceed max allowed size: {limit} pixels"
                    ));
                }
            }
            None
        }
        Dialect::Responses => {
            // A function_call_output's output parts: input_text, input_image, input_file.
            for item in request["input"].as_array()? {
                for part in item["output"].as_array().into_iter().flatten() {
                    let kind = part["type"].as_str().unwrap_or("");
                    if !["input_text", "input_image", "input_file"].contains(&kind) {
                        return Some(format!("Invalid value: '{kind}'. Supported values are: 'input_text', 'input_image', and 'input_file'."));
                    }
                }
            }
            None
        }
    }
}

/// Every content block of `request[key]`'s messages, a tool result's own blocks included.
fn blocks_of<'r>(request: &'r Value, key: &str) -> Vec<&'r Value> {
    let mut out = Vec::new();
    for m in request[key].as_array().into_iter().flatten() {
        for block in m["content"].as_array().into_iter().flatten() {
            out.push(block);
            out.extend(block["content"].as_array().into_iter().flatten());
        }
    }
    out
}

/// OpenAI chat's rules for an `input_audio` part (WIRE.md): in a user message only, `format`
/// `wav` or `mp3`, base64 `data` whose bytes are that format.
fn chat_audio_rules(message: &Value, part: &Value) -> Option<String> {
    if message["role"] != "user" {
        return Some(format!(
            "Invalid value: 'input_audio'. Supported values are: 'text'. (message with role '{}')",
            message["role"].as_str().unwrap_or("")
        ));
    }
    let audio = &part["input_audio"];
    let format = audio["format"].as_str().unwrap_or("");
    if !["wav", "mp3"].contains(&format) {
        return Some(format!(
            "Invalid value: '{format}'. Supported values are: 'wav' and 'mp3'."
        ));
    }
    let Ok(bytes) = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        audio["data"].as_str().unwrap_or(""),
    ) else {
        return Some("Invalid base64 in input_audio.data".into());
    };
    let wav = bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WAVE".as_slice());
    let mp3 = bytes.starts_with(b"ID3") || bytes.first() == Some(&0xFF);
    if !(format == "wav" && wav || format == "mp3" && mp3) {
        return Some(format!(
            "The audio file could not be decoded or its format is not supported ({format})."
        ));
    }
    None
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Chat,
    Responses,
    Anthropic,
    Gemini,
}

/// A model's answer: text and tool calls, in order.
#[derive(Debug, Clone)]
pub enum Part {
    Text(String),
    Tool(String, Value),
}

/// The parts, and a serial number that keeps item and call ids unique across answers, as a
/// provider's are.
struct Content(Vec<Part>, u64);

static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Content {
    fn new(parts: Vec<Part>) -> Self {
        Content(
            parts,
            SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        )
    }

    fn text(text: String) -> Self {
        Content::new(vec![Part::Text(text)])
    }

    /// Ids are unique per answer, as a provider's are (agents merge messages by id).
    fn response_id(&self) -> String {
        format!("resp_mock_{}", self.1)
    }

    fn calls(&self) -> usize {
        self.0
            .iter()
            .filter(|p| matches!(p, Part::Tool(..)))
            .count()
    }

    /// The text parts joined (chat has one content string).
    fn joined(&self) -> Option<String> {
        let texts: Vec<&str> = self
            .0
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                Part::Tool(..) => None,
            })
            .collect();
        (!texts.is_empty()).then(|| texts.concat())
    }

    /// The tool calls with their call ids.
    fn tools(&self) -> Vec<(String, &String, &Value)> {
        self.0
            .iter()
            .filter_map(|p| match p {
                Part::Tool(name, args) => Some((name, args)),
                Part::Text(_) => None,
            })
            .enumerate()
            .map(|(i, (name, args))| (format!("call_mock_{}_{}", self.1, i + 1), name, args))
            .collect()
    }
}

/// Splits text into three roughly equal deltas (at char boundaries).
fn deltas(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len().div_ceil(3).max(1);
    chars.chunks(n).map(|c| c.iter().collect()).collect()
}

fn sse(event: Option<&str>, data: &Value) -> Bytes {
    match event {
        Some(name) => Bytes::from(format!("event: {name}\ndata: {data}\n\n")),
        None => Bytes::from(format!("data: {data}\n\n")),
    }
}

impl Dialect {
    fn json(self, model: &str, content: &Content) -> Value {
        match self {
            Dialect::Chat => {
                let calls: Vec<Value> = content
                    .tools()
                    .iter()
                    .map(|(id, name, args)| {
                        json!({"id": id, "type": "function",
                        "function": {"name": name, "arguments": args.to_string()}})
                    })
                    .collect();
                let mut message =
                    json!({"role": "assistant", "content": content.joined(), "refusal": null});
                if !calls.is_empty() {
                    message["tool_calls"] = Value::Array(calls);
                }
                json!({
                    "id": format!("chatcmpl-mock-{}", content.1), "object": "chat.completion", "created": 1_700_000_000, "model": model,
                    "choices": [{"index": 0, "message": message, "logprobs": null,
                                 "finish_reason": if content.calls() > 0 { "tool_calls" } else { "stop" }}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
                })
            }
            Dialect::Responses => responses_object(
                &content.response_id(),
                model,
                "completed",
                responses_items(content, "completed"),
            ),
            Dialect::Gemini => json!({
                "candidates": [{"content": {"role": "model", "parts": gemini_parts(content)},
                    "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5,
                    "totalTokenCount": 15},
                "modelVersion": model, "responseId": content.response_id()
            }),
            Dialect::Anthropic => json!({
                "id": format!("msg_mock_{}", content.1), "type": "message", "role": "assistant", "model": model,
                "content": anthropic_blocks(content),
                "stop_reason": if content.calls() > 0 { "tool_use" } else { "end_turn" },
                "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 5}
            }),
        }
    }

    fn events(self, model: &str, content: &Content) -> Vec<Bytes> {
        match self {
            Dialect::Chat => chat_events(model, content),
            Dialect::Responses => responses_events(model, content),
            Dialect::Anthropic => anthropic_events(model, content),
            Dialect::Gemini => gemini_events(model, content),
        }
    }
}

/// A Gemini answer's parts: text, then `functionCall`s (the first with a `thoughtSignature`,
/// as Gemini 3 models sign a turn's first call).
fn gemini_parts(content: &Content) -> Vec<Value> {
    let mut parts: Vec<Value> = Vec::new();
    let mut signed = false;
    for (part, call) in content.0.iter().zip(0..) {
        match part {
            Part::Text(t) => parts.push(json!({"text": t})),
            Part::Tool(name, args) => {
                let id = format!("call_mock_{}_{}", content.1, call + 1);
                let mut p = json!({"functionCall": {"name": name, "args": args, "id": id}});
                if !std::mem::replace(&mut signed, true) {
                    // Opaque base64 bytes, as the API sends (SDKs decode them).
                    let signature = format!("signature {}", content.1);
                    p["thoughtSignature"] = json!(base64::Engine::encode(
                        &base64::engine::general_purpose::STANDARD,
                        signature
                    ));
                }
                parts.push(p);
            }
        }
    }
    parts
}

/// Gemini's stream: each text delta its own chunk; the last chunk carries the calls, the
/// `finishReason` and the `usageMetadata`. No `[DONE]`.
fn gemini_events(model: &str, content: &Content) -> Vec<Bytes> {
    let chunk = |parts: Vec<Value>, last: bool| {
        let mut c = json!({"candidates": [{"content": {"role": "model", "parts": parts},
            "index": 0}], "modelVersion": model, "responseId": content.response_id(),
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 1,
                "totalTokenCount": 11}});
        if last {
            c["candidates"][0]["finishReason"] = json!("STOP");
            c["usageMetadata"] = json!({"promptTokenCount": 10, "candidatesTokenCount": 5,
                "totalTokenCount": 15});
        }
        sse(None, &c)
    };
    let parts = gemini_parts(content);
    let (texts, calls): (Vec<Value>, Vec<Value>) =
        parts.into_iter().partition(|p| p.get("text").is_some());
    let mut out: Vec<Bytes> = texts
        .iter()
        .flat_map(|t| deltas(t["text"].as_str().unwrap_or_default()))
        .map(|d| chunk(vec![json!({"text": d})], false))
        .collect();
    out.push(chunk(calls, true));
    out
}

/// The Gemini API's rules a request must keep (WIRE.md): `contents` alternate `user` and
/// `model`, starting with `user`; every `functionCall` of a model turn is answered by a
/// `functionResponse` of the same name (and id, when both have one) in the next user turn;
/// `inlineData` media types match their bytes; a function's `parameters` take no
/// `additionalProperties` (only `parametersJsonSchema` does); `toolConfig`'s mode is one the
/// API knows.
fn gemini_rules(request: &Value) -> Option<String> {
    let contents = request["contents"].as_array()?;
    let mut expect = "user";
    for (i, c) in contents.iter().enumerate() {
        let role = c["role"].as_str().unwrap_or("user");
        if role != expect {
            return Some(format!(
                "Please ensure that multiturn requests alternate between user and model (content {i} has role {role})."
            ));
        }
        expect = if role == "user" { "model" } else { "user" };
        let parts = c["parts"].as_array()?;
        for p in parts {
            let inlines = std::iter::once(p).chain(
                p["functionResponse"]["parts"]
                    .as_array()
                    .into_iter()
                    .flatten(),
            );
            for inline in inlines.filter_map(|x| x.get("inlineData")) {
                let mime = inline["mimeType"].as_str().unwrap_or("");
                let bytes = base64::Engine::decode(
                    &base64::engine::general_purpose::STANDARD,
                    inline["data"].as_str().unwrap_or(""),
                )
                .unwrap_or_default();
                if mime.starts_with("image/") && sniff(&bytes) != Some(mime) {
                    return Some(format!("Unable to process input image ({mime})."));
                }
            }
        }
        let calls: Vec<&Value> = parts.iter().filter_map(|p| p.get("functionCall")).collect();
        if role == "model" && !calls.is_empty() {
            let next = contents.get(i + 1)?;
            let answered: Vec<&Value> = next["parts"]
                .as_array()?
                .iter()
                .filter_map(|p| p.get("functionResponse"))
                .collect();
            for call in calls {
                let found = answered.iter().any(|r| {
                    r["name"] == call["name"]
                        && (call.get("id").is_none()
                            || r.get("id").is_none()
                            || r["id"] == call["id"])
                });
                if !found {
                    return Some(format!(
                        "Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn ({} unanswered).",
                        call["name"]
                    ));
                }
            }
        }
    }
    for tool in request["tools"].as_array().into_iter().flatten() {
        for f in tool["functionDeclarations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if f["parameters"].to_string().contains("additionalProperties") {
                return Some(
                    "Invalid JSON payload received. Unknown name \"additionalProperties\"".into(),
                );
            }
        }
    }
    let mode = &request["toolConfig"]["functionCallingConfig"]["mode"];
    if !mode.is_null() && !["AUTO", "ANY", "NONE", "VALIDATED"].contains(&mode.as_str()?) {
        return Some(format!(
            "Invalid value at 'tool_config.function_calling_config.mode' ({mode})"
        ));
    }
    None
}

/// The image type the bytes are, by their magic bytes.
fn sniff(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG") {
        Some("image/png")
    } else if bytes.starts_with(&[0xff, 0xd8]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF8") {
        Some("image/gif")
    } else if bytes.len() > 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

fn chat_events(model: &str, content: &Content) -> Vec<Bytes> {
    let chunk = |delta: Value, finish: Value| {
        sse(
            None,
            &json!({"id": format!("chatcmpl-mock-{}", content.1), "object": "chat.completion.chunk", "created": 1_700_000_000,
            "model": model, "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]}),
        )
    };
    let mut out = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    if let Some(text) = content.joined() {
        for d in deltas(&text) {
            out.push(chunk(json!({"content": d}), Value::Null));
        }
    }
    for (index, (id, name, args)) in content.tools().into_iter().enumerate() {
        out.push(chunk(
            json!({"tool_calls": [{"index": index, "id": id, "type": "function",
            "function": {"name": name, "arguments": ""}}]}),
            Value::Null,
        ));
        for d in deltas(&args.to_string()) {
            out.push(chunk(
                json!({"tool_calls": [{"index": index, "function": {"arguments": d}}]}),
                Value::Null,
            ));
        }
    }
    let finish = if content.calls() > 0 {
        "tool_calls"
    } else {
        "stop"
    };
    out.push(chunk(json!({}), json!(finish)));
    out.push(Bytes::from_static(b"data: [DONE]\n\n"));
    out
}

fn responses_object(id: &str, model: &str, status: &str, output: Vec<Value>) -> Value {
    json!({
        "id": id, "object": "response", "created_at": 1_700_000_000, "status": status,
        "model": model, "output": output, "error": null, "incomplete_details": null,
        "instructions": null, "metadata": {}, "parallel_tool_calls": true, "temperature": 1.0,
        "top_p": 1.0, "tool_choice": "auto", "tools": [], "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
                  "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}}
    })
}

/// The output items: one message item per text part, one function_call item per call.
fn responses_items(content: &Content, status: &str) -> Vec<Value> {
    let mut calls = content.tools().into_iter();
    content
        .0
        .iter()
        .enumerate()
        .map(|(i, part)| match part {
            Part::Text(text) => json!({"type": "message", "id": format!("msg_mock_{}_{i}", content.1), "status": status,
                "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]}),
            Part::Tool(..) => {
                let (id, name, args) = calls.next().unwrap_or_default_call();
                let mut item = json!({"type": "function_call", "id": format!("fc_mock_{}_{i}", content.1), "call_id": id,
                    "name": name, "arguments": args, "status": status});
                // `namespace::name`: a tool inside a `namespace` tool (Codex's MCP tools).
                if let Some((namespace, name)) = name.split_once("::") {
                    item["namespace"] = json!(namespace);
                    item["name"] = json!(name);
                }
                item
            }
        })
        .collect()
}

trait DefaultCall {
    fn unwrap_or_default_call(self) -> (String, String, String);
}

impl DefaultCall for Option<(String, &String, &Value)> {
    fn unwrap_or_default_call(self) -> (String, String, String) {
        self.map(|(id, name, args)| (id, name.clone(), args.to_string()))
            .unwrap_or_default()
    }
}

fn responses_events(model: &str, content: &Content) -> Vec<Bytes> {
    let mut seq = 0;
    let mut out = Vec::new();
    let mut push = |out: &mut Vec<Bytes>, mut data: Value| {
        data["sequence_number"] = json!(seq);
        seq += 1;
        let name = data["type"].as_str().unwrap_or("").to_string();
        out.push(sse(Some(&name), &data));
    };
    push(
        &mut out,
        json!({"type": "response.created", "response": responses_object(&content.response_id(), model, "in_progress", vec![])}),
    );
    push(
        &mut out,
        json!({"type": "response.in_progress", "response": responses_object(&content.response_id(), model, "in_progress", vec![])}),
    );
    let done = responses_items(content, "completed");
    for (index, item) in done.iter().enumerate() {
        let id = item["id"].clone();
        if item["type"] == "message" {
            let text = item["content"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let mut added = item.clone();
            added["status"] = json!("in_progress");
            added["content"] = json!([]);
            push(
                &mut out,
                json!({"type": "response.output_item.added", "output_index": index, "item": added}),
            );
            push(
                &mut out,
                json!({"type": "response.content_part.added", "item_id": id, "output_index": index,
                "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
            for d in deltas(&text) {
                push(
                    &mut out,
                    json!({"type": "response.output_text.delta", "item_id": id, "output_index": index,
                    "content_index": 0, "delta": d, "logprobs": []}),
                );
            }
            push(
                &mut out,
                json!({"type": "response.output_text.done", "item_id": id, "output_index": index,
                "content_index": 0, "text": text, "logprobs": []}),
            );
            push(
                &mut out,
                json!({"type": "response.content_part.done", "item_id": id, "output_index": index,
                "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": []}}),
            );
        } else {
            let args = item["arguments"].as_str().unwrap_or("").to_string();
            let mut added = item.clone();
            added["status"] = json!("in_progress");
            added["arguments"] = json!("");
            push(
                &mut out,
                json!({"type": "response.output_item.added", "output_index": index, "item": added}),
            );
            for d in deltas(&args) {
                push(
                    &mut out,
                    json!({"type": "response.function_call_arguments.delta", "item_id": id,
                    "output_index": index, "delta": d}),
                );
            }
            push(
                &mut out,
                json!({"type": "response.function_call_arguments.done", "item_id": id,
                "output_index": index, "arguments": args}),
            );
        }
        push(
            &mut out,
            json!({"type": "response.output_item.done", "output_index": index, "item": item}),
        );
    }
    push(
        &mut out,
        json!({"type": "response.completed", "response": responses_object(&content.response_id(), model, "completed", done)}),
    );
    out
}

fn anthropic_blocks(content: &Content) -> Vec<Value> {
    let mut calls = content.tools().into_iter();
    content
        .0
        .iter()
        .map(|part| match part {
            Part::Text(text) => json!({"type": "text", "text": text}),
            Part::Tool(..) => {
                let (id, name, args) = calls.next().unwrap_or_default_call();
                json!({"type": "tool_use", "id": id.replace("call_", "toolu_"), "name": name,
                    "input": serde_json::from_str::<Value>(&args).unwrap_or_default()})
            }
        })
        .collect()
}

fn anthropic_events(model: &str, content: &Content) -> Vec<Bytes> {
    let ev = |data: Value| sse(Some(data["type"].as_str().unwrap_or("")), &data);
    let mut out = vec![
        ev(
            json!({"type": "message_start", "message": {"id": format!("msg_mock_{}", content.1), "type": "message", "role": "assistant",
            "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 1}}}),
        ),
        ev(json!({"type": "ping"})),
    ];
    for (index, block) in anthropic_blocks(content).into_iter().enumerate() {
        let mut start = block.clone();
        if block["type"] == "text" {
            start["text"] = json!("");
        } else {
            start["input"] = json!({});
        }
        out.push(ev(
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        if block["type"] == "text" {
            for d in deltas(block["text"].as_str().unwrap_or("")) {
                out.push(ev(json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": d}})));
            }
        } else {
            for d in deltas(&block["input"].to_string()) {
                out.push(ev(json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": d}})));
            }
        }
        out.push(ev(json!({"type": "content_block_stop", "index": index})));
    }
    let stop = if content.calls() > 0 {
        "tool_use"
    } else {
        "end_turn"
    };
    out.push(ev(
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
        "usage": {"output_tokens": 5}}),
    ));
    out.push(ev(json!({"type": "message_stop"})));
    out
}
