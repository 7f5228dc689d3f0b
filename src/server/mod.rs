//! The gateway: listeners, workers, dispatch and graceful shutdown, one file per job.
//!
//! - `workers.rs`: worker threads, accepting under `max_connections`, background tasks.
//! - `handle.rs`: every request gets its id (`x-sluice-request-id`, O3), metrics, and on
//!   failure a dialect-shaped error; dispatch by path.
//! - `pipeline.rs`: projected endpoints (`Dialect::from_path`), stage by stage; the stage list
//!   is written once, on `App::projected`.
//! - `relay.rs`: every other `/v1/...` path streamed to the family's first route unchanged
//!   (P5), and the relay of upstream responses (P3).
//! - `rounds.rs`: the read rounds (C2-C5); `pages.rs`: the pages of stored texts they and
//!   `/v1/sluice/read` serve, cut from ranges of a text too large to read whole.
//! - `commit.rs`: the one commit path of delivery state (A9).
//! - `endpoints.rs`: `/v1/sluice/*` on the proxy listener; health, readiness, metrics.
//! - `sessions.rs`: the inspector's session API and its page, `/sluice/ui`.
//! - `body.rs`: request bodies (limits, pacing, decoding).
//! - `heavy.rs`: the lower-priority threads CPU-heavy projection runs on; `fair.rs`: their
//!   places, given in turn across tenants.
//! - `shed.rs`: at `max_connections`, the connection idle the longest closes for a newcomer.
//! - `busiest.rs`: which tenants get their own label in the per-tenant gauge.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::task::TaskTracker;

use crate::config::blobs::BlobsBackend;
use crate::config::Config;
use crate::config::StoreBackend;
use crate::memo::Memo;
use crate::metrics::Metrics;
use crate::route::RouteTable;
use crate::store::file::FileStore;
use crate::store::redis::RedisStore;
use crate::store::s3::S3Store;
use crate::store::session::{EmbeddedSessions, Sessions};
use crate::store::{Artifacts, Backend};
use crate::upstream::{BoxError, Upstream};

mod body;
mod busiest;
mod commit;
mod endpoints;
mod fair;
mod front;
mod handle;
mod heavy;
mod pages;
mod pipeline;
mod relay;
mod reshow;
mod rounds;
mod sessions;
mod shed;
mod tenants;
mod workers;

use body::{decode_body, full, plain, read_body};
use handle::{upstream_uri, Context, InFlight};
use workers::{
    accept_error, acceptor, connection_cap, serve_admin, sweep, watch_store, worker, Balance,
    Source,
};

pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Response header naming the request in sluice's logs (O3).
pub const REQUEST_ID: &str = "x-sluice-request-id";
/// Response header summarising the projection (O3, section 9).
pub const PROJECTION: &str = "x-sluice-projection";
/// Response header of the read endpoint: the cursor of the next page.
pub const NEXT_CURSOR: &str = "x-sluice-next-cursor";
/// The projection header of a request that nothing was done to.
const NOTHING_PROJECTED: &str = "spilled=0; embedded=0; deferred=0; refused=0; placeholders=0";
/// A client must send its request head within this time (slow-loris guard).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request body waits for room under `max_inflight_body_bytes` before its 503.
const BODY_ROOM_WAIT: Duration = Duration::from_secs(10);
/// After this grace, a request body must keep arriving at [`BODY_MIN_BYTES_PER_SECOND`] on
/// average (as Apache's `mod_reqtimeout` asks): a client trickling its body is cut in seconds,
/// not at the full `request_body_timeout_seconds`, so it cannot hold connections for nothing.
const BODY_GRACE: Duration = Duration::from_secs(5);
/// 1 KiB/s: any real link sends an agent's request far faster.
const BODY_MIN_BYTES_PER_SECOND: u64 = 1024;
/// File descriptors kept back from the connection cap: listeners, store files, logs, the
/// upstream connections of the requests in flight are counted separately (one per connection).
const RESERVED_FDS: u64 = 256;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot build the upstream client: {0}")]
    Client(#[from] crate::upstream::ClientError),
    #[error("cannot register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("store.data_dir: cannot use {path}: {source}")]
    DataDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("store.redis_url: cannot connect to Redis: {0}")]
    Redis(String),
    #[error("store.blobs: cannot use the bucket: {0}")]
    Blobs(String),
}

