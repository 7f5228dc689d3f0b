//! The upstream side: a reqwest client per worker thread (rustls, HTTP/1.1 and h2, its own
//! connection pool), the header policy in both directions, and the streamed relay of response
//! bodies (SPEC P3, S4).

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use std::future::Future;
use std::task::{Context, Poll};

use http_body::Frame;

use crate::config::UpstreamConfig;
use crate::dialect::completion::Completion;
use crate::dialect::Family;
use crate::encoding::{Coding, DecodeError, Decoder};
use crate::error::GatewayError;
use crate::metrics::StreamOutcome;
use crate::route::Route;

/// Headers that describe one hop of a connection, never forwarded (RFC 9110 section 7.6.1).
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// `Keep-Alive` (RFC 9112 appendix C.2.2), hop-by-hop too; named once, not parsed per request.
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub struct Upstream {
    client: reqwest::Client,
    first_byte: Duration,
    idle: Duration,
}

impl Upstream {
    pub fn new(config: &UpstreamConfig) -> Result<Self, reqwest::Error> {
        // reqwest is built without a bundled crypto provider; install ring's (once per process).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs_f64(config.connect_timeout_seconds))
            .pool_idle_timeout(Duration::from_secs_f64(config.pool_idle_timeout_seconds))
            .tcp_nodelay(true)
            // Notice a provider connection that died silently before a request is sent on it.
            .tcp_keepalive(Duration::from_secs(30))
            // Large streamed answers over h2 should not be held back by a small fixed window.
            .http2_adaptive_window(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Self {
            client,
            first_byte: Duration::from_secs_f64(config.first_byte_timeout_seconds),
            idle: Duration::from_secs_f64(config.idle_timeout_seconds),
        })
    }

