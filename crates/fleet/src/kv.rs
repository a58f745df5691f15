//! Shared KV cache pages in Redis (`[redis] share_kv`, docs/kv-cache.md,
//! "Sharing across instances"): one string per page under
//! `{ns}:kv:{model namespace}:{page}`, written with a TTL, and a sorted set
//! per model namespace of pages by write time that keeps the total under
//! `kv_max_bytes` (oldest out first).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ingot_kv_tiers::{BoxFuture, SharedKvStore, StoreError};

use crate::Fleet;

/// A model's pages in Redis.
pub struct RedisKvStore {
    fleet: Fleet,
    /// `{ns}:kv-lru:{model namespace}`.
    lru: String,
    ttl: Duration,
    /// Pages kept at most (the byte bound over the page size).
    max_pages: u64,
}

impl RedisKvStore {
    /// Pages of the model namespace `model` (hex), `entry_bytes` each,
    /// at most `max_bytes` of them, each kept `ttl` after its last write.
    pub fn new(
        fleet: Fleet,
        model: &str,
        entry_bytes: usize,
        max_bytes: u64,
        ttl: Duration,
    ) -> Self {
        Self {
            lru: fleet.key(&format!("kv-lru:{model}")),
            fleet,
            ttl,
            max_pages: (max_bytes / entry_bytes.max(1) as u64).max(1),
        }
    }
}

fn failed(e: crate::FleetError) -> StoreError {
    StoreError(e.to_string())
}

impl SharedKvStore for RedisKvStore {
    fn present(&self, keys: Vec<String>) -> BoxFuture<'_, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            let mut pipe = redis::pipe();
            for k in &keys {
                pipe.exists(self.fleet.key(k));
            }
            self.fleet
                .run("kv_present", |mut c| async move {
                    pipe.query_async(&mut c).await
                })
                .await
                .map_err(failed)
        })
    }

    fn get(&self, keys: Vec<String>) -> BoxFuture<'_, Result<Vec<Option<Vec<u8>>>, StoreError>> {
        Box::pin(async move {
            let keys: Vec<String> = keys.iter().map(|k| self.fleet.key(k)).collect();
            self.fleet
                .run("kv_get", |mut c| async move {
                    redis::cmd("MGET").arg(&keys).query_async(&mut c).await
                })
                .await
                .map_err(failed)
        })
    }

    fn put(&self, entries: Vec<(String, Vec<u8>)>) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            let ms = u64::try_from(self.ttl.as_millis())
                .unwrap_or(u64::MAX)
                .max(1);
            let mut pipe = redis::pipe();
            for (k, v) in &entries {
                let key = self.fleet.key(k);
                pipe.cmd("SET").arg(&key).arg(v).arg("PX").arg(ms).ignore();
                pipe.zadd(&self.lru, &key, now).ignore();
            }
            pipe.pexpire(&self.lru, ms as i64).ignore();
            pipe.zcard(&self.lru);
            let (count,): (u64,) = self
                .fleet
                .run(
                    "kv_put",
                    |mut c| async move { pipe.query_async(&mut c).await },
                )
                .await
                .map_err(failed)?;
            if count <= self.max_pages {
                return Ok(());
            }
            // Over the bound: the oldest pages go.
            let lru = self.lru.clone();
            let excess = (count - self.max_pages) as isize;
            let fleet = self.fleet.clone();
            let old: Vec<(String, f64)> = fleet
                .run("kv_trim", |mut c| async move {
                    redis::cmd("ZPOPMIN")
                        .arg(&lru)
                        .arg(excess)
                        .query_async(&mut c)
                        .await
                })
                .await
                .map_err(failed)?;
            let keys: Vec<String> = old.into_iter().map(|(k, _)| k).collect();
            if keys.is_empty() {
                return Ok(());
            }
            self.fleet
                .run("kv_trim", |mut c| async move {
                    redis::cmd("DEL").arg(&keys).query_async::<()>(&mut c).await
                })
                .await
                .map_err(failed)
        })
    }
}