/// What every worker shares: configuration, routes, metrics, and whether sluice is draining.
struct Shared {
    config: Config,
    routes: RouteTable,
    metrics: Arc<Metrics>,
    draining: AtomicBool,
    /// Random per process, so request ids are unique across replicas and restarts.
    id_prefix: u64,
    next_id: AtomicU64,
    artifacts: Artifacts<Backend>,
    /// With artifacts in a bucket: the state store's own backend, which readiness checks too.
    state_probe: Option<Backend>,
    memo: Memo,
    /// Where long bodies' views were read to, so the next turn reads only what it adds.
    resumes: crate::dialect::resume::Resumes,
    sessions: Arc<Sessions>,
    session_header: http::HeaderName,
    /// Sessions seen within the idle TTL, for `sluice_sessions_active`.
    seen: moka::sync::Cache<String, ()>,
    /// Commits on their way to the session store, by session: the session's next request
    /// waits for them (briefly), so it plans on the state its predecessor left.
    landing: moka::sync::Cache<String, tokio::sync::watch::Receiver<bool>>,
    /// One permit per client connection served (`max_connections`).
    connections: Arc<tokio::sync::Semaphore>,
    /// The served connections, the idle ones shed oldest first at the cap (`shed.rs`).
    registry: Arc<shed::Registry>,
    /// One permit per request body byte buffered (`max_inflight_body_bytes`).
    body_room: Arc<tokio::sync::Semaphore>,
    /// One permit per CPU-heavy projection running on the heavy pool (`heavy.rs`):
    /// `worker_threads` − 1, at least one, so a core is left to the I/O threads. Images
    /// decoded, checked and downscaled, large outputs paged and hashed.
    /// Given in turn across tenants (`fair.rs`).
    heavy: Arc<fair::FairPlaces>,
    /// Turn records, when `[inspector] enabled` (docs/inspector.md).
    inspector: Option<Arc<crate::inspect::Inspector>>,
    /// Per-tenant shares, when `[limits]` sets any (`tenants.rs`).
    tenants: Option<tenants::Tenants>,
    /// Connections per source address, when `[limits] address_connections` is set.
    addresses: Option<tenants::Addresses>,
}

/// One worker's request handler: the shared state plus the worker's own upstream client, whose
/// connections live on the worker's thread.
struct App {
    shared: Arc<Shared>,
    upstream: Upstream,
    /// Delivery-state commits in flight; shutdown waits for them.
    commits: TaskTracker,
}

impl std::ops::Deref for App {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.shared
    }
}

/// A bound, not yet running gateway.
pub struct Server {
    shared: Arc<Shared>,
    proxy: std::net::TcpListener,
    admin: TcpListener,
    balance: Balance,
}

