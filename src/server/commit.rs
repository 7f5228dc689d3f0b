//! The one commit path of delivery state (A9).

use std::time::Instant;

use crate::attach::state::Delta;
use crate::session::{SessionKey, SessionStore};

use super::Shared;

impl Shared {
    /// Writes the delivery-state delta of a request whose response completed (A9), and
    /// records how it went: `committed` (with the images it pruned) or `failed`.
    pub(super) async fn commit(&self, session: &SessionKey, delta: &Delta) {
        let pruned = delta
            .records
            .values()
            .filter(|r| r.status == crate::attach::state::Status::Pruned)
            .count() as u64;
        let started = Instant::now();
        let result = self.sessions.commit(session, delta).await;
        self.metrics
            .store_seconds
            .with_label_values(&[self.sessions.backend(), "commit"])
            .observe(started.elapsed().as_secs_f64());
        let outcome = match result {
            Ok(()) => {
                self.metrics.images_pruned_total.inc_by(pruned);
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
