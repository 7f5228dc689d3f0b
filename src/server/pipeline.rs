//! The projected request path, stage by stage: the stage list is on [`App::projected`].

use crate::dialect::resume::Received;
use std::sync::Arc;

use futures_util::FutureExt;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;

use crate::dialect::completion::Completion;
use crate::dialect::Endpoint;
use crate::encoding::Coding;
use crate::error::GatewayError;
use crate::projection::exit::Spill;
use crate::projection::{self, splice_shared, Summary};
use crate::route::Route;
use crate::store::ArtifactKind;
use crate::tenant::Tenant;
use crate::upstream;

use super::commit::{Commit, Written};
use super::front::{Ask, Front};
use super::{
    body::BodyRoom, decode_body, read_body, rounds, App, Body, Context, InFlight,
    NOTHING_PROJECTED, PROJECTION,
};

impl App {
    /// A projected request, stage by stage. The stages, in order:
    /// 1. **read**: the body under `max_body_bytes` (413 while reading), paced (408), within
    ///    `max_inflight_body_bytes` (503), decoded off the I/O thread if compressed.
    /// 2. **view**: read once by its dialect into a [`RequestView`](projection::RequestView) (400 on bad JSON). Stages 2
    ///    to 7 are the front ([`super::front`]): on the blocking pool for a body of a megabyte
    ///    or more, so its view is read once, off the I/O thread.
    /// 3. **route**: by dialect and model (404); the tenant from the credential or the route.
    /// 4. **prepare**: the request's images found and checked (memoized).
    /// 5. **session**: its delivery state loaded, only when it has images (or, at 7, the read
    ///    tool is offered); a store that cannot be read means no state and no commit.
    /// 6. **plan**: the core projects view, policy and state into edits, artifacts and a delta.
    /// 7. **read tool**: offered when something is spilled or re-readable (C1, C5); the rounds
    ///    hidden on earlier turns spliced back where the history shows them (C3).
    /// 8. **persist**: artifacts stored before the model is shown a reference (T3).
    /// 9. **splice**: the edits written into the original bytes (P1, P2); a long body stays
    ///    pieces of the received one (`projection::splice_shared`).
    /// 10. **forward**: header policy, the `Accept-Encoding` sluice decodes; the upstream's head
    ///     and first chunk awaited (502/504).
    /// 11. **relay** (P3) or **read rounds** (C2).
    /// 12. **commit**: the delta, once the response reached the client (A9, [`Commit`]).
    pub(super) async fn projected(
        self: &Arc<Self>,
        endpoint: Endpoint,
        req: Request<Incoming>,
        start: Instant,
        ctx: &mut Context,
        inflight: InFlight,
    ) -> Result<Response<Body>, GatewayError> {
        let (mut parts, incoming) = req.into_parts();
        let dialect = endpoint.dialect;
        dialect.normalise_head(&mut parts);
        // The body's share of max_inflight_body_bytes, held until the response is produced.
        let tenant_room = inflight.admitted.as_ref().map(|a| a.body_room().clone());
        let (body, received, _room) = self.read(&mut parts.headers, incoming, tenant_room).await?;
        let read_at = Instant::now();
        let ask = Ask {
            dialect,
            model: endpoint.model.as_deref(),
            headers: &parts.headers,
            request_id: &ctx.request_id,
            received: received.as_ref(),
            share: ctx.share.as_ref(),
            peer: ctx.peer,
        };
        let front = self.shared.front(ask, &body).await?;
        let Front {
            route,
            tenant,
            session,
            mut projection,
            tool,
            media,
            seen,
        } = front;
        let route = self.routes.get(route).ok_or(GatewayError::Internal)?;
        ctx.route.clone_from(&route.config.name);
        // Counting tokens shows the model nothing: it never changes what was delivered.
        let shows_model = !endpoint.counts;
        let mut commit = Commit::new(
            &self.shared,
            &self.commits,
            session.filter(|_| shows_model),
            std::mem::take(&mut projection.delta),
            &route.config.name,
        );
        let spills = std::mem::take(&mut projection.spills);
        commit.after(self.persist(spills, &tenant, ctx, route).await?);
        self.count_images(&projection.images);
        for audio in &projection.audio {
            self.metrics
                .audio_total
                .with_label_values(&[audio.outcome, audio.reason])
                .inc();
        }
        if let Some(report) = projection.context {
            self.count_context(&report, &route.config.name, &ctx.request_id);
        }
        for (key, value) in std::mem::take(&mut projection.memos) {
            self.memo.insert_page(key, value);
        }
        let draft = seen
            .filter(|_| shows_model && self.inspector.is_some())
            .map(|seen| self.draft(seen, &projection, dialect, &tenant, ctx, start, &body));
        let forwarded = splice_shared(&body, projection.edits).map_err(|e| {
            tracing::error!(request_id = %ctx.request_id, error = %e, "projection produced bad edits");
            GatewayError::Internal
        })?;
        if let (Some(mut draft), Some(inspector)) = (draft, &self.inspector) {
            draft.forwarded = forwarded.to_bytes();
            draft.turn.read_tool = tool.is_some();
            commit.inspect(inspector.clone(), draft);
        }
        let uri = super::upstream_uri(route, &parts.uri, ctx)?;
        let headers = forward_headers(parts.headers, route, ctx);
        let mut job = tool.filter(|_| shows_model).map(|tool| rounds::Job {
            dialect,
            tool,
            max_steps: route.config.max_read_steps,
            tenant: tenant.clone(),
            method: parts.method.clone(),
            uri: uri.clone(),
            headers: headers.clone(),
            body: forwarded.clone(),
            original: body.clone(),
            commit: std::mem::replace(&mut commit, Commit::none()),
            images: rounds::MediaRoom::left(
                &route.config,
                media,
                (&projection.images, &projection.audio),
            ),
        });
        let before_send = read_at.elapsed();
        let sent_at = Instant::now();
        // No response at all: the commit is dropped, and counted discarded.
        let forwarded = upstream::Outgoing::pieces(forwarded);
        let started = self
            .upstream
            .send(parts.method, uri, headers, forwarded)
            .await?;
        let answered_at = Instant::now();
        match &mut job {
            Some(job) => job.commit.answered(started.status, answered_at - sent_at),
            None => commit.answered(started.status, answered_at - sent_at),
        }
        self.metrics
            .upstream_duration_seconds
            .with_label_values(&[ctx.dialect, &route.config.name])
            .observe((answered_at - sent_at).as_secs_f64());
        if projection.summary.deferred_edits > 0 {
            self.metrics
                .deferred_edits_total
                .with_label_values(&[&route.config.name])
                .inc_by(projection.summary.deferred_edits as u64);
        }
        let summary = if projection.summary == Summary::default() {
            Ok(HeaderValue::from_static(NOTHING_PROJECTED))
        } else {
            HeaderValue::from_str(&projection.summary.header_value())
        };
        let mut response = match job {
            Some(job) => {
                // Boxed: the rounds' state (5 KB) is not carried by every request's future.
                Box::pin(self.read_rounds(job, started, ctx, inflight, start, before_send)).await
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

    /// Stage 1: the body, read within its limits and decoded; what is forwarded goes out
    /// uncompressed. A long uncompressed body is checked as text while it arrives.
    async fn read(
        &self,
        headers: &mut http::HeaderMap,
        incoming: Incoming,
        tenant_room: Option<Arc<tokio::sync::Semaphore>>,
    ) -> Result<(Bytes, Option<Received>, Option<BodyRoom>), GatewayError> {
        let coding = Coding::of(headers).map_err(GatewayError::UnsupportedEncoding)?;
        let limit = self.config.max_body_bytes;
        let timeout = self.config.request_body_timeout();
        let as_text = coding == Coding::Identity;
        let (mut body, received, room) = read_body(
            incoming,
            headers,
            limit,
            timeout,
            (&self.body_room, tenant_room),
            as_text,
        )
        .await?;
        if coding != Coding::Identity {
            body = decode_body(body, coding, limit).await?;
            headers.remove(http::header::CONTENT_ENCODING);
        }
        Ok((body, received, room))
    }

    /// Stage 8 (T3): spilled text is durable before the model is shown a cursor into it. A
    /// page whose artifact cannot be stored would hand the model a dead cursor: the request
    /// fails instead. An image is sent with the request itself; only a later re-read needs its
    /// artifact, so images are written while the request is forwarded (their commit and read
    /// rounds wait for them, [`Written`]), and one that cannot be stored is logged and left.
    async fn persist(
        &self,
        spills: Vec<Spill>,
        tenant: &Tenant,
        ctx: &Context,
        route: &Route,
    ) -> Result<Option<Written>, GatewayError> {
        let (media, text): (Vec<Spill>, Vec<Spill>) = spills
            .into_iter()
            .partition(|spill| spill.id.kind == ArtifactKind::Media);
        let failed = self.shared.put_all(&text, tenant, false).await.into_iter();
        if let Some(e) = failed.filter_map(Result::err).next() {
            tracing::error!(request_id = %ctx.request_id, error = %e, "cannot store a spilled tool result");
            return Err(GatewayError::StoreUnavailable);
        }
        if !text.is_empty() {
            let labels = [ctx.dialect, route.config.name.as_str()];
            self.metrics
                .spills_total
                .with_label_values(&labels)
                .inc_by(text.len() as u64);
            self.metrics
                .spilled_bytes_total
                .with_label_values(&labels)
                .inc_by(text.iter().map(|s| s.bytes.len() as u64).sum());
        }
        // Readable here at once (an artifact GET, a read round); written behind.
        let media: Vec<Spill> = media
            .into_iter()
            .filter(|spill| self.artifacts.stage(tenant, &spill.id, &spill.bytes))
            .collect();
        if media.is_empty() {
            return Ok(None);
        }
        let (shared, tenant, request_id) =
            (self.shared.clone(), tenant.clone(), ctx.request_id.clone());
        // On the commit tracker: shutdown waits for these writes as for the commits.
        let written = self.commits.spawn(async move {
            let stored = shared.put_all(&media, &tenant, true).await;
            for (spill, stored) in media.iter().zip(stored) {
                if let Err(e) = stored {
                    shared.artifacts.unstage(&tenant, &spill.id);
                    tracing::warn!(request_id, error = %e, "cannot store an image artifact");
                }
            }
        });
        Ok(Some(written.map(|_| ()).boxed().shared()))
    }

    /// The turn record of a projected request, drafted from what its stages hold (cheap
    /// clones); the inspector finishes it off the request path (docs/inspector.md).
    #[allow(clippy::too_many_arguments)]
    fn draft(
        &self,
        seen: super::front::Seen,
        projection: &projection::Projection,
        dialect: crate::dialect::Dialect,
        tenant: &Tenant,
        ctx: &Context,
        start: Instant,
        received: &Bytes,
    ) -> crate::inspect::turn::Draft {
        use crate::inspect::turn::{ContextFate, Draft, Turn};
        let replaced: std::collections::HashMap<projection::Span, &projection::Rope> =
            projection.edits.iter().map(|e| (e.span, &e.with)).collect();
        let results = seen
            .results
            .into_iter()
            .map(|(span, mut result)| {
                result.with = replaced.get(&span).map(|w| w.to_bytes());
                result
            })
            .collect();
        let turn = Turn {
            at_ms: crate::store::session::stamp(),
            request_id: ctx.request_id.clone(),
            dialect: dialect.as_str().to_owned(),
            route: ctx.route.clone(),
            model: seen.model,
            projection: projection.summary.header_value(),
            images: Draft::images(&projection.images),
            audio: Draft::audio(&projection.audio),
            hidden_rounds: seen.hidden,
            results_unlisted: seen.unlisted,
            context: projection.context.map(|r| ContextFate {
                estimated: r.estimated,
                limit: r.limit,
                retired: r.retired,
                batch: r.batch,
                overflow: r.overflow,
            }),
            ms: crate::inspect::turn::Durations {
                sluice: start.elapsed().as_secs_f64() * 1e3,
                ..Default::default()
            },
            ..Turn::default()
        };
        Draft {
            tenant: tenant.clone(),
            session: seen.session,
            label: seen.label,
            dialect,
            tokenizer: seen.tokenizer,
            started: start,
            turn,
            received: received.clone(),
            forwarded: Bytes::new(),
            results,
            response: None,
        }
    }

    /// What the context guard did, in the metrics and, for a batch or an overflow, the log.
    fn count_context(&self, report: &projection::guard::Report, route: &str, request_id: &str) {
        self.metrics
            .input_tokens_estimated
            .observe(report.estimated as f64);
        tracing::debug!(
            request_id,
            estimated = report.estimated,
            limit = report.limit,
            retired = report.retired,
            "context estimate"
        );
        if report.batch > 0 {
            tracing::info!(
                request_id,
                route,
                retired = report.batch,
                estimated = report.estimated,
                limit = report.limit,
                "context guard retired a batch of tool results"
            );
        }
        if report.overflow {
            self.metrics
                .context_overflows_total
                .with_label_values(&[route])
                .inc();
            tracing::warn!(
                request_id,
                route,
                estimated = report.estimated,
                "over the context window with nothing left to retire; forwarded as it is"
            );
        }
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

impl super::Shared {
    /// Artifacts written side by side, up to [`PARALLEL_WRITES`] at once, each durable on its
    /// own (docs/runtime.md); how each write went. `staged`: already in the cache
    /// ([`crate::store::Artifacts::stage`]), written whatever it holds.
    async fn put_all(
        &self,
        spills: &[Spill],
        tenant: &Tenant,
        staged: bool,
    ) -> Vec<Result<(), crate::store::StoreError>> {
        let mut stored = Vec::with_capacity(spills.len());
        for chunk in spills.chunks(PARALLEL_WRITES) {
            let writes = chunk.iter().map(|spill| async {
                let bytes = spill.bytes.clone();
                if staged {
                    self.artifacts.write(tenant, &spill.id, bytes).await
                } else {
                    self.artifacts.put(tenant, &spill.id, bytes).await
                }
            });
            stored.extend(futures_util::future::join_all(writes).await);
        }
        stored
    }
}

/// Stage 10: the headers forwarded. sluice reads this response (the completion watch, the read
/// rounds): the upstream may compress it only in a coding sluice decodes.
fn forward_headers(headers: http::HeaderMap, route: &Route, ctx: &Context) -> http::HeaderMap {
    let mut headers = upstream::request_headers(headers, route, ctx.family);
    crate::encoding::keep_decodable_accept(&mut headers);
    headers
}
