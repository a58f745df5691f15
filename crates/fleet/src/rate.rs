//! Per-key rate limits shared by every instance: one GCRA bucket per key
//! and limit in Redis, taken atomically by a Lua script (sent once, then
//! called by its SHA1 with EVALSHA). Same semantics as the edge's local
//! `governor` buckets: full at start, a burst of the whole per-minute
//! limit, refilled one unit per `60 s / limit`.
//!
//! The bucket is its theoretical arrival time (TAT, µs on Redis's clock):
//! taking `n` moves it `n` intervals later, and is refused when the new
//! TAT would lie more than a minute ahead. Giving back (`n < 0`) moves it
//! earlier, never before now.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use crate::{Fleet, FleetError};

/// KEYS: the bucket. ARGV: limit per minute, n (negative: give back).
/// Returns {allowed, remaining, retry_after_ms, reset_ms}.
pub const RATE_SCRIPT: &str = r"
local limit = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = 60000000
local interval = window / limit
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new_tat = tat + n * interval
if new_tat < now then new_tat = now end
local function remaining(at)
  local r = math.floor((now + window - at) / interval)
  if r > limit then r = limit end
  if r < 0 then r = 0 end
  return r
end
if n > 0 and new_tat - window > now then
  return {0, remaining(tat), math.ceil((new_tat - window - now) / 1000), math.ceil((tat - now) / 1000)}
end
local ttl = math.ceil((new_tat - now) / 1000) + 1
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', ttl)
return {1, remaining(new_tat), 0, math.ceil((new_tat - now) / 1000)}
";

static RATE: LazyLock<Script> = LazyLock::new(|| Script::new(RATE_SCRIPT));

/// The outcome of taking from a shared bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateDecision {
    /// Whether the units were taken.
    pub allowed: bool,
    /// Units that could be taken now, after this decision.
    pub remaining: u32,
    /// When refused: until the units would fit.
    pub retry_after: Duration,
    /// Until the bucket is full again.
    pub reset: Duration,
}

impl Fleet {
    /// Takes `n` units (negative: gives them back) from the shared bucket
    /// `{ns}:rl:{bucket}` of `limit` per minute.
    pub async fn take_rate(
        &self,
        bucket: &str,
        limit: u32,
        n: i64,
    ) -> Result<RateDecision, FleetError> {
        let key = self.key(&format!("rl:{bucket}"));
        let limit = limit.max(1);
        let (allowed, remaining, retry_ms, reset_ms): (i64, i64, i64, i64) = self
            .run("rate_limit", |mut c| async move {
                RATE.key(key).arg(limit).arg(n).invoke_async(&mut c).await
            })
            .await?;
        let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
        Ok(RateDecision {
            allowed: allowed == 1,
            remaining: u32::try_from(remaining).unwrap_or(0),
            retry_after: ms(retry_ms),
            reset: ms(reset_ms),
        })
    }
}
