//! Where turn records live (docs/inspector.md): beside the session state, in the embedded
//! database or in Redis, scoped by tenant and expiring with the session's idle TTL (S2, S3).
//! Per session: a head (label, totals), the chains of its last request, and its last
//! `keep_turns` turns.

use std::sync::Arc;
use std::time::Duration;

use redb::{Database, ReadableDatabase, TableDefinition};
use serde::{Deserialize, Serialize};

use super::chain::Chain;
use super::turn::Turn;
use crate::store::StoreError;

/// The most sessions a tenant's list shows (the most recent first).
pub const MAX_LISTED_SESSIONS: usize = 200;
/// The most sessions a tenant keeps in Redis' index.
const MAX_INDEXED_SESSIONS: isize = 1000;

const HEADS: TableDefinition<&str, &[u8]> = TableDefinition::new("inspector_heads");
const CHAINS: TableDefinition<&str, &[u8]> = TableDefinition::new("inspector_chains");
const TURNS: TableDefinition<&str, &[u8]> = TableDefinition::new("inspector_turns");

/// A session at a glance.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Head {
    /// The session's key (a digest; reveals neither tenant nor id).
    pub id: String,
    /// The session id the client sent, if it sent one.
    pub label: String,
    pub first_ms: u64,
    pub last_ms: u64,
    /// Turns recorded (the oldest beyond `keep_turns` are no longer kept).
    pub turns: u64,
    pub dialect: String,
    pub route: String,
    pub model: String,
    pub totals: Totals,
}

/// A session's sums over its completed turns.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Totals {
    pub completed: u64,
    pub failed: u64,
    pub received_tokens: u64,
    pub forwarded_tokens: u64,
    pub received_cost: f64,
    pub forwarded_cost: f64,
    /// What the provider reported.
    pub provider_input: u64,
    pub provider_cached: u64,
    pub provider_output: u64,
    pub spilled: u64,
    pub retired: u64,
    pub images_embedded: u64,
    pub images_placeholders: u64,
    pub reads: u64,
}

/// The chains of a session's last completed request, as sent and as forwarded.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Chains {
    pub received: Chain,
    pub forwarded: Chain,
    /// The provider's cache entries as the agent's own requests would have left them, and as
    /// sluice's forwarded ones did (`projection::cache`).
    #[serde(default)]
    pub received_cache: crate::projection::cache::Entries,
    #[serde(default)]
    pub forwarded_cache: crate::projection::cache::Entries,
}

fn io(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(std::io::Error::other(e.to_string()))
}

fn now_ms() -> u64 {
    crate::store::session::stamp()
}

/// The backend of the turn records.
#[derive(Clone)]
pub enum TurnStore {
    Embedded(Arc<Database>),
    Redis(crate::store::redis::Connection),
}

impl TurnStore {
    /// Creates the embedded tables when they are new.
    pub fn embedded(db: Arc<Database>) -> Result<TurnStore, StoreError> {
        let txn = db.begin_write().map_err(io)?;
        txn.open_table(HEADS).map_err(io)?;
        txn.open_table(CHAINS).map_err(io)?;
        txn.open_table(TURNS).map_err(io)?;
        txn.commit().map_err(io)?;
        Ok(TurnStore::Embedded(db))
    }

    /// The session's head and chains, when it has a record within `ttl`.
    pub async fn previous(
        &self,
        ns: &str,
        id: &str,
        ttl: Duration,
    ) -> Result<Option<(Head, Chains)>, StoreError> {
        let (head, chains) = self.read(ns, id, ttl, true).await?;
        Ok(head.map(|h| (h, chains.unwrap_or_default())))
    }

    /// The session's head when it is live, and its chains when `with_chains` (the session API
    /// needs only the head; a long session's chains are the larger record).
    async fn read(
        &self,
        ns: &str,
        id: &str,
        ttl: Duration,
        with_chains: bool,
    ) -> Result<(Option<Head>, Option<Chains>), StoreError> {
        let (head, chains) = match self {
            TurnStore::Embedded(db) => {
                let txn = db.begin_read().map_err(io)?;
                let key = format!("{ns}/{id}");
                let head = txn
                    .open_table(HEADS)
                    .map_err(io)?
                    .get(key.as_str())
                    .map_err(io)?
                    .and_then(|v| serde_json::from_slice::<Head>(v.value()).ok());
                let chains = match with_chains {
                    true => txn
                        .open_table(CHAINS)
                        .map_err(io)?
                        .get(key.as_str())
                        .map_err(io)?
                        .and_then(|v| unpacked::<Chains>(v.value())),
                    false => None,
                };
                (head, chains)
            }
            TurnStore::Redis(conn) => {
                let mut conn = conn.clone();
                let mut get = redis::cmd("MGET");
                get.arg(redis_key(&conn, ns, id, "head"));
                if with_chains {
                    get.arg(redis_key(&conn, ns, id, "chains"));
                }
                let found: Vec<Option<Vec<u8>>> = get.query_async(&mut conn).await.map_err(io)?;
                let mut found = found.into_iter();
                let head = found
                    .next()
                    .flatten()
                    .and_then(|v| serde_json::from_slice(&v).ok());
                let chains = found.next().flatten().and_then(|v| unpacked(&v));
                (head, chains)
            }
        };
        let live = |h: &Head| now_ms().saturating_sub(h.last_ms) <= ttl.as_millis() as u64;
        Ok((head.filter(live), chains))
    }

