//! Sessions (SPEC section 1, S1, S2): which conversation a request belongs to, and the store of
//! each session's delivery state. The key is, first found: the session header; a conversation id
//! the client already sends (Responses `prompt_cache_key`, Anthropic `metadata.user_id`); else a
//! fingerprint of the conversation's root (tenant, route, system prompt, first user message).
//! Scoped by tenant: the same id under two tenants is two sessions.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::projection::attach::state::{apply, Delta, SessionState};
use crate::projection::RequestView;
use crate::store::StoreError;
use crate::tenant::Tenant;

/// Where a session key came from (logged at debug with each session load).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    Header,
    Conversation,
    Fingerprint,
}

impl KeySource {
    pub fn as_str(self) -> &'static str {
        match self {
            KeySource::Header => "header",
            KeySource::Conversation => "conversation",
            KeySource::Fingerprint => "fingerprint",
        }
    }
}

/// A session's key: a digest of tenant and session id, so it reveals neither (S3).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey(pub String);

impl SessionKey {
    pub fn of(
        tenant: &Tenant,
        header: Option<&str>,
        view: &RequestView<'_>,
        route: &str,
    ) -> (SessionKey, KeySource) {
        let mut h = Sha256::new();
        h.update(b"sluice-session\0");
        h.update(tenant.key());
        let source = match (
            header.filter(|v| !v.is_empty()),
            view.conversation.as_deref(),
        ) {
            (Some(id), _) => {
                h.update(b"header\0");
                h.update(id.as_bytes());
                KeySource::Header
            }
            (None, Some(id)) => {
                h.update(b"conversation\0");
                h.update(id.as_bytes());
                KeySource::Conversation
            }
            (None, None) => {
                h.update(b"root\0");
                h.update(route.as_bytes());
                for part in &view.root {
                    h.update(b"\0");
                    h.update(part.as_bytes());
                }
                KeySource::Fingerprint
            }
        };
        let digest = h.finalize();
        let key = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        (SessionKey(key), source)
    }
}

/// A backend for session state. `commit` merges a delta atomically: concurrent commits of one
/// session both land (deltas are order-free, see [`crate::projection::attach::state`]).
pub trait SessionStore: Send + Sync + 'static {
    /// The session's state; empty when it is new or expired (S2).
    fn load(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = Result<SessionState, StoreError>> + Send;
    /// Merges `delta` into the session's state and makes it durable; returns how many tool
    /// results it retired that were not retired yet (for the metrics: a batch that two
    /// requests of a session both chose is counted once).
    fn commit(
        &self,
        key: &SessionKey,
        delta: &Delta,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");

#[derive(Serialize, Deserialize)]
struct Stored {
    touched: u64,
    state: SessionState,
}

/// The embedded session store: one redb database under the data dir. redb commits are atomic
/// and crash-safe, so a `kill -9` at any moment leaves either the old or the new state.
pub struct EmbeddedSessions {
    db: Arc<Database>,
    ttl: Duration,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Milliseconds since the epoch: the stamp of what a commit releases or links.
pub fn stamp() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn io(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(std::io::Error::other(e.to_string()))
}

impl EmbeddedSessions {
    pub fn open(data_dir: &Path, ttl: Duration) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data_dir)?;
        let db = Database::create(data_dir.join("sessions.redb")).map_err(io)?;
        let txn = db.begin_write().map_err(io)?;
        txn.open_table(SESSIONS).map_err(io)?;
        txn.commit().map_err(io)?;
        Ok(Self {
            db: Arc::new(db),
            ttl,
        })
    }

    /// The database, shared with the inspector's turn records.
    pub fn database(&self) -> Arc<Database> {
        self.db.clone()
    }

    /// Deletes sessions idle for longer than the TTL (S2). Returns how many.
    pub fn sweep(&self) -> Result<usize, StoreError> {
        let cutoff = now().saturating_sub(self.ttl.as_secs());
        let txn = self.db.begin_write().map_err(io)?;
        let deleted = {
            let mut table = txn.open_table(SESSIONS).map_err(io)?;
            let before = table.len().map_err(io)?;
            table
                .retain(|_, value| {
                    serde_json::from_slice::<Stored>(value).is_ok_and(|s| s.touched >= cutoff)
                })
                .map_err(io)?;
            before - table.len().map_err(io)?
        };
        txn.commit().map_err(io)?;
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }

    fn read(db: &Database, key: &str, ttl: Duration) -> Result<SessionState, StoreError> {
        let txn = db.begin_read().map_err(io)?;
        let table = txn.open_table(SESSIONS).map_err(io)?;
        let Some(value) = table.get(key).map_err(io)? else {
            return Ok(SessionState::default());
        };
        let mut stored: Stored = serde_json::from_slice(value.value()).map_err(io)?;
        if now().saturating_sub(stored.touched) > ttl.as_secs() {
            return Ok(SessionState::default());
        }
        stored.state.normalize(stored.touched.saturating_mul(1000));
        Ok(stored.state)
    }
}

impl SessionStore for EmbeddedSessions {
    async fn load(&self, key: &SessionKey) -> Result<SessionState, StoreError> {
        // Inline, not on the blocking pool: a redb read transaction never waits for a writer
        // (it reads the last committed snapshot) and a session is one small record, so the read
        // costs microseconds, less than the thread hop (benches: first_byte).
        Self::read(&self.db, &key.0, self.ttl)
    }

    async fn commit(&self, key: &SessionKey, delta: &Delta) -> Result<u64, StoreError> {
        let (db, key, delta, ttl) = (self.db.clone(), key.0.clone(), delta.clone(), self.ttl);
        tokio::task::spawn_blocking(move || {
            // One write transaction: read, merge, write. redb serialises writers, so two
            // commits of one session cannot interleave.
            let txn = db.begin_write().map_err(io)?;
            let retired;
            {
                let mut table = txn.open_table(SESSIONS).map_err(io)?;
                let mut state = match table.get(key.as_str()).map_err(io)? {
                    Some(v) => serde_json::from_slice::<Stored>(v.value())
                        .ok()
                        .filter(|s| now().saturating_sub(s.touched) <= ttl.as_secs())
                        .map(|mut s| {
                            s.state.normalize(s.touched.saturating_mul(1000));
                            s.state
                        })
                        .unwrap_or_default(),
                    None => SessionState::default(),
                };
                retired = apply(&mut state, &delta, stamp());
                let bytes = serde_json::to_vec(&Stored {
                    touched: now(),
                    state,
                })
                .map_err(io)?;
                table.insert(key.as_str(), bytes.as_slice()).map_err(io)?;
            }
            txn.commit().map_err(io)?;
            Ok(retired)
        })
        .await
        .map_err(|_| StoreError::Task)?
    }
}

/// The configured session store.
pub enum Sessions {
    Embedded(EmbeddedSessions),
    Redis(crate::store::redis::RedisStore),
}

impl Sessions {
    /// The backend's name, for metrics.
    pub fn backend(&self) -> &'static str {
        match self {
            Sessions::Embedded(_) => "embedded",
            Sessions::Redis(_) => "redis",
        }
    }
}

