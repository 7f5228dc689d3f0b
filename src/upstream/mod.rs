//! The upstream side: each worker's own connections ([`pool`]: hyper's connection API over
//! rustls, HTTP/1.1 and h2 by ALPN), the header policy in both directions ([`headers`]), and the streamed relay of response
//! bodies ([`relay`]; SPEC P3, S4). A request's URI is the route's parsed base with the client's
//! path and query, so nothing is parsed again per request; a request an HTTP/2 provider refused
//! unread is sent again. Where the environment routes a destination through a proxy
//! (`HTTPS_PROXY` and the like), reqwest sends it, as it did every request before: it speaks to
//! proxies (docs/runtime.md, "The upstream client").

mod headers;
mod pool;
mod relay;

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::proxy::matcher::Matcher;

use crate::config::UpstreamConfig;
use crate::encoding::{Coding, Decoder};
use crate::error::GatewayError;

pub use headers::{request_headers, response_headers};
pub use relay::{RelayBody, RelayEnd, Started};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body from the upstream, whichever client received it.
pub(crate) type Incoming = http_body_util::combinators::BoxBody<Bytes, BoxError>;

type Tls = hyper_rustls::HttpsConnector<HttpConnector>;

/// How many times a request is sent again after an HTTP/2 provider refused it unread.
const RESENDS: usize = 2;

pub struct Upstream {
    pool: pool::Pool,
    /// The environment's proxies and the client that reaches them, when it names any.
    proxied: Option<(Matcher, reqwest::Client)>,
    first_byte: Duration,
    idle: Duration,
}

/// The upstream client could not be built (its TLS roots, or reqwest's for a proxy).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClientError(String);

/// The environment variables a proxy is named in (curl's, which reqwest and hyper-util read).
const PROXY_VARIABLES: &[&str] = &[
    "ALL_PROXY",
    "all_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
];

impl Upstream {
    pub fn new(config: &UpstreamConfig) -> Result<Self, ClientError> {
        // Built without a bundled crypto provider; install ring's (once per process).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let connect = Duration::from_secs_f64(config.connect_timeout_seconds);
        let pool_idle = Duration::from_secs_f64(config.pool_idle_timeout_seconds);
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(connect));
        http.set_nodelay(true);
        // Notice a provider connection that died silently before a request is sent on it.
        http.set_keepalive(Some(Duration::from_secs(30)));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_platform_verifier(rustls::crypto::ring::default_provider())
            .map_err(|e| ClientError(format!("TLS roots: {e}")))?
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let connector = Connector {
            https,
            limit: connect,
        };
        let pool = pool::Pool::new(connector, pool_idle);
        let named = PROXY_VARIABLES
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()));
        let proxied = if named {
            let client = reqwest::Client::builder()
                .connect_timeout(connect)
                .pool_idle_timeout(pool_idle)
                .tcp_nodelay(true)
                .tcp_keepalive(Duration::from_secs(30))
                .http2_adaptive_window(true)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| ClientError(format!("proxy client: {e}")))?;
            Some((Matcher::from_env(), client))
        } else {
            None
        };
        Ok(Self {
            pool,
            proxied,
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
        uri: http::Uri,
        headers: HeaderMap,
        body: Outgoing,
    ) -> Result<Started, GatewayError> {
        let deadline = tokio::time::Instant::now() + self.first_byte;
        let sent = tokio::time::timeout_at(deadline, self.response(method, uri, headers, body));
        let response = match sent.await {
            Err(_) => return Err(GatewayError::UpstreamTimeout("the first-byte timeout")),
            Ok(Err(e)) => return Err(classify(&*e)),
            Ok(Ok(response)) => response,
        };
        let (mut head, mut body) = response.into_parts();
        let turns = head.extensions.remove::<relay::Turns>();
        let next = std::future::poll_fn(|cx| relay::poll_chunk(&mut body, cx));
        let first = match tokio::time::timeout_at(deadline, next).await {
            Err(_) => return Err(GatewayError::UpstreamTimeout("the first-byte timeout")),
            Ok(Some(Err(e))) => return Err(classify(&*e)),
            Ok(Some(Ok(chunk))) => Some(chunk),
            Ok(None) => None,
        };
        let headers = head.headers;
        let expected = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let (decoder, undecodable) = match Coding::of(&headers) {
            Ok(coding) => (Decoder::new(coding), None),
            Err(named) => (None, Some(named)),
        };
        Ok(Started {
            status: head.status,
            headers,
            expected,
            first,
            rest: body,
            idle: self.idle,
            decoder,
            undecodable,
            turns,
        })
    }

    /// The response head, from whichever client the destination takes; a request an HTTP/2
    /// provider refused unread is sent again, up to [`RESENDS`] times, when its body can be.
    async fn response(
        &self,
        method: http::Method,
        uri: http::Uri,
        headers: HeaderMap,
        body: Outgoing,
    ) -> Result<http::Response<Incoming>, BoxError> {
        if let Some((matcher, client)) = &self.proxied {
            if matcher.intercept(&uri).is_some() {
                let url = reqwest::Url::parse(&uri.to_string())?;
                let sent = client.request(method, url).headers(headers);
                let response = sent.body(reqwest::Body::wrap(body)).send().await?;
                let response = http::Response::<reqwest::Body>::from(response);
                return Ok(response.map(|b| b.map_err(BoxError::from).boxed()));
            }
        }
        // h2 comes only by ALPN, over TLS: a plain `http` request is never refused that way, and
        // keeps no copy of itself to send again.
        let mut resends = if uri.scheme() == Some(&http::uri::Scheme::HTTPS) {
            RESENDS
        } else {
            0
        };
        let (mut body, mut head) = (body, (method, uri, headers));
        loop {
            let again = (resends > 0)
                .then(|| body.again())
                .flatten()
                .map(|again| (again, head.clone()));
            let mut request = http::Request::new(body);
            (
                *request.method_mut(),
                *request.uri_mut(),
                *request.headers_mut(),
            ) = head;
            match self.pool.send(request).await {
                Ok(response) => return Ok(response),
                Err(e) => match again {
                    Some(next) if refused_unread(&*e) => {
                        tracing::debug!(error = %e, "the upstream refused the request unread; sending it again");
                        resends -= 1;
                        (body, head) = next;
                    }
                    _ => return Err(e),
                },
            }
        }
    }
}

