//! Pass-through and the streamed relay of upstream responses (P3, P5).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::dialect::completion::Completion;
use crate::error::GatewayError;
use crate::upstream::{self, BoxError};

use super::commit::Commit;
use super::{App, Body, Context, InFlight};

impl App {
    pub(super) async fn pass_through(
        &self,
        req: Request<Incoming>,
        ctx: &mut Context,
        inflight: InFlight,
    ) -> Result<Response<Body>, GatewayError> {
        let start = inflight.start;
        let route = self
            .routes
            .select_family(ctx.family)
            .ok_or_else(|| GatewayError::NoRoute {
                dialect: ctx.dialect,
                model: String::new(),
            })?;
        ctx.route.clone_from(&route.config.name);
        let (parts, incoming) = req.into_parts();
        let uri = super::upstream_uri(route, &parts.uri, ctx)?;
        let headers = upstream::request_headers(parts.headers, route, ctx.family);
        let expired = Arc::new(AtomicBool::new(false));
        let body = if http_body::Body::is_end_stream(&incoming) {
            upstream::Outgoing::empty()
        } else {
            let timeout = self.config.request_body_timeout();
            upstream::Outgoing::stream(TimedBody {
                inner: incoming,
                deadline: Box::pin(tokio::time::sleep(timeout)),
                expired: expired.clone(),
            })
        };
        let sent_at = Instant::now();
        let sent = self.upstream.send(parts.method, uri, headers, body).await;
        let started = match sent {
            Err(_) if expired.load(Ordering::Relaxed) => {
                return Err(GatewayError::BodyTimeout {
                    seconds: self.config.request_body_timeout_seconds,
                })
            }
            other => other?,
        };
        self.metrics
            .upstream_duration_seconds
            .with_label_values(&[ctx.dialect, &route.config.name])
            .observe(upstream::seconds_since(sent_at));
        Ok(self.relay(started, ctx, inflight, start, None, Commit::none()))
    }

    /// Streams an upstream response to the client; records the stream's end (O2).
    pub(super) fn relay(
        &self,
        mut started: upstream::Started,
        ctx: &Context,
        inflight: InFlight,
        start: Instant,
        watch: Option<Completion>,
        mut commit: Commit,
    ) -> Response<Body> {
        let status = started.status;
        let event_stream = started.is_event_stream();
        // The inspector reads the provider's usage: from the stream's events, or from a whole
        // body kept for it.
        let inspected = commit.draft().is_some();
        let watch = watch
            .filter(|_| event_stream)
            .map(|w| if inspected { w.with_usage() } else { w });
        let keep = if inspected && !event_stream {
            crate::inspect::KEEP_RESPONSE_BYTES
        } else {
            0
        };
        let headers = upstream::response_headers(std::mem::take(&mut started.headers));
        let metrics = self.metrics.clone();
        let (request_id, dialect, route) = (ctx.request_id.clone(), ctx.dialect, ctx.route.clone());
        let body = started.relay_keeping(watch, keep, move |end| {
            drop(inflight);
            commit.ended(event_stream, end.usage, end.kept);
            // A9: state changes count only when the response completed.
            commit.settle(end.complete);
            if event_stream {
                metrics
                    .streams_total
                    .with_label_values(&[dialect, end.outcome.as_str()])
                    .inc();
            }
            tracing::debug!(
                request_id,
                dialect,
                route,
                status = status.as_u16(),
                outcome = end.outcome.as_str(),
                bytes = end.bytes,
                duration_ms = start.elapsed().as_secs_f64() * 1e3,
                "request finished"
            );
        });
        let mut response = Response::new(body.boxed_unsync());
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }
}

/// A client body streamed to the upstream (P5), cut when it has not fully arrived by its
/// deadline; `expired` says so, for the 408.
pub(super) struct TimedBody {
    inner: Incoming,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    expired: Arc<AtomicBool>,
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        use std::task::Poll;
        if let Poll::Ready(frame) = std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(BoxError::from)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.expired.store(true, Ordering::Relaxed);
                Poll::Ready(Some(Err("the request body did not arrive in time".into())))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
