//! Stages 2 to 7 of a projected request, from its bytes to its edits: view, route, prepare,
//! session, plan, read tool. A large body runs them all on the heavy pool, where its view is
//! read once; a small one reads its view here and sends only image work to the pool.

use crate::dialect::resume::Received;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::HeaderMap;

use crate::dialect::Dialect;
use crate::error::GatewayError;
use crate::projection::attach::state::SessionState;
use crate::projection::memos::Memos;
use crate::projection::policy::Policy;
use crate::projection::{self, RequestView};
use crate::read;
use crate::route::Route;
use crate::store::session::{SessionKey, SessionStore};
use crate::tenant::Tenant;

use super::Shared;

/// Bodies from this size on run the whole front on the heavy pool: reading the view of a
/// few megabytes of history, paging and hashing its outputs take milliseconds.
const HEAVY_BODY_BYTES: usize = 1024 * 1024;

/// How long a request waits for its session's previous commit to land. A local store commits in
/// about a millisecond and Redis in a round trip, but the commit first waits for the turn's image
/// artifacts, each synced to disk: on a busy or network disk that has taken more than 200 ms.
/// The bound is the session store's own response timeout (Redis, 2 s), so a store that hangs
/// holds its session's next request no longer than a load from it would.
const COMMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What the front decided, owned, so it can come back from the heavy pool.
pub(super) struct Front {
    /// The route's place in the route table.
    pub(super) route: usize,
    pub(super) tenant: Tenant,
    /// The session to commit to; `None` when it was not needed or its store was unreadable.
    pub(super) session: Option<SessionKey>,
    /// The edits (with the read tool and the hidden rounds), artifacts and delta.
    pub(super) projection: projection::Projection,
    /// The read tool's name, when it is offered.
    pub(super) tool: Option<String>,
    /// Whether the route shows images, and sends audio (the read tool's re-views, C5).
    pub(super) media: (bool, bool),
    /// What the inspector records of the request, when it is on.
    pub(super) seen: Option<Seen>,
}

/// What the front saw, for the inspector's turn record (docs/inspector.md).
pub(super) struct Seen {
    pub(super) session: SessionKey,
    /// The session id the client sent (header or conversation id), if any.
    pub(super) label: String,
    pub(super) model: String,
    pub(super) tokenizer: crate::tokens::Tokenizer,
    /// Each tool result's place and what the front knows of it.
    pub(super) results: Vec<(projection::Span, crate::inspect::turn::SeenResult)>,
    /// Tool results past the listed ones.
    pub(super) unlisted: usize,
    /// Rounds hidden on earlier turns, spliced back.
    pub(super) hidden: usize,
}

/// What a request's front needs to know besides its body.
#[derive(Clone, Copy)]
pub(super) struct Ask<'r> {
    pub(super) dialect: Dialect,
    /// The model the path names (Gemini), which the body then does not.
    pub(super) model: Option<&'r str>,
    pub(super) headers: &'r HeaderMap,
    pub(super) request_id: &'r str,
    /// What was checked of the body as it arrived (`resume::Receiving`), if anything.
    pub(super) received: Option<&'r Received>,
    /// Whose turn its heavy work takes (`fair.rs`): the share `[limits]` counted it against,
    /// else found from the headers when heavy work needs it.
    pub(super) share: Option<&'r Tenant>,
    pub(super) peer: Option<std::net::IpAddr>,
}

impl Shared {
    /// The front of a request: on the heavy pool for a large body, or one whose tokens the
    /// context guard may count (within the `heavy` bound, so a core stays with the I/O
    /// threads); here for a small one.
    pub(super) async fn front(
        self: &Arc<Self>,
        ask: Ask<'_>,
        body: &Bytes,
    ) -> Result<Front, GatewayError> {
        if body.len() < HEAVY_BODY_BYTES && !self.routes.may_guard(ask.dialect, body.len()) {
            return self.stages(ask, body, false).await;
        }
        let share = self.share_in(&ask);
        let _place = self.heavy.take(&share).await;
        let shared = Arc::clone(self);
        let body = body.clone();
        let (dialect, headers, request_id, peer) = (
            ask.dialect,
            ask.headers.clone(),
            ask.request_id.to_owned(),
            ask.peer,
        );
        let model = ask.model.map(str::to_owned);
        let received = ask.received.cloned();
        // The session and artifact reads it awaits are driven by this worker's runtime, which
        // keeps running while the pool thread waits for them.
        let runtime = tokio::runtime::Handle::current();
        super::heavy::run(move || {
            runtime.block_on(async move {
                let ask = Ask {
                    dialect,
                    model: model.as_deref(),
                    headers: &headers,
                    request_id: &request_id,
                    received: received.as_ref(),
                    share: Some(&share),
                    peer,
                };
                shared.stages(ask, &body, true).await
            })
        })
        .await
        .map_err(|_| GatewayError::Internal)?
    }

