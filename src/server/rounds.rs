//! Continue through the gateway (SPEC C2–C4): when a forwarded request offered the read tool,
//! sluice reads the model's answer; while the model calls only the read tool, sluice answers the
//! calls itself and asks again, and the client receives one response. Streamed answers stay
//! streamed: the rounds are stitched into the client's one stream as they arrive.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::{Method, Response};
use http_body::Frame;
use serde_json::Value;
use tokio::sync::mpsc;

use super::commit::{Commit, WholeBody};
use super::pages::Paged;
pub(super) use super::reshow::MediaRoom;
use super::{App, Body, Context, InFlight};
use crate::dialect::stitch::Stitcher;
use crate::dialect::wire::merged;
use crate::dialect::Dialect;
use crate::metrics::StreamOutcome;
use crate::projection::splice;
use crate::read::{self, Call, Layout, Link, Output};
use crate::tenant::Tenant;
use crate::upstream::{BoxError, Started};

/// Largest non-streamed model response sluice reads to look for read calls.
const MAX_REPLY_BYTES: usize = 64 * 1024 * 1024;

/// Everything a request's read rounds need.
pub(super) struct Job {
    pub dialect: Dialect,
    /// The read tool's name in this request.
    pub tool: String,
    pub max_steps: usize,
    pub tenant: Tenant,
    pub method: Method,
    pub uri: http::Uri,
    pub headers: HeaderMap,
    /// The first round's forwarded body.
    pub body: crate::projection::Rope,
    /// The client's request as sent: its last history item starts a link's fingerprint (read
    /// only when rounds were hidden, so a request the model answers at once pays nothing).
    pub original: Bytes,
    /// The request's delivery-state change; the link of hidden rounds joins it (C3).
    pub commit: Commit,
    /// Images and audio this request may still show (C5: re-read media count against the
    /// route's budgets, after the media the request already embeds).
    pub images: MediaRoom,
}

/// The rounds so far: each round's output and the read results that answered it.
#[derive(Default)]
struct Rounds {
    outputs: Vec<Output>,
    answered: Vec<Vec<read::Answer>>,
}

impl Rounds {
    /// The items the model actually saw, in place of what the client received, and the
    /// blocks that go first in the client's next message (Anthropic, mixed calls).
    fn hidden(&self, dialect: Dialect) -> (String, String) {
        let mut items: Vec<String> = Vec::new();
        let mut prefix = String::new();
        let last = self.outputs.len().saturating_sub(1);
        for (i, output) in self.outputs.iter().enumerate() {
            items.extend(output.items.iter().map(Value::to_string));
            let Some(results) = self.answered.get(i) else {
                continue;
            };
            // Later turns show a re-read image once: as its placeholder (C5).
            let results: Vec<read::Answer> = results.iter().map(read::Answer::once_shown).collect();
            let results = &results;
            let wire = dialect.wire();
            match wire.results_first_in_next(results).filter(|_| i == last) {
                Some(first) => {
                    prefix = first
                        .iter()
                        .map(Value::to_string)
                        .collect::<Vec<_>>()
                        .join(",");
                }
                None => items.extend(wire.results(results).iter().map(Value::to_string)),
            }
        }
        (items.join(","), prefix)
    }
}

impl App {
    /// Answers the model's read calls until it answers the client (see the module doc).
    pub(super) async fn read_rounds(
        self: &Arc<Self>,
        job: Job,
        started: Started,
        ctx: &Context,
        inflight: InFlight,
        start: Instant,
        before_send: Duration,
    ) -> Response<Body> {
        let answered = Instant::now();
        let overhead = |own: Duration| {
            self.metrics
                .overhead_seconds
                .observe((before_send + own).as_secs_f64());
        };
        if !started.status.is_success() {
            // The provider refused the first round: relayed as is; the delta is discarded there.
            let response = self.relay(started, ctx, inflight, start, None, job.commit);
            overhead(answered.elapsed());
            return response;
        }
        if started.is_event_stream() {
            let response = self.read_stream(job, started, ctx, inflight).await;
            overhead(answered.elapsed());
            return response;
        }
        let mut waited = Duration::ZERO;
        let response = self
            .read_whole(job, started, ctx, inflight, &mut waited)
            .await;
        // sluice's own time: the rounds' upstream waits are the provider's.
        overhead(answered.elapsed().saturating_sub(waited));
        tracing::debug!(
            request_id = %ctx.request_id,
            dialect = ctx.dialect,
            route = %ctx.route,
            status = response.status().as_u16(),
            duration_ms = start.elapsed().as_secs_f64() * 1e3,
            "request finished (read rounds, not streamed)"
        );
        response
    }

