//! Artifacts in S3-compatible object storage (`[store.blobs] backend = "s3"`, #39), through the
//! `object_store` crate: one object per artifact at `<prefix><tenant namespace>/<id>`, beside
//! whichever state store runs (embedded or Redis), so the state store holds no artifact bytes.
//!
//! - Written before a reference goes out (T3): a put returns once S3 acknowledged the whole
//!   object (a PUT is atomic: a reader sees all of it or nothing). Content-addressed: a put of
//!   an object that exists and is fresh costs a HEAD, no upload.
//! - Idle expiry (S2) by the object's last-modified time: a put or a read that reaches the
//!   bucket for an object older than a quarter of the idle TTL uploads it again (the bytes are
//!   in hand either way). The cache in front of the store sends each artifact's use to the
//!   bucket at least every half TTL, so an artifact a live session still uses is never older
//!   than three quarters of the TTL; [`S3Store::sweep`] deletes what is older than the TTL.
//!   A bucket lifecycle rule expiring objects a day after the TTL is the backstop
//!   (docs/delivery-state.md).
//! - Bounded waits: every request has a timeout and at most two retries, so a slow or absent
//!   S3 fails a request's artifact write within [`S3_WAIT`], as a full disk would.
//! - Credentials from the standard AWS environment (`AWS_ACCESS_KEY_ID`,
//!   `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, a web-identity token file); never logged.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{
    ClientOptions, GetOptions, GetRange, GetResult, ObjectStore, ObjectStoreExt, RetryConfig,
};

use super::{ArtifactId, ArtifactStore, StoreError};
use crate::config::blobs::BlobsConfig;
use crate::tenant::Tenant;

/// The longest a request waits on object storage for one artifact, retries included.
pub const S3_WAIT: Duration = Duration::from_secs(10);
/// One attempt's limit; a large artifact's upload gets the whole of [`S3_WAIT`].
const ATTEMPT: Duration = Duration::from_secs(8);

/// An artifact read back: whole, or streamed from the bucket with its size.
pub enum Read {
    Whole(Bytes),
    Stream {
        size: u64,
        stream: futures_util::stream::BoxStream<'static, Result<Bytes, StoreError>>,
    },
}

/// Artifacts in an S3-compatible bucket, under `prefix` and the tenant's namespace.
pub struct S3Store {
    store: AmazonS3,
    prefix: String,
    ttl: Duration,
}

fn failed(e: object_store::Error) -> StoreError {
    // The crate's messages name the bucket and path, never the credentials.
    StoreError::Io(std::io::Error::other(format!("object storage: {e}")))
}

/// `op` given at most [`S3_WAIT`], retries included: a server that accepts and never answers
/// fails like one that is down.
async fn bounded<T>(
    op: impl std::future::Future<Output = object_store::Result<T>>,
) -> object_store::Result<T> {
    tokio::time::timeout(S3_WAIT, op).await.unwrap_or_else(|_| {
        Err(object_store::Error::Generic {
            store: "S3",
            source: format!("no answer within {} s", S3_WAIT.as_secs()).into(),
        })
    })
}

