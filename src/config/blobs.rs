//! `[store.blobs]` (#39): where artifacts are kept. `"store"` keeps them where the state is
//! (files beside the embedded store, keys in Redis); `"s3"` puts them in an S3-compatible
//! bucket, with either state store. Credentials are not config: they come from the standard
//! AWS environment (docs/delivery-state.md), so `check-config` never prints them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum BlobsBackend {
    #[default]
    Store,
    S3,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BlobsConfig {
    pub backend: BlobsBackend,
    /// Empty: the provider's default endpoint for the region (AWS).
    pub endpoint: String,
    pub bucket: String,
    pub region: String,
    /// Put before every object's key, so a bucket can be shared (and a lifecycle rule scoped).
    pub prefix: String,
}

impl Default for BlobsConfig {
    fn default() -> Self {
        BlobsConfig {
            backend: BlobsBackend::Store,
            endpoint: String::new(),
            bucket: String::new(),
            region: "us-east-1".into(),
            prefix: "artifacts/".into(),
        }
    }
}

impl BlobsConfig {
    /// `Err((key, message))` for a value that cannot work.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.backend != BlobsBackend::S3 {
            return Ok(());
        }
        if self.bucket.is_empty() {
            return Err((
                "store.blobs.bucket",
                "must name the bucket when backend = \"s3\"".into(),
            ));
        }
        let url = self.endpoint.starts_with("http://") || self.endpoint.starts_with("https://");
        if !(self.endpoint.is_empty() || url) {
            return Err((
                "store.blobs.endpoint",
                "must be an http:// or https:// URL, or empty for the region's AWS endpoint".into(),
            ));
        }
        if self.prefix.starts_with('/') || (!self.prefix.is_empty() && !self.prefix.ends_with('/'))
        {
            return Err((
                "store.blobs.prefix",
                "must be empty or end with '/', and not start with one (e.g. \"artifacts/\")"
                    .into(),
            ));
        }
        Ok(())
    }
}
