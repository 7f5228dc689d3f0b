//! Listeners, endpoint dispatch and graceful shutdown.
//!
//! The request path, once (STYLE 1):
//! 1. [`App::handle`] gives the request an id (`x-sluice-request-id`, O3) and dispatches by path.
//! 2. Projected endpoints ([`Dialect::from_path`]): the body is read under `max_body_bytes`
//!    (413 while reading, never after buffering all of it), read once into a
//!    [`RequestView`](crate::projection::RequestView) by its dialect (400 on bad JSON), routed by
//!    dialect and model (404), projected into edits and spliced into the original bytes (P1, P2).
//! 3. Every other `/v1/...` path is streamed to the family's first route unchanged (P5).
//! 4. [`Upstream::send`] waits for the upstream's head and first chunk (502/504 on failure);
//!    the status, headers and body then stream back through a bounded relay (P3), which records
//!    the end of the body in the metrics.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::task::TaskTracker;

use crate::attach::state::{Delta, SessionState};
use crate::config::Config;
use crate::config::StoreBackend;
use crate::dialect::completion::Completion;
use crate::dialect::{Dialect, Family};
use crate::encoding::{Coding, DecodeError, Decoder, TooLarge};
use crate::error::GatewayError;
use crate::exit::cursor::{Cursor, CursorError};
use crate::exit::text::Lines;
use crate::exit::{notice, Memo};
use crate::metrics::Metrics;
use crate::projection::{self, splice, Summary};
use crate::read;
use crate::route::RouteTable;
use crate::session::{EmbeddedSessions, SessionKey, SessionStore, Sessions};
use crate::store::file::FileStore;
use crate::store::redis::RedisStore;
use crate::store::{ArtifactId, ArtifactKind, Artifacts, Backend};
use crate::tenant::Tenant;
use crate::upstream::{self, BoxError, Upstream};

mod rounds;

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
    Client(#[from] reqwest::Error),
    #[error("cannot register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("store.data_dir: cannot use {path}: {source}")]
    DataDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("store.redis_url: cannot connect to Redis: {0}")]
    Redis(String),
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
    memo: Memo,
    media: crate::attach::Memo,
    sessions: Arc<Sessions>,
    session_header: http::HeaderName,
    /// Sessions seen within the idle TTL, for `sluice_sessions_active`.
    seen: moka::sync::Cache<String, ()>,
    /// One permit per client connection served (`max_connections`).
    connections: Arc<tokio::sync::Semaphore>,
    /// One permit per request body byte buffered (`max_inflight_body_bytes`).
    body_room: Arc<tokio::sync::Semaphore>,
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
}