impl S3Store {
    /// A client for the configured bucket; nothing is sent until the first use.
    pub fn open(config: &BlobsConfig, ttl: Duration) -> Result<S3Store, String> {
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(ATTEMPT)
                    .with_connect_timeout(Duration::from_secs(2))
                    .with_allow_http(config.endpoint.starts_with("http://")),
            )
            .with_retry(RetryConfig {
                max_retries: 2,
                retry_timeout: S3_WAIT,
                ..RetryConfig::default()
            });
        if !config.endpoint.is_empty() {
            // A self-hosted server (SeaweedFS, MinIO, Ceph) is addressed by path.
            builder = builder
                .with_endpoint(&config.endpoint)
                .with_virtual_hosted_style_request(false);
        }
        let store = builder.build().map_err(|e| e.to_string())?;
        Ok(S3Store {
            store,
            prefix: config.prefix.clone(),
            ttl,
        })
    }

    fn path(&self, tenant: &Tenant, id: &ArtifactId) -> Path {
        Path::from(format!("{}{}/{id}", self.prefix, tenant.namespace()))
    }

    /// Whether an object written at `modified` (seconds) should be written again to stay
    /// alive: older than a quarter of the TTL.
    fn stale(&self, modified: i64) -> bool {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        now.saturating_sub(modified) > (self.ttl / 4).as_secs() as i64
    }

    /// An artifact over `whole_up_to` bytes as a stream from the bucket (not held in memory),
    /// a smaller one whole (as [`ArtifactStore::get`]); `Ok(None)` when there is none.
    pub async fn read(
        &self,
        tenant: &Tenant,
        id: &ArtifactId,
        whole_up_to: u64,
    ) -> Result<Option<Read>, StoreError> {
        let path = self.path(tenant, id);
        let got = match bounded(self.store.get(&path)).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(failed(e)),
        };
        if got.meta.size <= whole_up_to {
            return self.whole(&path, got).await.map(|b| Some(Read::Whole(b)));
        }
        let size = got.meta.size;
        if self.stale(got.meta.last_modified.timestamp()) {
            self.refresh_in_place(&path).await;
        }
        let stream = got.into_stream().map(|chunk| chunk.map_err(failed)).boxed();
        Ok(Some(Read::Stream { size, stream }))
    }

    /// Renews the idle time of an object too large to hold (S2: a streamed read keeps it alive
    /// as a whole one does) without passing its bytes through sluice: copied server-side to a
    /// sibling key and back, since S3 refuses a copy onto itself that changes nothing. The
    /// object stays readable throughout (the copy back replaces it whole); a failure costs only
    /// the refresh, and a sibling left behind by one is swept after the TTL like any object.
    async fn refresh_in_place(&self, path: &Path) {
        let sibling = Path::from(format!("{path}.refresh"));
        let renewed = async {
            bounded(self.store.copy(path, &sibling)).await?;
            bounded(self.store.copy(&sibling, path)).await?;
            bounded(self.store.delete(&sibling)).await
        };
        if let Err(e) = renewed.await {
            tracing::warn!(error = %failed(e), "cannot refresh an artifact's idle time");
        }
    }

    /// A fetched object's bytes, written again first when it is getting old (S2: a read keeps
    /// the artifact alive, once per quarter TTL at most; a failure costs only the refresh).
    async fn whole(&self, path: &Path, got: GetResult) -> Result<Bytes, StoreError> {
        let modified = got.meta.last_modified.timestamp();
        let bytes = bounded(got.bytes()).await.map_err(failed)?;
        if self.stale(modified) {
            if let Err(e) = self.upload(path, bytes.clone()).await {
                tracing::warn!(error = %e, "cannot refresh an artifact's idle time");
            }
        }
        Ok(bytes)
    }

    async fn upload(&self, path: &Path, bytes: Bytes) -> Result<(), StoreError> {
        bounded(self.store.put(path, bytes.into()))
            .await
            .map(|_| ())
            .map_err(failed)
    }

    /// Deletes artifacts under the prefix not written for the idle TTL (S2); returns how many.
    pub async fn sweep(&self) -> Result<usize, StoreError> {
        let Some(cutoff) = SystemTime::now().checked_sub(self.ttl) else {
            return Ok(0);
        };
        let cutoff = cutoff
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let prefix = Path::from(self.prefix.trim_end_matches('/'));
        let mut listing = self.store.list(Some(&prefix));
        let mut deleted = 0;
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(failed)?;
            if meta.last_modified.timestamp() < cutoff {
                match self.store.delete(&meta.location).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => deleted += 1,
                    Err(e) => return Err(failed(e)),
                }
            }
        }
        Ok(deleted)
    }
}

impl ArtifactStore for S3Store {
    async fn put(&self, tenant: &Tenant, id: &ArtifactId, bytes: Bytes) -> Result<(), StoreError> {
        let path = self.path(tenant, id);
        match bounded(self.store.head(&path)).await {
            Ok(meta) if !self.stale(meta.last_modified.timestamp()) => Ok(()),
            Ok(_) | Err(object_store::Error::NotFound { .. }) => self.upload(&path, bytes).await,
            Err(e) => Err(failed(e)),
        }
    }

    async fn get(&self, tenant: &Tenant, id: &ArtifactId) -> Result<Option<Bytes>, StoreError> {
        let path = self.path(tenant, id);
        match bounded(self.store.get(&path)).await {
            Ok(got) => self.whole(&path, got).await.map(Some),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(failed(e)),
        }
    }

    async fn get_range(
        &self,
        tenant: &Tenant,
        id: &ArtifactId,
        range: std::ops::Range<u64>,
    ) -> Result<Option<(Bytes, u64)>, StoreError> {
        let path = self.path(tenant, id);
        let options = GetOptions {
            // An empty range asks for the first byte: the answer carries the size either way.
            range: Some(GetRange::Bounded(
                range.start..range.end.max(range.start + 1),
            )),
            ..GetOptions::default()
        };
        let got = match bounded(self.store.get_opts(&path, options)).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(failed(e)),
        };
        let size = got.meta.size;
        if self.stale(got.meta.last_modified.timestamp()) {
            self.refresh_in_place(&path).await;
        }
        let bytes = bounded(got.bytes()).await.map_err(failed)?;
        let keep = (range.end.saturating_sub(range.start) as usize).min(bytes.len());
        Ok(Some((bytes.slice(..keep), size)))
    }

    /// The bucket answers for this client: a HEAD of a key that is never written is a 404
    /// (reachable, credentials accepted), anything else an error.
    async fn check(&self) -> Result<(), StoreError> {
        let probe = Path::from(format!("{}.sluice-ready", self.prefix));
        match bounded(self.store.head(&probe)).await {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(failed(e)),
        }
    }
}
