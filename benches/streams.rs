//! Streams as providers send them (issue #41): the two ends of `benches/streams.sh`.
//!
//! `streams mock ADDR` serves every dialect's streamed answer the way a provider sends it: chat
//! chunks with `include_usage` (`/chat/completions`), Responses events (`/responses`),
//! Anthropic events with a tool call (`/messages`) and Gemini chunks
//! (`:streamGenerateContent`), `x-mock-events` events per answer (default 200), each its own
//! HTTP chunk. `x-mock-write: together` (the default) has them all ready at once, so they leave
//! in as few writes as the server makes; `each` gives one write per event; `x-mock-pace-us`
//! spaces them as a model would. Every event carries the time it was handed to the socket
//! (`"sent_ns"`, the wall clock in nanoseconds), so a client on this machine can tell how long
//! each event took to reach it.
//!
//! `streams client URL PATH CONNECTIONS SECONDS EVENTS PACE_US` keeps CONNECTIONS streams going
//! for SECONDS (each connection asks again when its stream ends; the first asks are spread over
//! one pace of the answer, so paced streams do not move in step) and prints one JSON line: the
//! requests and events received, each event's delay from the mock's hand-off to the client's
//! read (p50, p99, p99.9, max, in microseconds), the time to first byte (p50, p99) and failures.
//! The delay through a proxy minus the delay direct is what the proxy adds to each event.
//!
//! Run through `benches/streams.sh`, which builds this with `cargo build --release --bench
//! streams`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // benchmark code: fail loudly
// A tool process: its tasks end with it.
#![allow(clippy::disallowed_methods)]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match args.first().map(String::as_str) {
        Some("mock") => runtime.block_on(mock(args.get(1).expect("mock ADDR"))),
        Some("client") => {
            let n = |i: usize| -> u64 { args.get(i).and_then(|v| v.parse().ok()).expect("client URL PATH CONNECTIONS SECONDS EVENTS PACE_US") };
            let (url, path) = (args.get(1).unwrap().clone(), args.get(2).unwrap().clone());
            let report = runtime.block_on(client(url, path, n(3), n(4), n(5), n(6)));
            println!("{report}");
        }
        Some("body") => print!("{}", request_body(args.get(1).expect("body PATH"))),
        // `cargo bench` runs every bench target: this one is a tool, not a measurement.
        _ => eprintln!("usage: streams mock ADDR | streams client URL PATH CONNECTIONS SECONDS EVENTS PACE_US (run by benches/streams.sh)"),
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The dialects, told from the request's path.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dialect {
    Chat,
    Responses,
    Anthropic,
    Gemini,
}

impl Dialect {
    fn of(path: &str) -> Option<Dialect> {
        if path.ends_with("/chat/completions") {
            Some(Dialect::Chat)
        } else if path.ends_with("/responses") {
            Some(Dialect::Responses)
        } else if path.ends_with("/messages") {
            Some(Dialect::Anthropic)
        } else if path.contains(":streamGenerateContent") {
            Some(Dialect::Gemini)
        } else {
            None
        }
    }
}

/// One event as a template: the time it leaves is added as the last member of its JSON object
/// (at `stamp_at`, its closing brace), so the event starts as its provider's does.
struct Event {
    text: String,
    stamp_at: Option<usize>,
}

/// An event from the text before its JSON (`head`, ending with the `{` that opens it) and the
/// rest; an event with no `{` in its head (`data: [DONE]`) is not stamped.
fn ev(head: &'static str, tail: impl Into<String>) -> Event {
    let text = format!("{head}{}", tail.into());
    let stamp_at = head.ends_with('{').then(|| text.rfind('}')).flatten();
    Event { text, stamp_at }
}

/// A few tokens of text, different per event as a model's are.
fn words(i: usize) -> &'static str {
    const WORDS: [&str; 8] = [
        " the",
        " result",
        " of",
        " running",
        " it",
        " shows",
        " that",
        " tests pass",
    ];
    WORDS[i % WORDS.len()]
}

