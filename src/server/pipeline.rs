//! The projected request path, stage by stage: the stage list is on [`App::projected`].

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use tokio::sync::OwnedSemaphorePermit;

use crate::dialect::completion::Completion;
use crate::dialect::Dialect;
use crate::encoding::Coding;
use crate::error::GatewayError;
use crate::projection::attach::state::SessionState;
use crate::projection::exit::Spill;
use crate::projection::{self, splice, RequestView, Summary};
use crate::read;
use crate::route::Route;
use crate::store::session::{SessionKey, SessionStore};
use crate::store::ArtifactKind;
use crate::tenant::Tenant;
use crate::upstream;

use super::commit::Commit;
use super::{
    decode_body, read_body, rounds, App, Body, Context, InFlight, NOTHING_PROJECTED, PROJECTION,
};

impl App {
    /// The session of a request and its delivery state. A store that cannot be read must not
    /// fail the request: it goes on without state (`None`), and commits nothing.
    pub(super) async fn load_session(
        &self,
        headers: &http::HeaderMap,
        tenant: &Tenant,
        view: &projection::RequestView<'_>,
        route: &crate::route::Route,
        ctx: &Context,
    ) -> (Option<SessionKey>, SessionState) {
        let header = headers
            .get(&self.session_header)
            .and_then(|v| v.to_str().ok());
        let (key, source) = SessionKey::of(tenant, header, view, &route.config.name);
        tracing::debug!(request_id = %ctx.request_id, session_from = source.as_str(), "session");
        self.seen.insert(key.0.clone(), ());
        self.metrics
            .sessions_active
            .set(i64::try_from(self.seen.entry_count()).unwrap_or(i64::MAX));
        let loading = Instant::now();
        let loaded = self.sessions.load(&key).await;
        self.metrics
            .store_seconds
            .with_label_values(&[self.sessions.backend(), "load"])
            .observe(loading.elapsed().as_secs_f64());
        match loaded {
            Ok(state) => (Some(key), state),
            Err(e) => {
                tracing::warn!(request_id = %ctx.request_id, error = %e, "session state unavailable");
                (None, SessionState::default())
            }
        }
    }