impl Server {
    pub async fn bind(config: Config) -> Result<Server, StartError> {
        let proxy_addr = config.listen_addr()?;
        let admin_addr = config.admin_addr()?;
        let routes = RouteTable::new(&config.routes)?;
        // Fail at startup, not on the first request, if the client cannot be built.
        Upstream::new(&config.upstream)?;
        let metrics = Arc::new(Metrics::new()?);
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
                let redis = RedisStore::connect(&config.store.redis_url, ttl)
                    .await
                    .map_err(|e| StartError::Redis(e.to_string()))?;
                (Backend::Redis(redis.clone()), Sessions::Redis(redis))
            }
        };
        let artifacts = Artifacts::new(backend, metrics.clone(), ttl);
        let session_header = http::HeaderName::from_bytes(config.session.header.as_bytes())
            .map_err(|_| crate::config::ConfigError {
                key: "session.header".into(),
                message: "is not a valid HTTP header name".into(),
            })?;
        let proxy = std::net::TcpListener::bind(proxy_addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|source| StartError::Bind {
                addr: proxy_addr,
                source,
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
        Ok(Server {
            shared: Arc::new(Shared {
                config,
                routes,
                metrics,
                draining: AtomicBool::new(false),
                id_prefix,
                next_id: AtomicU64::new(0),
                artifacts,
                memo: Memo::new(ttl),
                media: crate::attach::Memo::new(ttl),
                sessions: Arc::new(sessions),
                session_header,
                seen: moka::sync::Cache::builder()
                    .max_capacity(1_000_000)
                    .time_to_idle(ttl)
                    .build(),
                connections: Arc::new(tokio::sync::Semaphore::new(max_connections)),
                body_room: Arc::new(tokio::sync::Semaphore::new(body_room)),
            }),
            proxy,
            admin,
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
    /// The proxy runs on `worker_threads` threads, each with its own single-threaded runtime
    /// accepting on the shared listener: a connection, its upstream connections and its relay
    /// all stay on one thread, with no cross-thread wake-ups on the request path. The admin
    /// listener runs on the caller's runtime.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server {
            shared,
            proxy,
            admin,
        } = self;
        let workers = shared.config.workers();
        let (stop_tx, stop_rx) = watch::channel(false);
        let (done_tx, mut done_rx) = mpsc::channel::<()>(workers);
        for n in 0..workers {
            let listener = match proxy.try_clone() {
                Ok(listener) => listener,
                Err(e) => {
                    tracing::error!(error = %e, "cannot share the listener with a worker");
                    break;
                }
            };
            let (shared, stop, done) = (shared.clone(), stop_rx.clone(), done_tx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("sluice-worker-{n}"))
                .spawn(move || {
                    worker(shared, listener, stop);
                    drop(done);
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a worker thread");
            }
        }
        drop((proxy, done_tx));
        let admin_graceful = GracefulShutdown::new();
        let admin_tasks = TaskTracker::new();
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

/// How often the store is checked for `sluice_store_up` between readiness probes.
const STORE_CHECK_EVERY: Duration = Duration::from_secs(5);

/// Keeps `sluice_store_up` current, so a Redis outage shows in metrics even where nothing
/// probes /readyz.
async fn watch_store(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
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
async fn sweep(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
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
fn worker(shared: Arc<Shared>, listener: std::net::TcpListener, mut stop: watch::Receiver<bool>) {
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

async fn accept_error(e: std::io::Error) {
    // Out of file descriptors and the like: back off briefly instead of spinning.
    tracing::warn!(error = %e, "accept failed");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

fn serve_proxy(
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
struct ConnectionSlot {
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
fn connection_cap(configured: usize) -> usize {
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

fn serve_admin(
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
fn serve<H, F>(
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

/// Decrements the in-flight gauge and records the request duration when dropped, which happens
/// exactly once: at the end of the response body, or with an early error response.
struct InFlight {
    metrics: Arc<Metrics>,
    dialect: &'static str,
    start: Instant,
}

impl InFlight {
    fn new(metrics: &Arc<Metrics>, dialect: &'static str, start: Instant) -> Self {
        metrics.inflight_requests.inc();
        Self {
            metrics: metrics.clone(),
            dialect,
            start,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.metrics.inflight_requests.dec();
        self.metrics
            .request_duration_seconds
            .with_label_values(&[self.dialect])
            .observe(upstream::seconds_since(self.start));
    }
}

/// What the handler knows about a request when it answers it, for metrics and logs.
struct Context {
    request_id: String,
    family: Family,
    dialect: &'static str,
    route: String,
}

impl App {
    /// The session of a request and its delivery state. A store that cannot be read must not
    /// fail the request: it goes on without state (`None`), and commits nothing.
    async fn load_session(
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

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let start = Instant::now();
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request_id = format!("{:016x}{n:016x}", self.id_prefix);
        let path = req.uri().path();
        let dialect = (req.method() == Method::POST)
            .then(|| Dialect::from_path(path))
            .flatten();
        let mut ctx = Context {
            request_id,
            family: dialect
                .map_or_else(|| Family::of_request(path, req.headers()), Dialect::family),
            dialect: dialect.map_or("passthrough", Dialect::as_str),
            route: String::new(),
        };
        let inflight = InFlight::new(&self.metrics, ctx.dialect, start);
        let result = if let Some(dialect) = dialect {
            self.projected(dialect, req, start, &mut ctx, inflight)
                .await
        } else if path.starts_with("/v1/sluice/") {
            drop(inflight);
            ctx.dialect = "sluice";
            self.sluice_endpoint(&req, &ctx).await
        } else if path.starts_with("/v1/") {
            self.pass_through(req, &mut ctx, inflight).await
        } else if path == "/" && matches!(*req.method(), Method::GET | Method::HEAD) {
            // Clients check the base URL answers before they start (Claude Code: `HEAD /`).
            drop(inflight);
            ctx.dialect = "sluice";
            Ok(plain(StatusCode::OK, "text/plain", Bytes::from("sluice\n")))
        } else {
            drop(inflight);
            Err(GatewayError::NotFound(path.to_string()))
        };
        let mut response = match result {
            Ok(response) => response,
            Err(err) => self.error_response(&ctx, &err),
        };
        self.metrics
            .requests_total
            .with_label_values(&[
                ctx.dialect,
                if ctx.route.is_empty() {
                    "none"
                } else {
                    &ctx.route
                },
                response.status().as_str(),
            ])
            .inc();
        if let Ok(value) = HeaderValue::from_str(&ctx.request_id) {
            response.headers_mut().insert(REQUEST_ID, value);
        }
        response
    }

    async fn projected(
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
        let prepared = projection::Prepared::new(&view, &tenant, &self.media);
        let mut session = None;
        let mut state = SessionState::default();
        if prepared.has_images() {
            (session, state) = self
                .load_session(&parts.headers, &tenant, &view, route, ctx)
                .await;
        }
        // A client tool of the read tool's name: sluice's tool takes a suffix, and the notices
        // name that (the route is copied only then).
        let renamed = view
            .tools
            .filter(|raw| raw.get().contains(route.config.read_tool.as_str()))
            .and_then(|_| read::Shape::of_view(&view))
            .map(|shape| read::tool_name(&route.config.read_tool, &shape.tool_names(dialect)))
            .filter(|name| *name != route.config.read_tool)
            .map(|read_tool| crate::config::RouteConfig {
                read_tool,
                ..route.config.clone()
            });
        let route_config = renamed.as_ref().unwrap_or(&route.config);
        let mut projection = projection::project_prepared(
            &view,
            &projection::Context {
                tenant: &tenant,
                route: route_config,
                memo: &self.memo,
                media: &self.media,
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
                let name = route_config.read_tool.clone();
                projection
                    .edits
                    .push(shape.add_tool(&read::definition(dialect, &name)));
                tool = Some(name);
            }
        }
        let commit = session
            .clone()
            .filter(|_| shows_model && !projection.delta.records.is_empty())
            .map(|session| (session, projection.delta.clone()));
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
            self.memo.insert(key, value);
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
            session: session.clone(),
            delta: projection.delta.clone(),
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
            Err(e) => {
                // No response at all: the delta is discarded as for any that did not complete.
                if commit.is_some() {
                    self.shared.discarded();
                }
                return Err(e);
            }
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

    async fn pass_through(
        &self,
        req: Request<Incoming>,
        ctx: &mut Context,
        inflight: InFlight,
    ) -> Result<Response<Body>, GatewayError> {
        let start = inflight.start;
        let route = self
            .routes
            .select_family(ctx.family)
            .ok_or_else(|| GatewayError::NoRoute {
                dialect: ctx.dialect,
                model: String::new(),
            })?;
        ctx.route.clone_from(&route.config.name);
        let (parts, incoming) = req.into_parts();
        let url = route.url(&parts.uri);
        let headers = upstream::request_headers(parts.headers, route, ctx.family);
        let expired = Arc::new(AtomicBool::new(false));
        let body = if http_body::Body::is_end_stream(&incoming) {
            reqwest::Body::from(Bytes::new())
        } else {
            let timeout = self.config.request_body_timeout();
            reqwest::Body::wrap(TimedBody {
                inner: incoming,
                deadline: Box::pin(tokio::time::sleep(timeout)),
                expired: expired.clone(),
            })
        };
        let sent_at = Instant::now();
        let sent = self.upstream.send(parts.method, url, headers, body).await;
        let started = match sent {
            Err(_) if expired.load(Ordering::Relaxed) => {
                return Err(GatewayError::BodyTimeout {
                    seconds: self.config.request_body_timeout_seconds,
                })
            }
            other => other?,
        };
        self.metrics
            .upstream_duration_seconds
            .with_label_values(&[ctx.dialect, &route.config.name])
            .observe(upstream::seconds_since(sent_at));
        Ok(self.relay(started, ctx, inflight, start, None, None))
    }

    /// Streams an upstream response to the client; records the stream's end (O2).
    fn relay(
        &self,
        mut started: upstream::Started,
        ctx: &Context,
        inflight: InFlight,
        start: Instant,
        watch: Option<Completion>,
        commit: Option<(SessionKey, Delta)>,
    ) -> Response<Body> {
        let status = started.status;
        let event_stream = started.is_event_stream();
        let watch = watch.filter(|_| event_stream);
        let (shared, commits) = (self.shared.clone(), self.commits.clone());
        let headers = upstream::response_headers(std::mem::take(&mut started.headers));
        let metrics = self.metrics.clone();
        let (request_id, dialect, route) = (ctx.request_id.clone(), ctx.dialect, ctx.route.clone());
        let body = started.relay(watch, move |end| {
            drop(inflight);
            // A9: state changes count only when the response completed.
            if let Some((session, delta)) = commit {
                if end.complete {
                    commits.spawn(async move { shared.commit(&session, &delta).await });
                } else {
                    shared.discarded();
                }
            }
            if event_stream {
                metrics
                    .streams_total
                    .with_label_values(&[dialect, end.outcome.as_str()])
                    .inc();
            }
            tracing::debug!(
                request_id,
                dialect,
                route,
                status = status.as_u16(),
                outcome = end.outcome.as_str(),
                bytes = end.bytes,
                duration_ms = start.elapsed().as_secs_f64() * 1e3,
                "request finished"
            );
        });
        let mut response = Response::new(body.boxed_unsync());
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }

    /// sluice's own endpoints (section 9): `GET /v1/sluice/artifacts/{id}` and
    /// `GET /v1/sluice/read?cursor=…`. Only the creating tenant gets anything; everyone else gets
    /// 404, never a hint that the artifact exists (S3). Reading never makes an artifact (T6).
    async fn sluice_endpoint(
        &self,
        req: &Request<Incoming>,
        ctx: &Context,
    ) -> Result<Response<Body>, GatewayError> {
        let path = req.uri().path();
        let not_found = || GatewayError::NotFound(path.to_string());
        if req.method() != Method::GET {
            return Err(not_found());
        }
        // Without a credential (and no route naming a tenant for that case) nobody can be told
        // apart: 401, never the shared anonymous tenant's artifacts (S3).
        let tenant = Tenant::of_request(req.headers())
            .or_else(|| {
                self.routes
                    .select_family(ctx.family)
                    .and_then(|r| r.tenant.clone())
            })
            .ok_or(GatewayError::Unauthorized)?;
        let store_error = |e: crate::store::StoreError| {
            tracing::error!(request_id = %ctx.request_id, error = %e, "artifact read failed");
            GatewayError::StoreUnavailable
        };
        if let Some(id) = path.strip_prefix("/v1/sluice/artifacts/") {
            let id = ArtifactId::parse(id).ok_or_else(not_found)?;
            let bytes = self
                .artifacts
                .get(&tenant, &id)
                .await
                .map_err(store_error)?
                .ok_or_else(not_found)?;
            let content_type = match id.kind {
                ArtifactKind::Text => "text/plain; charset=utf-8",
                ArtifactKind::Media => crate::image::check(bytes.clone(), None)
                    .map_or("application/octet-stream", |image| image.kind.mime()),
            };
            return Ok(plain(StatusCode::OK, content_type, bytes));
        }
        if path != "/v1/sluice/read" {
            return Err(not_found());
        }
        let cursor = url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .find(|(k, _)| k == "cursor")
            .map(|(_, v)| v.into_owned())
            .ok_or(GatewayError::BadCursor)?;
        let cursor = Cursor::decode(&cursor, &tenant).map_err(|e| match e {
            CursorError::Malformed => GatewayError::BadCursor,
            CursorError::Foreign => not_found(),
        })?;
        let bytes = self
            .artifacts
            .get(&tenant, &cursor.artifact)
            .await
            .map_err(store_error)?
            .ok_or_else(not_found)?;
        let text = std::str::from_utf8(&bytes).map_err(|_| GatewayError::Internal)?;
        let read_tool = self
            .routes
            .select_family(ctx.family)
            .map_or("sluice_read", |r| r.config.read_tool.as_str());
        let page = notice::render(
            &Lines::new(text),
            &cursor.artifact,
            &tenant,
            cursor.at,
            cursor.budget,
            read_tool,
        );
        let mut response = plain(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            Bytes::from(page.text),
        );
        if let Some(next) = page.next.and_then(|n| HeaderValue::from_str(&n).ok()) {
            response.headers_mut().insert(NEXT_CURSOR, next);
        }
        Ok(response)
    }

    fn error_response(&self, ctx: &Context, err: &GatewayError) -> Response<Body> {
        self.metrics
            .errors_total
            .with_label_values(&[err.kind()])
            .inc();
        if err.status().is_server_error() {
            tracing::warn!(request_id = %ctx.request_id, dialect = ctx.dialect, route = %ctx.route, kind = err.kind(), "request failed");
        } else {
            tracing::debug!(request_id = %ctx.request_id, dialect = ctx.dialect, kind = err.kind(), error = %err, "request refused");
        }
        let mut response = Response::new(full(err.body(ctx.family)));
        *response.status_mut() = err.status();
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if err.status() == StatusCode::REQUEST_TIMEOUT {
            // The rest of that body is not waited for: the connection ends here.
            response
                .headers_mut()
                .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

impl Shared {
    /// Writes the delivery-state delta of a request whose response completed (A9), and
    /// records how it went: `committed` (with the images it pruned) or `failed`.
    async fn commit(&self, session: &SessionKey, delta: &Delta) {
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
    fn discarded(&self) {
        tracing::info!("response did not complete; its delivery-state changes are not committed");
        self.metrics
            .commits_total
            .with_label_values(&["discarded"])
            .inc();
    }

    /// Checks the store can be written, and records the answer in `sluice_store_up`.
    async fn check_store(&self) -> Result<(), crate::store::StoreError> {
        let checked = self.artifacts.check().await;
        self.metrics
            .store_up
            .with_label_values(&[self.sessions.backend()])
            .set(i64::from(checked.is_ok()));
        checked
    }

    /// The admin listener: `/healthz`, `/readyz`, `/metrics` (O2).
    async fn admin(&self, req: &Request<Incoming>) -> Response<Body> {
        let (status, content_type, body) = match (req.method(), req.uri().path()) {
            (&Method::GET, "/healthz") => (StatusCode::OK, "text/plain", Bytes::from("ok\n")),
            (&Method::GET, "/readyz") if self.draining.load(Ordering::SeqCst) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                Bytes::from("draining\n"),
            ),
            (&Method::GET, "/readyz") => match self.check_store().await {
                Ok(()) => (StatusCode::OK, "text/plain", Bytes::from("ready\n")),
                Err(e) => {
                    tracing::warn!(error = %e, "not ready: the store cannot be written");
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain",
                        Bytes::from("store unavailable\n"),
                    )
                }
            },
            (&Method::GET, "/metrics") => (
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                Bytes::from(self.metrics.render()),
            ),
            _ => (
                StatusCode::NOT_FOUND,
                "text/plain",
                Bytes::from("not found\n"),
            ),
        };
        let mut response = Response::new(full(body));
        *response.status_mut() = status;
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(content_type),
        );
        response
    }
}

/// Reads a request body, refusing it as soon as it passes `limit` bytes (P4: 413), and at once
/// when its declared length already does; one that has not fully arrived within `timeout` gets
/// 408. Each chunk takes its room under `max_inflight_body_bytes` (`room`) first: the permit
/// returned holds it until dropped; no room within [`BODY_ROOM_WAIT`] is a 503. A single-chunk
/// body is kept without a copy.
async fn read_body(
    mut incoming: Incoming,
    headers: &http::HeaderMap,
    limit: u64,
    timeout: Duration,
    room: &Arc<tokio::sync::Semaphore>,
) -> Result<(Bytes, Option<tokio::sync::OwnedSemaphorePermit>), GatewayError> {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        drain(incoming).await;
        return Err(GatewayError::BodyTooLarge { limit });
    }
    let started = tokio::time::Instant::now();
    let (deadline, room_deadline) = (started + timeout, started + BODY_ROOM_WAIT);
    // Each byte received buys the body more time, at the minimum rate, after the grace.
    let paced = |total: u64| {
        started
            + BODY_GRACE
            + Duration::from_millis(total.saturating_mul(1000) / BODY_MIN_BYTES_PER_SECOND)
    };
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut held: Option<tokio::sync::OwnedSemaphorePermit> = None;
    let mut total = 0u64;
    loop {
        let until = deadline.min(paced(total));
        let frame = match tokio::time::timeout_at(until, incoming.frame()).await {
            Err(_) => {
                return Err(GatewayError::BodyTimeout {
                    seconds: timeout.as_secs_f64(),
                })
            }
            Ok(None) => break,
            Ok(Some(frame)) => frame,
        };
        let frame = frame.map_err(|e| {
            tracing::debug!(error = %e, "client body read failed");
            GatewayError::ClientBody
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        total += data.len() as u64;
        if total > limit {
            drain(incoming).await;
            return Err(GatewayError::BodyTooLarge { limit });
        }
        let wanted = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let permit =
            tokio::time::timeout_at(room_deadline, room.clone().acquire_many_owned(wanted));
        match permit.await {
            Ok(Ok(permit)) => match &mut held {
                Some(held) => held.merge(permit),
                None => held = Some(permit),
            },
            _ => return Err(GatewayError::Overloaded),
        }
        chunks.push(data);
    }
    let body = match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.swap_remove(0),
        _ => Bytes::from(chunks.concat()),
    };
    Ok((body, held))
}

/// A client body streamed to the upstream (P5), cut when it has not fully arrived by its
/// deadline; `expired` says so, for the 408.
struct TimedBody {
    inner: Incoming,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    expired: Arc<AtomicBool>,
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        use std::task::Poll;
        if let Poll::Ready(frame) = std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(BoxError::from)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.expired.store(true, Ordering::Relaxed);
                Poll::Ready(Some(Err("the request body did not arrive in time".into())))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Decodes a compressed request body off the I/O thread, refusing it as soon as its decoded
/// size passes `limit` (a bomb costs at most `limit` bytes of memory and the CPU to get there).
async fn decode_body(body: Bytes, coding: Coding, limit: u64) -> Result<Bytes, GatewayError> {
    let decoded = tokio::task::spawn_blocking(move || {
        let Some(mut decoder) = Decoder::new(coding) else {
            return Ok(body);
        };
        let cap = usize::try_from(limit).unwrap_or(usize::MAX);
        let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(cap));
        decoder
            .decode_into(Some(&body), &mut out, cap)
            .and_then(|()| decoder.decode_into(None, &mut out, cap))
            .map_err(|e| match e {
                DecodeError::Sink(TooLarge) => GatewayError::BodyTooLarge { limit },
                other => GatewayError::BadEncoding(other.to_string()),
            })?;
        Ok(Bytes::from(out))
    })
    .await;
    decoded.map_err(|_| GatewayError::Internal)?
}

/// Bytes of a refused body still read (and dropped) so the client finishes sending and can read
/// the 413, instead of failing with a broken pipe.
const DRAIN_MAX_BYTES: u64 = 8 * 1024 * 1024;
const DRAIN_MAX_TIME: Duration = Duration::from_secs(2);

/// Reads and drops what is left of a refused body, within [`DRAIN_MAX_BYTES`] and
/// [`DRAIN_MAX_TIME`]; past either, the connection is closed with the response.
async fn drain(mut incoming: Incoming) {
    let _ = tokio::time::timeout(DRAIN_MAX_TIME, async move {
        let mut dropped = 0u64;
        while let Some(Ok(frame)) = incoming.frame().await {
            dropped += frame.data_ref().map_or(0, |d| d.len() as u64);
            if dropped > DRAIN_MAX_BYTES {
                break;
            }
        }
    })
    .await;
}

fn plain(status: StatusCode, content_type: &'static str, bytes: Bytes) -> Response<Body> {
    let mut response = Response::new(full(bytes));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    response
}

fn full(bytes: Bytes) -> Body {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}
