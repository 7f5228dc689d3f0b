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
pub struct RelayBody {
    first: Option<Bytes>,
    rest: Incoming,
    idle: Duration,
    silence: std::pin::Pin<Box<tokio::time::Sleep>>,
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

    fn chunk(&mut self, chunk: Bytes) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.bytes += chunk.len() as u64;
        if let Some(kept) = &mut self.kept {
            if kept.len() + chunk.len() <= self.keep {
                kept.extend_from_slice(&chunk);
            } else {
                self.kept = None;
            }
        }
        if let Some(watch) = &mut self.watch {
            match &mut self.decoder {
                None => watch.feed(&chunk),
                // Until the final event: what follows it cannot change the outcome.
                Some(decoder) if !watch.is_complete() => {
                    let fed = decoder.feed(&chunk, &mut |piece| {
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
        Poll::Ready(Some(Ok(Frame::data(chunk))))
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
            return this.chunk(first);
        }
        if this.on_end.is_none() {
            return Poll::Ready(None);
        }
        match poll_chunk(&mut this.rest, cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                let deadline = tokio::time::Instant::now() + this.idle;
                this.silence.as_mut().reset(deadline);
                this.chunk(chunk)
            }
            Poll::Ready(None) => {
                if let Some(watch) = &mut this.watch {
                    watch.finish();
                }
                // An event stream that ends before its dialect's final event did not complete
                // (A9): the client sees it cut, never a clean end that looks complete.
                let cut = |w: &Completion| w.can_tell() && !w.is_complete();
                if this.success && this.watch.as_ref().is_some_and(cut) {
                    tracing::warn!(
                        "upstream stream ended before its final event; cut for the client"
                    );
                    this.end(StreamOutcome::UpstreamError);
                    return Poll::Ready(Some(Err(
                        "upstream stream ended before its final event".into()
                    )));
                }
                this.end(StreamOutcome::Completed);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                tracing::warn!(error = %e, "upstream body failed mid-stream");
                this.end(StreamOutcome::UpstreamError);
                Poll::Ready(Some(Err("upstream body failed".into())))
            }
            Poll::Pending => match this.silence.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    tracing::warn!(
                        idle_seconds = this.idle.as_secs_f64(),
                        "upstream went silent mid-stream"
                    );
                    this.end(StreamOutcome::UpstreamError);
                    Poll::Ready(Some(Err("upstream idle timeout".into())))
                }
                Poll::Pending => Poll::Pending,
            },
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
        let outcome =
            if self.first.is_none() && (self.expected == Some(self.bytes) || final_event_sent) {
                StreamOutcome::Completed
            } else {
                StreamOutcome::Cancelled
            };
        self.end(outcome);
    }
}
