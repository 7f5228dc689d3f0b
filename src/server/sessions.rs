//! The inspector's endpoints on the proxy listener (docs/inspector.md, SPEC 9.1):
//! `GET /v1/sluice/sessions` and `GET /v1/sluice/sessions/{id}`, scoped by the caller's
//! credential like artifacts (S3), and the page at `GET /sluice/ui`, static files built into
//! the binary that call that API with the key the user enters.

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::error::GatewayError;
use crate::inspect::SessionRecord;
use crate::tenant::Tenant;

use super::{plain, App, Body, Context};

/// The page's files: (path, content type, bytes).
const PAGE: &[(&str, &str, &str)] = &[
    (
        "/sluice/ui",
        "text/html; charset=utf-8",
        include_str!("../../assets/inspector/index.html"),
    ),
    (
        "/sluice/ui/app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/inspector/app.js"),
    ),
    (
        "/sluice/ui/app.css",
        "text/css; charset=utf-8",
        include_str!("../../assets/inspector/app.css"),
    ),
];

/// The page may load only its own files and talk only to this origin; images and audio it shows
/// are blobs it fetched with the key.
const POLICY: &str = "default-src 'self'; img-src 'self' blob:; media-src 'self' blob:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

impl App {
    /// `GET /v1/sluice/sessions[/{id}]`: JSON, the caller's tenant only. No credential: 401;
    /// another tenant's (or an unknown) id: 404; inspector off: 404 saying so.
    pub(super) async fn sessions_endpoint(
        &self,
        req: &Request<Incoming>,
        ctx: &Context,
        tenant: Tenant,
    ) -> Result<Response<Body>, GatewayError> {
        let path = req.uri().path();
        let Some(inspector) = &self.inspector else {
            return Err(GatewayError::NotFound(
                "/v1/sluice/sessions (the inspector is off: set [inspector] enabled = true)".into(),
            ));
        };
        let ns = tenant.namespace();
        let ttl = inspector.ttl();
        let store_error = |e: crate::store::StoreError| {
            tracing::error!(request_id = %ctx.request_id, error = %e, "turn records unavailable");
            GatewayError::StoreUnavailable
        };
        // Records of requests that just ended are still on their way to the store.
        inspector.settled().await;
        let json = match path
            .trim_end_matches('/')
            .strip_prefix("/v1/sluice/sessions")
        {
            Some("") => {
                let sessions = inspector.store.list(&ns, ttl).await.map_err(store_error)?;
                serde_json::json!({
                    "sessions": sessions,
                    "keep_turns": inspector.config.keep_turns,
                })
                .to_string()
            }
            Some(rest) => {
                let id = rest.strip_prefix('/').unwrap_or_default();
                let valid =
                    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit());
                if !valid {
                    return Err(GatewayError::NotFound(path.to_string()));
                }
                let (head, turns) = inspector
                    .store
                    .session(&ns, id, ttl)
                    .await
                    .map_err(store_error)?
                    .ok_or_else(|| GatewayError::NotFound(path.to_string()))?;
                serde_json::to_string(&SessionRecord {
                    session: head,
                    turns,
                })
                .map_err(|_| GatewayError::Internal)?
            }
            None => return Err(GatewayError::NotFound(path.to_string())),
        };
        let mut response = plain(StatusCode::OK, "application/json", Bytes::from(json));
        response.headers_mut().insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        );
        Ok(response)
    }
}

/// `GET /sluice/ui` and its files; `None` for any other path.
pub(super) fn page(req: &Request<Incoming>) -> Option<Response<Body>> {
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return None;
    }
    let path = req.uri().path().trim_end_matches('/');
    let (_, content_type, text) = PAGE.iter().find(|(p, _, _)| *p == path)?;
    let mut response = plain(
        StatusCode::OK,
        content_type,
        Bytes::from_static(text.as_bytes()),
    );
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    headers.insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    Some(response)
}
