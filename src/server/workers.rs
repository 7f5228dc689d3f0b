//! Worker threads, accepting, connection serving and the background tasks (store checks, sweeps).

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::task::TaskTracker;

use crate::store::session::Sessions;
use crate::store::Backend;
use crate::upstream::Upstream;

use super::handle::Peer;
use super::{App, Body, Shared, HEADER_READ_TIMEOUT, RESERVED_FDS};

/// How often the store is checked for `sluice_store_up` between readiness probes.
pub(super) const STORE_CHECK_EVERY: Duration = Duration::from_secs(5);

/// Keeps `sluice_store_up` current, so a Redis outage shows in metrics even where nothing
/// probes /readyz.
pub(super) async fn watch_store(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let _ = shared.check_store().await;
        tokio::select! {
            () = tokio::time::sleep(STORE_CHECK_EVERY) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
    }
}

/// Expires idle artifacts and sessions of the embedded store and idle objects in an artifact
/// bucket (S2), every tenth of the idle TTL (at most hourly), until shutdown. Redis expires its
/// keys itself.
pub(super) async fn sweep(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let ttl = Duration::from_secs(shared.config.store.idle_ttl_seconds);
    let every = (ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(3600));
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        let on_pool = shared.clone();
        let swept = tokio::task::spawn_blocking(move || {
            let shared = on_pool;
            let files = match shared.artifacts.backend() {
                Backend::File(files) => files.sweep(ttl),
                Backend::Redis(_) | Backend::S3(_) => 0,
            };
            let sessions = match &*shared.sessions {
                Sessions::Embedded(s) => s.sweep().unwrap_or(0),
                Sessions::Redis(_) => 0,
            };
            if let Some(inspector) = &shared.inspector {
                if let Err(e) = inspector.store.sweep(ttl) {
                    tracing::warn!(error = %e, "cannot expire turn records");
                }
            }
            (files, sessions)
        })
        .await;
        let swept = match (swept, shared.artifacts.backend()) {
            (Ok((_, sessions)), Backend::S3(bucket)) => match bucket.sweep().await {
                Ok(objects) => Ok((objects, sessions)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot expire idle artifacts in the bucket");
                    Ok((0, sessions))
                }
            },
            (swept, _) => swept,
        };
        if let Ok((files, sessions)) = swept {
            if files + sessions > 0 {
                tracing::info!(
                    artifacts = files,
                    sessions,
                    "expired idle artifacts and sessions"
                );
            }
        }
    }
}

/// How connections reach the workers (`SLUICE_BALANCE`, for measurement; docs/runtime.md has
/// the comparison that chose the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Balance {
    /// One acceptor hands each connection to the worker serving the fewest (the default).
    Least,
    /// Every worker accepts on a shared copy of one listening socket: whichever wakes first.
    Shared,
    /// Every worker has its own socket on the port (`SO_REUSEPORT`): the kernel hashes each
    /// connection to one.
    ReusePort,
    /// One work-stealing multi-thread runtime of `worker_threads` threads.
    Threads,
}

impl Balance {
    pub(super) fn from_env() -> Balance {
        match std::env::var("SLUICE_BALANCE").as_deref() {
            Ok("shared") => Balance::Shared,
            Ok("reuseport") => Balance::ReusePort,
            Ok("threads") => Balance::Threads,
            Ok("least") | Err(_) => Balance::Least,
            Ok(other) => {
                tracing::warn!(balance = other, "unknown SLUICE_BALANCE; using least");
                Balance::Least
            }
        }
    }
}

/// Where a worker gets its connections.
pub(super) enum Source {
    /// It accepts them itself, on its copy of the listener (or its own `SO_REUSEPORT` socket).
    Listener(std::net::TcpListener),
    /// The acceptor hands them over, each with its place under `max_connections`.
    Handed(mpsc::UnboundedReceiver<Handed>),
}

/// A connection accepted for a worker, with its permit under `max_connections`.
pub(super) type Handed = (std::net::TcpStream, tokio::sync::OwnedSemaphorePermit);

