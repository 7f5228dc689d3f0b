//! End-to-end: streams relayed as providers send them (P3, issue #41). sluice joins the chunks
//! that have already arrived into one write, but never holds an event back for one that has
//! not: here the provider sends each event only once the client has read the one before, so a
//! relay that waited for more would stall the stream. A burst of many small events, each its
//! own chunk, arrives whole, in order and complete (A9), in every dialect.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::{config_for, post, Sluice};
use futures_util::StreamExt;
use http_body_util::StreamBody;
use hyper::body::Frame;
use serde_json::json;
use tokio::sync::mpsc;

/// A provider whose streamed answer is written by the test: each message on the channel it
/// hands back for a request is one HTTP chunk; dropping the sender ends the answer.
struct Scripted {
    addr: SocketAddr,
    answers: mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>,
}

impl Scripted {
    #[allow(clippy::disallowed_methods)] // its tasks end with the test's runtime
    async fn start() -> Scripted {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (answers_tx, answers) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let answers_tx = answers_tx.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: http::Request<_>| {
                        let answers_tx = answers_tx.clone();
                        async move {
                            let _ = http_body_util::BodyExt::collect(
                                req.into_body() as hyper::body::Incoming
                            )
                            .await;
                            let (tx, rx) = mpsc::channel::<Bytes>(1);
                            answers_tx.send(tx).unwrap();
                            let frames = futures_util::stream::unfold(rx, |mut rx| async move {
                                let chunk = rx.recv().await?;
                                Some((Ok::<_, Infallible>(Frame::data(chunk)), rx))
                            });
                            Ok::<_, Infallible>(
                                http::Response::builder()
                                    .header("content-type", "text/event-stream")
                                    .body(StreamBody::new(frames))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        Scripted { addr, answers }
    }

    /// sluice in front of this provider for all four dialects.
    fn sluice(&self) -> Sluice {
        let url = format!("http://{}", self.addr);
        Sluice::start(&format!(
            "{}\n[[routes]]\nname = \"gemini\"\ndialects = [\"gemini-generate\"]\nmodels = [\"*\"]\nupstream = \"{url}\"\n",
            config_for(&url, "")
        ))
    }
}

/// `sluice_streams_total{outcome="completed"}`, once the count stops changing (a stream is
/// counted as its body ends, which the client may see a moment before).
async fn completed_streams(sluice: &Sluice) -> f64 {
    let count = |text: String| -> f64 {
        text.lines()
            .filter(|l| {
                l.starts_with("sluice_streams_total") && l.contains("outcome=\"completed\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let mut last = count(sluice.metrics().await);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = count(sluice.metrics().await);
        if now == last && now > 0.0 {
            break;
        }
        last = now;
    }
    last
}

/// Each dialect's request and its answer as events: deltas, then the final ones.
fn dialects(deltas: usize) -> Vec<(&'static str, serde_json::Value, Vec<String>)> {
    let chat_delta = |i: usize| {
        format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"w{i} \"}},\"finish_reason\":null}}]}}\n\n")
    };
    let mut chat: Vec<String> = (0..deltas).map(chat_delta).collect();
    chat.push("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n".into());
    chat.push("data: [DONE]\n\n".into());
    let typed =
        |kind: &str, rest: &str| format!("event: {kind}\ndata: {{\"type\":\"{kind}\"{rest}}}\n\n");
    let mut responses = vec![typed(
        "response.created",
        ",\"response\":{\"id\":\"r\",\"output\":[]}",
    )];
    responses.extend((0..deltas).map(|i| {
        typed(
            "response.output_text.delta",
            &format!(
                ",\"item_id\":\"m\",\"output_index\":0,\"content_index\":0,\"delta\":\"w{i} \""
            ),
        )
    }));
    responses.push(typed(
        "response.completed",
        ",\"response\":{\"id\":\"r\",\"status\":\"completed\",\"output\":[]}",
    ));
    let mut anthropic = vec![
        typed("message_start", ",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}"),
        typed("content_block_start", ",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}"),
    ];
    anthropic.extend((0..deltas).map(|i| {
        typed(
            "content_block_delta",
            &format!(",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"w{i} \"}}"),
        )
    }));
    anthropic.push(typed("content_block_stop", ",\"index\":0"));
    anthropic.push(typed(
        "message_delta",
        ",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":9}",
    ));
    anthropic.push(typed("message_stop", ""));
    let gemini_chunk = |i: usize, finish: &str| {
        format!("data: {{\"candidates\":[{{\"content\":{{\"parts\":[{{\"text\":\"w{i} \"}}],\"role\":\"model\"}}{finish},\"index\":0}}]}}\r\n\r\n")
    };
    let mut gemini: Vec<String> = (0..deltas).map(|i| gemini_chunk(i, "")).collect();
    gemini.push(gemini_chunk(deltas, ",\"finishReason\":\"STOP\""));
    let user = "Run the tests.";
    vec![
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": user}]}),
            chat,
        ),
        (
            "/v1/responses",
            json!({"model": "gpt-5", "stream": true, "input": user}),
            responses,
        ),
        (
            "/v1/messages",
            json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": true, "messages": [{"role": "user", "content": user}]}),
            anthropic,
        ),
        (
            "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
            json!({"contents": [{"role": "user", "parts": [{"text": user}]}]}),
            gemini,
        ),
    ]
}

/// The relay hands each event on as soon as it has it: the provider writes the next event only
/// once the client has read the last, so one held back would stall the stream (P3).
#[tokio::test]
async fn no_event_waits_for_the_next_one_p3() {
    let mut provider = Scripted::start().await;
    let sluice = provider.sluice();
    for (path, request, events) in dialects(30) {
        let asked = post(&sluice, path, &request);
        let answered = async {
            let answer = provider.answers.recv().await.unwrap();
            answer.send(Bytes::from(events[0].clone())).await.unwrap();
            answer
        };
        let both = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(asked, answered)
        });
        let (response, answer) = both
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer: {}", sluice.logs().join("\n")));
        assert_eq!(
            response.status(),
            200,
            "{path}: {}",
            sluice.logs().join("\n")
        );
        let mut body = response.bytes_stream();
        let mut got = String::new();
        for i in 0..events.len() {
            let want: String = events[..=i].concat();
            while got.len() < want.len() {
                let next = tokio::time::timeout(Duration::from_secs(10), body.next()).await;
                let chunk = next
                    .unwrap_or_else(|_| panic!("{path}: event {i} of {} held back", events.len()))
                    .expect("the stream went on")
                    .unwrap();
                got.push_str(std::str::from_utf8(&chunk).unwrap());
            }
            assert_eq!(got, want, "{path}: the bytes as sent, in order");
            if let Some(next) = events.get(i + 1) {
                answer.send(Bytes::from(next.clone())).await.unwrap();
            }
        }
        drop(answer);
        assert!(body.next().await.is_none(), "{path}: ends cleanly");
    }
    // Every stream completed: its final event passed (A9).
    assert_eq!(
        completed_streams(&sluice).await,
        4.0,
        "{}",
        sluice.logs().join("\n")
    );
}

/// Hundreds of small events written at once, each its own HTTP chunk, as a provider's burst
/// reaches a relay: the client gets every byte, in order, and the stream counts as complete.
#[tokio::test]
async fn a_burst_of_small_chunks_arrives_whole_and_complete_a9() {
    let mut provider = Scripted::start().await;
    let sluice = provider.sluice();
    for (path, request, events) in dialects(2_000) {
        let read = async {
            let response = post(&sluice, path, &request).await;
            assert_eq!(response.status(), 200, "{path}");
            response.bytes().await.unwrap()
        };
        let sent = async {
            let answer = provider.answers.recv().await.unwrap();
            for event in &events {
                answer.send(Bytes::from(event.clone())).await.unwrap();
            }
        };
        let (got, ()) = tokio::join!(read, sent);
        assert_eq!(
            std::str::from_utf8(&got).unwrap(),
            events.concat(),
            "{path}"
        );
    }
    assert_eq!(
        completed_streams(&sluice).await,
        4.0,
        "{}",
        sluice.logs().join("\n")
    );
}