    /// Writes turn number `seq` with the session's new head and chains; keeps the last `keep`
    /// turns. An embedded write that is not `durable` skips its fsync: the next durable one
    /// (a session commit, or [`TurnStore::persist`]) makes it durable.
    #[allow(clippy::too_many_arguments)]
    pub async fn record(
        &self,
        ns: &str,
        head: &Head,
        chains: &Chains,
        turn: &Turn,
        seq: u64,
        keep: u64,
        ttl: Duration,
        durable: bool,
    ) -> Result<(), StoreError> {
        let (head_json, chains_json, turn_json) = (
            serde_json::to_vec(head).map_err(io)?,
            pack(&serde_json::to_vec(chains).map_err(io)?)?,
            pack(&serde_json::to_vec(turn).map_err(io)?)?,
        );
        let id = &head.id;
        match self {
            TurnStore::Embedded(db) => {
                let mut txn = db.begin_write().map_err(io)?;
                if !durable {
                    txn.set_durability(redb::Durability::None).map_err(io)?;
                }
                {
                    let key = format!("{ns}/{id}");
                    txn.open_table(HEADS)
                        .map_err(io)?
                        .insert(key.as_str(), head_json.as_slice())
                        .map_err(io)?;
                    txn.open_table(CHAINS)
                        .map_err(io)?
                        .insert(key.as_str(), chains_json.as_slice())
                        .map_err(io)?;
                    let mut turns = txn.open_table(TURNS).map_err(io)?;
                    turns
                        .insert(turn_key(ns, id, seq).as_str(), turn_json.as_slice())
                        .map_err(io)?;
                    if seq >= keep {
                        let old = turn_key(ns, id, seq - keep);
                        let first = turn_key(ns, id, 0);
                        turns
                            .retain_in(first.as_str()..=old.as_str(), |_, _| false)
                            .map_err(io)?;
                    }
                }
                txn.commit().map_err(io)
            }
            TurnStore::Redis(conn) => {
                let mut conn = conn.clone();
                let ttl = ttl.as_secs().max(1);
                let index = format!("sluice:i:{}:sessions", conn.slot(ns));
                let turns = redis_key(&conn, ns, id, "turns");
                let cutoff = now_ms().saturating_sub(ttl.saturating_mul(1000));
                redis::pipe()
                    .atomic()
                    .cmd("SET")
                    .arg(redis_key(&conn, ns, id, "head"))
                    .arg(head_json)
                    .arg("EX")
                    .arg(ttl)
                    .ignore()
                    .cmd("SET")
                    .arg(redis_key(&conn, ns, id, "chains"))
                    .arg(chains_json)
                    .arg("EX")
                    .arg(ttl)
                    .ignore()
                    .cmd("RPUSH")
                    .arg(&turns)
                    .arg(turn_json)
                    .ignore()
                    .cmd("LTRIM")
                    .arg(&turns)
                    .arg(-(keep.max(1) as i64))
                    .arg(-1)
                    .ignore()
                    .cmd("EXPIRE")
                    .arg(&turns)
                    .arg(ttl)
                    .ignore()
                    .cmd("ZADD")
                    .arg(&index)
                    .arg(head.last_ms)
                    .arg(id)
                    .ignore()
                    .cmd("ZREMRANGEBYSCORE")
                    .arg(&index)
                    .arg("-inf")
                    .arg(cutoff)
                    .ignore()
                    .cmd("ZREMRANGEBYRANK")
                    .arg(&index)
                    .arg(0)
                    .arg(-(MAX_INDEXED_SESSIONS + 1))
                    .ignore()
                    .cmd("EXPIRE")
                    .arg(&index)
                    .arg(ttl)
                    .ignore()
                    .query_async::<()>(&mut conn)
                    .await
                    .map_err(io)
            }
        }
    }

