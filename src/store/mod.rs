//! Stores at the edge of sluice: artifacts (immutable, content-addressed, tenant-scoped blobs,
//! SPEC section 1, S1-S3) behind [`ArtifactStore`], with a bounded cache in front.
//!
//! Backends: [`file::FileStore`] (embedded default, files under `store.data_dir`); the Redis
//! backend of shared mode and [`s3::S3Store`] (`[store.blobs] backend = "s3"`, with either
//! state store) implement the same trait.

pub mod file;
pub mod redis;
pub mod s3;
pub mod session;

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::metrics::Metrics;
pub use crate::projection::artifact::{ArtifactId, ArtifactKind, ARTIFACT_ID_LEN};
use crate::projection::exit::index::TextIndex;
use crate::tenant::Tenant;

/// Bytes of artifacts kept in memory in front of the store: pages of recently spilled results
/// are read from here. Bounded, so a burst of large artifacts cannot grow memory without limit.
const ARTIFACT_CACHE_BYTES: u64 = 32 * 1024 * 1024;
/// The largest artifact the cache takes: a bigger one would push out everything else (and, as
/// the cache trims itself only on later use, stay in memory after a burst until then).
const ARTIFACT_CACHE_MAX_ENTRY: usize = (ARTIFACT_CACHE_BYTES / 4) as usize;

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
    /// Bytes `range` of the artifact (cut at its end) and its whole size; `Ok(None)` when this
    /// tenant has no such artifact. A read of part keeps the artifact alive as a whole one does
    /// (S2). Backends read only the range; this default reads the whole artifact.
    fn get_range(
        &self,
        tenant: &Tenant,
        id: &ArtifactId,
        range: Range<u64>,
    ) -> impl Future<Output = Result<Option<(Bytes, u64)>, StoreError>> + Send {
        async move {
            let found = self.get(tenant, id).await?;
            Ok(found.map(|bytes| {
                let size = bytes.len() as u64;
                (slice(&bytes, range, size), size)
            }))
        }
    }
    /// `Ok(())` while the store can be written (readiness, O2).
    fn check(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// `range` of `bytes` (an artifact of `size` bytes), cut at the end.
fn slice(bytes: &Bytes, range: Range<u64>, size: u64) -> Bytes {
    let end = range.end.min(size) as usize;
    let start = (range.start as usize).min(end);
    bytes.slice(start..end)
}

/// The configured backend.
pub enum Backend {
    File(file::FileStore),
    Redis(redis::RedisStore),
    S3(s3::S3Store),
}

impl ArtifactStore for Backend {
    async fn put(&self, tenant: &Tenant, id: &ArtifactId, bytes: Bytes) -> Result<(), StoreError> {
        match self {
            Backend::File(s) => s.put(tenant, id, bytes).await,
            Backend::Redis(s) => s.put(tenant, id, bytes).await,
            Backend::S3(s) => s.put(tenant, id, bytes).await,
        }
    }

    async fn get(&self, tenant: &Tenant, id: &ArtifactId) -> Result<Option<Bytes>, StoreError> {
        match self {
            Backend::File(s) => s.get(tenant, id).await,
            Backend::Redis(s) => s.get(tenant, id).await,
            Backend::S3(s) => s.get(tenant, id).await,
        }
    }

    async fn get_range(
        &self,
        tenant: &Tenant,
        id: &ArtifactId,
        range: Range<u64>,
    ) -> Result<Option<(Bytes, u64)>, StoreError> {
        match self {
            Backend::File(s) => s.get_range(tenant, id, range).await,
            Backend::Redis(s) => s.get_range(tenant, id, range).await,
            Backend::S3(s) => s.get_range(tenant, id, range).await,
        }
    }

    async fn check(&self) -> Result<(), StoreError> {
        match self {
            Backend::File(s) => s.check().await,
            Backend::Redis(s) => s.check().await,
            Backend::S3(s) => s.check().await,
        }
    }
}

/// A backend that may keep its artifacts in a bucket, which [`Artifacts::read`] streams from.
pub trait AsBucket {
    fn bucket(&self) -> Option<&s3::S3Store>;
}

impl AsBucket for Backend {
    fn bucket(&self) -> Option<&s3::S3Store> {
        match self {
            Backend::S3(s) => Some(s),
            Backend::File(_) | Backend::Redis(_) => None,
        }
    }
}

/// Bytes of text indexes kept in memory (`exit::index`): about 15 KB for a 60 MB text.
const TEXT_INDEX_BYTES: u64 = 4 * 1024 * 1024;

/// The largest artifact read whole (and cached): pages of a larger text are cut from ranges.
pub const WHOLE_UP_TO: usize = ARTIFACT_CACHE_MAX_ENTRY;

/// The artifact store sluice uses: a backend with a bounded cache of recent artifacts in front.
pub struct Artifacts<S> {
    backend: S,
    /// Keyed by the tenant's key material (no hashing per lookup) and the id.
    cache: moka::sync::Cache<([u8; 32], ArtifactId), Bytes>,
    /// The indexes of texts too large for `cache`, which their pages are cut from.
    indexes: moka::sync::Cache<([u8; 32], ArtifactId), Arc<TextIndex>>,
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
        let indexes = moka::sync::Cache::builder()
            .max_capacity(TEXT_INDEX_BYTES)
            .time_to_idle(ttl)
            .weigher(|_, v: &Arc<TextIndex>| u32::try_from(v.weight()).unwrap_or(u32::MAX))
            .build();
        Self {
            backend,
            cache,
            indexes,
            metrics,
        }
    }

    /// The artifact if this process holds it whole, without asking the store.
    pub fn cached(&self, tenant: &Tenant, id: &ArtifactId) -> Option<Bytes> {
        self.cache.get(&(*tenant.key(), *id))
    }

    /// Bytes `range` of the artifact and its size, from the store (or the cache).
    pub async fn range(
        &self,
        tenant: &Tenant,
        id: &ArtifactId,
        range: Range<u64>,
    ) -> Result<Option<(Bytes, u64)>, StoreError> {
        if let Some(bytes) = self.cached(tenant, id) {
            let size = bytes.len() as u64;
            return Ok(Some((slice(&bytes, range, size), size)));
        }
        let start = Instant::now();
        let result = self.backend.get_range(tenant, id, range).await;
        self.observe("range", start, result.is_ok());
        result
    }

    /// Keeps an artifact read whole in the cache (as [`Artifacts::get`] does).
    pub fn keep(&self, tenant: &Tenant, id: &ArtifactId, bytes: &Bytes) {
        self.remember((*tenant.key(), *id), bytes);
    }

    /// The index of a large text this process built before.
    pub fn index(&self, tenant: &Tenant, id: &ArtifactId) -> Option<Arc<TextIndex>> {
        self.indexes.get(&(*tenant.key(), *id))
    }

    pub fn keep_index(&self, tenant: &Tenant, id: &ArtifactId, index: Arc<TextIndex>) {
        self.indexes.insert((*tenant.key(), *id), index);
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
        self.write(tenant, id, bytes.clone()).await?;
        self.remember(key, &bytes);
        Ok(())
    }

    /// An artifact to be written in the background: readable through this process's cache
    /// from now on. `false` when it is known already (nothing to write).
    pub fn stage(&self, tenant: &Tenant, id: &ArtifactId, bytes: &Bytes) -> bool {
        let key = (*tenant.key(), *id);
        if self.cache.contains_key(&key) {
            return false;
        }
        self.remember(key, bytes);
        true
    }

    /// A staged artifact whose write failed: no longer served from the cache, so a later
    /// `put` of it writes it again.
    pub fn unstage(&self, tenant: &Tenant, id: &ArtifactId) {
        self.cache.invalidate(&(*tenant.key(), *id));
    }

    /// Writes an artifact to the backend, whatever the cache holds (after [`Artifacts::stage`]).
    pub async fn write(
        &self,
        tenant: &Tenant,
        id: &ArtifactId,
        bytes: Bytes,
    ) -> Result<(), StoreError> {
        let start = Instant::now();
        let result = self.backend.put(tenant, id, bytes).await;
        self.observe("put", start, result.is_ok());
        result
    }

    /// The artifact for a download: whole from the cache or a store that keeps it in memory
    /// anyway, streamed from a bucket when it is too large for the cache (25 MB of audio, 60 MB
    /// of text need not sit in memory while a client reads them).
    pub async fn read(
        &self,
        tenant: &Tenant,
        id: &ArtifactId,
    ) -> Result<Option<s3::Read>, StoreError>
    where
        S: AsBucket,
    {
        let Some(bucket) = self.backend.bucket() else {
            return Ok(self.get(tenant, id).await?.map(s3::Read::Whole));
        };
        let key = (*tenant.key(), *id);
        if let Some(bytes) = self.cache.get(&key) {
            return Ok(Some(s3::Read::Whole(bytes)));
        }
        let start = Instant::now();
        let result = bucket
            .read(tenant, id, ARTIFACT_CACHE_MAX_ENTRY as u64)
            .await;
        let op = match &result {
            Ok(Some(s3::Read::Stream { .. })) => "stream",
            _ => "get",
        };
        self.observe(op, start, result.is_ok());
        let found = result?;
        if let Some(s3::Read::Whole(bytes)) = &found {
            self.remember(key, bytes);
        }
        Ok(found)
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
            self.remember(key, bytes);
        }
        Ok(found)
    }

    /// Caches an artifact the store holds, unless it is over [`ARTIFACT_CACHE_MAX_ENTRY`].
    fn remember(&self, key: ([u8; 32], ArtifactId), bytes: &Bytes) {
        if bytes.len() <= ARTIFACT_CACHE_MAX_ENTRY {
            self.cache.insert(key, bytes.clone());
        }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A backend in memory that counts its reads.
    #[derive(Default)]
    struct Counting {
        gets: AtomicUsize,
        kept: std::sync::Mutex<Vec<(ArtifactId, Bytes)>>,
    }

    impl ArtifactStore for Counting {
        async fn put(&self, _: &Tenant, id: &ArtifactId, bytes: Bytes) -> Result<(), StoreError> {
            self.kept.lock().unwrap().push((*id, bytes));
            Ok(())
        }
        async fn get(&self, _: &Tenant, id: &ArtifactId) -> Result<Option<Bytes>, StoreError> {
            self.gets.fetch_add(1, Ordering::Relaxed);
            let kept = self.kept.lock().unwrap();
            Ok(kept.iter().find(|(k, _)| k == id).map(|(_, b)| b.clone()))
        }
        async fn check(&self) -> Result<(), StoreError> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn small_artifacts_are_read_from_the_cache_large_ones_from_the_store() {
        let metrics = Arc::new(Metrics::new().unwrap());
        let artifacts = Artifacts::new(
            Counting::default(),
            metrics,
            std::time::Duration::from_secs(60),
        );
        let tenant = Tenant::from_credential(b"k");
        let small = Bytes::from(vec![b'a'; 1024]);
        let large = Bytes::from(vec![b'b'; ARTIFACT_CACHE_MAX_ENTRY + 1]);
        let small_id = ArtifactId::for_content(&tenant, ArtifactKind::Text, &small);
        let large_id = ArtifactId::for_content(&tenant, ArtifactKind::Text, &large);
        artifacts
            .put(&tenant, &small_id, small.clone())
            .await
            .unwrap();
        artifacts
            .put(&tenant, &large_id, large.clone())
            .await
            .unwrap();
        assert_eq!(
            artifacts.get(&tenant, &small_id).await.unwrap(),
            Some(small)
        );
        assert_eq!(artifacts.backend.gets.load(Ordering::Relaxed), 0);
        for _ in 0..2 {
            let got = artifacts.get(&tenant, &large_id).await.unwrap();
            assert_eq!(got.as_ref(), Some(&large));
        }
        assert_eq!(artifacts.backend.gets.load(Ordering::Relaxed), 2);
    }
}
