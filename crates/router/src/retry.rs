//! Retry decisions: exponential backoff with full jitter, and a retry budget
//! so that retries stay a bounded fraction of traffic during an outage
//! (the Finagle/Envoy "retry budget" idea: retries ≤ ratio × requests + min
//! over a sliding window).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rand::Rng;

use crate::config::RetryConfig;

/// The delay before retry number `retry` (1-based): uniform in
/// `[0, min(max, base × 2^(retry-1))]` ("full jitter", so that clients that
/// failed together do not retry together).
pub fn backoff(config: &RetryConfig, retry: u32, rng: &mut impl Rng) -> Duration {
    let exp = config
        .backoff
        .saturating_mul(1u32 << retry.saturating_sub(1).min(20));
    let cap = exp.min(config.backoff_max);
    cap.mul_f64(rng.random::<f64>())
}

/// Requests and retries over a sliding window.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    min: u32,
    window: Duration,
    requests: VecDeque<Instant>,
    retries: VecDeque<Instant>,
}

impl RetryBudget {
    /// An empty budget.
    pub fn new(config: &RetryConfig) -> Self {
        Self {
            ratio: config.budget_ratio,
            min: config.budget_min,
            window: config.budget_window,
            requests: VecDeque::new(),
            retries: VecDeque::new(),
        }
    }

    fn expire(&mut self, now: Instant) {
        for q in [&mut self.requests, &mut self.retries] {
            while q
                .front()
                .is_some_and(|&t| now.duration_since(t) > self.window)
            {
                q.pop_front();
            }
        }
    }

    /// Counts a client request.
    pub fn on_request(&mut self, now: Instant) {
        self.expire(now);
        self.requests.push_back(now);
    }

    /// Takes one retry from the budget; false when it is spent.
    pub fn try_retry(&mut self, now: Instant) -> bool {
        self.expire(now);
        let allowed = f64::from(self.min) + self.ratio * self.requests.len() as f64;
        if (self.retries.len() as f64) < allowed {
            self.retries.push_back(now);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn config() -> RetryConfig {
        RetryConfig {
            max_attempts: 3,
            backoff: Duration::from_millis(10),
            backoff_max: Duration::from_millis(100),
            first_byte_timeout: Duration::from_secs(1),
            budget_ratio: 0.2,
            budget_min: 2,
            budget_window: Duration::from_secs(10),
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let c = config();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for retry in 1..10 {
            let cap = Duration::from_millis((10u64 << (retry - 1)).min(100));
            for _ in 0..50 {
                assert!(backoff(&c, retry, &mut rng) <= cap);
            }
        }
        let big: Vec<_> = (0..50).map(|_| backoff(&c, 8, &mut rng)).collect();
        assert!(
            big.iter().any(|d| *d > Duration::from_millis(50)),
            "jitter spans the range"
        );
    }

    #[test]
    fn budget_is_min_plus_ratio_of_requests_in_window() {
        let c = config();
        let mut b = RetryBudget::new(&c);
        let t = Instant::now();
        for _ in 0..10 {
            b.on_request(t);
        }
        // 2 + 0.2 × 10 = 4 retries.
        assert_eq!((0..10).filter(|_| b.try_retry(t)).count(), 4);
        // The window slides: later, the old requests and retries are gone.
        let later = t + Duration::from_secs(11);
        assert_eq!((0..10).filter(|_| b.try_retry(later)).count(), 2);
    }
}
