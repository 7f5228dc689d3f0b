//! Connections past `max_connections` (docs/reliability.md, "Tenants"): at the cap, a new
//! connection is accepted and the connection idle the longest (no request in flight, its last
//! answer sent) is closed to make room, instead of the newcomer waiting in the listen queue
//! behind clients that hold a keep-alive connection open and send nothing. When no connection
//! is idle, the newcomer waits for a place as before.
//!
//! A connection counts as busy from the moment its request reaches the handler until the
//! request's response body ends (the request's `InFlight` holds a [`Busy`]). Only a connection
//! idle for [`IDLE_BEFORE_SHED_MS`] can be chosen: one accepted a moment ago whose head is not
//! read yet, or a client's keep-alive between two quick requests, is not idle in the sense that
//! matters, and closing it would cut a request on its way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::Notify;

/// How long a connection must have been idle (since its accept or its last answer) before it
/// may be closed for a newcomer.
pub(super) const IDLE_BEFORE_SHED_MS: u64 = 1_000;

/// One served connection's state, as the shedder sees it.
pub(super) struct Connection {
    busy: AtomicU32,
    /// When its last request ended, in milliseconds since the registry began.
    idle_since: AtomicU64,
    /// Told when the connection is chosen to be shed.
    shed: Notify,
    /// Chosen and not yet closed (or kept): not chosen again.
    chosen: AtomicBool,
    registry: Arc<Registry>,
}

/// Every served connection, by number.
pub(super) struct Registry {
    epoch: Instant,
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Connection>>>,
}

/// A connection's entry in the registry, removed when the connection ends.
pub(super) struct Registered {
    id: u64,
    pub(super) connection: Arc<Connection>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let registry = &self.connection.registry;
        registry
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// A request in flight on a connection; the connection is idle again once the last is dropped.
pub(super) struct Busy(Arc<Connection>);

impl Drop for Busy {
    fn drop(&mut self) {
        let c = &self.0;
        c.idle_since.store(c.registry.now(), Ordering::Relaxed);
        c.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Connection {
    /// A request of this connection starts.
    pub(super) fn enter(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// Waits until the connection is chosen, then says whether it is still idle: a request
    /// that came meanwhile keeps it.
    pub(super) async fn chosen(&self) -> bool {
        self.shed.notified().await;
        let idle = self.busy.load(Ordering::Acquire) == 0;
        if !idle {
            self.chosen.store(false, Ordering::Release);
        }
        idle
    }
}

impl Registry {
    pub(super) fn new() -> Arc<Registry> {
        Arc::new(Registry {
            epoch: Instant::now(),
            next: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A connection begins, idle.
    pub(super) fn register(self: &Arc<Self>) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(Connection {
            busy: AtomicU32::new(0),
            idle_since: AtomicU64::new(self.now()),
            shed: Notify::new(),
            chosen: AtomicBool::new(false),
            registry: self.clone(),
        });
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, connection.clone());
        Registered { id, connection }
    }

    /// Tells the connection idle the longest to close; false when none has been idle for
    /// [`IDLE_BEFORE_SHED_MS`]. A chosen one is not chosen again unless a request kept it.
    pub(super) fn shed_oldest_idle(&self) -> bool {
        self.shed_idle_at(self.now())
    }

    /// [`Registry::shed_oldest_idle`] at `now` (milliseconds since the registry began).
    fn shed_idle_at(&self, now: u64) -> bool {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let oldest = open
            .values()
            .filter(|c| c.busy.load(Ordering::Acquire) == 0 && !c.chosen.load(Ordering::Acquire))
            .map(|c| (c, c.idle_since.load(Ordering::Relaxed)))
            .filter(|(_, since)| now.saturating_sub(*since) >= IDLE_BEFORE_SHED_MS)
            .min_by_key(|(_, since)| *since)
            .map(|(c, _)| c);
        let Some(connection) = oldest else {
            return false;
        };
        connection.chosen.store(true, Ordering::Release);
        connection.shed.notify_one();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/reliability.md "Tenants": the connection idle the longest is chosen; a busy one
    /// never is; with none idle, nothing is.
    #[tokio::test]
    async fn the_oldest_idle_connection_is_chosen_and_a_busy_one_never() {
        let registry = Registry::new();
        let (a, b, c) = (
            registry.register(),
            registry.register(),
            registry.register(),
        );
        let busy = c.connection.enter();
        // b's last request ended after a's.
        a.connection.idle_since.store(10, Ordering::Relaxed);
        b.connection.idle_since.store(20, Ordering::Relaxed);
        let later = 20 + IDLE_BEFORE_SHED_MS;
        assert!(registry.shed_idle_at(later));
        assert!(a.connection.chosen().await, "a was idle longest");
        assert!(registry.shed_idle_at(later));
        assert!(b.connection.chosen().await);
        assert!(!registry.shed_idle_at(later), "c is busy");
        drop(busy);
        let c_since = c.connection.idle_since.load(Ordering::Relaxed);
        assert!(registry.shed_idle_at(c_since + IDLE_BEFORE_SHED_MS));
        assert!(
            !registry.shed_idle_at(c_since + IDLE_BEFORE_SHED_MS),
            "each is chosen once"
        );
        drop((a, b, c));
        assert!(registry.open.lock().unwrap().is_empty());
    }

    /// A connection chosen while a request arrived is kept.
    #[tokio::test]
    async fn a_connection_busy_when_told_is_kept() {
        let registry = Registry::new();
        let a = registry.register();
        assert!(registry.shed_idle_at(IDLE_BEFORE_SHED_MS));
        let busy = a.connection.enter();
        assert!(!a.connection.chosen().await);
        drop(busy);
        let since = a.connection.idle_since.load(Ordering::Relaxed);
        assert!(
            registry.shed_idle_at(since + IDLE_BEFORE_SHED_MS),
            "kept, it can be chosen again"
        );
    }

    /// A connection accepted a moment ago (its head perhaps not read yet), or idle between two
    /// quick requests, is not closed for a newcomer: only one idle for the whole grace is.
    #[tokio::test]
    async fn a_connection_idle_for_less_than_the_grace_is_never_chosen() {
        let registry = Registry::new();
        let a = registry.register();
        let since = a.connection.idle_since.load(Ordering::Relaxed);
        assert!(!registry.shed_oldest_idle(), "just accepted");
        assert!(!registry.shed_idle_at(since + IDLE_BEFORE_SHED_MS - 1));
        assert!(registry.shed_idle_at(since + IDLE_BEFORE_SHED_MS));
        assert!(a.connection.chosen().await);
    }
}