/// The connector, bounded as a whole by the connect timeout: the TCP connection and the TLS
/// handshake, so a provider (or a middlebox) that takes the connection and never answers TLS
/// is a connect timeout, not a wait for the first-byte one.
#[derive(Clone)]
struct Connector {
    https: Tls,
    limit: Duration,
}

impl tower_service::Service<http::Uri> for Connector {
    type Response = <Tls as tower_service::Service<http::Uri>>::Response;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.https.poll_ready(cx)
    }

    fn call(&mut self, dst: http::Uri) -> Self::Future {
        let connecting = self.https.call(dst);
        let limit = self.limit;
        Box::pin(async move {
            match tokio::time::timeout(limit, connecting).await {
                Ok(connected) => connected,
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connecting and the TLS handshake took longer than the connect timeout",
                )
                .into()),
            }
        })
    }
}

/// Whether an HTTP/2 provider refused the request before reading it, which makes sending it
/// again safe: a graceful GOAWAY, or REFUSED_STREAM (RFC 9113 section 8.7).
fn refused_unread(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(e) = source {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_remote()
                && ((h2.is_go_away() && h2.reason() == Some(h2::Reason::NO_ERROR))
                    || (h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM)));
        }
        source = e.source();
    }
    false
}

/// A failed send as the client sees it: a timeout (connecting) or an unreachable upstream.
fn classify(e: &(dyn std::error::Error + 'static)) -> GatewayError {
    let mut timed_out = false;
    let mut source = Some(e);
    while let Some(e) = source {
        timed_out |= e
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
            || e.downcast_ref::<reqwest::Error>()
                .is_some_and(reqwest::Error::is_timeout);
        source = e.source();
    }
    tracing::warn!(error = %Chain(e), timeout = timed_out, "upstream request failed");
    if timed_out {
        GatewayError::UpstreamTimeout("the connect timeout")
    } else {
        GatewayError::UpstreamUnreachable
    }
}

/// An error with its causes, for the log: hyper-util's own message says only "client error".
struct Chain<'e>(&'e (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

/// A request body for the upstream: a buffer, or a spliced body's pieces, each sent from where
/// it lies in memory with its length known (so it goes with a `content-length`), and sendable
/// again; or a client's body streamed through (pass-through, P5), sent once.
pub struct Outgoing {
    kind: Kind,
}

enum Kind {
    Pieces {
        pieces: Arc<[Bytes]>,
        next: usize,
        left: u64,
    },
    Stream(Incoming),
}

impl Outgoing {
    /// No body.
    pub fn empty() -> Outgoing {
        Outgoing::pieces(crate::projection::Rope::default())
    }

    /// A spliced body's pieces (or one buffer).
    pub fn pieces(spliced: crate::projection::Rope) -> Outgoing {
        let left = spliced.len() as u64;
        let pieces: Arc<[Bytes]> = spliced.into_pieces().into();
        Outgoing {
            kind: Kind::Pieces {
                pieces,
                next: 0,
                left,
            },
        }
    }

    /// A body streamed through as it arrives.
    pub fn stream<B>(body: B) -> Outgoing
    where
        B: http_body::Body<Data = Bytes, Error = BoxError> + Send + Sync + 'static,
    {
        Outgoing {
            kind: Kind::Stream(body.boxed()),
        }
    }

    /// The same body from its start, to send again; `None` for a streamed one.
    fn again(&self) -> Option<Outgoing> {
        match &self.kind {
            Kind::Pieces { pieces, .. } => Some(Outgoing {
                kind: Kind::Pieces {
                    pieces: pieces.clone(),
                    next: 0,
                    left: pieces.iter().map(|p| p.len() as u64).sum(),
                },
            }),
            Kind::Stream(_) => None,
        }
    }
}

impl http_body::Body for Outgoing {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.kind {
            Kind::Pieces { pieces, next, left } => {
                let piece = pieces.get(*next).cloned();
                if let Some(piece) = &piece {
                    *next += 1;
                    *left = left.saturating_sub(piece.len() as u64);
                }
                Poll::Ready(piece.map(|piece| Ok(Frame::data(piece))))
            }
            Kind::Stream(body) => std::pin::Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Pieces { left, .. } => *left == 0,
            Kind::Stream(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.kind {
            Kind::Pieces { left, .. } => http_body::SizeHint::with_exact(*left),
            Kind::Stream(body) => body.size_hint(),
        }
    }
}

/// Seconds since `start`, for histograms.
pub fn seconds_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64()
}
