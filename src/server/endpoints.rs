//! sluice's own endpoints: artifacts and the read endpoint on the proxy listener, health, readiness and metrics on the admin listener.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::error::GatewayError;
use crate::projection::exit::cursor::{Cursor, CursorError};
use crate::store::s3::Read;
use crate::store::{ArtifactId, ArtifactKind, StoreError};
use crate::tenant::Tenant;

use super::pages::Paged;
use super::{full, plain, App, Body, Context, Shared, NEXT_CURSOR};

impl App {
    /// sluice's own endpoints (section 9): `GET /v1/sluice/artifacts/{id}` and
    /// `GET /v1/sluice/read?cursor=…`. Only the creating tenant gets anything; everyone else gets
    /// 404, never a hint that the artifact exists (S3). Reading never makes an artifact (T6).
    pub(super) async fn sluice_endpoint(
        &self,
        req: &Request<Incoming>,
        ctx: &Context,
    ) -> Result<Response<Body>, GatewayError> {
        let path = req.uri().path();
        let not_found = || GatewayError::NotFound(path.to_string());
        if req.method() != Method::GET {
            return Err(not_found());
        }
        // Without a credential (and no route naming a tenant for that case) nobody can be told
        // apart: 401, never the shared anonymous tenant's artifacts (S3).
        let tenant = Tenant::of_request(req.headers())
            .or_else(|| {
                self.routes
                    .select_family(ctx.family)
                    .and_then(|r| r.tenant.clone())
            })
            .ok_or(GatewayError::Unauthorized)?;
        if path.starts_with("/v1/sluice/sessions") {
            return self.sessions_endpoint(req, ctx, tenant).await;
        }
        let store_error = |e: crate::store::StoreError| {
            tracing::error!(request_id = %ctx.request_id, error = %e, "artifact read failed");
            GatewayError::StoreUnavailable
        };
        if let Some(id) = path.strip_prefix("/v1/sluice/artifacts/") {
            let id = ArtifactId::parse(id).ok_or_else(not_found)?;
            let read = self
                .artifacts
                .read(&tenant, &id)
                .await
                .map_err(store_error)?
                .ok_or_else(not_found)?;
            return match read {
                Read::Whole(bytes) => Ok(plain(StatusCode::OK, served_type(&id, &bytes), bytes)),
                Read::Stream { size, stream } => {
                    streamed(&id, size, stream).await.map_err(store_error)
                }
            };
        }
        if path != "/v1/sluice/read" {
            return Err(not_found());
        }
        let cursor = url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .find(|(k, _)| k == "cursor")
            .map(|(_, v)| v.into_owned())
            .ok_or(GatewayError::BadCursor)?;
        let cursor = Cursor::decode(&cursor, &tenant).map_err(|e| match e {
            CursorError::Malformed => GatewayError::BadCursor,
            CursorError::Foreign => not_found(),
        })?;
        let read_tool = self
            .routes
            .select_family(ctx.family)
            .map_or("sluice_read", |r| r.config.read_tool.as_str());
        let page = match self
            .read_page(&tenant, &cursor, read_tool)
            .await
            .map_err(store_error)?
        {
            Paged::Page(page) => page,
            Paged::NotThisText => return Err(GatewayError::BadCursor),
            Paged::Missing => return Err(not_found()),
        };
        let mut response = plain(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            Bytes::from(page.text),
        );
        if let Some(next) = page.next.and_then(|n| HeaderValue::from_str(&n).ok()) {
            response.headers_mut().insert(NEXT_CURSOR, next);
        }
        Ok(response)
    }
}

/// What a download of artifact `id` is served as, from its first bytes: its media's own type
/// (the bytes were checked when stored), text as UTF-8.
fn served_type(id: &ArtifactId, head: &[u8]) -> &'static str {
    match id.kind {
        ArtifactKind::Text => "text/plain; charset=utf-8",
        ArtifactKind::Media => match crate::audio::AudioType::sniff(head) {
            Some(audio) => audio.mime(),
            None => crate::image::sniff(head).map_or("application/octet-stream", |i| i.mime()),
        },
    }
}

/// A download passed on from the bucket chunk by chunk, its type read off the first chunk.
async fn streamed(
    id: &ArtifactId,
    size: u64,
    mut stream: futures_util::stream::BoxStream<'static, Result<Bytes, StoreError>>,
) -> Result<Response<Body>, StoreError> {
    use futures_util::StreamExt;
    let first = stream.next().await.transpose()?.unwrap_or_default();
    let content_type = served_type(id, &first);
    let frames = futures_util::stream::once(async move { Ok(first) })
        .chain(stream)
        .map(|chunk| {
            chunk
                .map(hyper::body::Frame::data)
                .map_err(|e| Box::new(e) as crate::upstream::BoxError)
        });
    let mut response = Response::new(http_body_util::BodyExt::boxed_unsync(
        http_body_util::StreamBody::new(frames),
    ));
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(size));
    Ok(response)
}

impl Shared {
    /// Checks the store can be written, and records the answer in `sluice_store_up`.
    pub(super) async fn check_store(&self) -> Result<(), crate::store::StoreError> {
        let checked = match &self.state_probe {
            Some(state) => match crate::store::ArtifactStore::check(state).await {
                Ok(()) => self.artifacts.check().await,
                Err(e) => Err(e),
            },
            None => self.artifacts.check().await,
        };
        self.metrics
            .store_up
            .with_label_values(&[self.sessions.backend()])
            .set(i64::from(checked.is_ok()));
        checked
    }

    /// The admin listener: `/healthz`, `/readyz`, `/metrics` (O2).
    pub(super) async fn admin(&self, req: &Request<Incoming>) -> Response<Body> {
        let (status, content_type, body) = match (req.method(), req.uri().path()) {
            (&Method::GET, "/healthz") => (StatusCode::OK, "text/plain", Bytes::from("ok\n")),
            (&Method::GET, "/readyz") if self.draining.load(Ordering::SeqCst) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                Bytes::from("draining\n"),
            ),
            (&Method::GET, "/readyz") => match self.check_store().await {
                Ok(()) => (StatusCode::OK, "text/plain", Bytes::from("ready\n")),
                Err(e) => {
                    tracing::warn!(error = %e, "not ready: the store cannot be written");
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain",
                        Bytes::from("store unavailable\n"),
                    )
                }
            },
            (&Method::GET, "/metrics") => (
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                Bytes::from(self.metrics.render()),
            ),
            _ => (
                StatusCode::NOT_FOUND,
                "text/plain",
                Bytes::from("not found\n"),
            ),
        };
        let mut response = Response::new(full(body));
        *response.status_mut() = status;
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(content_type),
        );
        response
    }
}
