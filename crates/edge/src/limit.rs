//! Per-key limits: requests and tokens per minute (GCRA buckets from
//! `governor`, full at start, refilled evenly: a key at 60/min may burst 60,
//! then gets one more per second), and concurrent requests (a semaphore
//! whose permit the response holds until its body ends).

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::Rejection;

/// A bucket's state as the `x-ratelimit-*` headers report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// Size of the bucket (the per-minute limit).
    pub limit: u32,
    /// What could be taken now.
    pub remaining: u32,
    /// Until the bucket is full again.
    pub reset: Duration,
}

/// A per-minute bucket.
pub struct Bucket<C: Clock + Clone = DefaultClock> {
    limiter: RateLimiter<NotKeyed, InMemoryState, C, StateInformationMiddleware>,
    clock: C,
    pub(crate) limit: u32,
    /// The remaining capacity at the last take, and when: the headers of
    /// answers that took nothing are estimated from it.
    last: Mutex<Option<(u32, Instant)>>,
}

impl Bucket {
    /// A full bucket of `per_minute`, on the real clock.
    pub fn per_minute(per_minute: NonZeroU32) -> Self {
        Self::with_clock(per_minute, DefaultClock::default())
    }
}

impl<C: Clock + Clone> Bucket<C> {
    /// A full bucket of `per_minute` on `clock` (tests pass a fake one).
    pub fn with_clock(per_minute: NonZeroU32, clock: C) -> Self {
        let limiter = RateLimiter::direct_with_clock(Quota::per_minute(per_minute), clock.clone())
            .with_middleware::<StateInformationMiddleware>();
        Self {
            limiter,
            clock,
            limit: per_minute.get(),
            last: Mutex::new(None),
        }
    }

    /// Time for one unit to come back.
    fn interval(&self) -> Duration {
        Duration::from_secs(60) / self.limit
    }

    /// Takes `n` units (0 takes nothing). `Err(Some(wait))`: retry after
    /// `wait`; `Err(None)`: `n` is more than the bucket holds, never
    /// possible.
    pub fn take(&self, n: u32) -> Result<Status, Option<Duration>> {
        let Some(n) = NonZeroU32::new(n) else {
            return Ok(self.status());
        };
        match self.limiter.check_n(n) {
            Ok(Ok(snapshot)) => {
                let remaining = snapshot.remaining_burst_capacity();
                self.remember(remaining);
                Ok(self.status_of(remaining))
            }
            Ok(Err(not_until)) => {
                let wait = not_until.wait_time_from(self.clock.now());
                self.remember(short_by(n.get(), wait, self.interval()));
                Err(Some(wait))
            }
            Err(_) => Err(None),
        }
    }

    /// Records a remaining count decided elsewhere (the shared bucket),
    /// for the headers.
    pub(crate) fn observe(&self, remaining: u32) {
        self.remember(remaining);
    }

    fn remember(&self, remaining: u32) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((remaining, Instant::now()));
    }

    fn status_of(&self, remaining: u32) -> Status {
        Status {
            limit: self.limit,
            remaining,
            reset: self.interval() * (self.limit - remaining.min(self.limit)),
        }
    }

    /// The state now, estimated from the last take plus what has refilled
    /// since (taking nothing from the bucket).
    pub fn status(&self) -> Status {
        let last = *self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let remaining = last.map_or(self.limit, |(r, at)| {
            refilled(r, at.elapsed(), self.interval(), self.limit)
        });
        self.status_of(remaining)
    }
}

/// What remained when taking `n` had to wait `wait`: `n` less the units
/// still to come back.
fn short_by(n: u32, wait: Duration, interval: Duration) -> u32 {
    let missing = wait.as_nanos().div_ceil(interval.as_nanos().max(1));
    n.saturating_sub(u32::try_from(missing).unwrap_or(u32::MAX))
}

/// `remaining` after `elapsed`, one unit back per `interval`, capped at
/// `limit`.
fn refilled(remaining: u32, elapsed: Duration, interval: Duration, limit: u32) -> u32 {
    let back = elapsed.as_nanos() / interval.as_nanos().max(1);
    let back = u32::try_from(back).unwrap_or(u32::MAX);
    remaining.saturating_add(back).min(limit)
}