impl Server {
    pub async fn bind(config: Config) -> Result<Server, StartError> {
        let proxy_addr = config.listen_addr()?;
        let admin_addr = config.admin_addr()?;
        let routes = RouteTable::new(&config.routes)?;
        // Fail at startup, not on the first request, if the client cannot be built.
        Upstream::new(&config.upstream)?;
        let metrics = Arc::new(Metrics::new()?);
        for route in config.routes.iter().filter(|r| r.context.enabled()) {
            // Guarded routes show their context counters at 0 from the start, so a rate or an
            // alert on them has a series before the first retirement.
            metrics
                .context_retired_total
                .with_label_values(&[&route.name]);
            metrics
                .context_overflows_total
                .with_label_values(&[&route.name]);
        }
        for route in config.routes.iter().filter(|_| config.inspector.enabled) {
            // The savings series exist from the start, so their rates have a baseline.
            for side in ["received", "forwarded"] {
                let labels = [route.name.as_str(), side];
                metrics.input_tokens_total.with_label_values(&labels);
                metrics.input_cost_tokens_total.with_label_values(&labels);
            }
            for kind in ["uncached", "cached", "cache_creation"] {
                metrics
                    .provider_input_tokens_total
                    .with_label_values(&[route.name.as_str(), kind]);
            }
            for side in ["received", "forwarded"] {
                for kind in ["read", "write", "uncached"] {
                    metrics.cache_tokens_total.with_label_values(&[
                        route.name.as_str(),
                        side,
                        kind,
                    ]);
                }
            }
            for cause in ["ttl", "client", "sluice"] {
                metrics
                    .cache_breaks_total
                    .with_label_values(&[route.name.as_str(), cause]);
            }
        }
        for route in &config.routes {
            metrics
                .deferred_edits_total
                .with_label_values(&[route.name.as_str()]);
        }
        let ttl = Duration::from_secs(config.store.idle_ttl_seconds);
        let (backend, sessions) = match config.store.backend {
            StoreBackend::Embedded => {
                let dir = &config.store.data_dir;
                let data_dir = |source| StartError::DataDir {
                    path: dir.clone(),
                    source,
                };
                let files = FileStore::open(dir).map_err(data_dir)?;
                let sessions = EmbeddedSessions::open(dir, ttl)
                    .map_err(|e| data_dir(std::io::Error::other(e.to_string())))?;
                (Backend::File(files), Sessions::Embedded(sessions))
            }
            StoreBackend::Redis => {
                let redis =
                    RedisStore::connect(&config.store.redis_url, config.store.redis_cluster, ttl)
                        .await
                        .map_err(|e| StartError::Redis(e.to_string()))?;
                (Backend::Redis(redis.clone()), Sessions::Redis(redis))
            }
        };
        let inspector = if config.inspector.enabled {
            let store = match &sessions {
                Sessions::Embedded(s) => crate::inspect::store::TurnStore::embedded(s.database())
                    .map_err(|e| StartError::DataDir {
                    path: config.store.data_dir.clone(),
                    source: std::io::Error::other(e.to_string()),
                })?,
                Sessions::Redis(r) => crate::inspect::store::TurnStore::Redis(r.connection()),
            };
            let started = crate::inspect::Inspector::start(
                config.inspector.clone(),
                store,
                ttl,
                metrics.clone(),
                tokio::runtime::Handle::current(),
            )
            .map_err(|e| StartError::Redis(format!("cannot start the inspector: {e}")))?;
            Some(started)
        } else {
            None
        };
        let (backend, state_probe) = match config.store.blobs.backend {
            BlobsBackend::Store => (backend, None),
            BlobsBackend::S3 => (
                Backend::S3(S3Store::open(&config.store.blobs, ttl).map_err(StartError::Blobs)?),
                Some(backend),
            ),
        };
        let artifacts = Artifacts::new(backend, metrics.clone(), ttl);
        let session_header = http::HeaderName::from_bytes(config.session.header.as_bytes())
            .map_err(|_| crate::config::ConfigError {
                key: "session.header".into(),
                message: "is not a valid HTTP header name".into(),
            })?;
        let balance = Balance::from_env();
        let tenants = tenants::Tenants::new(
            &config.limits,
            (config.max_inflight_body_bytes, config.max_body_bytes),
            metrics.tenant_inflight_requests.clone(),
        );
        let addresses = tenants::Addresses::new(&config.limits);
        let proxy = listen(proxy_addr, balance == Balance::ReusePort).map_err(|source| {
            StartError::Bind {
                addr: proxy_addr,
                source,
            }
        })?;
        let admin = TcpListener::bind(admin_addr)
            .await
            .map_err(|source| StartError::Bind {
                addr: admin_addr,
                source,
            })?;
        let id_prefix = uuid::Uuid::new_v4().as_u64_pair().0;
        let max_connections = connection_cap(config.max_connections);
        tracing::info!(max_connections, "connection cap");
        let body_room = usize::try_from(config.max_inflight_body_bytes)
            .unwrap_or(usize::MAX)
            .min(tokio::sync::Semaphore::MAX_PERMITS);
        let heavy = config.workers().saturating_sub(1).max(1);
        Ok(Server {
            shared: Arc::new(Shared {
                config,
                routes,
                metrics,
                draining: AtomicBool::new(false),
                id_prefix,
                next_id: AtomicU64::new(0),
                artifacts,
                state_probe,
                memo: Memo::new(ttl),
                resumes: Default::default(),
                sessions: Arc::new(sessions),
                session_header,
                seen: moka::sync::Cache::builder()
                    .max_capacity(1_000_000)
                    .time_to_idle(ttl)
                    .build(),
                landing: moka::sync::Cache::builder()
                    .max_capacity(100_000)
                    .time_to_live(std::time::Duration::from_secs(10))
                    .build(),
                connections: Arc::new(tokio::sync::Semaphore::new(max_connections)),
                registry: shed::Registry::new(),
                body_room: Arc::new(tokio::sync::Semaphore::new(body_room)),
                heavy: fair::FairPlaces::new(heavy),
                inspector,
                tenants,
                addresses,
            }),
            proxy,
            admin,
            balance,
        })
    }