    /// A projected request, stage by stage. The stages, in order:
    /// 1. **read**: the body under `max_body_bytes` (413 while reading), paced (408), within
    ///    `max_inflight_body_bytes` (503), decoded off the I/O thread if compressed.
    /// 2. **view**: read once by its dialect into a [`RequestView`] (400 on bad JSON).
    /// 3. **route**: by dialect and model (404); the tenant from the credential or the route.
    /// 4. **prepare**: the request's images found and checked (memoized).
    /// 5. **session**: its delivery state loaded, only when it has images (or, at 7, the read
    ///    tool is offered); a store that cannot be read means no state and no commit.
    /// 6. **plan**: the core projects view, policy and state into edits, artifacts and a delta.
    /// 7. **read tool**: offered when something is spilled or re-readable (C1, C5); the rounds
    ///    hidden on earlier turns spliced back where the history shows them (C3).
    /// 8. **persist**: artifacts stored before the model is shown a reference (T3).
    /// 9. **splice**: the edits written into the original bytes (P1, P2).
    /// 10. **forward**: header policy, the `Accept-Encoding` sluice decodes; the upstream's head
    ///     and first chunk awaited (502/504).
    /// 11. **relay** (P3) or **read rounds** (C2).
    /// 12. **commit**: the delta, once the response reached the client (A9, [`Commit`]).
    pub(super) async fn projected(
        self: &Arc<Self>,
        dialect: Dialect,
        req: Request<Incoming>,
        start: Instant,
        ctx: &mut Context,
        inflight: InFlight,
    ) -> Result<Response<Body>, GatewayError> {
        let (mut parts, incoming) = req.into_parts();
        // The body's share of max_inflight_body_bytes, held until the response is produced.
        let (body, _room) = self.read(&mut parts.headers, incoming).await?;
        let read_at = Instant::now();
        let view = dialect
            .read_view(&body)
            .map_err(|e| GatewayError::BadJson(e.to_string()))?;
        let (route, tenant) = self.route(dialect, &view, &parts.headers, ctx)?;
        let shape = read::Shape::of_view(&view);
        let read_tool = read_tool_name(dialect, route, &view, shape.as_ref());
        let mut session = None;
        let mut state = SessionState::default();
        let policy = route.config.policy(&read_tool);
        let light = (body.len() < HEAVY_BODY_BYTES)
            .then(|| projection::Prepared::without_images(&view, &tenant, &self.memo))
            .flatten();
        let mut projection = if let Some(prepared) = light {
            // No image and a small body: projected here, and no session is needed for it.
            projection::project_prepared(
                &view,
                &projection::Context {
                    tenant: &tenant,
                    policy,
                    memo: &self.memo,
                    state: &state,
                },
                prepared,
            )
        } else {
            // Images to decode and check (or downscale), or a large body to page and hash: on
            // the blocking pool, so this worker's other connections keep moving.
            (session, state) = self
                .load_session(&parts.headers, &tenant, &view, route, ctx)
                .await;
            let job = Planning {
                dialect,
                body: body.clone(),
                tenant: tenant.clone(),
                route: route.config.clone(),
                read_tool: read_tool.clone(),
                state,
            };
            let (projection, planned) = self.off_thread(job).await?;
            state = planned;
            projection
        };
        // C1, C5: a request sluice changes nothing in gets no tool (P1).
        let accepts_images = policy.accepts_images;
        let offer = route.config.max_read_steps > 0
            && (projection.summary.spilled > 0 || (projection.rereadable > 0 && accepts_images));
        let mut tool = None;
        if offer {
            if session.is_none() {
                (session, state) = self
                    .load_session(&parts.headers, &tenant, &view, route, ctx)
                    .await;
            }
            let hidden = self.hidden_rounds(dialect, &body, &tenant, &state).await;
            projection.edits.extend(hidden);
            if let Some(shape) = &shape {
                let definition = read::definition(dialect, &read_tool);
                projection.edits.push(shape.add_tool(&definition));
                tool = Some(read_tool);
            }
        }
        // count_tokens shows the model nothing: it never changes what was delivered.
        let shows_model = !parts.uri.path().ends_with("/count_tokens");
        let mut commit = Commit::new(
            &self.shared,
            &self.commits,
            session.filter(|_| shows_model),
            projection.delta,
        );
        drop((shape, view));
        self.persist(&projection.spills, &tenant, ctx, route)
            .await?;
        self.count_images(&projection.images);
        for (key, value) in projection.memos {
            self.memo.insert_page(key, value);
        }
        let forwarded = splice(&body, projection.edits).map_err(|e| {
            tracing::error!(request_id = %ctx.request_id, error = %e, "projection produced bad edits");
            GatewayError::Internal
        })?;
        let url = route.url(&parts.uri);
        let headers = forward_headers(parts.headers, route, ctx);
        let job = tool.filter(|_| shows_model).map(|tool| rounds::Job {
            dialect,
            tool,
            max_steps: route.config.max_read_steps,
            tenant: tenant.clone(),
            method: parts.method.clone(),
            url: url.clone(),
            headers: headers.clone(),
            body: forwarded.clone(),
            original: body.clone(),
            commit: std::mem::replace(&mut commit, Commit::none()),
            images: rounds::ImageRoom::left(&route.config, accepts_images, &projection.images),
        });
        let before_send = read_at.elapsed();
        let sent_at = Instant::now();
        // No response at all: the commit is dropped, and counted discarded.
        let started = self
            .upstream
            .send(parts.method, url, headers, forwarded.into())
            .await?;
        let answered_at = Instant::now();
        self.metrics
            .upstream_duration_seconds
            .with_label_values(&[ctx.dialect, &route.config.name])
            .observe((answered_at - sent_at).as_secs_f64());
        let summary = if projection.summary == Summary::default() {
            Ok(HeaderValue::from_static(NOTHING_PROJECTED))
        } else {
            HeaderValue::from_str(&projection.summary.header_value())
        };
        let mut response = match job {
            Some(job) => {
                self.read_rounds(job, started, ctx, inflight, start, before_send)
                    .await
            }
            None => {
                let watch = Some(Completion::new(dialect));
                let response = self.relay(started, ctx, inflight, start, watch, commit);
                self.metrics
                    .overhead_seconds
                    .observe((before_send + answered_at.elapsed()).as_secs_f64());
                response
            }
        };
        if let Ok(value) = summary {
            response.headers_mut().insert(PROJECTION, value);
        }
        Ok(response)
    }