/// One proxy worker's runtime: single-threaded, or (for [`Balance::Threads`]) a multi-thread
/// runtime of `worker_threads` threads. Serves its source until told to stop, then drains its
/// own connections up to the drain deadline. `load` counts the connections it serves.
pub(super) fn worker(
    shared: Arc<Shared>,
    source: Source,
    load: Arc<AtomicUsize>,
    multi_thread: bool,
    mut stop: watch::Receiver<bool>,
) {
    let built = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(shared.config.workers())
            .thread_name("sluice-worker")
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            // Names its blocking pool's threads (the runtime itself runs on this one).
            .thread_name("sluice-blocking")
            .enable_all()
            .build()
    };
    let runtime = match built {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start a worker runtime");
            return;
        }
    };
    runtime.block_on(async move {
        let upstream = match Upstream::new(&shared.config.upstream) {
            Ok(upstream) => upstream,
            Err(e) => {
                tracing::error!(error = %e, "cannot build the upstream client");
                return;
            }
        };
        let mut source = match source {
            Source::Listener(listener) => match TcpListener::from_std(listener) {
                Ok(listener) => Feed::Listener(listener),
                Err(e) => {
                    tracing::error!(error = %e, "cannot register the listener");
                    return;
                }
            },
            Source::Handed(handed) => Feed::Handed(handed),
        };
        let app = Arc::new(App {
            shared,
            upstream,
            commits: TaskTracker::new(),
        });
        let graceful = GracefulShutdown::new();
        let tasks = TaskTracker::new();
        loop {
            let next = tokio::select! {
                next = source.next(&app) => next,
                _ = stop.wait_for(|stop| *stop) => break,
            };
            match next {
                Next::Connection(stream, permit) => {
                    if matches!(source, Feed::Listener(_)) {
                        load.fetch_add(1, Ordering::Relaxed);
                    }
                    serve_proxy(&app, &tasks, &graceful, stream, permit, load.clone());
                }
                Next::Retry => {}
                Next::Closed => break,
            }
        }
        drop(source);
        let deadline = app.config.drain_timeout();
        if tokio::time::timeout(deadline, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                inflight = app.metrics.inflight_requests.get(),
                deadline_seconds = deadline.as_secs_f64(),
                "drain deadline passed; closing the remaining connections"
            );
        }
        tasks.close();
        app.commits.close();
        if tokio::time::timeout(Duration::from_secs(5), app.commits.wait())
            .await
            .is_err()
        {
            tracing::warn!("delivery-state commits still running at exit");
        }
    });
}

/// A worker's source, registered with its runtime.
enum Feed {
    Listener(TcpListener),
    Handed(mpsc::UnboundedReceiver<Handed>),
}

enum Next {
    Connection(tokio::net::TcpStream, tokio::sync::OwnedSemaphorePermit),
    /// Accepting failed (and was backed off) or a handed connection could not be registered.
    Retry,
    /// The acceptor is gone, or the cap's semaphore was closed.
    Closed,
}

impl Feed {
    async fn next(&mut self, app: &App) -> Next {
        match self {
            Feed::Listener(listener) => accept(listener, app).await,
            Feed::Handed(handed) => match handed.recv().await {
                Some((stream, permit)) => match tokio::net::TcpStream::from_std(stream) {
                    Ok(stream) => Next::Connection(stream, permit),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot register a handed connection");
                        Next::Retry
                    }
                },
                None => Next::Closed,
            },
        }
    }
}

/// The acceptor of [`Balance::Least`]: takes each connection (under `max_connections`) and
/// hands it to the worker serving the fewest, the next one in turn on a tie. Runs until told
/// to stop; dropping the senders then tells the workers to drain.
pub(super) async fn acceptor(
    shared: Arc<Shared>,
    listener: std::net::TcpListener,
    workers: Vec<(mpsc::UnboundedSender<Handed>, Arc<AtomicUsize>)>,
    mut stop: watch::Receiver<bool>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(error = %e, "cannot register the listener");
            return;
        }
    };
    let mut turn = 0usize;
    loop {
        let next = tokio::select! {
            next = accept(&listener, &shared) => next,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let (stream, permit) = match next {
            Next::Connection(stream, permit) => (stream, permit),
            Next::Retry => continue,
            Next::Closed => return,
        };
        let Ok(stream) = stream.into_std() else {
            continue;
        };
        turn = turn.wrapping_add(1);
        let loads: Vec<usize> = workers
            .iter()
            .map(|w| w.1.load(Ordering::Relaxed))
            .collect();
        let Some((to, load)) = least_loaded(&loads, turn).and_then(|i| workers.get(i)) else {
            return;
        };
        // Counted now, so the next connection (accepted before this one is registered) sees it.
        load.fetch_add(1, Ordering::Relaxed);
        if to.send((stream, permit)).is_err() {
            load.fetch_sub(1, Ordering::Relaxed);
            tracing::error!("a proxy worker stopped; its connection is dropped");
        }
    }
}

