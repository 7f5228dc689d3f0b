//! Per-tenant shares of the gateway (`[limits]`, docs/reliability.md "Tenants"): requests in
//! flight, a token-bucket request rate and buffered body bytes, per credential. A request over
//! its tenant's share is refused with 429 and `retry-after` before its body is read (for body
//! bytes: as soon as its declared length, or its next chunk, would pass the share), so what it
//! would have held (body room, the heavy pool, upstream connections) stays with the others.
//! Places on the heavy pool are shared in turn across tenants (`fair.rs`).
//!
//! Before a tenant is known (its headers still arriving), connections are capped per source
//! address (`address_connections`): one address cannot take every place under `max_connections`.
//!
//! Shares are per process: each replica of a shared gateway applies them on its own.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::config::LimitsConfig;
use crate::error::GatewayError;
use crate::tenant::Tenant;

use super::busiest::Busiest;

/// Tenants remembered at once; a quiet one is forgotten after [`IDLE`], and one forgotten while
/// busy starts afresh (its requests in flight still end on the entry they hold).
const TENANTS: u64 = 100_000;
const IDLE: Duration = Duration::from_secs(600);
/// What a refusal for concurrency asks the client to wait: requests end within seconds.
const CONCURRENCY_RETRY_SECONDS: u64 = 1;

/// One tenant's use of its share.
struct Share {
    inflight: AtomicU32,
    /// Tokens left and when they were last counted (`None`: never, a full bucket).
    bucket: Mutex<Option<(f64, Instant)>>,
    /// One permit per body byte the tenant may hold buffered (`tenant_inflight_body_bytes`).
    body: Arc<tokio::sync::Semaphore>,
}

/// Every tenant's share, when any limit is set.
pub(super) struct Tenants {
    limits: LimitsConfig,
    /// Permits in each tenant's body room.
    body_share: usize,
    shares: moka::sync::Cache<Tenant, Arc<Share>>,
    busiest: Arc<Busiest>,
}

/// A request's place in its tenant's share, given back when dropped (at the end of the
/// response body).
pub(super) struct Admitted {
    share: Arc<Share>,
    busiest: Arc<Busiest>,
    label: Arc<str>,
}

impl Admitted {
    /// The tenant's room for buffered body bytes, taken before the gateway-wide one.
    pub(super) fn body_room(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.share.body
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.share.inflight.fetch_sub(1, Ordering::AcqRel);
        self.busiest.leave(&self.label);
    }
}

impl Tenants {
    /// `None` when `[limits]` sets no per-tenant limit: requests skip the table entirely.
    /// `body_bytes`: the gateway's `max_inflight_body_bytes` and `max_body_bytes`.
    pub(super) fn new(
        limits: &LimitsConfig,
        body_bytes: (u64, u64),
        gauge: prometheus::IntGaugeVec,
    ) -> Option<Tenants> {
        let share = limits.body_share(body_bytes.0, body_bytes.1);
        limits.any().then(|| Tenants {
            limits: limits.clone(),
            body_share: usize::try_from(share)
                .unwrap_or(usize::MAX)
                .min(tokio::sync::Semaphore::MAX_PERMITS),
            shares: moka::sync::Cache::builder()
                .max_capacity(TENANTS)
                .time_to_idle(IDLE)
                .build(),
            busiest: Arc::new(Busiest::new(gauge)),
        })
    }

    /// Admits one request of `tenant` now, or says which share it is over and when to retry.
    pub(super) fn admit(&self, tenant: &Tenant, now: Instant) -> Result<Admitted, GatewayError> {
        let share = self.shares.get_with_by_ref(tenant, || {
            Arc::new(Share {
                inflight: AtomicU32::new(0),
                bucket: Mutex::new(None),
                body: Arc::new(tokio::sync::Semaphore::new(self.body_share)),
            })
        });
        let max = self.limits.tenant_concurrency;
        let before = share.inflight.fetch_add(1, Ordering::AcqRel);
        // From here the place is held; dropping it gives it back on every refusal below.
        let admitted = Admitted {
            share,
            busiest: self.busiest.clone(),
            label: self.busiest.enter(tenant, now),
        };
        if max > 0 && before >= max {
            return Err(GatewayError::TenantLimited {
                limit: "concurrency",
                retry_after: CONCURRENCY_RETRY_SECONDS,
            });
        }
        let rate = self.limits.tenant_requests_per_second;
        if rate > 0.0 {
            let mut bucket = admitted
                .share
                .bucket
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let (left, wait) = take(*bucket, now, rate, self.limits.burst());
            *bucket = Some((left, now));
            if let Some(wait) = wait {
                return Err(GatewayError::TenantLimited {
                    limit: "rate",
                    retry_after: wait,
                });
            }
        }
        Ok(admitted)
    }
}

/// Connections open per source address (`address_connections`). An address is in the table only
/// while it has a connection open, so the table never holds more than `max_connections`.
pub(super) struct Addresses {
    max: u32,
    open: Arc<Mutex<HashMap<IpAddr, u32>>>,
}

/// A connection's place under its address's cap, given back when the connection ends.
pub(super) struct AddressSlot {
    ip: IpAddr,
    open: Arc<Mutex<HashMap<IpAddr, u32>>>,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

impl Addresses {
    /// `None` when `address_connections` is 0.
    pub(super) fn new(limits: &LimitsConfig) -> Option<Addresses> {
        (limits.address_connections > 0).then(|| Addresses {
            max: limits.address_connections,
            open: Arc::default(),
        })
    }