    pub fn proxy_addr(&self) -> std::io::Result<SocketAddr> {
        self.proxy.local_addr()
    }

    pub fn admin_addr(&self) -> std::io::Result<SocketAddr> {
        self.admin.local_addr()
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// Serves until `shutdown` resolves, then drains (O4): stops accepting, reports not-ready,
    /// lets in-flight requests and streams finish up to `drain_timeout_seconds`.
    ///
    /// The proxy runs on `worker_threads` threads, each with its own single-threaded runtime; an
    /// acceptor on the caller's runtime hands each new connection to the worker serving the
    /// fewest. A connection, its upstream connections and its relay stay on that worker.
    /// CPU-heavy projection, decoding compressed request bodies and embedded-store commits go
    /// to the blocking pool. The admin listener runs on the caller's runtime too.
    /// (`SLUICE_BALANCE` picks another design, for measurement: docs/runtime.md.)
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server {
            shared,
            proxy,
            admin,
            balance,
        } = self;
        let workers = match balance {
            Balance::Threads => 1,
            _ => shared.config.workers(),
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let (done_tx, mut done_rx) = mpsc::channel::<()>(workers);
        let admin_tasks = TaskTracker::new();
        let mut handed = Vec::new();
        for n in 0..workers {
            let load = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let source = match balance {
                Balance::Least => {
                    let (tx, rx) = mpsc::unbounded_channel();
                    handed.push((tx, load.clone()));
                    Ok(Source::Handed(rx))
                }
                Balance::ReusePort if n > 0 => proxy
                    .local_addr()
                    .and_then(|addr| listen(addr, true))
                    .map(Source::Listener),
                _ => proxy.try_clone().map(Source::Listener),
            };
            let source = match source {
                Ok(source) => source,
                Err(e) => {
                    tracing::error!(error = %e, "cannot give a worker its connections");
                    break;
                }
            };
            let (shared, stop, done) = (shared.clone(), stop_rx.clone(), done_tx.clone());
            let multi_thread = balance == Balance::Threads;
            let spawned = std::thread::Builder::new()
                .name(format!("sluice-worker-{n}"))
                .spawn(move || {
                    worker(shared, source, load, multi_thread, stop);
                    drop(done);
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a worker thread");
            }
        }
        if balance == Balance::Least {
            admin_tasks.spawn(acceptor(shared.clone(), proxy, handed, stop_rx.clone()));
        } else {
            drop(proxy);
        }
        drop(done_tx);
        let admin_graceful = GracefulShutdown::new();
        admin_tasks.spawn(sweep(shared.clone(), stop_rx.clone()));
        admin_tasks.spawn(watch_store(shared.clone(), stop_rx.clone()));
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = admin.accept() => match accepted {
                    Ok((stream, _)) => serve_admin(&shared, &admin_tasks, &admin_graceful, stream),
                    Err(e) => accept_error(e).await,
                },
                () = &mut shutdown => break,
                // Every worker ended (they only do when they could not start): nothing to serve.
                None = done_rx.recv() => {
                    tracing::error!("no proxy worker is running; stopping");
                    break;
                }
            }
        }
        shared.draining.store(true, Ordering::SeqCst);
        tracing::info!(
            inflight = shared.metrics.inflight_requests.get(),
            "shutting down: draining in-flight requests"
        );
        let _ = stop_tx.send(true);
        // The admin listener keeps answering (readyz says 503) until the workers are done.
        let deadline = shared.config.drain_timeout() + Duration::from_secs(1);
        let timer = tokio::time::sleep(deadline);
        let mut timer = std::pin::pin!(timer);
        loop {
            tokio::select! {
                None = done_rx.recv() => break,
                () = &mut timer => break,
                accepted = admin.accept() => if let Ok((stream, _)) = accepted {
                    serve_admin(&shared, &admin_tasks, &admin_graceful, stream);
                },
            }
        }
        drop(admin);
        let _ = tokio::time::timeout(Duration::from_secs(1), admin_graceful.shutdown()).await;
        admin_tasks.close();
        tracing::info!("stopped");
    }
}

/// The proxy's listening socket, non-blocking; with `SO_REUSEPORT` when each worker is to have
/// its own on the same port.
fn listen(addr: SocketAddr, reuse_port: bool) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}