    /// Sends the request and waits for the response head and its first body chunk, so an
    /// upstream that fails early still gets a proper status (STYLE 5). Both waits together are
    /// bounded by the first-byte timeout.
    pub async fn send(
        &self,
        method: http::Method,
        url: reqwest::Url,
        headers: HeaderMap,
        body: reqwest::Body,
    ) -> Result<Started, GatewayError> {
        let deadline = tokio::time::Instant::now() + self.first_byte;
        let request = self.client.request(method, url).headers(headers).body(body);
        let mut response = match tokio::time::timeout_at(deadline, request.send()).await {
            Err(_) => return Err(GatewayError::UpstreamTimeout("the first-byte timeout")),
            Ok(Err(e)) => return Err(classify(&e)),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        let headers = std::mem::take(response.headers_mut());
        let mut body = response.bytes_stream();
        let first = match tokio::time::timeout_at(deadline, body.next()).await {
            Err(_) => return Err(GatewayError::UpstreamTimeout("the first-byte timeout")),
            Ok(Some(Err(e))) => return Err(classify(&e)),
            Ok(Some(Ok(chunk))) => Some(chunk),
            Ok(None) => None,
        };
        let expected = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let (decoder, undecodable) = match Coding::of(&headers) {
            Ok(coding) => (Decoder::new(coding), None),
            Err(named) => (None, Some(named)),
        };
        Ok(Started {
            status,
            headers,
            expected,
            first,
            rest: Box::pin(body),
            idle: self.idle,
            decoder,
            undecodable,
        })
    }
}

/// A request body for `url`: a spliced body's pieces, each sent from where it lies in memory,
/// with its length known so it goes with a `content-length`; or, to an `https` upstream, joined
/// into one buffer. reqwest sends a request again when an HTTP/2 provider refused it unread
/// (GOAWAY, REFUSED_STREAM), which it can do only with a body in one buffer; a plain `http`
/// upstream speaks HTTP/1.1, where nothing is retried that needs the body again. Over TLS the
/// body is encrypted record by record anyway, a pass over all of it that the join adds little to.
pub fn body_of(url: &reqwest::Url, spliced: crate::projection::Rope) -> reqwest::Body {
    if spliced.pieces().len() <= 1 || url.scheme() != "http" {
        return reqwest::Body::from(spliced.to_bytes());
    }
    let left = spliced.len() as u64;
    reqwest::Body::wrap(Pieces {
        pieces: spliced.into_pieces().into_iter(),
        left,
    })
}

/// [`body_of`] for a body of several pieces.
struct Pieces {
    pieces: std::vec::IntoIter<Bytes>,
    left: u64,
}

impl http_body::Body for Pieces {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let next = self.pieces.next();
        if let Some(piece) = &next {
            self.left = self.left.saturating_sub(piece.len() as u64);
        }
        Poll::Ready(next.map(|piece| Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.left)
    }
}

fn classify(e: &reqwest::Error) -> GatewayError {
    tracing::warn!(error = %e, connect = e.is_connect(), timeout = e.is_timeout(), "upstream request failed");
    if e.is_timeout() {
        GatewayError::UpstreamTimeout("the connect timeout")
    } else {
        GatewayError::UpstreamUnreachable
    }
}

type ChunkStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// An upstream response whose head and first chunk have arrived.
pub struct Started {
    pub status: http::StatusCode,
    pub headers: HeaderMap,
    /// The upstream's `content-length`, if it sent one.
    expected: Option<u64>,
    first: Option<Bytes>,
    rest: ChunkStream,
    idle: Duration,
    /// Decodes the body's content coding for the bytes sluice reads itself; `None` for
    /// identity.
    decoder: Option<Decoder>,
    /// The `content-encoding` the upstream named when sluice cannot decode it.
    undecodable: Option<String>,
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
        match tokio::time::timeout(self.idle, self.rest.next()).await {
            Err(_) => Err("upstream idle timeout".into()),
            Ok(None) => Ok(None),
            Ok(Some(Ok(chunk))) => Ok(Some(chunk)),
            Ok(Some(Err(e))) => Err(e.into()),
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
    rest: ChunkStream,
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
        match this.rest.as_mut().poll_next(cx) {
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

/// Request headers for the upstream, edited in place from the client's: hop-by-hop headers,
/// `host`, `content-length` (recomputed) and sluice's own `x-sluice-*` removed; the credential
/// replaced when the route has its own key (S4).
pub fn request_headers(mut headers: HeaderMap, route: &Route, family: Family) -> HeaderMap {
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    if headers.keys().any(|n| n.as_str().starts_with("x-sluice-")) {
        let ours: Vec<HeaderName> = headers
            .keys()
            .filter(|n| n.as_str().starts_with("x-sluice-"))
            .cloned()
            .collect();
        for name in ours {
            headers.remove(name);
        }
    }
    if let Some(key) = &route.api_key {
        headers.remove(header::AUTHORIZATION);
        headers.remove("x-api-key");
        match family {
            Family::OpenAi => {
                let mut bearer =
                    HeaderValue::from_bytes(&[b"Bearer ".as_slice(), key.as_bytes()].concat())
                        .unwrap_or_else(|_| key.clone());
                bearer.set_sensitive(true);
                headers.insert(header::AUTHORIZATION, bearer);
            }
            Family::Anthropic => {
                headers.insert(HeaderName::from_static("x-api-key"), key.clone());
            }
        }
    }
    headers
}

/// Response headers for the client, edited in place from the upstream's: hop-by-hop removed.
pub fn response_headers(mut headers: HeaderMap) -> HeaderMap {
    strip_hop_by_hop(&mut headers);
    headers
}

/// Removes the headers that describe one hop of a connection, and those that `Connection` names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in connection_tokens(headers) {
        headers.remove(name.as_str());
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(KEEP_ALIVE);
}

/// Header names listed in `Connection`, which are hop-by-hop too.
fn connection_tokens(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}

/// Seconds since `start`, for histograms.
pub fn seconds_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouteConfig;
    use crate::dialect::Dialect;
    use crate::route::RouteTable;

    fn table(api_key_env: &str) -> RouteTable {
        RouteTable::new(&[RouteConfig {
            name: "r".into(),
            dialects: vec![Dialect::OpenAiChat, Dialect::AnthropicMessages],
            upstream: "http://up".into(),
            api_key_env: api_key_env.into(),
            ..RouteConfig::default()
        }])
        .unwrap()
    }

    #[test]
    fn strips_hop_by_hop_and_sluice_headers() {
        let t = table("");
        let route = t.select(Dialect::OpenAiChat, "m").unwrap();
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive, x-custom-hop".parse().unwrap());
        h.insert("x-custom-hop", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("host", "sluice".parse().unwrap());
        h.insert("content-length", "12".parse().unwrap());
        h.insert("x-sluice-session", "s".parse().unwrap());
        h.insert("authorization", "Bearer client".parse().unwrap());
        h.insert("openai-organization", "org".parse().unwrap());
        let out = request_headers(h, route, Family::OpenAi);
        let mut names: Vec<_> = out.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, vec!["authorization", "openai-organization"]);
        assert_eq!(out["authorization"], "Bearer client");
    }

    #[test]
    fn route_key_replaces_client_credential() {
        std::env::set_var("SLUICE_TEST_ROUTE_KEY", "sk-route");
        let t = table("SLUICE_TEST_ROUTE_KEY");
        let route = t.select(Dialect::OpenAiChat, "m").unwrap();
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer client".parse().unwrap());
        h.insert("x-api-key", "client".parse().unwrap());
        let out = request_headers(h.clone(), route, Family::OpenAi);
        assert_eq!(out["authorization"], "Bearer sk-route");
        assert!(out.get("x-api-key").is_none());
        assert!(out["authorization"].is_sensitive());
        let out = request_headers(h, route, Family::Anthropic);
        assert_eq!(out["x-api-key"], "sk-route");
        assert!(out.get("authorization").is_none());
    }
}