    /// Whose turn a request's heavy work takes (at most `worker_threads` − 1 jobs run at once).
    fn share_in(&self, ask: &Ask<'_>) -> Tenant {
        match ask.share {
            Some(share) => share.clone(),
            None => self.share_of(ask.headers, ask.dialect.family(), ask.peer),
        }
    }

    /// Stages 2 to 7, in order; `pooled` when already on the heavy pool.
    async fn stages(
        self: &Arc<Self>,
        ask: Ask<'_>,
        body: &Bytes,
        pooled: bool,
    ) -> Result<Front, GatewayError> {
        let dialect = ask.dialect;
        let (mut view, read_before) = dialect
            .read_view_resumed(body, ask.received, &self.resumes)
            .map_err(|e| GatewayError::BadJson(e.to_string()))?;
        if let (None, Some(model)) = (&view.model, ask.model) {
            view.model = Some(std::borrow::Cow::Owned(model.to_owned()));
        }
        let count = |read, bytes: usize| {
            self.metrics
                .view_bytes_total
                .with_label_values(&[read])
                .inc_by(bytes as u64)
        };
        count("resumed", read_before);
        count("scanned", body.len() - read_before);
        let (index, route, tenant) = self.route(dialect, &view, ask.headers)?;
        let layout = read::Layout::of_view(dialect, &view);
        let read_tool = read_tool_name(route, &view, layout.as_ref());
        let mut session = None;
        let mut state = SessionState::default();
        let policy = route.config.policy(&read_tool);
        let accepts_images = policy.accepts_images;
        let hears_audio = policy.accepts_audio && view.shapes.takes_audio();
        let light = projection::Prepared::without_images(&view, &tenant, &self.memo);
        // The context guard needs the session (its retired results) and counts tokens, once the
        // request is large enough to reach its trigger.
        let thresholds = projection::guard::Thresholds::of(&view, &route.config.context);
        let guarded = thresholds.is_some_and(|t| t.engaged(&view, 0));
        let mut hidden = None;
        let mut limits = route.config.context.clone();
        // A conversation that marks no breakpoint gets sluice's, timed by the session's clock.
        let clocked = light
            .as_ref()
            .is_some_and(|p| projection::edits::may_mark_own(&view, &route.config.cache, p));
        let mut projection = match light {
            // No image, no guard and no breakpoint of sluice's: no session is needed.
            Some(prepared) if !guarded && !clocked => {
                plan(&view, &tenant, policy, &self.memo, &state, prepared)
            }
            light => {
                (session, state) = self
                    .load_session(ask.headers, &tenant, &view, route, ask.request_id)
                    .await;
                if let Some(t) = thresholds.filter(|_| guarded) {
                    let edits = Box::pin(self.hidden_rounds(dialect, body, &tenant, &state)).await;
                    let added = added_after_planning(t.tokenizer, dialect, &read_tool, &edits);
                    limits.window_tokens = limits.window_tokens.saturating_sub(added).max(1);
                    hidden = Some(edits);
                }
                let policy = projection::policy::Policy {
                    context: &limits,
                    ..policy
                };
                // Without images or tokens to count, planning is as light as without a session.
                if pooled || (light.is_some() && !guarded) {
                    let prepared = light
                        .unwrap_or_else(|| projection::Prepared::new(&view, &tenant, &self.memo));
                    plan(&view, &tenant, policy, &self.memo, &state, prepared)
                } else {
                    // Images to decode and check (or downscale), tokens to count: on the
                    // heavy pool, so this worker's other connections keep moving.
                    let job = Planning {
                        dialect,
                        body: body.clone(),
                        received: ask.received.cloned(),
                        tenant: tenant.clone(),
                        route: crate::config::RouteConfig {
                            context: limits.clone(),
                            ..route.config.clone()
                        },
                        read_tool: read_tool.clone(),
                        state,
                        share: self.share_in(&ask),
                    };
                    // Boxed: this path's state stays out of every request's future.
                    let (projection, planned) = Box::pin(self.images_off_thread(job)).await?;
                    state = planned;
                    projection
                }
            }
        };
        // C1, C5: a request sluice changes nothing in gets no tool (P1), except, under the
        // economic policy, one with tool-result images sluice will take out later: added then,
        // the tool would rewrite the provider's whole cached prefix (docs/cache.md).
        let early = route.config.cache.policy == crate::projection::policy::EditPolicy::Economic
            && projection.rereadable_later > 0;
        let offer = route.config.max_read_steps > 0
            && (projection.summary.spilled > 0
                || projection.summary.retired.unwrap_or(0) > 0
                || projection.rereadable > 0
                || early);
        let mut tool = None;
        let mut hidden_rounds = 0;
        if offer {
            if session.is_none() {
                (session, state) = self
                    .load_session(ask.headers, &tenant, &view, route, ask.request_id)
                    .await;
            }
            let hidden = match hidden {
                Some(edits) => edits,
                None => Box::pin(self.hidden_rounds(dialect, body, &tenant, &state)).await,
            };
            hidden_rounds = hidden.len();
            projection.edits.extend(hidden);
            if let Some(layout) = &layout {
                let definition = read::definition(dialect, &read_tool);
                projection.edits.push(layout.add_tool(&definition));
                tool = Some(read_tool);
            }
        }
        let seen = self.inspector.as_ref().map(|_| {
            self.seen(
                ask.headers,
                &tenant,
                &view,
                route,
                session.as_ref(),
                hidden_rounds,
            )
        });
        Ok(Front {
            route: index,
            tenant,
            session,
            projection,
            tool,
            media: (accepts_images, hears_audio),
            seen,
        })
    }