/// OpenAI's reset format: `1s`, `0.5s`, `6m0s`.
pub fn format_reset(d: Duration) -> String {
    let ms = d.as_millis();
    let (minutes, ms) = (ms / 60_000, ms % 60_000);
    let secs = if ms % 1000 == 0 {
        format!("{}", ms / 1000)
    } else {
        format!("{}.{:03}", ms / 1000, ms % 1000)
            .trim_end_matches('0')
            .to_string()
    };
    if minutes > 0 {
        format!("{minutes}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

/// Everything one key is limited by. Shared by the key's requests and kept
/// across reloads while the key's limits do not change.
pub struct KeyLimits {
    /// Requests per minute.
    pub requests: Option<Bucket>,
    /// Tokens per minute.
    pub tokens: Option<Bucket>,
    concurrent: Option<(u32, Arc<Semaphore>)>,
    /// Tokens reserved at admission but not used (a request that stopped
    /// before max_tokens), taken before the bucket: the correction at
    /// completion. Never more than the per-minute limit.
    token_credit: AtomicU64,
    /// (rpm, tpm, concurrent) as configured, to tell whether a reload kept them.
    pub(crate) spec: (Option<u32>, Option<u32>, Option<u32>),
    /// The fleet-wide buckets, when shared through Redis.
    pub(crate) shared: std::sync::OnceLock<crate::shared::SharedBuckets>,
}

impl KeyLimits {
    /// Limits as configured (`None`: unlimited).
    pub fn new(rpm: Option<u32>, tpm: Option<u32>, concurrent: Option<u32>) -> Self {
        Self {
            requests: rpm.and_then(NonZeroU32::new).map(Bucket::per_minute),
            tokens: tpm.and_then(NonZeroU32::new).map(Bucket::per_minute),
            concurrent: concurrent.map(|n| (n, Arc::new(Semaphore::new(n as usize)))),
            token_credit: AtomicU64::new(0),
            spec: (rpm, tpm, concurrent),
            shared: std::sync::OnceLock::new(),
        }
    }

    /// A concurrency permit (`None` when unlimited), or 429.
    pub fn enter(&self) -> Result<Option<OwnedSemaphorePermit>, Rejection> {
        let Some((n, sem)) = &self.concurrent else {
            return Ok(None);
        };
        sem.clone()
            .try_acquire_owned()
            .map(Some)
            .map_err(|_| Rejection::RateLimited {
                message: format!("too many requests in flight for this key (limit {n})"),
                retry_after: Some(Duration::from_secs(1)),
            })
    }

    /// Takes one request from the requests bucket, or 429 with the wait.
    pub fn take_request(&self) -> Result<(), Rejection> {
        let Some(b) = &self.requests else {
            return Ok(());
        };
        b.take(1).map(drop).map_err(|wait| Rejection::RateLimited {
            message: format!(
                "rate limit reached for this key: {} requests per minute",
                b.limit
            ),
            retry_after: wait,
        })
    }

    /// Reserves `n` tokens (prompt + max_tokens) from the tokens bucket, or
    /// 429: with the wait, or without a Retry-After when `n` exceeds the
    /// per-minute limit (it never fits; lower max_tokens).
    pub fn reserve_tokens(&self, n: u64) -> Result<(), Rejection> {
        let Some(b) = &self.tokens else {
            return Ok(());
        };
        let too_large = || {
            Rejection::RateLimited {
            message: format!(
                "request too large for this key: {n} tokens (prompt + max_tokens) against a limit of {} tokens per minute",
                b.limit
            ),
            retry_after: None,
        }
        };
        if n > u64::from(b.limit) {
            return Err(too_large());
        }
        let credited = self.take_credit(n);
        let rest = u32::try_from(n - credited).map_err(|_| too_large())?;
        let taken = b.take(rest);
        if taken.is_err() {
            self.refund_tokens(credited);
        }
        match taken {
            Ok(_) => Ok(()),
            Err(None) => Err(too_large()),
            Err(Some(wait)) => Err(Rejection::RateLimited {
                message: format!(
                    "rate limit reached for this key: {} tokens per minute (this request reserves {n})",
                    b.limit
                ),
                retry_after: Some(wait),
            }),
        }
    }

    /// Gives back `n` reserved tokens a request did not use.
    pub fn refund_tokens(&self, n: u64) {
        let Some(b) = &self.tokens else {
            return;
        };
        if self.refund_shared(n) {
            return;
        }
        let cap = u64::from(b.limit);
        let _ = self
            .token_credit
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                Some(c.saturating_add(n).min(cap))
            });
    }

    /// Takes up to `n` tokens of credit; returns how many.
    fn take_credit(&self, n: u64) -> u64 {
        let mut taken = 0;
        let _ = self
            .token_credit
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                taken = c.min(n);
                Some(c - taken)
            });
        taken
    }

    /// Adds the `x-ratelimit-*` headers of every limited bucket (the tokens
    /// remaining include the credit).
    pub fn add_headers(&self, headers: &mut HeaderMap) {
        if let Some(b) = &self.requests {
            put_headers(headers, "requests", b.status());
        }
        if let Some(b) = &self.tokens {
            let mut s = b.status();
            let credit =
                u32::try_from(self.token_credit.load(Ordering::SeqCst)).unwrap_or(u32::MAX);
            s.remaining = s.remaining.saturating_add(credit).min(s.limit);
            put_headers(headers, "tokens", s);
        }
    }
}