/// The answer of `dialect` in `n` events (at least its fixed ones), as its provider sends it.
fn answer(dialect: Dialect, n: usize) -> Vec<Event> {
    let mut out = Vec::with_capacity(n);
    match dialect {
        Dialect::Chat => {
            const HEAD: &str = "data: {";
            let chunk = |delta: &str, finish: &str| {
                format!(
                    r#""id":"chatcmpl-b","object":"chat.completion.chunk","created":1765000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_1","choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish}}}],"usage":null}}"#
                ) + "\n\n"
            };
            out.push(ev(
                HEAD,
                chunk(
                    r#"{"role":"assistant","content":"","refusal":null}"#,
                    "null",
                ),
            ));
            for i in 0..n.saturating_sub(4).max(1) {
                out.push(ev(
                    HEAD,
                    chunk(&format!(r#"{{"content":"{}"}}"#, words(i)), "null"),
                ));
            }
            out.push(ev(HEAD, chunk("{}", r#""stop""#)));
            out.push(ev(HEAD, r#""id":"chatcmpl-b","object":"chat.completion.chunk","created":1765000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":1200,"completion_tokens":180,"total_tokens":1380,"prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0}}}"#.to_owned() + "\n\n"));
            out.push(ev("", "data: [DONE]\n\n"));
        }
        Dialect::Responses => {
            let typed = |kind: &'static str, rest: String| (kind, rest);
            let mut seq = vec![
                typed("response.created", r#""response":{"id":"resp_b","object":"response","status":"in_progress","model":"gpt-5","output":[]}"#.into()),
                typed("response.in_progress", r#""response":{"id":"resp_b","object":"response","status":"in_progress","model":"gpt-5","output":[]}"#.into()),
                typed("response.output_item.added", r#""output_index":0,"item":{"id":"msg_b","type":"message","status":"in_progress","content":[],"role":"assistant"}"#.into()),
                typed("response.content_part.added", r#""item_id":"msg_b","output_index":0,"content_index":0,"part":{"type":"output_text","annotations":[],"text":""}"#.into()),
            ];
            for i in 0..n.saturating_sub(8).max(1) {
                seq.push(typed("response.output_text.delta", format!(r#""item_id":"msg_b","output_index":0,"content_index":0,"delta":"{}","logprobs":[]"#, words(i))));
            }
            seq.push(typed("response.output_text.done", r#""item_id":"msg_b","output_index":0,"content_index":0,"text":"done","logprobs":[]"#.into()));
            seq.push(typed("response.content_part.done", r#""item_id":"msg_b","output_index":0,"content_index":0,"part":{"type":"output_text","annotations":[],"text":"done"}"#.into()));
            seq.push(typed("response.output_item.done", r#""output_index":0,"item":{"id":"msg_b","type":"message","status":"completed","content":[{"type":"output_text","annotations":[],"text":"done"}],"role":"assistant"}"#.into()));
            seq.push(typed("response.completed", r#""response":{"id":"resp_b","object":"response","status":"completed","model":"gpt-5","output":[{"id":"msg_b","type":"message","status":"completed","content":[{"type":"output_text","annotations":[],"text":"done"}],"role":"assistant"}],"usage":{"input_tokens":1200,"input_tokens_details":{"cached_tokens":1024},"output_tokens":180,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":1380}}"#.into()));
            for (seq_no, (kind, rest)) in seq.into_iter().enumerate() {
                let head: &'static str =
                    Box::leak(format!("event: {kind}\ndata: {{").into_boxed_str());
                out.push(ev(
                    head,
                    format!(r#""type":"{kind}","sequence_number":{seq_no},{rest}}}"#) + "\n\n",
                ));
            }
        }
        Dialect::Anthropic => {
            let e = |kind: &'static str, rest: &str| {
                let head: &'static str =
                    Box::leak(format!("event: {kind}\ndata: {{").into_boxed_str());
                ev(head, format!(r#""type":"{kind}"{rest}}}"#) + "\n\n")
            };
            out.push(e("message_start", r#","message":{"id":"msg_b","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":1200,"output_tokens":1}}"#));
            out.push(e(
                "content_block_start",
                r#","index":0,"content_block":{"type":"text","text":""}"#,
            ));
            out.push(e("ping", ""));
            // Three quarters of the deltas are text, the rest the tool call's input.
            let deltas = n.saturating_sub(8).max(2);
            let text = deltas * 3 / 4;
            for i in 0..text {
                out.push(e(
                    "content_block_delta",
                    &format!(
                        r#","index":0,"delta":{{"type":"text_delta","text":"{}"}}"#,
                        words(i)
                    ),
                ));
            }
            out.push(e("content_block_stop", r#","index":0"#));
            out.push(e("content_block_start", r#","index":1,"content_block":{"type":"tool_use","id":"toolu_b","name":"bash","input":{}}"#));
            for i in text..deltas {
                let piece = if i == text {
                    r#"{\"command\": \""#
                } else if i + 1 == deltas {
                    r#"ls\"}"#
                } else {
                    "cargo t"
                };
                out.push(e("content_block_delta", &format!(r#","index":1,"delta":{{"type":"input_json_delta","partial_json":"{piece}"}}"#)));
            }
            out.push(e("content_block_stop", r#","index":1"#));
            out.push(e("message_delta", r#","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":180}"#));
            out.push(e("message_stop", ""));
        }
        Dialect::Gemini => {
            // Each chunk carries the usage so far; the last one its finish reason.
            const HEAD: &str = "data: {";
            for i in 0..n.max(1) {
                let last = i + 1 == n.max(1);
                let finish = if last {
                    r#","finishReason":"STOP""#
                } else {
                    ""
                };
                out.push(ev(HEAD, format!(r#""candidates":[{{"content":{{"parts":[{{"text":"{}"}}],"role":"model"}}{finish},"index":0}}],"usageMetadata":{{"promptTokenCount":1200,"candidatesTokenCount":{i},"totalTokenCount":{}}},"modelVersion":"gemini-2.5-flash","responseId":"b"}}"#, words(i), 1200 + i) + "\r\n\r\n"));
            }
        }
    }
    out
}

/// The events of one answer, each its own frame, stamped as it is handed on.
struct Answer {
    events: Arc<Vec<Event>>,
    next: usize,
    pace: Duration,
    /// One write per event: the body says "not yet" once between events.
    each: bool,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    yielded: bool,
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if this.next >= this.events.len() {
            return Poll::Ready(None);
        }
        if this.next > 0 {
            if !this.pace.is_zero() {
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(this.pace)));
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.sleep = None;
            } else if this.each && !this.yielded {
                this.yielded = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
        this.yielded = false;
        let event = &this.events[this.next];
        this.next += 1;
        let mut out = BytesMut::with_capacity(event.text.len() + 32);
        match event.stamp_at {
            Some(at) => {
                out.extend_from_slice(&event.text.as_bytes()[..at]);
                out.extend_from_slice(format!(r#","sent_ns":{}"#, now_ns()).as_bytes());
                out.extend_from_slice(&event.text.as_bytes()[at..]);
            }
            None => out.extend_from_slice(event.text.as_bytes()),
        }
        Poll::Ready(Some(Ok(Frame::data(out.freeze()))))
    }
}

type Answers = Arc<Mutex<std::collections::HashMap<(usize, usize), Arc<Vec<Event>>>>>;

async fn mock(addr: &str) {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let answers: Answers = Arc::default();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let answers = answers.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let answers = answers.clone();
                async move { Ok::<_, Infallible>(respond(req, &answers).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

type MockBody = http_body_util::Either<Answer, http_body_util::Full<Bytes>>;

async fn respond(req: Request<Incoming>, answers: &Answers) -> Response<MockBody> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let n: usize = header("x-mock-events")
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let pace = Duration::from_micros(
        header("x-mock-pace-us")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    );
    let each = header("x-mock-write").as_deref() == Some("each");
    let dialect = Dialect::of(req.uri().path());
    let _ = req.into_body().collect().await;
    let Some(dialect) = dialect else {
        let mut response = Response::new(http_body_util::Either::Right(http_body_util::Full::new(
            Bytes::from_static(br#"{"error":"no such path"}"#),
        )));
        *response.status_mut() = http::StatusCode::NOT_FOUND;
        return response;
    };
    let events = answers
        .lock()
        .unwrap()
        .entry((dialect as usize, n))
        .or_insert_with(|| Arc::new(answer(dialect, n)))
        .clone();
    let body = Answer {
        events,
        next: 0,
        pace,
        each,
        sleep: None,
        yielded: false,
    };
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(http_body_util::Either::Left(body))
        .unwrap()
}

/// Delays in microseconds, counted in 1 µs buckets up to one second (the last holds the rest).
struct Histogram(Vec<u64>);

impl Histogram {
    const BUCKETS: usize = 1_000_000;

    fn new() -> Histogram {
        Histogram(vec![0; Self::BUCKETS])
    }

    fn add(&mut self, micros: u64) {
        let at = usize::try_from(micros)
            .unwrap_or(usize::MAX)
            .min(Self::BUCKETS - 1);
        self.0[at] += 1;
    }

    fn count(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The value at quantile `q`, in microseconds.
    fn at(&self, q: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let want = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (micros, n) in self.0.iter().enumerate() {
            seen += n;
            if seen >= want {
                return micros as u64;
            }
        }
        (Self::BUCKETS - 1) as u64
    }

    fn max(&self) -> u64 {
        self.0.iter().rposition(|n| *n > 0).unwrap_or(0) as u64
    }
}

/// Reads the `"sent_ns":` stamps out of a stream's bytes as they come, however they are cut.
struct Stamps {
    carry: Vec<u8>,
}

const STAMP: &[u8] = br#","sent_ns":"#;

impl Stamps {
    /// Each whole stamp in the bytes so far, given to `on_stamp`; a cut one waits for the rest.
    fn feed(&mut self, bytes: &[u8], on_stamp: &mut impl FnMut(u64)) {
        self.carry.extend_from_slice(bytes);
        let mut from = 0;
        let finder = memchr::memmem::Finder::new(STAMP);
        let mut keep_from = self.carry.len().saturating_sub(STAMP.len() - 1);
        while let Some(at) = finder.find(&self.carry[from..]) {
            let digits_at = from + at + STAMP.len();
            let digits = self.carry[digits_at..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            if digits_at + digits == self.carry.len() {
                keep_from = from + at;
                break;
            }
            let text =
                std::str::from_utf8(&self.carry[digits_at..digits_at + digits]).unwrap_or("0");
            on_stamp(text.parse().unwrap_or(0));
            from = digits_at + digits;
            keep_from = keep_from.max(from);
        }
        self.carry.drain(..keep_from.min(self.carry.len()));
    }
}

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    events: AtomicU64,
    failures: AtomicU64,
}

fn request_body(path: &str) -> &'static str {
    match Dialect::of(path) {
        Some(Dialect::Chat) | None => {
            r#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"You are a coding agent."},{"role":"user","content":"Run the tests and tell me what failed."}]}"#
        }
        Some(Dialect::Responses) => {
            r#"{"model":"gpt-5","stream":true,"instructions":"You are a coding agent.","input":[{"role":"user","content":"Run the tests and tell me what failed."}]}"#
        }
        Some(Dialect::Anthropic) => {
            r#"{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,"system":"You are a coding agent.","messages":[{"role":"user","content":"Run the tests and tell me what failed."}],"tools":[{"name":"bash","description":"Runs a shell command.","input_schema":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}]}"#
        }
        Some(Dialect::Gemini) => {
            r#"{"contents":[{"role":"user","parts":[{"text":"Run the tests and tell me what failed."}]}],"systemInstruction":{"parts":[{"text":"You are a coding agent."}]}}"#
        }
    }
}

async fn client(
    url: String,
    path: String,
    conns: u64,
    secs: u64,
    events: u64,
    pace_us: u64,
) -> String {
    let uri: http::Uri = url.parse().unwrap();
    let authority = uri.authority().unwrap().to_string();
    let delays = Arc::new(Mutex::new(Histogram::new()));
    let firsts = Arc::new(Mutex::new(Histogram::new()));
    let counts = Arc::new(Counts::default());
    let begin = Instant::now();
    let end = begin + Duration::from_secs(secs);
    // The first asks are spread over one answer's length, so paced streams do not move in step.
    let spread = Duration::from_micros(pace_us.saturating_mul(events)).min(Duration::from_secs(5));
    let mut tasks = Vec::new();
    for i in 0..conns {
        let (authority, path) = (authority.clone(), path.clone());
        let (delays, firsts, counts) = (delays.clone(), firsts.clone(), counts.clone());
        let start = begin + spread.mul_f64(i as f64 / conns.max(1) as f64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(start.into()).await;
            while Instant::now() < end {
                let ok = one_connection(
                    &authority, &path, events, pace_us, end, &delays, &firsts, &counts,
                )
                .await;
                if !ok {
                    counts.failures.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let elapsed = begin.elapsed().as_secs_f64();
    let (d, f) = (delays.lock().unwrap(), firsts.lock().unwrap());
    format!(
        r#"{{"requests":{},"events":{},"failures":{},"seconds":{elapsed:.3},"delay_p50_us":{},"delay_p99_us":{},"delay_p999_us":{},"delay_max_us":{},"ttfb_p50_us":{},"ttfb_p99_us":{}}}"#,
        counts.requests.load(Ordering::Relaxed),
        counts.events.load(Ordering::Relaxed),
        counts.failures.load(Ordering::Relaxed),
        d.at(0.5),
        d.at(0.99),
        d.at(0.999),
        d.max(),
        f.at(0.5),
        f.at(0.99),
    )
}

/// Streams answers on one connection until `end`; false when the connection failed.
#[allow(clippy::too_many_arguments)]
async fn one_connection(
    authority: &str,
    path: &str,
    events: u64,
    pace_us: u64,
    end: Instant,
    delays: &Mutex<Histogram>,
    firsts: &Mutex<Histogram>,
    counts: &Counts,
) -> bool {
    let Ok(stream) = tokio::net::TcpStream::connect(authority).await else {
        return false;
    };
    let _ = stream.set_nodelay(true);
    let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    else {
        return false;
    };
    tokio::spawn(conn);
    let body = request_body(path);
    while Instant::now() < end {
        if sender.ready().await.is_err() {
            return false;
        }
        let mut request = Request::post(path)
            .header("host", authority)
            .header("content-type", "application/json")
            .header("authorization", "Bearer sk-bench")
            .header("x-api-key", "sk-bench")
            .header("x-goog-api-key", "bench")
            .header("anthropic-version", "2023-06-01")
            .header("x-mock-events", events.to_string())
            .body(http_body_util::Full::new(Bytes::from_static(
                body.as_bytes(),
            )))
            .unwrap();
        if pace_us > 0 {
            request
                .headers_mut()
                .insert("x-mock-pace-us", pace_us.to_string().parse().unwrap());
        }
        let asked = Instant::now();
        let Ok(response) = sender.send_request(request).await else {
            return false;
        };
        if !response.status().is_success() {
            let _ = response.into_body().collect().await;
            return false;
        }
        let mut body = response.into_body();
        let mut stamps = Stamps { carry: Vec::new() };
        let mut first = true;
        let mut seen = 0u64;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                return false;
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let arrived = now_ns();
            if first {
                firsts
                    .lock()
                    .unwrap()
                    .add(asked.elapsed().as_micros() as u64);
                first = false;
            }
            let mut delays = delays.lock().unwrap();
            stamps.feed(&data, &mut |sent| {
                seen += 1;
                delays.add(arrived.saturating_sub(sent) / 1_000);
            });
        }
        counts.requests.fetch_add(1, Ordering::Relaxed);
        counts.events.fetch_add(seen, Ordering::Relaxed);
    }
    true
}
