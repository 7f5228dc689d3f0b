//! The one commit path of delivery state (A9): a request's delta is written only once its
//! response completed and reached the client. The relay, the non-streamed read rounds and the
//! streamed read rounds all hand their [`Commit`] to the response body, which settles it when it
//! ends: [`Commit::settle`] with `true` writes it; an incomplete end, or a body dropped before its
//! end (the client hung up), counts it `discarded`.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures_util::future::{BoxFuture, Shared as SharedFuture};
use http_body::{Frame, SizeHint};
use tokio_util::task::TaskTracker;

use crate::projection::attach::state::Delta;
use crate::store::session::{SessionKey, SessionStore};
use crate::upstream::BoxError;

use super::Shared;

/// The media artifacts of a request, being written while it is forwarded (docs/runtime.md):
/// its commit and its read rounds wait for them, so no delivery state and no re-read ever
/// names an image whose artifact is not stored yet.
pub(super) type Written = SharedFuture<BoxFuture<'static, ()>>;

/// A request's delivery-state change, waiting for its response to end.
pub(super) struct Commit {
    /// Where it goes; `None` once settled, or when there is nowhere to write (no session, a
    /// request that shows the model nothing).
    to: Option<(Arc<Shared>, TaskTracker, SessionKey)>,
    delta: Delta,
    /// The media writes of the request, when it has any.
    written: Option<Written>,
    /// The route's name, for the metrics.
    route: String,
    /// The request's turn record, handed to the inspector when the response ends (whether or
    /// not it completed).
    turn: Option<(
        Arc<crate::inspect::Inspector>,
        Box<crate::inspect::turn::Draft>,
    )>,
}

impl Commit {
    /// Nothing to commit (pass-through, a request without a session).
    pub(super) fn none() -> Commit {
        Commit {
            to: None,
            delta: Delta::default(),
            written: None,
            route: String::new(),
            turn: None,
        }
    }

    pub(super) fn new(
        shared: &Arc<Shared>,
        tasks: &TaskTracker,
        session: Option<SessionKey>,
        delta: Delta,
        route: &str,
    ) -> Commit {
        Commit {
            to: session.map(|s| (shared.clone(), tasks.clone(), s)),
            delta,
            written: None,
            route: route.to_owned(),
            turn: None,
        }
    }

    /// The turn record this request's end hands to the inspector.
    pub(super) fn inspect(
        &mut self,
        inspector: Arc<crate::inspect::Inspector>,
        draft: crate::inspect::turn::Draft,
    ) {
        self.turn = Some((inspector, Box::new(draft)));
    }

    /// The turn record being drafted, if the inspector is on.
    pub(super) fn draft(&mut self) -> Option<&mut crate::inspect::turn::Draft> {
        self.turn.as_mut().map(|(_, d)| &mut **d)
    }

    /// The upstream answered: its status, and how long it took.
    pub(super) fn answered(&mut self, status: http::StatusCode, upstream: std::time::Duration) {
        if let Some(d) = self.draft() {
            d.turn.status = status.as_u16();
            d.turn.ms.upstream = upstream.as_secs_f64() * 1e3;
        }
    }

    /// How the response ended, for the turn record: a stream or not, the usage its events
    /// reported, the body kept for its usage.
    pub(super) fn ended(
        &mut self,
        stream: bool,
        usage: Option<crate::dialect::usage::Usage>,
        kept: Option<bytes::Bytes>,
    ) {
        if let Some(d) = self.draft() {
            d.turn.stream = stream;
            d.turn.usage = usage.or(d.turn.usage);
            d.response = kept.or(d.response.take());
        }
    }

    /// Hands the turn record to the inspector (once).
    fn record(&mut self, complete: bool) {
        if let Some((inspector, mut draft)) = self.turn.take() {
            draft.turn.complete = complete;
            inspector.record(draft);
        }
    }

    /// The media writes this commit (and the request's read rounds) wait for.
    pub(super) fn after(&mut self, written: Option<Written>) {
        self.written = written;
    }

    /// Once the request's media artifacts are stored (at once when it has none).
    pub(super) async fn written(&self) {
        if let Some(written) = &self.written {
            written.clone().await;
        }
    }

    /// The delta so far, for the read rounds to add the link of their hidden rounds (C3).
    pub(super) fn delta_mut(&mut self) -> &mut Delta {
        &mut self.delta
    }

    /// Whether this request has a session to remember things in.
    pub(super) fn has_session(&self) -> bool {
        self.to.is_some()
    }

    /// The response ended: written when it `complete`d (on a tracked task, so shutdown waits
    /// for it), counted `discarded` otherwise.
    pub(super) fn settle(mut self, complete: bool) {
        self.record(complete);
        let Some((shared, tasks, session)) = self.to.take() else {
            return;
        };
        if self.delta.is_empty() {
            return;
        }
        if complete {
            let delta = std::mem::take(&mut self.delta);
            let written = self.written.take();
            let route = std::mem::take(&mut self.route);
            let (landed, landing) = tokio::sync::watch::channel(false);
            shared.landing.insert(session.0.clone(), landing);
            tasks.spawn(async move {
                if let Some(written) = written {
                    written.await;
                }
                shared.commit(&session, &delta, &route).await;
                let _ = landed.send(true);
            });
        } else {
            shared.discarded();
        }
    }
}

impl Drop for Commit {
    /// Never settled: the response did not reach the client.
    fn drop(&mut self) {
        self.record(false);
        if let Some((shared, _, _)) = self.to.take() {
            if !self.delta.is_empty() {
                shared.discarded();
            }
        }
    }
}

/// A whole response body that settles its commit when it hands its bytes on (A9): hyper takes
/// them whole for the socket, as the relay's body counts a body complete once its declared
/// length passed. One dropped before that (the client hung up) commits nothing.
pub(super) struct WholeBody {
    bytes: Option<Bytes>,
    commit: Option<Commit>,
}

impl WholeBody {
    pub(super) fn new(bytes: Bytes, commit: Commit) -> WholeBody {
        WholeBody {
            bytes: Some(bytes),
            commit: Some(commit),
        }
    }
}

impl http_body::Body for WholeBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(commit) = this.commit.take() {
            commit.settle(true);
        }
        Poll::Ready(this.bytes.take().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.bytes.as_ref().map_or(0, |b| b.len() as u64))
    }
}
impl Shared {
    /// Writes the delivery-state delta of a request whose response completed (A9), and
    /// records how it went: `committed` (with the images it pruned) or `failed`.
    pub(super) async fn commit(&self, session: &SessionKey, delta: &Delta, route: &str) {
        let pruned = delta
            .records
            .values()
            .filter(|r| r.status == crate::projection::attach::state::Status::Pruned)
            .count() as u64;
        let started = Instant::now();
        let result = self.sessions.commit(session, delta).await;
        self.metrics
            .store_seconds
            .with_label_values(&[self.sessions.backend(), "commit"])
            .observe(started.elapsed().as_secs_f64());
        let outcome = match result {
            Ok(retired) => {
                self.metrics.images_pruned_total.inc_by(pruned);
                if retired > 0 {
                    self.metrics
                        .context_retired_total
                        .with_label_values(&[route])
                        .inc_by(retired);
                }
                "committed"
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot commit delivery state");
                "failed"
            }
        };
        self.metrics
            .commits_total
            .with_label_values(&[outcome])
            .inc();
    }

    /// Counts a delta that is not committed because its response did not complete (A9).
    pub(super) fn discarded(&self) {
        tracing::info!("response did not complete; its delivery-state changes are not committed");
        self.metrics
            .commits_total
            .with_label_values(&["discarded"])
            .inc();
    }
}
