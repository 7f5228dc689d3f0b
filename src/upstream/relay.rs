//! An upstream response once its head and first chunk arrived: read by sluice itself (the read
//! tool's rounds), or relayed to the client chunk by chunk as it comes (SPEC P3), with its end
//! observed in one place.

use std::future::Future;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http_body::{Body as _, Frame};

use crate::dialect::completion::Completion;
use crate::encoding::{DecodeError, Decoder};
use crate::metrics::StreamOutcome;

use super::headers::response_headers;
use super::{BoxError, Incoming};

/// The next data chunk of an upstream body; trailers and other frames are passed over.
pub(super) fn poll_chunk(
    body: &mut Incoming,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Bytes, BoxError>>> {
    loop {
        match std::pin::Pin::new(&mut *body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => return Poll::Ready(Some(Ok(data))),
                Err(_) => continue,
            },
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        }
    }
}

/// How many turns an upstream HTTP/1.1 connection's task has had. hyper's connection task hands
/// a response body on one chunk at a time, each taken chunk waking it for the next: when a
/// relay has taken a chunk and finds no next one, this tells whether the task has run since
/// (then it had nothing more) or is still to run ([`RelayBody`]).
#[derive(Clone, Default)]
pub(super) struct Turns(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl Turns {
    pub(super) fn count(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn now(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// An upstream response whose head and first chunk have arrived.
pub struct Started {
    pub status: http::StatusCode,
    pub headers: HeaderMap,
    /// The upstream's `content-length`, if it sent one.
    pub(super) expected: Option<u64>,
    pub(super) first: Option<Bytes>,
    pub(super) rest: Incoming,
    pub(super) idle: Duration,
    /// Decodes the body's content coding for the bytes sluice reads itself; `None` for
    /// identity.
    pub(super) decoder: Option<Decoder>,
    /// The `content-encoding` the upstream named when sluice cannot decode it.
    pub(super) undecodable: Option<String>,
    /// The turns of the connection's task, for an HTTP/1.1 upstream.
    pub(super) turns: Option<Turns>,
}

/// Decoded bytes one upstream chunk may inflate to before the body counts as too large.
const MAX_DECODED_CHUNK_BYTES: usize = 64 * 1024 * 1024;

/// What the relay reports when a body has ended.
pub struct RelayEnd {
    pub outcome: StreamOutcome,
    pub bytes: u64,
    /// The response completed (A9): an event stream's final event passed through, or a whole
    /// non-stream body with a success status was handed on.
    pub complete: bool,
    /// The usage the stream's events reported, when the watch read it.
    pub usage: Option<crate::dialect::usage::Usage>,
    /// The whole body, when it was asked to be kept ([`Started::relay_keeping`]).
    pub kept: Option<Bytes>,
}

type OnEnd = Box<dyn FnOnce(RelayEnd) + Send>;

impl Started {
    pub fn is_event_stream(&self) -> bool {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"))
    }

    /// The response headers for a client that gets the body as [`Started::next_chunk`] reads
    /// it: hop-by-hop headers removed, and, when that body is decoded, the content coding and
    /// length that no longer describe it.
    pub fn decoded_headers(&mut self) -> HeaderMap {
        let mut headers = response_headers(std::mem::take(&mut self.headers));
        if self.decoder.is_some() {
            headers.remove(header::CONTENT_ENCODING);
            headers.remove(header::CONTENT_LENGTH);
        }
        headers
    }

    /// The next body chunk as the upstream sent it.
    async fn next_raw(&mut self) -> Result<Option<Bytes>, BoxError> {
        if let Some(first) = self.first.take() {
            return Ok(Some(first));
        }
        let next = std::future::poll_fn(|cx| poll_chunk(&mut self.rest, cx));
        match tokio::time::timeout(self.idle, next).await {
            Err(_) => Err("upstream idle timeout".into()),
            Ok(None) => Ok(None),
            Ok(Some(Ok(chunk))) => Ok(Some(chunk)),
            Ok(Some(Err(e))) => Err(e),
        }
    }

    /// The next body chunk, decoded from the upstream's content coding, for callers that read
    /// the body themselves (the read tool's rounds); `Ok(None)` at the end. Fails on an
    /// upstream error, past the idle timeout, or on a body sluice cannot decode.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, BoxError> {
        if let Some(named) = &self.undecodable {
            return Err(format!(
                "the upstream answered in content-encoding {named:?}, which sluice cannot decode"
            )
            .into());
        }
        loop {
            let raw = self.next_raw().await?;
            let Some(decoder) = &mut self.decoder else {
                return Ok(raw);
            };
            let mut out = Vec::new();
            decoder
                .decode_into(raw.as_deref(), &mut out, MAX_DECODED_CHUNK_BYTES)
                .map_err(|e| -> BoxError {
                    match e {
                        DecodeError::Sink(_) => "upstream response too large once decoded".into(),
                        other => format!("upstream body: {other}").into(),
                    }
                })?;
            match raw {
                None if out.is_empty() => return Ok(None),
                _ if out.is_empty() => continue,
                _ => return Ok(Some(Bytes::from(out))),
            }
        }
    }

    /// The whole body, up to `limit` bytes (a longer one is an error).
    pub async fn collect(&mut self, limit: usize) -> Result<Bytes, BoxError> {
        let mut all = bytes::BytesMut::new();
        while let Some(chunk) = self.next_chunk().await? {
            if all.len() + chunk.len() > limit {
                return Err("upstream response too large".into());
            }
            all.extend_from_slice(&chunk);
        }
        Ok(all.freeze())
    }

    /// The response body for the client: each upstream chunk is handed on as it arrives, with no
    /// re-framing and no buffering beyond the chunk in hand (P3). The client's pace drives the
    /// reads, so a slow client slows the upstream instead of filling memory. `on_end` runs once,
    /// when the body ended one way or another.
    /// `watch` follows an event stream for its dialect's final event.
    pub fn relay<F>(self, watch: Option<Completion>, on_end: F) -> RelayBody
    where
        F: FnOnce(RelayEnd) + Send + 'static,
    {
        self.relay_keeping(watch, 0, on_end)
    }

    /// [`Started::relay`], keeping a copy of a body of up to `keep` bytes that is not
    /// compressed, for reading after its end (the inspector reads the usage in it).
    pub fn relay_keeping<F>(
        self,
        mut watch: Option<Completion>,
        keep: usize,
        on_end: F,
    ) -> RelayBody
    where
        F: FnOnce(RelayEnd) + Send + 'static,
    {
        let keeps = keep > 0
            && self.decoder.is_none()
            && self.undecodable.is_none()
            && self.expected.is_none_or(|n| n <= keep as u64);
        if let (Some(watch), Some(named)) = (&mut watch, &self.undecodable) {
            // A body sluice cannot read cannot be seen to complete: nothing is committed.
            tracing::warn!(content_encoding = %named, "cannot decode the upstream stream to watch for its end; its delivery state is not committed");
            watch.fail();
        }
        RelayBody {
            decoder: self.decoder.filter(|_| watch.is_some()),
            success: self.status.is_success(),
            watch,
            first: self.first,
            rest: self.rest,
            idle: self.idle,
            silence: Box::pin(tokio::time::sleep(self.idle)),
            heard: tokio::time::Instant::now(),
            batch: Batch::default(),
            upstream_end: None,
            turns: self.turns,
            turn: 0,
            looks: 0,
            bytes: 0,
            expected: self.expected,
            on_end: Some(Box::new(on_end)),
            kept: keeps.then(bytes::BytesMut::new),
            keep,
        }
    }
}

/// A response body relayed from the upstream. Ends with an error when the upstream fails or is
/// silent for longer than the idle timeout, so the client sees a cut stream, never a complete one.
///
/// The chunks that have arrived by the time one is handed on leave together, in one frame and
/// so one write to the client (docs/runtime.md, "Streams as providers send them"): a provider's stream is hundreds of
/// small events, each its own HTTP chunk, and a write per event cost the relay most of its time.
/// No chunk waits for one that has not arrived: after taking a chunk the body looks once more,
/// letting the upstream connection's task hand on what it has already read, and sends what it
/// holds as soon as nothing more is there.
pub struct RelayBody {
    first: Option<Bytes>,
    rest: Incoming,
    idle: Duration,
    /// Fires at the idle timeout after the last chunk heard of when it was armed; moved on
    /// lazily (see `heard`), so a chunk costs no timer update.
    silence: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// When the latest chunks were taken.
    heard: tokio::time::Instant,
    /// Chunks taken and not yet handed on.
    batch: Batch,
    /// How the upstream body ended, once it did while a batch was still to be handed on.
    upstream_end: Option<Result<(), BoxError>>,
    /// The upstream connection's turns ([`Turns`]), and their count when a chunk was last
    /// taken.
    turns: Option<Turns>,
    turn: u64,
    /// Looks since then that found the task still to run: a few, then the batch leaves.
    looks: u8,
    bytes: u64,
    /// The upstream's `content-length`: a body dropped after exactly that many bytes completed.
    expected: Option<u64>,
    /// Present until the body has ended.
    on_end: Option<OnEnd>,
    success: bool,
    watch: Option<Completion>,
    /// Decodes the relayed bytes for `watch`; the client gets them as the upstream sent them.
    decoder: Option<Decoder>,
    /// A copy of the body so far, while it stays within `keep` bytes.
    kept: Option<bytes::BytesMut>,
    keep: usize,
}

impl RelayBody {
    fn end(&mut self, outcome: StreamOutcome) {
        if let Some(on_end) = self.on_end.take() {
            let complete = self.success
                && match &self.watch {
                    Some(watch) => watch.is_complete(),
                    None => outcome == StreamOutcome::Completed,
                };
            on_end(RelayEnd {
                outcome,
                bytes: self.bytes,
                complete,
                usage: self.watch.as_ref().and_then(Completion::usage),
                kept: self.kept.take().map(bytes::BytesMut::freeze),
            });
        }
    }

    /// Hands the batch on as one frame.
    fn hand_on(&mut self, batch: Option<Bytes>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.heard = tokio::time::Instant::now();
        Poll::Ready(Some(Ok(Frame::data(batch.unwrap_or_default()))))
    }

    /// Reads a chunk as it is taken (its bytes counted, kept, watched); it is handed on later.
    fn take(&mut self, chunk: &Bytes) {
        self.bytes += chunk.len() as u64;
        if let Some(kept) = &mut self.kept {
            if kept.len() + chunk.len() <= self.keep {
                kept.extend_from_slice(chunk);
            } else {
                self.kept = None;
            }
        }
        if let Some(watch) = &mut self.watch {
            match &mut self.decoder {
                None => watch.feed(chunk),
                // Until the final event: what follows it cannot change the outcome.
                Some(decoder) if !watch.is_complete() => {
                    let fed = decoder.feed(chunk, &mut |piece| {
                        watch.feed(piece);
                        Ok::<(), std::convert::Infallible>(())
                    });
                    if let Err(e) = fed {
                        tracing::warn!(error = %e, "cannot decode the upstream stream to watch for its end; its delivery state is not committed");
                        watch.fail();
                        self.decoder = None;
                    }
                }
                Some(_) => {}
            }
        }
    }

    /// The upstream body has ended (`Ok`) or failed: the relay's own end.
    fn finish(
        &mut self,
        how: Result<(), BoxError>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match how {
            Ok(()) => {
                if let Some(watch) = &mut self.watch {
                    watch.finish();
                }
                // An event stream that ends before its dialect's final event did not complete
                // (A9): the client sees it cut, never a clean end that looks complete.
                let cut = |w: &Completion| w.can_tell() && !w.is_complete();
                if self.success && self.watch.as_ref().is_some_and(cut) {
                    tracing::warn!(
                        "upstream stream ended before its final event; cut for the client"
                    );
                    self.end(StreamOutcome::UpstreamError);
                    return Poll::Ready(Some(Err(
                        "upstream stream ended before its final event".into()
                    )));
                }
                self.end(StreamOutcome::Completed);
                Poll::Ready(None)
            }
            Err(e) => {
                tracing::warn!(error = %e, "upstream body failed mid-stream");
                self.end(StreamOutcome::UpstreamError);
                Poll::Ready(Some(Err("upstream body failed".into())))
            }
        }
    }
}

/// The bytes of chunks taken together, up to [`BATCH_BYTES`]: the first as it came, copied into
/// one buffer only when a second joins it.
#[derive(Default)]
struct Batch {
    first: Option<Bytes>,
    joined: Option<bytes::BytesMut>,
}

/// How many times a body looks again for its connection's turn before its batch leaves anyway
/// (the task is queued by then; this only bounds the wait should it not be).
const MAX_LOOKS: u8 = 4;

/// The most bytes joined into one frame; a chunk this long or longer leaves alone, uncopied.
const BATCH_BYTES: usize = 16 * 1024;

/// The room a batch's buffer takes when a second chunk joins the first.
const JOINED_ROOM: usize = 4 * 1024;

impl Batch {
    fn len(&self) -> usize {
        match (&self.joined, &self.first) {
            (Some(joined), _) => joined.len(),
            (None, Some(first)) => first.len(),
            (None, None) => 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.first.is_none() && self.joined.is_none()
    }

    /// Adds `chunk`, or gives it back when it does not fit (the batch should leave first).
    fn add(&mut self, chunk: Bytes) -> Result<(), Bytes> {
        if self.is_empty() {
            self.first = Some(chunk);
            return Ok(());
        }
        if self.len() + chunk.len() > BATCH_BYTES {
            return Err(chunk);
        }
        let joined = self.joined.get_or_insert_with(|| {
            let first = self.first.take().unwrap_or_default();
            // Room for a few more events; it grows, up to the batch's bound, when more come.
            let mut joined =
                bytes::BytesMut::with_capacity(JOINED_ROOM.max(first.len() + chunk.len()));
            joined.extend_from_slice(&first);
            joined
        });
        joined.extend_from_slice(&chunk);
        Ok(())
    }

    fn take(&mut self) -> Option<Bytes> {
        match self.joined.take() {
            Some(joined) => Some(joined.freeze()),
            None => self.first.take(),
        }
    }
}

impl http_body::Body for RelayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            // Arrived with the head: handed on at once, as the response's first byte.
            this.take(&first);
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if this.on_end.is_none() {
            return Poll::Ready(None);
        }
        loop {
            if let Some(how) = this.upstream_end.take() {
                return this.finish(how);
            }
            match poll_chunk(&mut this.rest, cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    this.take(&chunk);
                    if let Err(chunk) = this.batch.add(chunk) {
                        // Full: the batch leaves, and this chunk starts the next.
                        let full = this.batch.take();
                        let _ = this.batch.add(chunk);
                        return this.hand_on(full);
                    }
                    if this.batch.len() >= BATCH_BYTES {
                        let full = this.batch.take();
                        return this.hand_on(full);
                    }
                    // One more look once the upstream connection's task has had its turn: it
                    // hands on the next chunk if it has already read it, and nothing otherwise.
                    // Without that count (h2, whose streams buffer what has arrived), look now.
                    if let Some(turns) = &this.turns {
                        this.turn = turns.now();
                        this.looks = 0;
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    continue;
                }
                Poll::Ready(Some(Err(e))) => this.upstream_end = Some(Err(e)),
                Poll::Ready(None) => this.upstream_end = Some(Ok(())),
                Poll::Pending => {
                    // Taking a chunk woke the connection's task; until it has run, this body
                    // waits its turn (it may be polled again before, in the same turn of its
                    // own task).
                    let waiting = this.turns.as_ref().is_some_and(|t| t.now() == this.turn);
                    if waiting && !this.batch.is_empty() && this.looks < MAX_LOOKS {
                        this.looks += 1;
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                }
            }
            if !this.batch.is_empty() {
                let batch = this.batch.take();
                return this.hand_on(batch);
            }
            if this.upstream_end.is_some() {
                continue;
            }
            // Nothing to hand on: the body waits, for the upstream or for its silence.
            match this.silence.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) => {
                    let due = this.heard + this.idle;
                    if due > tokio::time::Instant::now() {
                        // Chunks came since it was armed: the silence counts from the last.
                        this.silence.as_mut().reset(due);
                        continue;
                    }
                    tracing::warn!(
                        idle_seconds = this.idle.as_secs_f64(),
                        "upstream went silent mid-stream"
                    );
                    this.end(StreamOutcome::UpstreamError);
                    return Poll::Ready(Some(Err("upstream idle timeout".into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.on_end.is_none()
    }
}

impl Drop for RelayBody {
    /// Dropped before its end: the client went away, unless every announced byte was sent or
    /// the stream's final event had passed (a client may hang up right after it).
    fn drop(&mut self) {
        let final_event_sent = self.watch.as_ref().is_some_and(Completion::is_complete);
        let all_handed_on = self.first.is_none() && self.batch.is_empty();
        let outcome = if all_handed_on && (self.expected == Some(self.bytes) || final_event_sent) {
            StreamOutcome::Completed
        } else {
            StreamOutcome::Cancelled
        };
        self.end(outcome);
    }
}