    /// What the inspector records of a request: its session (the key is computed here when
    /// the request needed no state), its model and its tool results.
    fn seen(
        &self,
        headers: &HeaderMap,
        tenant: &Tenant,
        view: &RequestView<'_>,
        route: &Route,
        session: Option<&SessionKey>,
        hidden: usize,
    ) -> Seen {
        let header = self.session_id(headers).filter(|v| !v.is_empty());
        let session = session
            .cloned()
            .unwrap_or_else(|| SessionKey::of(tenant, header, view, &route.config.name).0);
        let label = header
            .or(view.conversation.as_deref())
            .unwrap_or("")
            .chars()
            .take(128)
            .collect();
        let results = view
            .tool_results
            .iter()
            .take(crate::inspect::turn::MAX_LISTED_RESULTS)
            .map(|r| {
                let seen = crate::inspect::turn::SeenResult {
                    source: r.source.chars().take(128).collect(),
                    tool: r
                        .tool_name
                        .as_deref()
                        .map(|t| t.chars().take(128).collect()),
                    bytes: (r.span.end - r.span.start) as u64,
                    with: None,
                };
                (r.span, seen)
            })
            .collect();
        Seen {
            session,
            label,
            model: view
                .model
                .as_deref()
                .unwrap_or("")
                .chars()
                .take(128)
                .collect(),
            tokenizer: route
                .config
                .context
                .tokenizer
                .unwrap_or_else(|| view.shapes.tokenizer()),
            results,
            unlisted: view
                .tool_results
                .len()
                .saturating_sub(crate::inspect::turn::MAX_LISTED_RESULTS),
            hidden,
        }
    }

    /// Stage 3: the route of the request's dialect and model, and who asks.
    fn route(
        &self,
        dialect: Dialect,
        view: &RequestView<'_>,
        headers: &HeaderMap,
    ) -> Result<(usize, &Route, Tenant), GatewayError> {
        let model = view.model.as_deref().unwrap_or("");
        let (index, route) =
            self.routes
                .place(dialect, model)
                .ok_or_else(|| GatewayError::NoRoute {
                    dialect: dialect.as_str(),
                    model: model.chars().take(200).collect(),
                })?;
        let tenant = Tenant::of_request(headers)
            .or_else(|| route.tenant.clone())
            .unwrap_or_else(Tenant::anonymous);
        Ok((index, route, tenant))
    }