impl SessionStore for Sessions {
    async fn load(&self, key: &SessionKey) -> Result<SessionState, StoreError> {
        match self {
            Sessions::Embedded(s) => s.load(key).await,
            Sessions::Redis(s) => s.load(key).await,
        }
    }

    async fn commit(&self, key: &SessionKey, delta: &Delta) -> Result<u64, StoreError> {
        match self {
            Sessions::Embedded(s) => s.commit(key, delta).await,
            Sessions::Redis(s) => s.commit(key, delta).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Lifetime;
    use crate::dialect::Dialect;
    use crate::projection::attach::state::{Record, Status};

    #[test]
    fn keys_come_from_header_conversation_or_root_and_are_tenant_scoped() {
        let body = r#"{"model":"m","metadata":{"user_id":"conv-1"},"system":"be brief","messages":[{"role":"user","content":"hi"}]}"#;
        let view = Dialect::AnthropicMessages
            .read_view(body.as_bytes())
            .unwrap();
        let (a, b) = (Tenant::from_credential(b"a"), Tenant::from_credential(b"b"));
        let (k1, s1) = SessionKey::of(&a, Some("s-1"), &view, "r");
        assert_eq!(s1, KeySource::Header);
        let (k2, s2) = SessionKey::of(&a, None, &view, "r");
        assert_eq!(s2, KeySource::Conversation);
        assert_ne!(k1, k2);
        assert_ne!(
            SessionKey::of(&b, Some("s-1"), &view, "r").0,
            k1,
            "two tenants, two sessions"
        );
        let plain = r#"{"model":"m","system":"be brief","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]}"#;
        let longer = r#"{"model":"m","system":"be brief","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"user","content":"more"}]}"#;
        let (f1, s) = SessionKey::of(
            &a,
            None,
            &Dialect::AnthropicMessages
                .read_view(plain.as_bytes())
                .unwrap(),
            "r",
        );
        assert_eq!(s, KeySource::Fingerprint);
        let (f2, _) = SessionKey::of(
            &a,
            None,
            &Dialect::AnthropicMessages
                .read_view(longer.as_bytes())
                .unwrap(),
            "r",
        );
        assert_eq!(f1, f2, "later turns of one conversation share its root");
    }

    #[tokio::test]
    async fn commits_merge_survive_reopening_and_expire() {
        let dir = tempfile::tempdir().unwrap();
        let key = SessionKey("k".into());
        let delta = |k: &str, status| Delta {
            records: [(
                k.to_string(),
                Record {
                    status,
                    lifetime: Lifetime::Once,
                },
            )]
            .into(),
            links: Default::default(),
            retired: [xxhash_rust::xxh3::xxh3_64(k.as_bytes())].into(),
            touch: true,
            paused: k == "x",
        };
        {
            let store = EmbeddedSessions::open(dir.path(), Duration::from_secs(60)).unwrap();
            store
                .commit(&key, &delta("x", Status::Viewed))
                .await
                .unwrap();
            store
                .commit(&key, &delta("x", Status::Unviewed))
                .await
                .unwrap();
            store
                .commit(&key, &delta("y", Status::Unviewed))
                .await
                .unwrap();
        }
        let store = EmbeddedSessions::open(dir.path(), Duration::from_secs(60)).unwrap();
        let state = store.load(&key).await.unwrap();
        assert_eq!(
            state.records["x"].status,
            Status::Viewed,
            "never moves back"
        );
        assert_eq!(state.records.len(), 2);
        assert!(
            state.last_ms > 0,
            "the session's cache clock survives reopening"
        );
        assert!(
            state.paused,
            "a pause, once seen, stays (set by the first two commits only)"
        );
        assert_eq!(state.retired.len(), 2, "retired results survive reopening");
        drop(store);
        let expired = EmbeddedSessions::open(dir.path(), Duration::from_secs(0)).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        assert!(expired.load(&key).await.unwrap().records.is_empty(), "S2");
    }
}
