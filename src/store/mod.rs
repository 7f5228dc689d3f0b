//! Stores at the edge of sluice: artifacts (immutable, content-addressed, tenant-scoped blobs,
//! SPEC section 1, S1-S3) behind [`ArtifactStore`], with a bounded cache in front.
//!
//! Backends: [`file::FileStore`] (embedded default, files under `store.data_dir`); the Redis
//! backend of shared mode implements the same trait.

pub mod file;
pub mod redis;
pub mod session;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::metrics::Metrics;
pub use crate::projection::artifact::{ArtifactId, ArtifactKind, ARTIFACT_ID_LEN};
use crate::tenant::Tenant;

/// Bytes of artifacts kept in memory in front of the store: pages of recently spilled results
/// are read from here. Bounded, so a burst of large artifacts cannot grow memory without limit.
const ARTIFACT_CACHE_BYTES: u64 = 32 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store I/O failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("store task failed")]
    Task,
}

/// A backend for artifacts. Every method is scoped by tenant: a tenant never reaches another
/// tenant's artifacts, whatever id it names (S3).
pub trait ArtifactStore: Send + Sync + 'static {
    /// Stores `bytes` as artifact `id` of `tenant`. Idempotent: storing the same id twice keeps
    /// one artifact. `Ok(())` means the bytes are durable.
    fn put(
        &self,
        tenant: &Tenant,
        id: &ArtifactId,
        bytes: Bytes,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// The artifact's bytes; `Ok(None)` when this tenant has no such artifact.
    fn get(
        &self,
        tenant: &Tenant,
        id: &ArtifactId,
    ) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send;
    /// `Ok(())` while the store can be written (readiness, O2).
    fn check(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The configured backend.
pub enum Backend {
    File(file::FileStore),
    Redis(redis::RedisStore),
}

impl ArtifactStore for Backend {
    async fn put(&self, tenant: &Tenant, id: &ArtifactId, bytes: Bytes) -> Result<(), StoreError> {
        match self {
            Backend::File(s) => s.put(tenant, id, bytes).await,
            Backend::Redis(s) => s.put(tenant, id, bytes).await,
        }
    }

    async fn get(&self, tenant: &Tenant, id: &ArtifactId) -> Result<Option<Bytes>, StoreError> {
        match self {
            Backend::File(s) => s.get(tenant, id).await,
            Backend::Redis(s) => s.get(tenant, id).await,
        }
    }

    async fn check(&self) -> Result<(), StoreError> {
        match self {
            Backend::File(s) => s.check().await,
            Backend::Redis(s) => s.check().await,
        }
    }
}

/// The artifact store sluice uses: a backend with a bounded cache of recent artifacts in front.
pub struct Artifacts<S> {
    backend: S,
    /// Keyed by the tenant's key material (no hashing per lookup) and the id.
    cache: moka::sync::Cache<([u8; 32], ArtifactId), Bytes>,
    metrics: Arc<Metrics>,
}

impl<S: ArtifactStore> Artifacts<S> {
    /// `ttl` is the store's idle TTL: cached entries live at most half of it, so a `put` of a
    /// remembered artifact reaches the backend (and refreshes its expiry) in time (S2).
    pub fn new(backend: S, metrics: Arc<Metrics>, ttl: std::time::Duration) -> Self {
        let cache = moka::sync::Cache::builder()
            .max_capacity(ARTIFACT_CACHE_BYTES)
            .time_to_live(ttl / 2)
            .weigher(|_, v: &Bytes| u32::try_from(v.len()).unwrap_or(u32::MAX))
            .build();
        Self {
            backend,
            cache,
            metrics,
        }
    }

    pub async fn put(
        &self,
        tenant: &Tenant,
        id: &ArtifactId,
        bytes: Bytes,
    ) -> Result<(), StoreError> {
        let key = (*tenant.key(), *id);
        if self.cache.contains_key(&key) {
            return Ok(());
        }
        let start = Instant::now();
        let result = self.backend.put(tenant, id, bytes.clone()).await;
        self.observe("put", start, result.is_ok());
        result?;
        self.cache.insert(key, bytes);
        Ok(())
    }

    pub async fn get(&self, tenant: &Tenant, id: &ArtifactId) -> Result<Option<Bytes>, StoreError> {
        let key = (*tenant.key(), *id);
        if let Some(bytes) = self.cache.get(&key) {
            return Ok(Some(bytes));
        }
        let start = Instant::now();
        let result = self.backend.get(tenant, id).await;
        self.observe("get", start, result.is_ok());
        let found = result?;
        if let Some(bytes) = &found {
            self.cache.insert(key, bytes.clone());
        }
        Ok(found)
    }

    pub async fn check(&self) -> Result<(), StoreError> {
        self.backend.check().await
    }

    pub fn backend(&self) -> &S {
        &self.backend
    }

    fn observe(&self, op: &str, start: Instant, ok: bool) {
        self.metrics
            .artifact_store_seconds
            .with_label_values(&[op, if ok { "ok" } else { "error" }])
            .observe(start.elapsed().as_secs_f64());
    }
}