    /// The session id the client sent in the session header, if any.
    fn session_id<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        headers
            .get(&self.session_header)
            .and_then(|v| v.to_str().ok())
    }

    /// Stage 5: the session of a request and its delivery state. A store that cannot be read
    /// must not fail the request: it goes on without state (`None`), and commits nothing.
    async fn load_session(
        &self,
        headers: &HeaderMap,
        tenant: &Tenant,
        view: &RequestView<'_>,
        route: &Route,
        request_id: &str,
    ) -> (Option<SessionKey>, SessionState) {
        let header = self.session_id(headers);
        let (key, source) = SessionKey::of(tenant, header, view, &route.config.name);
        tracing::debug!(request_id, session_from = source.as_str(), "session");
        self.seen.insert(key.0.clone(), ());
        // The session's previous request may have finished a moment ago, its commit still on the
        // way: planning on the state before it would undo what it did (a batch the context guard
        // retired, an image shown once). Wait for it, within a bound a store that hangs cannot
        // stretch.
        if let Some(mut landing) = self.landing.get(&key.0) {
            let waited = tokio::time::timeout(COMMIT_WAIT, landing.wait_for(|landed| *landed));
            if waited.await.is_err() {
                tracing::warn!(
                    request_id,
                    wait_seconds = COMMIT_WAIT.as_secs_f64(),
                    "the session's previous commit has not landed; planning on the state before it"
                );
            }
        }
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
                tracing::warn!(request_id, error = %e, "session state unavailable");
                (None, SessionState::default())
            }
        }
    }

    /// Stages 4 and 6 of a small body with images, on the heavy pool within the `heavy`
    /// bound: the view is read again there from the same bytes (under a megabyte, a scan far
    /// cheaper than the image work it moves).
    async fn images_off_thread(
        self: &Arc<Self>,
        job: Planning,
    ) -> Result<(projection::Projection, SessionState), GatewayError> {
        let _place = self.heavy.take(&job.share).await;
        let shared = Arc::clone(self);
        let planned = super::heavy::run(move || {
            let view = job
                .dialect
                .read_view_resumed(&job.body, job.received.as_ref(), &shared.resumes)
                .ok()?
                .0;
            let prepared = projection::Prepared::new(&view, &job.tenant, &shared.memo);
            let policy = job.route.policy(&job.read_tool);
            let projection = plan(
                &view,
                &job.tenant,
                policy,
                &shared.memo,
                &job.state,
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
        let Some(layout) = read::Layout::read(dialect, body) else {
            return edits;
        };
        let text = std::str::from_utf8(body).unwrap_or_default();
        for m in read::matches(&layout, &links) {
            match self.artifacts.get(tenant, &m.link.artifact).await {
                Ok(Some(content)) => edits.extend(read::splice_edits(&layout, text, &m, &content)),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "cannot read hidden read rounds"),
            }
        }
        edits
    }
}

/// The tokens the front adds after planning when the guard counts: the rounds hidden on
/// earlier turns, spliced back (C3), and the read tool's definition. The guard plans under a
/// window smaller by them, so the request as forwarded stays under the real one.
fn added_after_planning(
    tokenizer: crate::tokens::Tokenizer,
    dialect: Dialect,
    read_tool: &str,
    hidden: &[projection::Edit],
) -> u64 {
    hidden
        .iter()
        .map(|e| e.with.to_text())
        .chain([read::definition(dialect, read_tool)])
        .map(|json| tokenizer.count(&crate::tokens::json_text(&json)))
        .sum()
}

/// Stage 6: the core's plan of a prepared view.
fn plan(
    view: &RequestView<'_>,
    tenant: &Tenant,
    policy: Policy<'_>,
    memo: &dyn Memos,
    state: &SessionState,
    prepared: projection::Prepared,
) -> projection::Projection {
    let ctx = projection::Context {
        tenant,
        policy,
        memo,
        state,
        now_ms: crate::store::session::stamp(),
    };
    projection::project_prepared(view, &ctx, prepared)
}

/// What planning on the heavy pool takes with it.
struct Planning {
    dialect: Dialect,
    body: Bytes,
    received: Option<Received>,
    tenant: Tenant,
    route: crate::config::RouteConfig,
    read_tool: String,
    state: SessionState,
    /// Whose turn it takes on the heavy pool.
    share: Tenant,
}

/// The read tool's name in this request: the route's, with a suffix when a client tool has that
/// name already (the notices name it as offered).
fn read_tool_name(
    route: &Route,
    view: &RequestView<'_>,
    layout: Option<&read::Layout<'_>>,
) -> String {
    let name = &route.config.read_tool;
    view.tools
        .filter(|raw| raw.get().contains(name.as_str()))
        .and(layout)
        .map(|layout| read::tool_name(name, &layout.tool_names()))
        .unwrap_or_else(|| name.clone())
}
