//! The prefix-cache policy's index shared by routers: which worker (by
//! URL) was last sent each chained chunk hash of prompt text, so several
//! routers send a shared prefix to the same worker. One hash per chunk,
//! `{ns}:prefix:{chunk hex}`, field = worker URL, value = last use (ms),
//! expiring `ttl` after the last use.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{Fleet, FleetError};

/// Chunks looked up or recorded per request at most (longer prompts are
/// matched on their first chunks only).
pub const MAX_CHUNKS: usize = 128;

fn hex(chunk: &[u8; 16]) -> String {
    chunk.iter().map(|b| format!("{b:02x}")).collect()
}

impl Fleet {
    fn prefix_key(&self, chunk: &[u8; 16]) -> String {
        self.key(&format!("prefix:{}", hex(chunk)))
    }

    /// For each of `chunks` in order, the worker URLs known to hold it,
    /// up to the first chunk nobody holds.
    pub async fn prefix_holders(
        &self,
        chunks: &[[u8; 16]],
    ) -> Result<Vec<Vec<String>>, FleetError> {
        let chunks = &chunks[..chunks.len().min(MAX_CHUNKS)];
        if chunks.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for c in chunks {
            pipe.hkeys(self.prefix_key(c));
        }
        let mut holders: Vec<Vec<String>> = self
            .run("prefix_lookup", |mut c| async move {
                pipe.query_async(&mut c).await
            })
            .await?;
        let known = holders.iter().take_while(|h| !h.is_empty()).count();
        holders.truncate(known);
        Ok(holders)
    }

    /// Records that `worker` was sent `chunks`.
    pub async fn prefix_record(
        &self,
        chunks: &[[u8; 16]],
        worker: &str,
        ttl: Duration,
    ) -> Result<(), FleetError> {
        let chunks = &chunks[..chunks.len().min(MAX_CHUNKS)];
        if chunks.is_empty() {
            return Ok(());
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1);
        let mut pipe = redis::pipe();
        for c in chunks {
            let key = self.prefix_key(c);
            pipe.hset(&key, worker, now).ignore();
            pipe.pexpire(&key, ms).ignore();
        }
        self.run("prefix_record", |mut c| async move {
            pipe.query_async::<()>(&mut c).await
        })
        .await
    }
}
