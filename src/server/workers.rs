//! Worker threads, accepting, connection serving and the background tasks (store checks, sweeps).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::store::session::Sessions;
use crate::store::Backend;
use crate::upstream::Upstream;

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

/// Expires idle artifacts and sessions of the embedded store (S2), every tenth of the idle TTL
/// (at most hourly), until shutdown. Redis expires its keys itself.
pub(super) async fn sweep(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let ttl = Duration::from_secs(shared.config.store.idle_ttl_seconds);
    let every = (ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(3600));
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        let shared = shared.clone();
        let swept = tokio::task::spawn_blocking(move || {
            let files = match shared.artifacts.backend() {
                Backend::File(files) => files.sweep(ttl),
                Backend::Redis(_) => 0,
            };
            let sessions = match &*shared.sessions {
                Sessions::Embedded(s) => s.sweep().unwrap_or(0),
                Sessions::Redis(_) => 0,
            };
            (files, sessions)
        })
        .await;
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

/// One proxy worker: a single-threaded runtime accepting on its copy of the listener until told
/// to stop, then draining its own connections up to the drain deadline.
pub(super) fn worker(
    shared: Arc<Shared>,
    listener: std::net::TcpListener,
    mut stop: watch::Receiver<bool>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
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
        let listener = match TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(error = %e, "cannot register the listener");
                return;
            }
        };
        let app = Arc::new(App {
            shared,
            upstream,
            commits: TaskTracker::new(),
        });
        let graceful = GracefulShutdown::new();
        let tasks = TaskTracker::new();
        loop {
            // At the connection cap, stop accepting: new connections wait in the listen queue
            // instead of failing for want of file descriptors.
            let permit = tokio::select! {
                permit = app.connections.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break,
                },
                _ = stop.wait_for(|stop| *stop) => break,
            };
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => serve_proxy(&app, &tasks, &graceful, stream, permit),
                    Err(e) => accept_error(e).await,
                },
                _ = stop.wait_for(|stop| *stop) => break,
            }
        }
        drop(listener);
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
) {
    let app = app.clone();
    let open = app.metrics.connections_open.clone();
    open.inc();
    let slot = ConnectionSlot {
        _permit: permit,
        open,
    };
    // The handler lives as long as the connection, and the slot with it.
    serve(tasks, graceful, stream, move |req| {
        let _slot = &slot;
        let app = app.clone();
        async move { app.handle(req).await }
    });
}

/// A connection's place under `max_connections`, given back when the connection ends.
pub(super) struct ConnectionSlot {
    /// Held for its drop: the permit goes back to the cap.
    _permit: tokio::sync::OwnedSemaphorePermit,
    open: prometheus::IntGauge,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.open.dec();
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
    serve(tasks, graceful, stream, move |req| {
        let shared = shared.clone();
        async move { shared.admin(&req).await }
    });
}

/// Serves one connection (HTTP/1.1 or h2c) on a tracked task, watched for graceful shutdown.
pub(super) fn serve<H, F>(
    tasks: &TaskTracker,
    graceful: &GracefulShutdown,
    stream: tokio::net::TcpStream,
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
            let response = handler(req);
            async move { Ok::<_, Infallible>(response.await) }
        });
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        if let Err(e) = watcher.watch(conn).await {
            tracing::debug!(error = %e, "connection ended with an error");
        }
    });
}