    /// Stages 4 and 6 on the blocking pool, within the `heavy` bound (a core is left to I/O):
    /// the view is read again there from the same bytes (a scan, far cheaper than the work it
    /// moves).
    async fn off_thread(
        &self,
        job: Planning,
    ) -> Result<(projection::Projection, SessionState), GatewayError> {
        let _permit = self
            .heavy
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| GatewayError::Internal)?;
        let shared = self.shared.clone();
        let planned = tokio::task::spawn_blocking(move || {
            let view = job.dialect.read_view(&job.body).ok()?;
            let prepared = projection::Prepared::new(&view, &job.tenant, &shared.memo);
            let projection = projection::project_prepared(
                &view,
                &projection::Context {
                    tenant: &job.tenant,
                    policy: job.route.policy(&job.read_tool),
                    memo: &shared.memo,
                    state: &job.state,
                },
                prepared,
            );
            Some((projection, job.state))
        })
        .await;
        match planned {
            Ok(Some(planned)) => Ok(planned),
            // The bytes were read into a view before: a second reading cannot fail.
            Ok(None) | Err(_) => Err(GatewayError::Internal),
        }
    }

    /// Stage 1: the body, read within its limits and decoded; what is forwarded goes out
    /// uncompressed.
    async fn read(
        &self,
        headers: &mut http::HeaderMap,
        incoming: Incoming,
    ) -> Result<(Bytes, Option<OwnedSemaphorePermit>), GatewayError> {
        let coding = Coding::of(headers).map_err(GatewayError::UnsupportedEncoding)?;
        let limit = self.config.max_body_bytes;
        let timeout = self.config.request_body_timeout();
        let (mut body, room) =
            read_body(incoming, headers, limit, timeout, &self.body_room).await?;
        if coding != Coding::Identity {
            body = decode_body(body, coding, limit).await?;
            headers.remove(http::header::CONTENT_ENCODING);
        }
        Ok((body, room))
    }

    /// Stage 3: the route of the request's dialect and model, and who asks.
    fn route(
        &self,
        dialect: Dialect,
        view: &RequestView<'_>,
        headers: &http::HeaderMap,
        ctx: &mut Context,
    ) -> Result<(&Route, Tenant), GatewayError> {
        let model = view.model.as_deref().unwrap_or("");
        let route = self
            .routes
            .select(dialect, model)
            .ok_or_else(|| GatewayError::NoRoute {
                dialect: dialect.as_str(),
                model: model.chars().take(200).collect(),
            })?;
        ctx.route.clone_from(&route.config.name);
        let tenant = Tenant::of_request(headers)
            .or_else(|| route.tenant.clone())
            .unwrap_or_else(Tenant::anonymous);
        Ok((route, tenant))
    }

    /// Stage 7 (C3): edits that splice back the rounds hidden from the client on earlier
    /// turns, for the session's links found in this history. An expired one is left as the
    /// client received it.
    async fn hidden_rounds(
        &self,
        dialect: Dialect,
        body: &Bytes,
        tenant: &Tenant,
        state: &SessionState,
    ) -> Vec<projection::Edit> {
        let links = read::Link::all(state);
        let mut edits = Vec::new();
        if links.is_empty() {
            return edits;
        }
        let Some(shape) = read::Shape::read(dialect, body) else {
            return edits;
        };
        let text = std::str::from_utf8(body).unwrap_or_default();
        for m in read::matches(&shape, &links) {
            match self.artifacts.get(tenant, &m.link.artifact).await {
                Ok(Some(content)) => edits.extend(read::splice_edits(&shape, text, &m, &content)),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "cannot read hidden read rounds"),
            }
        }
        edits
    }

    /// Stage 8 (T3): the artifacts are durable before the model is shown a reference to them.
    /// A page whose artifact cannot be stored would hand the model a dead cursor: the request
    /// fails instead. An image is sent with the request itself (only a later re-read needs its
    /// artifact), so it goes on.
    async fn persist(
        &self,
        spills: &[Spill],
        tenant: &Tenant,
        ctx: &Context,
        route: &Route,
    ) -> Result<(), GatewayError> {
        let (mut spilled, mut spilled_bytes) = (0u64, 0u64);
        // Written side by side, each durable on its own (docs/runtime.md).
        let mut stored = Vec::with_capacity(spills.len());
        for chunk in spills.chunks(PARALLEL_WRITES) {
            let mut writes = Vec::with_capacity(chunk.len());
            for spill in chunk {
                writes.push(self.artifacts.put(tenant, &spill.id, spill.bytes.clone()));
            }
            stored.extend(
                chunk
                    .iter()
                    .zip(futures_util::future::join_all(writes).await),
            );
        }
        for (spill, stored) in stored {
            match (stored, spill.id.kind) {
                (Ok(()), _) => {}
                (Err(e), ArtifactKind::Text) => {
                    tracing::error!(request_id = %ctx.request_id, error = %e, "cannot store a spilled tool result");
                    return Err(GatewayError::StoreUnavailable);
                }
                (Err(e), ArtifactKind::Media) => {
                    tracing::warn!(request_id = %ctx.request_id, error = %e, "cannot store an image artifact");
                }
            }
            if spill.id.kind == ArtifactKind::Text {
                spilled += 1;
                spilled_bytes += spill.bytes.len() as u64;
            }
        }
        if spilled > 0 {
            let labels = [ctx.dialect, route.config.name.as_str()];
            self.metrics
                .spills_total
                .with_label_values(&labels)
                .inc_by(spilled);
            self.metrics
                .spilled_bytes_total
                .with_label_values(&labels)
                .inc_by(spilled_bytes);
        }
        Ok(())
    }

    /// Each image's fate, in the metrics.
    fn count_images(&self, images: &[projection::ImageEvent]) {
        for image in images {
            self.metrics
                .images_total
                .with_label_values(&[image.outcome, image.reason])
                .inc();
            self.metrics.image_bytes_total.inc_by(image.bytes);
            if image.downscaled {
                self.metrics.downscales_total.inc();
            }
        }
    }
}

