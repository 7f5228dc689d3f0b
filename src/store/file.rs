//! The embedded artifact store: one file per artifact under `<data_dir>/artifacts/<tenant
//! namespace>/<2 chars>/<id>`, written atomically (temporary file, fsync, rename), so a reader
//! sees a whole artifact or none, and concurrent writers of one id are harmless.

use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::{ArtifactId, ArtifactStore, StoreError};
use crate::tenant::Tenant;

pub struct FileStore {
    root: PathBuf,
}

impl FileStore {
    /// Opens (creating) the artifact folder under `data_dir` and checks it can be written, so a
    /// wrong or read-only data dir is a startup error that names the path.
    pub fn open(data_dir: &Path) -> Result<FileStore, std::io::Error> {
        let root = data_dir.join("artifacts");
        std::fs::create_dir_all(&root)?;
        let store = FileStore { root };
        store.probe()?;
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Deletes artifacts not read or written for `ttl` (S2), by their modification time, which
    /// reads refresh. Returns how many were deleted.
    pub fn sweep(&self, ttl: std::time::Duration) -> usize {
        let Some(cutoff) = std::time::SystemTime::now().checked_sub(ttl) else {
            return 0;
        };
        let mut deleted = 0;
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(meta) = entry.metadata() else { continue };
                if meta.is_dir() {
                    stack.push(path);
                } else if meta.modified().is_ok_and(|m| m < cutoff)
                    && std::fs::remove_file(&path).is_ok()
                {
                    deleted += 1;
                }
            }
        }
        deleted
    }

    fn probe(&self) -> Result<(), std::io::Error> {
        let probe = self
            .root
            .join(format!(".probe-{}", uuid::Uuid::new_v4().simple()));
        std::fs::write(&probe, b"ok")?;
        std::fs::remove_file(&probe)
    }

    fn path(&self, tenant: &Tenant, id: &ArtifactId) -> PathBuf {
        let name = id.to_string();
        self.root
            .join(tenant.namespace())
            .join(&name[1..3])
            .join(name)
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), std::io::Error> {
    if path.exists() {
        // Stored already (content-addressed): only its idle time restarts.
        return std::fs::File::options()
            .append(true)
            .open(path)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".tmp-{}", uuid::Uuid::new_v4().simple()));
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A read keeps the artifact alive (S2: expiry counts idle time); a failure costs only that.
fn touch(path: &Path) {
    let _ = std::fs::File::options()
        .append(true)
        .open(path)
        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, std::io::Error> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| StoreError::Task)?
        .map_err(StoreError::Io)
}

impl ArtifactStore for FileStore {
    async fn put(&self, tenant: &Tenant, id: &ArtifactId, bytes: Bytes) -> Result<(), StoreError> {
        let path = self.path(tenant, id);
        blocking(move || write_atomically(&path, &bytes)).await
    }

    async fn get(&self, tenant: &Tenant, id: &ArtifactId) -> Result<Option<Bytes>, StoreError> {
        let path = self.path(tenant, id);
        blocking(move || match std::fs::read(&path) {
            Ok(bytes) => {
                touch(&path);
                Ok(Some(Bytes::from(bytes)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        })
        .await
    }

    async fn get_range(
        &self,
        tenant: &Tenant,
        id: &ArtifactId,
        range: std::ops::Range<u64>,
    ) -> Result<Option<(Bytes, u64)>, StoreError> {
        use std::io::{Read, Seek};
        let path = self.path(tenant, id);
        blocking(move || {
            let mut file = match std::fs::File::open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            };
            let size = file.metadata()?.len();
            let end = range.end.min(size);
            let start = range.start.min(end);
            file.seek(std::io::SeekFrom::Start(start))?;
            let mut bytes = Vec::with_capacity((end - start) as usize);
            file.take(end - start).read_to_end(&mut bytes)?;
            touch(&path);
            Ok(Some((Bytes::from(bytes), size)))
        })
        .await
    }

    async fn check(&self) -> Result<(), StoreError> {
        let root = self.root.clone();
        blocking(move || FileStore { root }.probe()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ArtifactKind;

    #[tokio::test]
    async fn put_get_is_tenant_scoped_and_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        let (a, b) = (Tenant::from_credential(b"a"), Tenant::from_credential(b"b"));
        let id = ArtifactId::for_content(&a, ArtifactKind::Text, b"text");
        store
            .put(&a, &id, Bytes::from_static(b"text"))
            .await
            .unwrap();
        store
            .put(&a, &id, Bytes::from_static(b"text"))
            .await
            .unwrap();
        assert_eq!(
            store.get(&a, &id).await.unwrap().as_deref(),
            Some(&b"text"[..])
        );
        assert_eq!(
            store.get(&b, &id).await.unwrap(),
            None,
            "S3: another tenant sees nothing"
        );
        // No temporary files are left behind.
        let mut stack = vec![store.root().to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                assert!(!path
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(".tmp"));
                if path.is_dir() {
                    stack.push(path);
                }
            }
        }
    }

    #[test]
    fn an_unwritable_data_dir_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"x").unwrap();
        assert!(FileStore::open(&file).is_err());
    }
}