    /// Non-streamed rounds: the client gets the final response with every round's visible
    /// output and the usage of all rounds. `waited` adds up the time spent waiting on the
    /// upstream (the provider's time, not sluice's).
    async fn read_whole(
        self: &Arc<Self>,
        mut job: Job,
        mut started: Started,
        ctx: &Context,
        inflight: InFlight,
        waited: &mut Duration,
    ) -> Response<Body> {
        let status = started.status;
        // The client gets the body sluice decoded (and may rewrite): no content coding.
        let mut headers = started.decoded_headers();
        headers.remove(header::CONTENT_LENGTH);
        let mut rounds = Rounds::default();
        let mut body = job.body.clone();
        let (last, last_bytes) = loop {
            let waiting = Instant::now();
            let collected = started.collect(MAX_REPLY_BYTES).await;
            *waited += waiting.elapsed();
            let bytes = match collected {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::warn!(request_id = %ctx.request_id, error = %e, "read round: upstream body failed");
                    return self
                        .error_response(ctx, &crate::error::GatewayError::UpstreamUnreachable);
                }
            };
            let Ok(value) = serde_json::from_slice::<Value>(&bytes) else {
                // Not JSON: the client gets it as the provider sent it (a whole 2xx body: the
                // request's delta counts as delivered, A9).
                self.remember(&mut job, &rounds).await;
                return respond(status, headers, bytes, inflight, job.commit);
            };
            let output = job.dialect.wire().output(&value);
            let (reads, others) = owned_reads(&output, &job.tool);
            rounds.outputs.push(output);
            if reads.is_empty() || rounds.answered.len() >= job.max_steps {
                break (value, bytes);
            }
            let results = self.answer(&mut job, &reads).await;
            rounds.answered.push(results);
            if others {
                break (value, bytes);
            }
            let force = rounds.answered.len() >= job.max_steps;
            let Some(next) = next_body(&job, &body.to_bytes(), &rounds, force) else {
                break (value, bytes);
            };
            body = next.into();
            let waiting = Instant::now();
            let sent = self.round(&job, &body).await;
            *waited += waiting.elapsed();
            started = match sent {
                Ok(next) if next.status.is_success() => next,
                // A failed round: the client gets the upstream's error; nothing is committed.
                Ok(failed) => {
                    return self.relay(failed, ctx, inflight, Instant::now(), None, job.commit);
                }
                Err(e) => return self.error_response(ctx, &e),
            };
        };
        self.metrics
            .read_rounds
            .observe(rounds.answered.len() as f64);
        job.commit
            .ended(false, first_usage(job.dialect, &rounds), None);
        self.remember(&mut job, &rounds).await;
        if rounds.answered.is_empty() {
            // The model answered at once: its response, byte for byte.
            return respond(status, headers, last_bytes, inflight, job.commit);
        }
        let merged = merged(job.dialect.wire(), last, &rounds.outputs, &job.tool);
        let merged = Bytes::from(merged.to_string());
        respond(status, headers, merged, inflight, job.commit)
    }

    /// Streamed rounds, stitched into one client stream by a tracked task. The first upstream
    /// chunk (already in hand) is stitched here, so it leaves with the response head: a stream
    /// that needs no read reaches the client as early as through the plain relay.
    async fn read_stream(
        self: &Arc<Self>,
        job: Job,
        mut started: Started,
        ctx: &Context,
        inflight: InFlight,
    ) -> Response<Body> {
        let status = started.status;
        let mut headers = started.decoded_headers();
        headers.remove(header::CONTENT_LENGTH);
        let mut stitch = Stitcher::new(job.dialect, &job.tool);
        let first = match started.next_chunk().await {
            Ok(Some(chunk)) => Some(Bytes::from(stitch.feed(&chunk))),
            _ => None,
        };
        let (tx, rx) = mpsc::channel::<Result<Piece, BoxError>>(16);
        let app = self.clone();
        let request_id = ctx.request_id.clone();
        let dialect_name = ctx.dialect;
        let mut job = job;
        self.commits.spawn(async move {
            let outcome = app.stream_rounds(&mut job, started, stitch, &tx).await;
            drop(tx);
            app.metrics
                .streams_total
                .with_label_values(&[dialect_name, outcome.as_str()])
                .inc();
            tracing::debug!(
                request_id,
                outcome = outcome.as_str(),
                "read rounds finished"
            );
            drop(inflight);
        });
        let body = ChannelBody {
            first: first.filter(|b| !b.is_empty()),
            rx,
        };
        let mut response = Response::new(http_body_util::BodyExt::boxed_unsync(body));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }

    async fn stream_rounds(
        self: &Arc<Self>,
        job: &mut Job,
        mut started: Started,
        mut stitch: Stitcher,
        tx: &mpsc::Sender<Result<Piece, BoxError>>,
    ) -> StreamOutcome {
        let mut rounds = Rounds::default();
        let mut body = job.body.clone();
        loop {
            loop {
                match started.next_chunk().await {
                    Ok(Some(chunk)) => {
                        let out = stitch.feed(&chunk);
                        if !out.is_empty() && tx.send(Ok(Piece::of(out))).await.is_err() {
                            return StreamOutcome::Cancelled;
                        }
                    }
                    Ok(None) => {
                        let out = stitch.upstream_ended();
                        if !out.is_empty() && tx.send(Ok(Piece::of(out))).await.is_err() {
                            return StreamOutcome::Cancelled;
                        }
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "read round: upstream stream failed");
                        let _ = tx.send(Err(e)).await;
                        return StreamOutcome::UpstreamError;
                    }
                }
            }
            let complete = stitch.round_complete();
            let output = stitch.output();
            let (reads, others) = owned_reads(&output, &job.tool);
            rounds.outputs.push(output);
            if !complete {
                // The provider ended the round early: the client sees a cut stream, as it
                // would without sluice, and nothing is committed.
                let _ = tx.send(Err("upstream stream ended early".into())).await;
                return StreamOutcome::UpstreamError;
            }
            if reads.is_empty() || rounds.answered.len() >= job.max_steps {
                break;
            }
            let results = self.answer(job, &reads).await;
            rounds.answered.push(results);
            if others {
                break;
            }
            let force = rounds.answered.len() >= job.max_steps;
            let Some(next) = next_body(job, &body.to_bytes(), &rounds, force) else {
                break;
            };
            body = next.into();
            match self.round(job, &body).await {
                Ok(next) if next.status.is_success() && next.is_event_stream() => {
                    started = next;
                    stitch.next_round();
                }
                Ok(mut failed) => {
                    let detail = failed.collect(64 * 1024).await.unwrap_or_default();
                    let message = format!(
                        "upstream answered {} to a read round: {}",
                        failed.status,
                        String::from_utf8_lossy(&detail[..detail.len().min(2000)])
                    );
                    let _ = tx.send(Ok(Piece::of(stitch.error(&message)))).await;
                    return StreamOutcome::UpstreamError;
                }
                Err(e) => {
                    let _ = tx.send(Ok(Piece::of(stitch.error(&e.to_string())))).await;
                    return StreamOutcome::UpstreamError;
                }
            }
        }
        self.metrics
            .read_rounds
            .observe(rounds.answered.len() as f64);
        let tail = stitch.finish(&rounds.outputs);
        job.commit
            .ended(true, first_usage(job.dialect, &rounds), None);
        // The link of the hidden rounds joins the commit, which goes with the stream's final
        // events: settled when they are handed to the client (A9), as the relay does; a client
        // gone before then (the piece comes back unsent and is dropped) commits nothing.
        self.remember(job, &rounds).await;
        let last = Piece {
            bytes: Bytes::from(tail),
            commit: Some(std::mem::replace(&mut job.commit, Commit::none())),
        };
        if tx.send(Ok(last)).await.is_err() {
            return StreamOutcome::Cancelled;
        }
        StreamOutcome::Completed
    }

    /// Sends one further round upstream.
    async fn round(
        &self,
        job: &Job,
        body: &crate::projection::Rope,
    ) -> Result<Started, crate::error::GatewayError> {
        self.upstream
            .send(
                job.method.clone(),
                job.uri.clone(),
                job.headers.clone(),
                crate::upstream::Outgoing::pieces(body.clone()),
            )
            .await
    }

    /// Answers read calls with their pages, images or audio; every failure is an answer the model can
    /// read.
    async fn answer(&self, job: &mut Job, calls: &[Call]) -> Vec<read::Answer> {
        let mut out = Vec::with_capacity(calls.len());
        for call in calls {
            let request = read::parse_call(call, &job.tenant);
            let artifact = request.artifact().map(|id| id.to_string());
            let (text, media, outcome) = match request {
                read::Request::Invalid(message) => (message, None, "bad_cursor"),
                read::Request::Page(cursor) => {
                    match self.read_page(&job.tenant, &cursor, &job.tool).await {
                        Ok(Paged::Page(page)) => (page.text, None, "page"),
                        Ok(Paged::NotThisText) => (
                            "[sluice: this cursor does not read a text sluice stored]".to_string(),
                            None,
                            "bad_cursor",
                        ),
                        Ok(Paged::Missing) => (expired(&cursor.artifact), None, "expired"),
                        Err(e) => store_unavailable(&e),
                    }
                }
                read::Request::Media(id) => {
                    // This request's own images are written while it is forwarded.
                    job.commit.written().await;
                    match self.artifacts.get(&job.tenant, &id).await {
                        Ok(Some(bytes)) => {
                            self.reshow_off_thread(&mut job.images, id, bytes, &job.tenant)
                                .await
                        }
                        Ok(None) => (expired(&id), None, "expired"),
                        Err(e) => store_unavailable(&e),
                    }
                }
            };
            self.metrics
                .read_calls_total
                .with_label_values(&[outcome])
                .inc();
            if let Some(draft) = job.commit.draft() {
                draft.read(outcome, artifact);
            }
            out.push(read::Answer {
                id: call.id.clone(),
                name: call.name.clone(),
                text,
                media,
            });
        }
        out
    }

    /// Adds to the request's commit the link that splices hidden rounds back into later
    /// requests (C3), once their artifact is stored. The commit itself waits for the response
    /// to reach the client.
    async fn remember(&self, job: &mut Job, rounds: &Rounds) {
        if !job.commit.has_session() || rounds.answered.is_empty() {
            return;
        }
        let wire = job.dialect.wire();
        let shown = wire.visible(&rounds.outputs, &job.tool);
        let (items, prefix) = rounds.hidden(job.dialect);
        if shown.is_empty() || items.is_empty() {
            return;
        }
        let content = Link::content(&items, &prefix);
        let link = Link {
            fingerprint: read::fingerprint(
                wire,
                Layout::read(job.dialect, &job.original)
                    .and_then(|s| s.last_item())
                    .as_ref(),
                &shown,
            ),
            items: shown.len(),
            artifact: Link::artifact_for(&job.tenant, &content),
        };
        match self
            .artifacts
            .put(&job.tenant, &link.artifact, Bytes::from(content))
            .await
        {
            Ok(()) => {
                job.commit.delta_mut().links.insert(link.key());
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot store hidden read rounds; later turns will not show them");
            }
        }
    }
}