fn put_headers(headers: &mut HeaderMap, what: &str, s: Status) {
    let values = [
        ("limit", HeaderValue::from(s.limit)),
        ("remaining", HeaderValue::from(s.remaining)),
        (
            "reset",
            HeaderValue::try_from(format_reset(s.reset)).unwrap_or(HeaderValue::from_static("0s")),
        ),
    ];
    for (kind, value) in values {
        if let Ok(name) = axum::http::HeaderName::try_from(format!("x-ratelimit-{kind}-{what}")) {
            headers.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use governor::clock::FakeRelativeClock;

    use super::*;

    fn bucket(n: u32) -> (Bucket<FakeRelativeClock>, FakeRelativeClock) {
        let clock = FakeRelativeClock::default();
        (
            Bucket::with_clock(NonZeroU32::new(n).unwrap(), clock.clone()),
            clock,
        )
    }

    #[test]
    fn a_full_bucket_bursts_then_refills_one_per_interval() {
        let (b, clock) = bucket(60);
        for i in 0..60 {
            let s = b.take(1).unwrap();
            assert_eq!(s.remaining, 59 - i);
        }
        let wait = b.take(1).unwrap_err().unwrap();
        assert!(
            wait <= Duration::from_secs(1) && wait > Duration::from_millis(900),
            "{wait:?}"
        );
        clock.advance(Duration::from_secs(1));
        assert!(b.take(1).is_ok());
        assert!(b.take(1).is_err());
    }

    #[test]
    fn tokens_take_many_and_too_many_never_fit() {
        let (b, _) = bucket(1000);
        assert_eq!(b.take(600).unwrap().remaining, 400);
        let wait = b.take(600).unwrap_err().unwrap();
        // 200 tokens short at 1000/min: 12 s.
        assert!(
            wait > Duration::from_secs(11) && wait <= Duration::from_secs(12),
            "{wait:?}"
        );
        assert_eq!(b.take(1001), Err(None));
        assert_eq!(b.take(0).unwrap().limit, 1000);
    }

    #[test]
    fn reset_is_the_time_to_refill() {
        let (b, _) = bucket(60);
        assert_eq!(b.take(1).unwrap().reset, Duration::from_secs(1));
        assert_eq!(b.take(9).unwrap().reset, Duration::from_secs(10));
    }

    #[test]
    fn refill_estimate_is_capped() {
        let s = Duration::from_secs(1);
        assert_eq!(refilled(0, Duration::from_millis(2500), s, 60), 2);
        assert_eq!(refilled(59, Duration::from_secs(10), s, 60), 60);
        assert_eq!(refilled(5, Duration::ZERO, s, 60), 5);
    }

    #[test]
    fn reset_format_matches_openai() {
        assert_eq!(format_reset(Duration::from_secs(1)), "1s");
        assert_eq!(format_reset(Duration::from_millis(500)), "0.5s");
        assert_eq!(format_reset(Duration::from_millis(1250)), "1.25s");
        assert_eq!(format_reset(Duration::from_secs(360)), "6m0s");
        assert_eq!(format_reset(Duration::from_millis(61_500)), "1m1.5s");
        assert_eq!(format_reset(Duration::ZERO), "0s");
    }

    #[test]
    fn limits_enforce_concurrency_and_reserve_tokens() {
        let l = KeyLimits::new(Some(2), Some(100), Some(1));
        let permit = l.enter().unwrap();
        assert!(permit.is_some());
        assert!(matches!(l.enter(), Err(Rejection::RateLimited { .. })));
        drop(permit);
        assert!(l.enter().unwrap().is_some());
        assert!(l.take_request().is_ok() && l.take_request().is_ok());
        let e = l.take_request().unwrap_err();
        assert!(matches!(
            e,
            Rejection::RateLimited {
                retry_after: Some(_),
                ..
            }
        ));
        assert!(l.reserve_tokens(60).is_ok());
        assert!(l
            .reserve_tokens(60)
            .unwrap_err()
            .retry_after_secs()
            .is_some());
        assert_eq!(l.reserve_tokens(101).unwrap_err().retry_after_secs(), None);
        let mut h = HeaderMap::new();
        l.add_headers(&mut h);
        assert_eq!(h["x-ratelimit-limit-requests"], "2");
        assert_eq!(h["x-ratelimit-remaining-requests"], "0");
        assert_eq!(h["x-ratelimit-limit-tokens"], "100");
        assert_eq!(h["x-ratelimit-remaining-tokens"], "40");
        let unlimited = KeyLimits::new(None, None, None);
        let mut h = HeaderMap::new();
        unlimited.add_headers(&mut h);
        assert!(h.is_empty());
        assert!(unlimited.enter().unwrap().is_none());
    }
}
