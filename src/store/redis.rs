//! The shared backend (SPEC S1, S2): artifacts and session state in Redis (≥ 6, or Valkey), so
//! any replica serves any session. One multiplexed connection per process, reconnecting on its
//! own after a Redis restart. Keys expire after `idle_ttl_seconds` without use.
//!
//! Keys: `sluice:a:<tenant namespace>:<artifact id>` (bytes) and `sluice:s:<session>` (a hash
//! of attachment identity → status and lifetime). A commit is one Lua script that keeps, per
//! attachment, the furthest status: atomic, and concurrent commits of one session both land.

use std::time::Duration;

use bytes::Bytes;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::AsyncCommands;

use super::{ArtifactId, ArtifactStore, StoreError};
use crate::attach::state::{Delta, Record, SessionState, Status};
use crate::config::Lifetime;
use crate::session::{SessionKey, SessionStore};
use crate::tenant::Tenant;

/// Merges a delta: ARGV[1] is the TTL, then field/value pairs; a value's first character is its
/// status rank, which only rises.
const MERGE: &str = r"
for i = 2, #ARGV - 1, 2 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if (not cur) or tonumber(string.sub(cur, 1, 1)) < tonumber(string.sub(ARGV[i + 1], 1, 1)) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
";

#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    ttl: u64,
    merge: std::sync::Arc<redis::Script>,
}

fn err(e: redis::RedisError) -> StoreError {
    StoreError::Io(std::io::Error::other(e.to_string()))
}

impl RedisStore {
    /// Connects to `url`. A Redis that is down at startup is an error; one that restarts later
    /// is reconnected to.
    pub async fn connect(url: &str, ttl: Duration) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url).map_err(err)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(err)?;
        Ok(RedisStore {
            conn,
            ttl: ttl.as_secs().max(1),
            merge: std::sync::Arc::new(redis::Script::new(MERGE)),
        })
    }

    fn artifact_key(tenant: &Tenant, id: &ArtifactId) -> String {
        format!("sluice:a:{}:{id}", tenant.namespace())
    }

    fn session_key(key: &SessionKey) -> String {
        format!("sluice:s:{}", key.0)
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
        let mut conn = self.conn.clone();
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
        let mut conn = self.conn.clone();
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

    async fn exists(&self, tenant: &Tenant, id: &ArtifactId) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        conn.exists(Self::artifact_key(tenant, id))
            .await
            .map_err(err)
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
        let key = Self::session_key(key);
        let (fields, _): (Vec<(String, String)>, i64) = redis::pipe()
            .hgetall(&key)
            .expire(&key, self.ttl as i64)
            .query_async(&mut conn)
            .await
            .map_err(err)?;
        Ok(SessionState {
            records: fields
                .into_iter()
                .filter_map(|(k, v)| decode(&v).map(|r| (k, r)))
                .collect(),
        })
    }

    async fn commit(&self, key: &SessionKey, delta: &Delta) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let mut invocation = self.merge.key(Self::session_key(key));
        invocation.arg(self.ttl);
        for (k, record) in &delta.records {
            invocation.arg(k).arg(encode(record));
        }
        invocation
            .invoke_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .map_err(err)
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
