//! The projected request path, stage by stage (see the module doc of `server`).

use std::sync::Arc;
use std::time::Instant;

use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;

use crate::dialect::completion::Completion;
use crate::dialect::Dialect;
use crate::encoding::Coding;
use crate::error::GatewayError;
use crate::projection::attach::state::SessionState;
use crate::projection::{self, splice, Summary};
use crate::read;
use crate::store::session::{SessionKey, SessionStore};
use crate::store::ArtifactKind;
use crate::tenant::Tenant;
use crate::upstream::{self};

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
        let (key, _) = SessionKey::of(tenant, header, view, &route.config.name);
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

    pub(super) async fn projected(
        self: &Arc<Self>,
        dialect: Dialect,
        req: Request<Incoming>,
        start: Instant,
        ctx: &mut Context,
        inflight: InFlight,
    ) -> Result<Response<Body>, GatewayError> {
        let (mut parts, incoming) = req.into_parts();
        let coding = Coding::of(&parts.headers).map_err(GatewayError::UnsupportedEncoding)?;
        let limit = self.config.max_body_bytes;
        let timeout = self.config.request_body_timeout();
        // The body's share of max_inflight_body_bytes, held until the request is forwarded.
        let (mut body, _room) =
            read_body(incoming, &parts.headers, limit, timeout, &self.body_room).await?;
        if coding != Coding::Identity {
            // Projection reads the decoded body, and what is forwarded goes out uncompressed.
            body = decode_body(body, coding, limit).await?;
            parts.headers.remove(http::header::CONTENT_ENCODING);
        }
        let read_at = Instant::now();
        let view = dialect
            .read_view(&body)
            .map_err(|e| GatewayError::BadJson(e.to_string()))?;
        let model = view.model.as_deref().unwrap_or("");
        let route = self
            .routes
            .select(dialect, model)
            .ok_or_else(|| GatewayError::NoRoute {
                dialect: dialect.as_str(),
                model: model.chars().take(200).collect(),
            })?;
        ctx.route.clone_from(&route.config.name);
        let tenant = Tenant::of_request(&parts.headers)
            .or_else(|| route.tenant.clone())
            .unwrap_or_else(Tenant::anonymous);
        // A store that cannot be read must not fail the request: it goes on without delivery
        // state, and commits nothing. A request without images needs no session at all.
        let prepared = projection::Prepared::new(&view, &tenant, &self.memo);
        let mut session = None;
        let mut state = SessionState::default();
        if prepared.has_images() {
            (session, state) = self
                .load_session(&parts.headers, &tenant, &view, route, ctx)
                .await;
        }
        // A client tool of the read tool's name: sluice's tool takes a suffix, and the notices
        // name that.
        let read_tool = view
            .tools
            .filter(|raw| raw.get().contains(route.config.read_tool.as_str()))
            .and_then(|_| read::Shape::of_view(&view))
            .map(|shape| read::tool_name(&route.config.read_tool, &shape.tool_names(dialect)))
            .unwrap_or_else(|| route.config.read_tool.clone());
        let mut projection = projection::project_prepared(
            &view,
            &projection::Context {
                tenant: &tenant,
                policy: route.config.policy(&read_tool),
                memo: &self.memo,
                state: &state,
            },
            prepared,
        );
        // count_tokens shows the model nothing: it never changes what was delivered.
        let shows_model = !parts.uri.path().ends_with("/count_tokens");
        // C1: a request that holds a cursor is offered the read tool; the rounds hidden from
        // the client on earlier turns are spliced back in where the client's history shows
        // what it received (C3).
        // C5: so does a request whose image placeholders name artifacts to read again. A request
        // sluice changes nothing in gets no tool (P1).
        let accepts_images = route
            .config
            .input_modalities
            .contains(&crate::config::Modality::Image);
        let offer = route.config.max_read_steps > 0
            && (projection.summary.spilled > 0 || (projection.rereadable > 0 && accepts_images));
        if offer {
            if session.is_none() {
                (session, state) = self
                    .load_session(&parts.headers, &tenant, &view, route, ctx)
                    .await;
            }
            let links = read::Link::all(&state);
            if !links.is_empty() {
                if let Some(shape) = read::Shape::read(dialect, &body) {
                    let text = std::str::from_utf8(&body).unwrap_or_default();
                    // Only the links found in this history have their rounds read.
                    for m in read::matches(&shape, &links) {
                        match self.artifacts.get(&tenant, &m.link.artifact).await {
                            Ok(Some(content)) => projection
                                .edits
                                .extend(read::splice_edits(&shape, text, &m, &content)),
                            // Expired: that turn shows as the client received it.
                            Ok(None) => {}
                            Err(e) => tracing::warn!(error = %e, "cannot read hidden read rounds"),
                        }
                    }
                }
            }
        }
        let mut tool = None;
        if offer {
            if let Some(shape) = read::Shape::of_view(&view) {
                let name = read_tool.clone();
                projection
                    .edits
                    .push(shape.add_tool(&read::definition(dialect, &name)));
                tool = Some(name);
            }
        }
        // A9: written only once the response completed and reached the client; count_tokens
        // shows the model nothing and never commits.
        let mut commit = Commit::new(
            &self.shared,
            &self.commits,
            session.filter(|_| shows_model),
            projection.delta,
        );
        drop(view);
        // The artifacts must be durable before the model is shown a reference to them (T3):
        // if they cannot be stored, the request fails rather than go out with a broken cursor.
        let (mut spills, mut spilled_bytes) = (0u64, 0u64);
        for spill in &projection.spills {
            let stored = self
                .artifacts
                .put(&tenant, &spill.id, spill.bytes.clone())
                .await;
            match (stored, spill.id.kind) {
                (Ok(()), _) => {}
                // A page whose artifact cannot be stored would hand the model a dead cursor:
                // the request fails instead (T3).
                (Err(e), ArtifactKind::Text) => {
                    tracing::error!(request_id = %ctx.request_id, error = %e, "cannot store a spilled tool result");
                    return Err(GatewayError::StoreUnavailable);
                }
                // An image is sent with the request itself; only a later re-read needs its
                // artifact, so the request goes on.
                (Err(e), ArtifactKind::Media) => {
                    tracing::warn!(request_id = %ctx.request_id, error = %e, "cannot store an image artifact");
                }
            }
            if spill.id.kind == ArtifactKind::Text {
                spills += 1;
                spilled_bytes += spill.bytes.len() as u64;
            }
        }
        if spills > 0 {
            let labels = [ctx.dialect, route.config.name.as_str()];
            self.metrics
                .spills_total
                .with_label_values(&labels)
                .inc_by(spills);
            self.metrics
                .spilled_bytes_total
                .with_label_values(&labels)
                .inc_by(spilled_bytes);
        }
        for image in &projection.images {
            self.metrics
                .images_total
                .with_label_values(&[image.outcome, image.reason])
                .inc();
            self.metrics.image_bytes_total.inc_by(image.bytes);
            if image.downscaled {
                self.metrics.downscales_total.inc();
            }
        }
        for (key, value) in projection.memos {
            self.memo.insert_page(key, value);
        }
        let forwarded = splice(&body, projection.edits).map_err(|e| {
            tracing::error!(request_id = %ctx.request_id, error = %e, "projection produced bad edits");
            GatewayError::Internal
        })?;
        let url = route.url(&parts.uri);
        let mut headers = upstream::request_headers(parts.headers, route, ctx.family);
        // sluice reads this response (the completion watch, the read rounds): the upstream may
        // compress it only in a coding sluice decodes.
        match crate::encoding::decodable_accept(&headers) {
            Some(accept) => headers.insert(http::header::ACCEPT_ENCODING, accept),
            None => headers.remove(http::header::ACCEPT_ENCODING),
        };
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
            images: {
                let limits = &route.config.images;
                let embedded = projection.images.iter().filter(|i| i.outcome == "embedded");
                let shown: u64 = embedded.clone().map(|i| i.bytes).sum();
                rounds::ImageRoom {
                    accepts: accepts_images,
                    count: limits.max_images.saturating_sub(embedded.count()),
                    bytes: limits.max_total_bytes.saturating_sub(shown),
                    max_image_bytes: limits.max_image_bytes,
                    max_dimension: limits.max_dimension,
                }
            },
        });
        let before_send = read_at.elapsed();
        let sent_at = Instant::now();
        let sent = self
            .upstream
            .send(parts.method, url, headers, forwarded.into())
            .await;
        let started = match sent {
            Ok(started) => started,
            // No response at all: the commit is dropped, and counted discarded.
            Err(e) => return Err(e),
        };
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
        if let Some(job) = job {
            let mut response = self
                .read_rounds(job, started, ctx, inflight, start, before_send)
                .await;
            if let Ok(value) = summary {
                response.headers_mut().insert(PROJECTION, value);
            }
            return Ok(response);
        }
        let watch = Some(Completion::new(dialect));
        let mut response = self.relay(started, ctx, inflight, start, watch, commit);
        if let Ok(value) = summary {
            response.headers_mut().insert(PROJECTION, value);
        }
        self.metrics
            .overhead_seconds
            .observe((before_send + answered_at.elapsed()).as_secs_f64());
        Ok(response)
    }
}
