//! The upstream connections of one worker, kept between requests (docs/runtime.md, "The
//! upstream pool"). hyper's connection API does the HTTP: each connection is a
//! `client::conn` handshake over the route's connector (TCP, and TLS with ALPN choosing h2 or
//! HTTP/1.1), its task spawned on the worker's runtime. What this module keeps is which
//! connections are free: an HTTP/1.1 connection is handed back when its response body has been
//! read to its end (a body dropped early closes it, as hyper does), and an h2 connection is
//! shared by every request to its origin while it stays open. hyper-util's pooled client did the
//! same, but hashed each request's origin byte by byte with SipHash three times and spawned a
//! task per answer to wait for its connection to come back; here an origin is compared with
//! the few a worker talks to, and a connection comes back when its body ends.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http_body::{Body as _, Frame};
use hyper::client::conn::{http1, http2};
use hyper::rt::Executor as _;
use hyper_util::client::legacy::connect::Connection as _;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower_service::Service as _;

use super::relay::Turns;
use super::{BoxError, Connector, Outgoing};

/// Where a connection goes: requests to the same scheme and authority share connections.
#[derive(Clone, PartialEq, Eq)]
struct Origin {
    tls: bool,
    authority: Authority,
}

impl Origin {
    fn of(uri: &http::Uri) -> Result<Origin, BoxError> {
        let authority = uri
            .authority()
            .cloned()
            .ok_or("the upstream URI has no host")?;
        Ok(Origin {
            tls: uri.scheme() == Some(&Scheme::HTTPS),
            authority,
        })
    }
}

/// An HTTP/1.1 connection, free for a request.
struct Free {
    origin: Origin,
    h1: H1,
    since: Instant,
}

/// An HTTP/1.1 connection's sending half, and the count of its task's turns, which its
/// responses carry (in their extensions) for the relay.
struct H1 {
    sender: http1::SendRequest<Outgoing>,
    turns: Turns,
}

struct Kept {
    /// Free HTTP/1.1 connections in the order they were freed: the longest idle first.
    free: std::collections::VecDeque<Free>,
    /// One open h2 connection per origin that offered h2.
    shared: Vec<(Origin, http2::SendRequest<Outgoing>)>,
    /// How long a free connection is kept.
    idle: Duration,
    /// Whether a task is closing the free connections as they pass `idle` ([`reap`]).
    reaping: bool,
}

impl Kept {
    /// Drops the free connections idle `idle` or longer (the first ones), as of `now`.
    fn expire(&mut self, now: Instant) {
        let idle = self.idle;
        while self
            .free
            .front()
            .is_some_and(|f| now.duration_since(f.since) >= idle)
        {
            self.free.pop_front();
        }
    }
}

/// One worker's upstream connections.
pub(super) struct Pool {
    connector: Connector,
    kept: Arc<Mutex<Kept>>,
}

/// A connection taken for one request.
enum Taken {
    H1(H1),
    H2(http2::SendRequest<Outgoing>),
}

impl Pool {
    pub(super) fn new(connector: Connector, idle: Duration) -> Pool {
        Pool {
            connector,
            kept: Arc::new(Mutex::new(Kept {
                free: std::collections::VecDeque::new(),
                shared: Vec::new(),
                idle,
                reaping: false,
            })),
        }
    }