/// The next connection on `listener`, once it has its place under `max_connections`. At the
/// cap, a connection that arrives is accepted and the connection idle the longest is closed to
/// make room for it (`shed.rs`); with none idle it waits for a place, and those behind it wait
/// in the listen queue instead of failing for want of file descriptors. A failed accept is
/// backed off.
async fn accept(listener: &TcpListener, shared: &Shared) -> Next {
    let connections = &shared.connections;
    let free = match connections.clone().try_acquire_owned() {
        Ok(permit) => Some(permit),
        Err(tokio::sync::TryAcquireError::Closed) => return Next::Closed,
        Err(tokio::sync::TryAcquireError::NoPermits) => None,
    };
    let (accepted, permit) = match free {
        Some(permit) => (listener.accept().await, permit),
        None => tokio::select! {
            permit = connections.clone().acquire_owned() => {
                let Ok(permit) = permit else {
                    return Next::Closed;
                };
                (listener.accept().await, permit)
            }
            // Cancel-safe: a connection not taken stays in the queue.
            accepted = listener.accept() => {
                let Some(permit) = make_room(shared, accepted.is_ok()).await else {
                    return Next::Closed;
                };
                (accepted, permit)
            }
        },
    };
    match accepted {
        Ok((stream, _)) => Next::Connection(stream, permit),
        Err(e) => {
            drop(permit);
            accept_error(e).await;
            Next::Retry
        }
    }
}

/// A place for a connection accepted at the cap: the connection idle the longest is closed for
/// it (`shed.rs`), and while none has been idle long enough, the choice is made again every
/// [`SHED_RETRY`] until a place comes free one way or the other. None once the cap is closed.
async fn make_room(shared: &Shared, mut shed: bool) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let connections = &shared.connections;
    loop {
        if shed && shared.registry.shed_oldest_idle() {
            shared.metrics.connections_shed_total.inc();
            shed = false;
        }
        tokio::select! {
            permit = connections.clone().acquire_owned() => return permit.ok(),
            () = tokio::time::sleep(SHED_RETRY), if shed => {}
        }
    }
}

/// How often a connection waiting at the cap looks again for one idle long enough to close.
const SHED_RETRY: std::time::Duration = std::time::Duration::from_millis(250);

/// The worker serving the fewest connections; among equals, the first from `turn` on, so
/// connections that arrive while all are idle go round the workers.
fn least_loaded(loads: &[usize], turn: usize) -> Option<usize> {
    let n = loads.len();
    (0..n)
        .map(|i| turn.wrapping_add(i) % n)
        .min_by_key(|&i| loads.get(i).copied().unwrap_or(usize::MAX))
}

pub(super) async fn accept_error(e: std::io::Error) {
    // Out of file descriptors and the like: back off briefly instead of spinning.
    tracing::warn!(error = %e, "accept failed");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

pub(super) fn serve_proxy(
    app: &Arc<App>,
    tasks: &TaskTracker,
    graceful: &GracefulShutdown,
    stream: tokio::net::TcpStream,
    permit: tokio::sync::OwnedSemaphorePermit,
    load: Arc<AtomicUsize>,
) {
    let peer = stream.peer_addr().ok().map(|a| a.ip());
    let address = match (&app.addresses, peer) {
        (Some(addresses), Some(ip)) => match addresses.open(ip) {
            Some(slot) => Some(slot),
            None => return super::tenants::refuse_address(app, tasks, stream, permit, load),
        },
        _ => None,
    };
    let app = app.clone();
    let open = app.metrics.connections_open.clone();
    open.inc();
    let registered = app.registry.register();
    let connection = registered.connection.clone();
    let shed = connection.clone();
    let slot = ConnectionSlot {
        _permit: permit,
        _address: address,
        _registered: registered,
        open,
        load,
        recycle: Recycle::after(app.config.max_requests_per_connection),
    };
    // The handler lives as long as the connection, and the slot with it.
    serve(tasks, graceful, stream, Some(shed), move |req| {
        let recycled = slot
            .recycle
            .is_last(req.version())
            .then(|| app.metrics.connections_recycled_total.clone());
        let app = app.clone();
        let peer = Peer::served(peer, &connection);
        async move {
            let mut response = app.handle(req, peer).await;
            let Some(recycled) = recycled else {
                return response;
            };
            if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
                // hyper closes the connection once this response is written; the client's
                // next request opens another (docs/runtime.md, "Connections recycled").
                response.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
                recycled.inc();
            }
            response
        }
    });
}

/// When a client connection is given up: after its `max`th request (0: never). Only HTTP/1
/// connections are: their last answer says `connection: close`, which every HTTP/1.1 client
/// honours before sending again. An h2 connection would need a GOAWAY, and h2 reaches sluice
/// only by prior knowledge, which no agent SDK uses.
struct Recycle {
    max: u32,
    served: AtomicU32,
}

impl Recycle {
    fn after(max: u32) -> Recycle {
        Recycle {
            max,
            served: AtomicU32::new(0),
        }
    }

