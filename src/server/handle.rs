//! Dispatch: every proxy request gets its id, its metrics and, on failure, a dialect-shaped error.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::dialect::{Dialect, Family};
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::tenant::Tenant;
use crate::upstream::{self};

use super::{full, plain, sessions, App, Body, REQUEST_ID};

/// Decrements the in-flight gauge and records the request duration when dropped, which happens
/// exactly once: at the end of the response body, or with an early error response.
pub(super) struct InFlight {
    pub(super) metrics: Arc<Metrics>,
    pub(super) dialect: &'static str,
    pub(super) start: Instant,
    /// The request's place in its tenant's share (`[limits]`), given back with the rest.
    pub(super) admitted: Option<super::tenants::Admitted>,
    /// Its connection is busy until then.
    pub(super) busy: Option<super::shed::Busy>,
}

impl InFlight {
    pub(super) fn new(metrics: &Arc<Metrics>, dialect: &'static str, start: Instant) -> Self {
        metrics.inflight_requests.inc();
        Self {
            metrics: metrics.clone(),
            dialect,
            start,
            admitted: None,
            busy: None,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.metrics.inflight_requests.dec();
        self.metrics
            .request_duration_seconds
            .with_label_values(&[self.dialect])
            .observe(upstream::seconds_since(self.start));
    }
}

/// A request's id: the process's prefix and the request's number, 16 hex digits each (what
/// `format!("{:016x}{:016x}")` gives, without the formatting machinery, on every request).
fn request_id(prefix: u64, n: u64) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(32);
    for word in [prefix, n] {
        for shift in (0..16).rev() {
            id.push(char::from(HEX[((word >> (shift * 4)) & 0xf) as usize]));
        }
    }
    id
}

/// The upstream URI of a request on `route`. It cannot fail for a path hyper accepted and a base
/// the route table parsed; if it ever does, the request gets a 500 and the log says why.
pub(super) fn upstream_uri(
    route: &crate::route::Route,
    uri: &http::Uri,
    ctx: &Context,
) -> Result<http::Uri, GatewayError> {
    route.uri(uri).map_err(|e| {
        tracing::error!(request_id = %ctx.request_id, error = %e, "cannot build the upstream URI");
        GatewayError::Internal
    })
}

/// Where a request came from: its source address, its connection (busy while the request is
/// in flight, `shed.rs`), and whether that address was already holding its
/// `address_connections` when this connection came (then every request on it is refused).
#[derive(Clone)]
pub(super) struct Peer {
    ip: Option<std::net::IpAddr>,
    connection: Option<Arc<super::shed::Connection>>,
    over_cap: bool,
}

impl Peer {
    pub(super) fn served(
        ip: Option<std::net::IpAddr>,
        connection: &Arc<super::shed::Connection>,
    ) -> Peer {
        Peer {
            ip,
            connection: Some(connection.clone()),
            over_cap: false,
        }
    }

    pub(super) fn refused() -> Peer {
        Peer {
            ip: None,
            connection: None,
            over_cap: true,
        }
    }
}

/// What the handler knows about a request when it answers it, for metrics and logs.
pub(super) struct Context {
    pub(super) request_id: String,
    pub(super) family: Family,
    pub(super) dialect: &'static str,
    pub(super) route: String,
    /// The source address of the connection, if known.
    pub(super) peer: Option<std::net::IpAddr>,
    /// Whose share the request counts against, once known (`[limits]`: before its body).
    pub(super) share: Option<Tenant>,
}

impl super::Shared {
    /// Whose share a request counts against: its credential's tenant; without one, the route's
    /// named tenant, else its source address's.
    pub(super) fn share_of(
        &self,
        headers: &http::HeaderMap,
        family: Family,
        peer: Option<std::net::IpAddr>,
    ) -> Tenant {
        Tenant::of_request(headers)
            .or_else(|| {
                self.routes
                    .select_family(family)
                    .and_then(|r| r.tenant.clone())
            })
            .or_else(|| peer.map(Tenant::of_address))
            .unwrap_or_else(Tenant::anonymous)
    }
}