pub(super) fn expired(id: &crate::store::ArtifactId) -> String {
    format!("[sluice: artifact://{id} has expired and can no longer be read]")
}

pub(super) fn store_unavailable(
    e: &crate::store::StoreError,
) -> (String, Option<read::Media>, &'static str) {
    tracing::warn!(error = %e, "read tool: artifact store unavailable");
    (
        "[sluice: the artifact store is unavailable; try the same call again later]".to_string(),
        None,
        "store_error",
    )
}

/// The read calls of a round (owned) and whether the model called other tools too.
fn owned_reads(output: &Output, tool: &str) -> (Vec<Call>, bool) {
    let (reads, others) = output.read_calls(tool);
    (reads.into_iter().cloned().collect(), others)
}

/// The next round's body: the last round's output and its read results appended; at the step
/// limit, `tool_choice` set so the model must answer.
fn next_body(job: &Job, body: &Bytes, rounds: &Rounds, force: bool) -> Option<Bytes> {
    let output = rounds.outputs.last()?;
    let results = rounds.answered.last()?;
    let layout = Layout::read(job.dialect, body)?;
    let items: Vec<String> = output
        .items
        .iter()
        .chain(job.dialect.wire().results(results).iter())
        .map(Value::to_string)
        .collect();
    let mut edits = vec![layout.append(&items.join(","))?];
    if force {
        edits.push(layout.force_answer());
    }
    splice(body, edits).ok()
}