    /// Sends `request` (its URI absolute) on a kept connection to its origin, or on a new one.
    /// A kept connection that turns out closed before the request was written is dropped and
    /// the next one tried, as hyper-util's client did; a new connection's failure is the answer.
    pub(super) async fn send(
        &self,
        mut request: http::Request<Outgoing>,
    ) -> Result<http::Response<super::Incoming>, BoxError> {
        let origin = Origin::of(request.uri())?;
        let absolute = request.uri().clone();
        loop {
            let (taken, fresh) = match self.take(&origin) {
                Some(taken) => (taken, false),
                // Boxed: connecting (TLS, the handshakes) holds kilobytes of state, which would
                // otherwise sit in every request's future and be copied with it.
                None => (
                    Box::pin(self.connect(&origin, absolute.clone())).await?,
                    true,
                ),
            };
            let mut failed = match taken {
                Taken::H1(mut h1) => {
                    for_http1(&mut request, &origin);
                    match h1.sender.try_send_request(request).await {
                        Ok(mut response) => {
                            response.extensions_mut().insert(h1.turns.clone());
                            let back = (origin.clone(), h1, self.kept.clone());
                            return Ok(response.map(|body| returning(body, back)));
                        }
                        Err(e) => e,
                    }
                }
                Taken::H2(mut sender) => match sender.try_send_request(request).await {
                    Ok(response) => return Ok(response.map(boxed)),
                    Err(e) => {
                        // A connection that is closing, or that did not take the request, is
                        // shared no longer: the next try opens a new one, never loops on it.
                        if sender.is_closed() || e.message().is_some() {
                            lock(&self.kept).shared.retain(|(o, _)| *o != origin);
                        }
                        e
                    }
                },
            };
            match failed.take_message() {
                // Not written, on a kept connection that had closed: try the next.
                Some(unsent) if !fresh => {
                    request = unsent;
                    *request.uri_mut() = absolute.clone();
                }
                _ => return Err(failed.into_error().into()),
            }
        }
    }

    /// A kept connection to `origin` that can take a request now: the shared h2 one, or the
    /// most recently freed HTTP/1.1 one. Closed and long-idle ones are dropped on the way.
    fn take(&self, origin: &Origin) -> Option<Taken> {
        let mut kept = lock(&self.kept);
        kept.shared.retain(|(_, sender)| !sender.is_closed());
        if let Some((_, sender)) = kept.shared.iter().find(|(o, _)| o == origin) {
            return Some(Taken::H2(sender.clone()));
        }
        // Those idle too long are the first; a taken one that turns out closed is dropped and
        // the next tried. Each request looks at only the few entries it needs.
        kept.expire(Instant::now());
        while let Some(at) = kept.free.iter().rposition(|f| f.origin == *origin) {
            let free = kept.free.remove(at)?;
            if free.h1.sender.is_ready() {
                return Some(Taken::H1(free.h1));
            }
        }
        None
    }

    /// A new connection to `origin`: h2 when TLS negotiated it (then shared from here on),
    /// else HTTP/1.1. Its task runs on this worker's runtime.
    async fn connect(&self, origin: &Origin, uri: http::Uri) -> Result<Taken, BoxError> {
        let mut connector = self.connector.clone();
        std::future::poll_fn(|cx| connector.poll_ready(cx)).await?;
        let io = connector.call(uri).await?;
        if io.connected().is_negotiated_h2() {
            let (sender, connection) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                // Large streamed answers should not be held back by a small fixed window.
                .adaptive_window(true)
                .handshake(io)
                .await?;
            drive(connection, None);
            lock(&self.kept)
                .shared
                .push((origin.clone(), sender.clone()));
            return Ok(Taken::H2(sender));
        }
        let (mut sender, connection) = http1::Builder::new().handshake(io).await?;
        let turns = Turns::default();
        drive(connection, Some(turns.clone()));
        sender.ready().await?;
        Ok(Taken::H1(H1 { sender, turns }))
    }
}

/// A request for an HTTP/1.1 connection: its URI in origin form (the path and query) and a
/// `Host` from its authority when it has none (the route sets it for a plain `http` upstream).
fn for_http1(request: &mut http::Request<Outgoing>, origin: &Origin) {
    if !request.headers().contains_key(http::header::HOST) {
        let default = if origin.tls { 443 } else { 80 };
        if let Some(value) = crate::route::host_header(&origin.authority, default) {
            request.headers_mut().insert(http::header::HOST, value);
        }
    }
    let path = request
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    *request.uri_mut() = http::Uri::from(path);
}

/// A connection to hand back, and where.
type Back = (Origin, H1, Arc<Mutex<Kept>>);