impl App {
    pub(super) async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: Peer,
    ) -> Response<Body> {
        let start = Instant::now();
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request_id = request_id(self.id_prefix, n);
        let path = req.uri().path();
        let endpoint = (req.method() == Method::POST)
            .then(|| Dialect::endpoint(path))
            .flatten();
        let dialect = endpoint.as_ref().map(|e| e.dialect);
        let mut ctx = Context {
            request_id,
            family: dialect
                .map_or_else(|| Family::of_request(path, req.headers()), Dialect::family),
            dialect: dialect.map_or("passthrough", Dialect::as_str),
            route: String::new(),
            peer: peer.ip,
            share: None,
        };
        let mut inflight = InFlight::new(&self.metrics, ctx.dialect, start);
        inflight.busy = peer.connection.as_ref().map(super::shed::Connection::enter);
        let api = endpoint.is_some() || Family::is_api_path(path);
        let admitted = match &self.tenants {
            _ if peer.over_cap => Err(GatewayError::TenantLimited {
                limit: "address",
                retry_after: 1,
            }),
            Some(tenants) if api => self.admit(tenants, &req, &mut ctx).map(Some),
            _ => Ok(None),
        };
        let result = if let Err(refused) = admitted {
            drop(inflight);
            Err(refused)
        } else if let Some(endpoint) = endpoint {
            inflight.admitted = admitted.ok().flatten();
            self.projected(endpoint, req, start, &mut ctx, inflight)
                .await
        } else if path.starts_with("/v1/sluice/") {
            drop(inflight);
            ctx.dialect = "sluice";
            self.sluice_endpoint(&req, &ctx).await
        } else if Family::is_api_path(path) {
            inflight.admitted = admitted.ok().flatten();
            self.pass_through(req, &mut ctx, inflight).await
        } else if let Some(page) = path
            .starts_with("/sluice/ui")
            .then(|| sessions::page(&req))
            .flatten()
        {
            drop(inflight);
            ctx.dialect = "sluice";
            Ok(page)
        } else if path == "/" && matches!(*req.method(), Method::GET | Method::HEAD) {
            // Clients check the base URL answers before they start (Claude Code: `HEAD /`).
            drop(inflight);
            ctx.dialect = "sluice";
            Ok(plain(StatusCode::OK, "text/plain", Bytes::from("sluice\n")))
        } else {
            drop(inflight);
            Err(GatewayError::NotFound(path.to_string()))
        };
        let mut response = match result {
            Ok(response) => response,
            Err(err) => self.error_response(&ctx, &err),
        };
        self.metrics
            .requests_total
            .with_label_values(&[
                ctx.dialect,
                if ctx.route.is_empty() {
                    "none"
                } else {
                    &ctx.route
                },
                response.status().as_str(),
            ])
            .inc();
        if let Ok(value) = HeaderValue::from_str(&ctx.request_id) {
            response.headers_mut().insert(REQUEST_ID, value);
        }
        response
    }

    /// A request's place in its tenant's share, taken before its body is read (`[limits]`).
    fn admit(
        &self,
        tenants: &super::tenants::Tenants,
        req: &Request<Incoming>,
        ctx: &mut Context,
    ) -> Result<super::tenants::Admitted, GatewayError> {
        let tenant = self.share_of(req.headers(), ctx.family, ctx.peer);
        let admitted = tenants.admit(&tenant, Instant::now());
        ctx.share = Some(tenant);
        admitted
    }

    pub(super) fn error_response(&self, ctx: &Context, err: &GatewayError) -> Response<Body> {
        self.metrics
            .errors_total
            .with_label_values(&[err.kind()])
            .inc();
        if err.status().is_server_error() {
            tracing::warn!(request_id = %ctx.request_id, dialect = ctx.dialect, route = %ctx.route, kind = err.kind(), "request failed");
        } else {
            tracing::debug!(request_id = %ctx.request_id, dialect = ctx.dialect, kind = err.kind(), error = %err, "request refused");
        }
        let mut response = Response::new(full(err.body(ctx.family)));
        *response.status_mut() = err.status();
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let GatewayError::TenantLimited { limit, retry_after } = err {
            self.metrics
                .tenant_rejected_total
                .with_label_values(&[limit])
                .inc();
            let headers = response.headers_mut();
            headers.insert(http::header::RETRY_AFTER, HeaderValue::from(*retry_after));
            let limits = &self.config.limits;
            let requests = match *limit {
                "concurrency" => Some(u64::from(limits.tenant_concurrency)),
                "rate" => Some(limits.burst() as u64),
                _ => None,
            };
            if let Some(requests) = requests {
                let reset =
                    std::time::SystemTime::now() + std::time::Duration::from_secs(*retry_after);
                ctx.family
                    .rate_limit_headers(headers, requests, *retry_after, reset);
            }
        }
        if matches!(err, GatewayError::Overloaded) {
            // Bodies in flight are answered within seconds; come back after that.
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if err.status() == StatusCode::REQUEST_TIMEOUT {
            // The rest of that body is not waited for: the connection ends here.
            response
                .headers_mut()
                .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_request_id_is_both_numbers_in_fixed_width_hex() {
        for (prefix, n) in [(0, 0), (u64::MAX, 1), (0x0123_4567_89ab_cdef, 0xfedc_ba98)] {
            assert_eq!(
                super::request_id(prefix, n),
                format!("{prefix:016x}{n:016x}")
            );
        }
    }
}