/// The provider's usage of the first round: the request as sluice forwarded it, which the
/// inspector's estimate describes (later rounds are the read tool's).
fn first_usage(dialect: Dialect, rounds: &Rounds) -> Option<crate::dialect::usage::Usage> {
    crate::dialect::usage::of_value(dialect, rounds.outputs.first()?.usage.as_ref()?)
}

fn respond(
    status: http::StatusCode,
    headers: HeaderMap,
    bytes: Bytes,
    inflight: InFlight,
    mut commit: Commit,
) -> Response<Body> {
    drop(inflight);
    if bytes.len() <= crate::inspect::KEEP_RESPONSE_BYTES {
        commit.ended(false, None, Some(bytes.clone()));
    }
    let body = WholeBody::new(bytes, commit);
    let mut response = Response::new(http_body_util::BodyExt::boxed_unsync(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// What the task that stitches the rounds sends the client's body: bytes, and with the stream's
/// final events, the request's commit.
struct Piece {
    bytes: Bytes,
    commit: Option<Commit>,
}

impl Piece {
    fn of(bytes: Vec<u8>) -> Piece {
        Piece {
            bytes: Bytes::from(bytes),
            commit: None,
        }
    }
}

/// A response body: the first stitched chunk, then what the task that stitches the rounds sends.
struct ChannelBody {
    first: Option<Bytes>,
    rx: mpsc::Receiver<Result<Piece, BoxError>>,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        loop {
            return match this.rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(piece))) => {
                    if let Some(commit) = piece.commit {
                        commit.settle(true);
                    }
                    if piece.bytes.is_empty() {
                        continue;
                    }
                    Poll::Ready(Some(Ok(Frame::data(piece.bytes))))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            };
        }
    }
}