    /// Makes the embedded records written without an fsync durable.
    pub fn persist(&self) -> Result<(), StoreError> {
        if let TurnStore::Embedded(db) = self {
            db.begin_write().map_err(io)?.commit().map_err(io)?;
        }
        Ok(())
    }

    /// The tenant's sessions seen within `ttl`, the most recent first.
    pub async fn list(&self, ns: &str, ttl: Duration) -> Result<Vec<Head>, StoreError> {
        let mut heads: Vec<Head> = match self {
            TurnStore::Embedded(db) => {
                let db = db.clone();
                let (from, to) = (format!("{ns}/"), format!("{ns}0"));
                blocking(move || {
                    let txn = db.begin_read().map_err(io)?;
                    let table = txn.open_table(HEADS).map_err(io)?;
                    let mut heads = Vec::new();
                    for entry in table.range(from.as_str()..to.as_str()).map_err(io)? {
                        let (_, v) = entry.map_err(io)?;
                        heads.extend(serde_json::from_slice::<Head>(v.value()).ok());
                    }
                    Ok(heads)
                })
                .await?
            }
            TurnStore::Redis(conn) => {
                let mut conn = conn.clone();
                let ids: Vec<String> = redis::cmd("ZREVRANGE")
                    .arg(format!("sluice:i:{}:sessions", conn.slot(ns)))
                    .arg(0)
                    .arg(MAX_LISTED_SESSIONS as isize - 1)
                    .query_async(&mut conn)
                    .await
                    .map_err(io)?;
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                let mut mget = redis::cmd("MGET");
                for id in &ids {
                    mget.arg(redis_key(&conn, ns, id, "head"));
                }
                let found: Vec<Option<String>> = mget.query_async(&mut conn).await.map_err(io)?;
                found
                    .into_iter()
                    .flatten()
                    .filter_map(|v| serde_json::from_str(&v).ok())
                    .collect()
            }
        };
        let cutoff = now_ms().saturating_sub(ttl.as_millis() as u64);
        heads.retain(|h| h.last_ms >= cutoff);
        heads.sort_by_key(|h| std::cmp::Reverse(h.last_ms));
        heads.truncate(MAX_LISTED_SESSIONS);
        Ok(heads)
    }

    /// One session of the tenant: its head and kept turns, oldest first.
    pub async fn session(
        &self,
        ns: &str,
        id: &str,
        ttl: Duration,
    ) -> Result<Option<(Head, Vec<Turn>)>, StoreError> {
        let (Some(head), _) = self.read(ns, id, ttl, false).await? else {
            return Ok(None);
        };
        let turns: Vec<Turn> = match self {
            TurnStore::Embedded(db) => {
                let db = db.clone();
                let (from, to) = (format!("{ns}/{id}/"), format!("{ns}/{id}0"));
                blocking(move || {
                    let txn = db.begin_read().map_err(io)?;
                    let table = txn.open_table(TURNS).map_err(io)?;
                    let mut turns = Vec::new();
                    for entry in table.range(from.as_str()..to.as_str()).map_err(io)? {
                        let (_, v) = entry.map_err(io)?;
                        turns.extend(unpacked::<Turn>(v.value()));
                    }
                    Ok(turns)
                })
                .await?
            }
            TurnStore::Redis(conn) => {
                let mut conn = conn.clone();
                let raw: Vec<Vec<u8>> = redis::cmd("LRANGE")
                    .arg(redis_key(&conn, ns, id, "turns"))
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut conn)
                    .await
                    .map_err(io)?;
                raw.iter().filter_map(|v| unpacked(v)).collect()
            }
        };
        Ok(Some((head, turns)))
    }

    /// Deletes the embedded records of sessions idle past `ttl` (Redis expires its own).
    pub fn sweep(&self, ttl: Duration) -> Result<usize, StoreError> {
        let TurnStore::Embedded(db) = self else {
            return Ok(0);
        };
        let cutoff = now_ms().saturating_sub(ttl.as_millis() as u64);
        let txn = db.begin_write().map_err(io)?;
        let mut gone = Vec::new();
        {
            let mut heads = txn.open_table(HEADS).map_err(io)?;
            heads
                .retain(|key, v| {
                    let live = serde_json::from_slice::<Head>(v).is_ok_and(|h| h.last_ms >= cutoff);
                    if !live {
                        gone.push(key.to_owned());
                    }
                    live
                })
                .map_err(io)?;
            let mut chains = txn.open_table(CHAINS).map_err(io)?;
            let mut turns = txn.open_table(TURNS).map_err(io)?;
            for key in &gone {
                chains.remove(key.as_str()).map_err(io)?;
                let (from, to) = (format!("{key}/"), format!("{key}0"));
                turns
                    .retain_in(from.as_str()..to.as_str(), |_, _| false)
                    .map_err(io)?;
            }
        }
        txn.commit().map_err(io)?;
        Ok(gone.len())
    }
}