/// Artifact writes of one request in flight at once.
const PARALLEL_WRITES: usize = 8;

/// Bodies from this size on are projected on the blocking pool: paging and hashing a tool
/// output of a few megabytes takes milliseconds.
const HEAVY_BODY_BYTES: usize = 1024 * 1024;

/// What planning on the blocking pool takes with it.
struct Planning {
    dialect: Dialect,
    body: Bytes,
    tenant: Tenant,
    route: crate::config::RouteConfig,
    read_tool: String,
    state: SessionState,
}

/// The read tool's name in this request: the route's, with a suffix when a client tool has that
/// name already (the notices name it as offered).
fn read_tool_name(
    dialect: Dialect,
    route: &Route,
    view: &RequestView<'_>,
    shape: Option<&read::Shape<'_>>,
) -> String {
    let name = &route.config.read_tool;
    view.tools
        .filter(|raw| raw.get().contains(name.as_str()))
        .and(shape)
        .map(|shape| read::tool_name(name, &shape.tool_names(dialect)))
        .unwrap_or_else(|| name.clone())
}

/// Stage 10: the headers forwarded. sluice reads this response (the completion watch, the read
/// rounds): the upstream may compress it only in a coding sluice decodes.
fn forward_headers(headers: http::HeaderMap, route: &Route, ctx: &Context) -> http::HeaderMap {
    let mut headers = upstream::request_headers(headers, route, ctx.family);
    match crate::encoding::decodable_accept(&headers) {
        Some(accept) => headers.insert(http::header::ACCEPT_ENCODING, accept),
        None => headers.remove(http::header::ACCEPT_ENCODING),
    };
    headers
}
