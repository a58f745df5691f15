//! Per-key limits shared by every instance (`redis.share_rate_limits`):
//! the requests and tokens buckets live in Redis (a GCRA script, see
//! `ingot_fleet::rate`), so a key at 10 requests per minute gets 10 across
//! the whole fleet. While Redis is unreachable each instance falls back to
//! its local `governor` bucket (the limit then holds per instance).

use std::sync::OnceLock;

use ingot_fleet::{Fleet, RateDecision};

use crate::error::Rejection;
use crate::limit::{Bucket, KeyLimits};

/// Where a key's buckets are shared: the client and the key's id.
pub(crate) struct SharedBuckets {
    fleet: Fleet,
    key_id: String,
}

impl KeyLimits {
    /// Shares this key's buckets through `fleet` (once; later calls keep
    /// the first).
    pub(crate) fn share(&self, fleet: &Fleet, key_id: &str) {
        let _ = self.shared.set(SharedBuckets {
            fleet: fleet.clone(),
            key_id: key_id.to_string(),
        });
    }

    fn shared(&self) -> Option<&SharedBuckets> {
        OnceLock::get(&self.shared)
    }

    /// [`KeyLimits::take_request`], from the shared bucket when there is
    /// one and Redis answers.
    pub async fn take_request_shared(&self) -> Result<(), Rejection> {
        let (Some(s), Some(b)) = (self.shared(), &self.requests) else {
            return self.take_request();
        };
        match take(s, "requests", b, 1).await {
            Some(d) if d.allowed => Ok(()),
            Some(d) => Err(Rejection::RateLimited {
                message: format!(
                    "rate limit reached for this key: {} requests per minute",
                    b.limit
                ),
                retry_after: Some(d.retry_after),
            }),
            None => self.take_request(),
        }
    }

    /// [`KeyLimits::reserve_tokens`], from the shared bucket when there is
    /// one and Redis answers.
    pub async fn reserve_tokens_shared(&self, n: u64) -> Result<(), Rejection> {
        let (Some(s), Some(b)) = (self.shared(), &self.tokens) else {
            return self.reserve_tokens(n);
        };
        if n > u64::from(b.limit) {
            // Never fits: the local path words the refusal.
            return self.reserve_tokens(n);
        }
        let units = i64::try_from(n).unwrap_or(i64::MAX);
        match take(s, "tokens", b, units).await {
            Some(d) if d.allowed => Ok(()),
            Some(d) => Err(Rejection::RateLimited {
                message: format!(
                    "rate limit reached for this key: {} tokens per minute (this request reserves {n})",
                    b.limit
                ),
                retry_after: Some(d.retry_after),
            }),
            None => self.reserve_tokens(n),
        }
    }

    /// Gives `n` unused tokens back to the shared bucket (in the
    /// background); `false` when not shared (the caller refunds locally).
    pub(crate) fn refund_shared(&self, n: u64) -> bool {
        let (Some(s), Some(b)) = (self.shared(), &self.tokens) else {
            return false;
        };
        if n == 0 {
            return true;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let (fleet, bucket, limit) = (s.fleet.clone(), bucket_name(s, "tokens", b), b.limit);
        let units = -i64::try_from(n).unwrap_or(i64::MAX);
        handle.spawn(async move {
            let _ = fleet.take_rate(&bucket, limit, units).await;
        });
        true
    }
}

/// `{key id}:{what}:{limit}`: a changed limit starts a fresh bucket.
fn bucket_name(s: &SharedBuckets, what: &str, b: &Bucket) -> String {
    format!("{}:{what}:{}", s.key_id, b.limit)
}

/// Takes `n` from the shared bucket; `None` when Redis did not answer.
/// The answer's remaining count feeds the `x-ratelimit-*` headers.
async fn take(s: &SharedBuckets, what: &str, b: &Bucket, n: i64) -> Option<RateDecision> {
    let d = s
        .fleet
        .take_rate(&bucket_name(s, what, b), b.limit, n)
        .await
        .ok()?;
    b.observe(d.remaining);
    Some(d)
}
