//! The shared backend (SPEC S1, S2): artifacts and session state in Redis (≥ 6, or Valkey), so
//! any replica serves any session. Two multiplexed connections per process, each reconnecting on
//! its own after a Redis restart: one for session state and health checks, one for artifacts,
//! so a session load never waits behind a large artifact. Keys expire after
//! `idle_ttl_seconds` without use.
//!
//! Keys: `sluice:a:<tenant namespace>:<artifact id>` (bytes); per session `sluice:s:<session>`
//! (a hash of live attachment identity → status and lifetime), `sluice:s:<session>:released`
//! (a sorted set of released identities' hashes, by when) and `sluice:s:<session>:links` (a
//! sorted set of read-tool links, by when). A commit is one Lua script that keeps, per
//! attachment, the furthest status, moves released ones to the set, and trims both sets to
//! their caps: atomic, and concurrent commits of one session both land.
//!
//! On a Redis Cluster (`store.redis_cluster`) the keys used together share a hash slot: a
//! session's keys are `sluice:s:{<session>}…` and the inspector's `sluice:i:{<namespace>}…`,
//! so the merge stays one atomic script on one node and nothing is CROSSSLOT; an artifact is a
//! key of its own, spread over the slots. The cluster client follows MOVED and ASK (a reshard)
//! and a failover, and a script is sent as EVALSHA, loaded again on a node that answers
//! NOSCRIPT. On one node the keys stay as they were, so an upgrade keeps its sessions.

use std::time::Duration;

use std::borrow::Cow;

use bytes::Bytes;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::{ArtifactId, ArtifactStore, StoreError};
use crate::config::Lifetime;
use crate::projection::attach::state::{
    released_key, Delta, Record, SessionState, Status, MAX_LINKS, MAX_RELEASED, MAX_RETIRED,
};
use crate::store::session::{SessionKey, SessionStore};
use crate::tenant::Tenant;

/// Merges a delta. KEYS: the records hash, the released set, the links set, the retired set.
/// ARGV: TTL, stamp, the three caps, the delta's clock flags (bit 1: it touches the session's
/// clock, the records hash's [`LAST_FIELD`] rising to the stamp; bit 2: the session paused,
/// [`PAUSED_FIELD`] set), the number of records, then per record its identity, value
/// and released key (hex), then the number of links and the links, then the retired keys (hex). Returns how many of
/// those were not retired yet. A value's first character is its status rank, which only rises;
/// rank 3 (released) leaves the hash for the released set, and a released identity is never
/// written back to the hash.
const MERGE: &str = r"
local ttl, stamp = ARGV[1], ARGV[2]
local max_released, max_links, max_retired = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local flags = tonumber(ARGV[6])
if flags % 2 == 1 then
  local last = tonumber(redis.call('HGET', KEYS[1], '@last') or '0')
  if tonumber(stamp) > last then
    redis.call('HSET', KEYS[1], '@last', stamp)
  end
end
if flags >= 2 then
  redis.call('HSET', KEYS[1], '@paused', '1')
end
local n = tonumber(ARGV[7])
local i = 8
for _ = 1, n do
  local field, value, released = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  i = i + 3
  if string.sub(value, 1, 1) == '3' then
    redis.call('HDEL', KEYS[1], field)
    if not redis.call('ZSCORE', KEYS[2], released) then
      redis.call('ZADD', KEYS[2], stamp, released)
    end
  elseif not redis.call('ZSCORE', KEYS[2], released) then
    local cur = redis.call('HGET', KEYS[1], field)
    if (not cur) or tonumber(string.sub(cur, 1, 1)) < tonumber(string.sub(value, 1, 1)) then
      redis.call('HSET', KEYS[1], field, value)
    end
  end
end
local links = tonumber(ARGV[i])
for j = i + 1, i + links do
  if not redis.call('ZSCORE', KEYS[3], ARGV[j]) then
    redis.call('ZADD', KEYS[3], stamp, ARGV[j])
  end
end
local retired = 0
for j = i + links + 1, #ARGV do
  if not redis.call('ZSCORE', KEYS[4], ARGV[j]) then
    redis.call('ZADD', KEYS[4], stamp, ARGV[j])
    retired = retired + 1
  end
end
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(max_released + 1))
redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -(max_links + 1))
redis.call('ZREMRANGEBYRANK', KEYS[4], 0, -(max_retired + 1))
for k = 1, 4 do
  redis.call('EXPIRE', KEYS[k], ttl)
end
return retired
";

/// The records hash's field that holds [`SessionState::last_ms`] (no identity starts with `@`:
/// an identity starts with its source, a tool call id or `user:`).
const LAST_FIELD: &str = "@last";
/// The records hash's field that holds [`SessionState::paused`] (`1` when set).
const PAUSED_FIELD: &str = "@paused";