    /// A place for one more connection from `ip`, or `None` when it already holds its cap.
    pub(super) fn open(&self, ip: IpAddr) -> Option<AddressSlot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            ip,
            open: self.open.clone(),
        })
    }
}

/// A connection from an address already holding `address_connections`. No tenant is known yet,
/// so it is not served: its one request is answered 429 in its dialect's shape with
/// `retry-after` and `connection: close`. Its head must come within two seconds and the whole
/// answer within five, so refused connections cannot hold places under `max_connections` the
/// way served ones may.
pub(super) fn refuse_address(
    app: &Arc<super::App>,
    tasks: &tokio_util::task::TaskTracker,
    stream: tokio::net::TcpStream,
    permit: tokio::sync::OwnedSemaphorePermit,
    load: Arc<std::sync::atomic::AtomicUsize>,
) {
    let app = app.clone();
    tasks.spawn(async move {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .keep_alive(false)
            .header_read_timeout(Duration::from_secs(2));
        let service = hyper::service::service_fn(move |req| {
            let app = app.clone();
            async move {
                Ok::<_, std::convert::Infallible>(
                    app.handle(req, super::handle::Peer::refused()).await,
                )
            }
        });
        let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
        drop(permit);
        load.fetch_sub(1, Ordering::Relaxed);
    });
}

/// A token bucket of `burst` tokens refilled at `rate` per second: the tokens left after this
/// request, and, when it cannot be admitted, the whole seconds until it could (at least 1).
fn take(bucket: Option<(f64, Instant)>, now: Instant, rate: f64, burst: f64) -> (f64, Option<u64>) {
    let tokens = match bucket {
        None => burst,
        Some((left, at)) => {
            (left + now.saturating_duration_since(at).as_secs_f64() * rate).min(burst)
        }
    };
    if tokens >= 1.0 {
        (tokens - 1.0, None)
    } else {
        let wait = ((1.0 - tokens) / rate).ceil().max(1.0);
        (tokens, Some(wait as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(concurrency: u32, rate: f64, burst: u32) -> LimitsConfig {
        LimitsConfig {
            tenant_concurrency: concurrency,
            tenant_requests_per_second: rate,
            tenant_burst: burst,
            ..Default::default()
        }
    }

    fn table(limits: &LimitsConfig) -> Option<Tenants> {
        let gauge =
            prometheus::IntGaugeVec::new(prometheus::Opts::new("t", "t"), &["tenant"]).unwrap();
        Tenants::new(limits, (256 << 20, 32 << 20), gauge)
    }

    fn limit(r: Result<Admitted, GatewayError>) -> Option<&'static str> {
        match r {
            Ok(_) => None,
            Err(GatewayError::TenantLimited { limit, .. }) => Some(limit),
            Err(e) => panic!("{e}"),
        }
    }

    /// SPEC 9.1 `tenant_concurrency`: the fifth of four allowed is refused; another tenant is
    /// not; a place given back admits the next.
    #[test]
    fn concurrency_is_counted_per_tenant_and_given_back() {
        let tenants = table(&limits(4, 0.0, 0)).unwrap();
        let (a, b) = (Tenant::from_credential(b"a"), Tenant::from_credential(b"b"));
        let now = Instant::now();
        let held: Vec<Admitted> = (0..4).map(|_| tenants.admit(&a, now).unwrap()).collect();
        assert_eq!(limit(tenants.admit(&a, now)), Some("concurrency"));
        assert_eq!(limit(tenants.admit(&b, now)), None);
        drop(held);
        assert_eq!(limit(tenants.admit(&a, now)), None);
        assert!(table(&limits(0, 0.0, 0)).is_none());
    }

    /// SPEC 9.1 `tenant_requests_per_second` and `tenant_burst`: a full bucket admits the burst
    /// at once, then one request per 1/rate seconds; a refusal says when to come back.
    #[test]
    fn the_rate_is_a_token_bucket() {
        let tenants = table(&limits(0, 2.0, 3)).unwrap();
        let a = Tenant::from_credential(b"a");
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(limit(tenants.admit(&a, t0)), None);
        }
        match tenants.admit(&a, t0) {
            Err(GatewayError::TenantLimited { limit, retry_after }) => {
                assert_eq!((limit, retry_after), ("rate", 1));
            }
            _ => panic!("the fourth at once is over the burst"),
        }
        // Half a second refills one token at 2/s.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(limit(tenants.admit(&a, t1)), None);
        assert_eq!(limit(tenants.admit(&a, t1)), Some("rate"));
        // A long quiet spell refills no more than the burst.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(limit(tenants.admit(&a, t2)), None);
        }
        assert_eq!(limit(tenants.admit(&a, t2)), Some("rate"));
        // A slow rate asks for a longer wait.
        assert_eq!(take(Some((0.0, t0)), t0, 0.1, 1.0), (0.0, Some(10)));
    }

    /// SPEC 9.1 `address_connections`: an address at its cap gets no more until one closes;
    /// another address is not held back, and a closed address leaves the table.
    #[test]
    fn an_address_holds_at_most_its_cap_of_connections() {
        let limits = LimitsConfig {
            address_connections: 2,
            ..Default::default()
        };
        let addresses = Addresses::new(&limits).unwrap();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = addresses.open(a).unwrap();
        let _second = addresses.open(a).unwrap();
        assert!(addresses.open(a).is_none());
        let other = addresses.open(b).unwrap();
        drop(first);
        assert!(addresses.open(a).is_some());
        drop(other);
        assert!(!addresses.open.lock().unwrap().contains_key(&b));
        assert!(Addresses::new(&LimitsConfig::default()).is_none());
    }
}