/// The response body, handing its connection back when it has been read to its end.
fn returning(body: hyper::body::Incoming, back: Back) -> super::Incoming {
    http_body_util::BodyExt::boxed(Returning {
        body,
        back: Some(back),
    })
}

fn boxed(body: hyper::body::Incoming) -> super::Incoming {
    use http_body_util::BodyExt;
    body.map_err(BoxError::from).boxed()
}

/// An HTTP/1.1 response body that hands its connection back to the pool at its end.
struct Returning {
    body: hyper::body::Incoming,
    back: Option<Back>,
}

impl Drop for Returning {
    /// A body that was empty, or whose last frame was read without the end being polled for,
    /// still hands its connection back; one dropped before its end does not (hyper closes it).
    fn drop(&mut self) {
        if self.body.is_end_stream() {
            self.hand_back();
        }
    }
}

impl Returning {
    /// The body has ended: its connection is free again, or will be once hyper has finished
    /// with it (then a task waits for that, as hyper-util's client did for every answer).
    fn hand_back(&mut self) {
        let Some((origin, mut h1, kept)) = self.back.take() else {
            return;
        };
        if h1.sender.is_closed() {
            return;
        }
        if h1.sender.is_ready() {
            free(&kept, origin, h1);
            return;
        }
        detach(async move {
            if h1.sender.ready().await.is_ok() {
                free(&kept, origin, h1);
            }
        });
    }
}

/// Puts a connection back among the free ones, and starts the task that closes them once idle
/// too long if none runs.
fn free(shared: &Arc<Mutex<Kept>>, origin: Origin, h1: H1) {
    let mut kept = lock(shared);
    kept.free.push_back(Free {
        origin,
        h1,
        since: Instant::now(),
    });
    if !kept.reaping {
        kept.reaping = true;
        detach(reap(Arc::downgrade(shared)));
    }
}

/// Runs a new connection's task (hyper's, reading and writing it) on this worker's runtime.
/// Runs a connection's task, counting its turns when asked to.
fn drive<C>(connection: C, turns: Option<Turns>)
where
    C: std::future::Future<Output = Result<(), hyper::Error>> + Send + 'static,
{
    detach(async move {
        let mut connection = std::pin::pin!(connection);
        let counted = std::future::poll_fn(|cx| {
            if let Some(turns) = &turns {
                turns.count();
            }
            connection.as_mut().poll(cx)
        });
        if let Err(e) = counted.await {
            tracing::debug!(error = %e, "upstream connection ended");
        }
    });
}

/// Runs `task` on this worker's runtime, beside its connections. A body dropped where there is
/// no runtime (its own shutting down) has nothing left to keep: the task is dropped.
fn detach<F>(task: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if tokio::runtime::Handle::try_current().is_ok() {
        TokioExecutor::new().execute(task);
    }
}

fn lock(kept: &Mutex<Kept>) -> std::sync::MutexGuard<'_, Kept> {
    kept.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Closes free connections as they pass the pool's idle timeout (`pool_idle_timeout_seconds`),
/// waking when the longest idle one is due; it ends when none is left free, or with the pool.
async fn reap(pool: std::sync::Weak<Mutex<Kept>>) {
    loop {
        let due = {
            let Some(shared) = pool.upgrade() else {
                return;
            };
            let mut kept = lock(&shared);
            kept.expire(Instant::now());
            match kept.free.front() {
                Some(first) => first.since + kept.idle,
                None => {
                    kept.reaping = false;
                    return;
                }
            }
        };
        tokio::time::sleep_until(due.into()).await;
    }
}

impl http_body::Body for Returning {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.hand_back(),
            Poll::Ready(Some(Ok(_))) if self.body.is_end_stream() => self.hand_back(),
            // An error closes the connection; it is not handed back.
            Poll::Ready(Some(Err(_))) => self.back = None,
            _ => {}
        }
        polled.map_err(BoxError::from)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