/// A connection to one Redis node (reconnecting on its own) or to a Redis Cluster (routing
/// each command by its key's slot).
#[derive(Clone)]
pub enum Connection {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    /// `part` as the piece of a key that chooses its slot: `{part}` on a cluster, so that keys
    /// sharing it are served by one node; unchanged on one node.
    pub fn slot<'a>(&self, part: &'a str) -> Cow<'a, str> {
        match self {
            Connection::Node(_) => Cow::Borrowed(part),
            Connection::Cluster(_) => Cow::Owned(format!("{{{part}}}")),
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Node(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Node(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

#[derive(Clone)]
pub struct RedisStore {
    /// Session state and health checks: small, and never queued behind an artifact.
    conn: Connection,
    /// Artifacts, up to tens of megabytes each.
    blobs: Connection,
    ttl: u64,
    merge: std::sync::Arc<redis::Script>,
}

fn err(e: redis::RedisError) -> StoreError {
    StoreError::Io(std::io::Error::other(e.to_string()))
}

impl RedisStore {
    /// Connects to `url`: one node, or with `cluster` any node of a Redis Cluster, whose other
    /// nodes it learns from that one. A Redis that is down at startup is an error; one that
    /// restarts later (or a master whose replica takes over) is reconnected to.
    pub async fn connect(
        url: &str,
        cluster: bool,
        ttl: Duration,
    ) -> Result<RedisStore, StoreError> {
        let (conn, blobs) = match cluster {
            true => Self::cluster(url).await?,
            false => Self::node(url).await?,
        };
        Ok(RedisStore {
            conn,
            blobs,
            ttl: ttl.as_secs().max(1),
            merge: std::sync::Arc::new(redis::Script::new(MERGE)),
        })
    }

    async fn cluster(url: &str) -> Result<(Connection, Connection), StoreError> {
        let client = |response: u64| {
            redis::cluster::ClusterClient::builder([url])
                .connection_timeout(Duration::from_secs(2))
                .response_timeout(Duration::from_secs(response))
                .retries(3)
                .max_retry_wait(1000)
                .build()
                .map_err(err)
        };
        let conn = client(2)?.get_async_connection().await.map_err(err)?;
        // As on one node: artifacts have their own connections, with time for their size.
        let blobs = client(10)?.get_async_connection().await.map_err(err)?;
        Ok((Connection::Cluster(conn), Connection::Cluster(blobs)))
    }

    async fn node(url: &str) -> Result<(Connection, Connection), StoreError> {
        let client = redis::Client::open(url).map_err(err)?;
        let config = |response: u64| {
            ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(2)))
                .set_response_timeout(Some(Duration::from_secs(response)))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_secs(1))
        };
        let conn = ConnectionManager::new_with_config(client.clone(), config(2))
            .await
            .map_err(err)?;
        // A multiplexed connection answers in order: an artifact of 30 MB in front of a session
        // load would hold it up, so artifacts have their own (with time for their size).
        let blobs = ConnectionManager::new_with_config(client, config(10))
            .await
            .map_err(err)?;
        Ok((Connection::Node(conn), Connection::Node(blobs)))
    }

    /// The connection for small records (session state, turn records).
    pub fn connection(&self) -> Connection {
        self.conn.clone()
    }

    fn artifact_key(tenant: &Tenant, id: &ArtifactId) -> String {
        format!("sluice:a:{}:{id}", tenant.namespace())
    }

    /// A session's four keys: live records, released, links, retired (one slot on a cluster).
    fn session_keys(&self, key: &SessionKey) -> [String; 4] {
        let records = format!("sluice:s:{}", self.conn.slot(&key.0));
        let released = format!("{records}:released");
        let links = format!("{records}:links");
        let retired = format!("{records}:retired");
        [records, released, links, retired]
    }
}

fn encode(record: &Record) -> String {
    let rank = match record.status {
        Status::Unviewed => '0',
        Status::Viewed => '1',
        Status::Pruned => '2',
        Status::Released => '3',
    };
    let lifetime = match record.lifetime {
        Lifetime::Once => 'o',
        Lifetime::Recent => 'r',
        Lifetime::Retain => 'k',
    };
    format!("{rank}{lifetime}")
}

fn decode(value: &str) -> Option<Record> {
    let mut chars = value.chars();
    let status = match chars.next()? {
        '0' => Status::Unviewed,
        '1' => Status::Viewed,
        '2' => Status::Pruned,
        '3' => Status::Released,
        _ => return None,
    };
    let lifetime = match chars.next()? {
        'o' => Lifetime::Once,
        'r' => Lifetime::Recent,
        'k' => Lifetime::Retain,
        _ => return None,
    };
    Some(Record { status, lifetime })
}

impl ArtifactStore for RedisStore {
    async fn put(&self, tenant: &Tenant, id: &ArtifactId, bytes: Bytes) -> Result<(), StoreError> {
        let mut conn = self.blobs.clone();
        let key = Self::artifact_key(tenant, id);
        // SET NX: content-addressed, the first writer wins and later ones change nothing; the
        // expiry is refreshed either way.
        redis::pipe()
            .cmd("SET")
            .arg(&key)
            .arg(bytes.as_ref())
            .arg("NX")
            .arg("EX")
            .arg(self.ttl)
            .ignore()
            .expire(&key, self.ttl as i64)
            .ignore()
            .query_async::<()>(&mut conn)
            .await
            .map_err(err)
    }