/// One of a session's records; on a cluster all of a namespace's keys share its slot, so the
/// index and the session's records are written in one transaction and read in one MGET.
/// The zstd frame's first bytes: a record that starts with them is compressed; one that does
/// not is JSON as records were written before they were compressed, and is read as it is.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// The most a compressed record may grow to when read back (a record is bounded far below:
/// 512 results and 256 images or reads a turn), so a damaged value cannot make a large
/// allocation.
const MAX_UNPACKED: usize = 8 << 20;

/// A turn record or a session's chains as stored: JSON compressed with zstd (level 3), which
/// keeps the inspector's share of Redis or the disk several times smaller (docs/inspector.md).
fn pack(json: &[u8]) -> Result<Vec<u8>, StoreError> {
    zstd::bulk::compress(json, 3).map_err(io)
}

/// A stored record read back; `None` when it is neither zstd nor JSON of `T`.
fn unpacked<T: serde::de::DeserializeOwned>(raw: &[u8]) -> Option<T> {
    if raw.starts_with(&ZSTD_MAGIC) {
        let json = zstd::bulk::decompress(raw, MAX_UNPACKED).ok()?;
        serde_json::from_slice(&json).ok()
    } else {
        serde_json::from_slice(raw).ok()
    }
}

fn redis_key(conn: &crate::store::redis::Connection, ns: &str, id: &str, what: &str) -> String {
    format!("sluice:i:{}:{id}:{what}", conn.slot(ns))
}

/// Turn keys sort in recording order: the sequence number is zero-padded.
fn turn_key(ns: &str, id: &str, seq: u64) -> String {
    format!("{ns}/{id}/{seq:020}")
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| StoreError::Task)?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(id: &str, turns: u64) -> Head {
        Head {
            id: id.into(),
            last_ms: now_ms(),
            turns,
            ..Head::default()
        }
    }

    #[test]
    fn records_are_stored_compressed_and_plain_ones_still_read() {
        let chains = Chains::default();
        let json = serde_json::to_vec(&chains).unwrap();
        let packed = pack(&json).unwrap();
        assert!(packed.starts_with(&ZSTD_MAGIC));
        assert_eq!(unpacked::<Chains>(&packed), Some(chains.clone()));
        assert_eq!(
            unpacked::<Chains>(&json),
            Some(chains),
            "written before compression"
        );
        // A long record shrinks; a damaged or oversized one reads as nothing, not a panic.
        let long = serde_json::to_vec(&vec!["tool_result sha256 tokens"; 2000]).unwrap();
        assert!(pack(&long).unwrap().len() * 5 < long.len());
        let mut damaged = pack(&long).unwrap();
        damaged.truncate(damaged.len() / 2);
        assert_eq!(unpacked::<Vec<String>>(&damaged), None);
        let bomb = pack(&vec![b' '; MAX_UNPACKED + 1]).unwrap();
        assert_eq!(unpacked::<Vec<String>>(&bomb), None);
    }

    #[tokio::test]
    async fn turns_are_kept_per_session_bounded_and_tenant_scoped() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(Database::create(dir.path().join("s.redb")).unwrap());
        let store = TurnStore::embedded(db).unwrap();
        let ttl = Duration::from_secs(60);
        for n in 0..5u64 {
            let turn = Turn {
                request_id: format!("r{n}"),
                ..Turn::default()
            };
            store
                .record(
                    "aa",
                    &head("s1", n + 1),
                    &Chains::default(),
                    &turn,
                    n,
                    3,
                    ttl,
                    n % 2 == 0,
                )
                .await
                .unwrap();
        }
        store.persist().unwrap();
        let (h, turns) = store.session("aa", "s1", ttl).await.unwrap().unwrap();
        assert_eq!(h.turns, 5);
        let ids: Vec<_> = turns.iter().map(|t| t.request_id.as_str()).collect();
        assert_eq!(ids, ["r2", "r3", "r4"]);
        assert!(store.session("bb", "s1", ttl).await.unwrap().is_none());
        assert_eq!(store.list("aa", ttl).await.unwrap().len(), 1);
        assert!(store.list("bb", ttl).await.unwrap().is_empty());
        // Idle past the TTL: gone from the list, and swept.
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(store.sweep(Duration::from_millis(1)).unwrap(), 1);
        assert!(store.session("aa", "s1", ttl).await.unwrap().is_none());
    }
}