    /// Counts a request; true for the one whose answer closes its connection.
    fn is_last(&self, version: http::Version) -> bool {
        if self.max == 0 || version > http::Version::HTTP_11 {
            return false;
        }
        self.served.fetch_add(1, Ordering::Relaxed).wrapping_add(1) == self.max
    }
}

/// A connection's place under `max_connections`, given back when the connection ends.
pub(super) struct ConnectionSlot {
    /// Held for its drop: the permit goes back to the cap.
    _permit: tokio::sync::OwnedSemaphorePermit,
    /// Held for its drop: the place under the source address's cap.
    _address: Option<super::tenants::AddressSlot>,
    /// Held for its drop: the connection's entry among those that may be shed.
    _registered: super::shed::Registered,
    open: prometheus::IntGauge,
    /// The serving worker's connection count, which the acceptor balances by.
    load: Arc<AtomicUsize>,
    recycle: Recycle,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.open.dec();
        self.load.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The connection cap: `configured`, or derived from the file-descriptor limit (raised to its
/// hard limit first): each connection may hold its own socket and one to the provider.
pub(super) fn connection_cap(configured: usize) -> usize {
    let limit = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the file-descriptor limit");
            rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft)
        }
    };
    let derived = usize::try_from(limit.saturating_sub(RESERVED_FDS) / 2).unwrap_or(usize::MAX);
    // A worker takes its permit before it accepts: never more connections than permits.
    match configured {
        0 => derived.max(16),
        n => n,
    }
}

pub(super) fn serve_admin(
    shared: &Arc<Shared>,
    tasks: &TaskTracker,
    graceful: &GracefulShutdown,
    stream: tokio::net::TcpStream,
) {
    let shared = shared.clone();
    serve(tasks, graceful, stream, None, move |req| {
        let shared = shared.clone();
        async move { shared.admin(&req).await }
    });
}

/// Serves one connection (HTTP/1.1 or h2c) on a tracked task, watched for graceful shutdown;
/// `shed`: the connection may be closed while idle to make room at the cap (`shed.rs`).
pub(super) fn serve<H, F>(
    tasks: &TaskTracker,
    graceful: &GracefulShutdown,
    stream: tokio::net::TcpStream,
    shed: Option<Arc<super::shed::Connection>>,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let _ = stream.set_nodelay(true);
    let watcher = graceful.watcher();
    tasks.spawn(async move {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        let service = service_fn(move |req| {
            // A request's future is kilobytes (every stage's state): boxed once, it is not
            // copied again as hyper moves it around.
            let response = Box::pin(handler(req));
            async move { Ok::<_, Infallible>(response.await) }
        });
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let mut served = std::pin::pin!(watcher.watch(conn));
        loop {
            let chosen = async {
                match &shed {
                    Some(connection) => connection.chosen().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ended = &mut served => {
                    if let Err(e) = ended {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    return;
                }
                // Idle, with no request in flight: closing it loses nothing. A request that
                // came meanwhile keeps it, and it may be chosen again later.
                idle = chosen => if idle {
                    return;
                },
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::{least_loaded, Recycle};

    #[test]
    fn an_http1_connection_is_given_up_at_its_maxth_request_only() {
        let recycle = Recycle::after(3);
        let picks: Vec<_> = (0..5)
            .map(|_| recycle.is_last(http::Version::HTTP_11))
            .collect();
        assert_eq!(picks, vec![false, false, true, false, false]);
        let h2 = Recycle::after(1);
        assert!(!h2.is_last(http::Version::HTTP_2));
        assert!(Recycle::after(1).is_last(http::Version::HTTP_10));
        let never = Recycle::after(0);
        assert!((0..2000).all(|_| !never.is_last(http::Version::HTTP_11)));
    }

    #[test]
    fn connections_go_to_the_least_loaded_worker_and_round_on_ties() {
        assert_eq!(least_loaded(&[], 0), None);
        assert_eq!(least_loaded(&[3, 1, 2], 0), Some(1));
        assert_eq!(least_loaded(&[3, 1, 2], 7), Some(1));
        // All equal: each turn starts from the next worker.
        let picks: Vec<_> = (0..4).filter_map(|t| least_loaded(&[0, 0], t)).collect();
        assert_eq!(picks, vec![0, 1, 0, 1]);
        // A busy worker is skipped until the others catch up with it.
        let mut loads = vec![5, 0, 0];
        for turn in 0..10 {
            let i = least_loaded(&loads, turn).unwrap();
            loads[i] += 1;
        }
        assert_eq!(loads, vec![5, 5, 5]);
    }
}