    async fn get(&self, tenant: &Tenant, id: &ArtifactId) -> Result<Option<Bytes>, StoreError> {
        let mut conn = self.blobs.clone();
        let key = Self::artifact_key(tenant, id);
        let found: Option<Vec<u8>> = redis::cmd("GETEX")
            .arg(&key)
            .arg("EX")
            .arg(self.ttl)
            .query_async(&mut conn)
            .await
            .map_err(err)?;
        Ok(found.map(Bytes::from))
    }

    async fn get_range(
        &self,
        tenant: &Tenant,
        id: &ArtifactId,
        range: std::ops::Range<u64>,
    ) -> Result<Option<(Bytes, u64)>, StoreError> {
        let mut conn = self.blobs.clone();
        let key = Self::artifact_key(tenant, id);
        let (found, bytes, size): (bool, Vec<u8>, u64) = redis::pipe()
            .expire(&key, self.ttl as i64)
            .getrange(&key, range.start as isize, (range.end - 1) as isize)
            .strlen(&key)
            .query_async(&mut conn)
            .await
            .map_err(err)?;
        Ok(found.then(|| (Bytes::from(bytes), size)))
    }

    async fn check(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map(|_| ())
            .map_err(err)
    }
}

impl SessionStore for RedisStore {
    async fn load(&self, key: &SessionKey) -> Result<SessionState, StoreError> {
        let mut conn = self.conn.clone();
        let [records, released, links, retired] = self.session_keys(key);
        type Scored = Vec<(String, f64)>;
        let (fields, released, links, retired): (Vec<(String, String)>, Scored, Scored, Scored) =
            redis::pipe()
                .hgetall(&records)
                .zrange_withscores(&released, 0, -1)
                .zrange_withscores(&links, 0, -1)
                .zrange_withscores(&retired, 0, -1)
                .expire(&records, self.ttl as i64)
                .ignore()
                .expire(&released, self.ttl as i64)
                .ignore()
                .expire(&links, self.ttl as i64)
                .ignore()
                .expire(&retired, self.ttl as i64)
                .ignore()
                .query_async(&mut conn)
                .await
                .map_err(err)?;
        // Scores are millisecond stamps: exact in an f64 for millennia.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let stamp = |score: f64| score as u64;
        let last_ms = fields
            .iter()
            .find(|(k, _)| k == LAST_FIELD)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let paused = fields.iter().any(|(k, _)| k == PAUSED_FIELD);
        let mut state = SessionState {
            last_ms,
            paused,
            records: fields
                .into_iter()
                .filter(|(k, _)| k != LAST_FIELD && k != PAUSED_FIELD)
                .filter_map(|(k, v)| decode(&v).map(|r| (k, r)))
                .collect(),
            released: released
                .into_iter()
                .filter_map(|(k, s)| Some((u64::from_str_radix(&k, 16).ok()?, stamp(s))))
                .collect(),
            links: links.into_iter().map(|(k, s)| (k, stamp(s))).collect(),
            retired: retired
                .into_iter()
                .filter_map(|(k, s)| Some((u64::from_str_radix(&k, 16).ok()?, stamp(s))))
                .collect(),
        };
        // Records of an older version's layout: read as now (they expire with the session).
        state.normalize(0);
        Ok(state)
    }

    async fn commit(&self, key: &SessionKey, delta: &Delta) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        let [records, released, links, retired] = self.session_keys(key);
        let mut invocation = self.merge.key(records);
        invocation
            .key(released)
            .key(links)
            .key(retired)
            .arg(self.ttl)
            .arg(crate::store::session::stamp())
            .arg(MAX_RELEASED)
            .arg(MAX_LINKS)
            .arg(MAX_RETIRED)
            .arg(u8::from(delta.touch) + 2 * u8::from(delta.paused))
            .arg(delta.records.len());
        for (k, record) in &delta.records {
            invocation
                .arg(k)
                .arg(encode(record))
                .arg(format!("{:016x}", released_key(k)));
        }
        invocation.arg(delta.links.len());
        for link in &delta.links {
            invocation.arg(link);
        }
        for key in &delta.retired {
            invocation.arg(format!("{key:016x}"));
        }
        invocation.invoke_async::<u64>(&mut conn).await.map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_ranks_follow_status_order() {
        for status in [
            Status::Unviewed,
            Status::Viewed,
            Status::Pruned,
            Status::Released,
        ] {
            for lifetime in [Lifetime::Once, Lifetime::Recent, Lifetime::Retain] {
                let r = Record { status, lifetime };
                assert_eq!(decode(&encode(&r)), Some(r));
            }
        }
        let rank = |s| {
            encode(&Record {
                status: s,
                lifetime: Lifetime::Once,
            })
            .chars()
            .next()
        };
        assert!(rank(Status::Unviewed) < rank(Status::Viewed));
        assert!(rank(Status::Viewed) < rank(Status::Pruned));
        assert!(rank(Status::Pruned) < rank(Status::Released));
        assert_eq!(decode("9x"), None);
    }
}
