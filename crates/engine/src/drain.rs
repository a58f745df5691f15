//! How fast the waiting queue drains, so an admission refusal can say when
//! a retry is likely to fit (`Retry-After`) instead of a constant.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The span of history the rate is measured over.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Samples closer together than this are merged (the engine loop records
/// every step).
const SPACING: Duration = Duration::from_millis(250);

/// The bounds of a suggested wait.
const MIN_WAIT: Duration = Duration::from_secs(1);
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Requests admitted (moved from waiting to running) over the last
/// [`WINDOW`].
#[derive(Debug, Default)]
pub struct DrainMeter {
    /// (when, requests admitted since start), oldest first.
    samples: VecDeque<(Instant, u64)>,
}

impl DrainMeter {
    /// Records that `admitted` requests have been admitted by `now`;
    /// returns the rate over the window in requests per second.
    pub fn record(&mut self, now: Instant, admitted: u64) -> f64 {
        let fresh = self
            .samples
            .back()
            .is_none_or(|&(t, _)| now.saturating_duration_since(t) >= SPACING);
        if fresh {
            self.samples.push_back((now, admitted));
        } else if let Some(last) = self.samples.back_mut() {
            last.1 = admitted;
        }
        while self
            .samples
            .front()
            .is_some_and(|&(t, _)| now.saturating_duration_since(t) > WINDOW)
            && self.samples.len() > 1
        {
            self.samples.pop_front();
        }
        let Some(&(t0, n0)) = self.samples.front() else {
            return 0.0;
        };
        // A window not yet full still spans at least one spacing, so a
        // burst at start-up is not read as an enormous rate.
        let span = now.saturating_duration_since(t0).max(SPACING).as_secs_f64();
        admitted.saturating_sub(n0) as f64 / span
    }
}

/// The wait before `excess` more requests have left the queue at `rate`
/// per second, within [1 s, 60 s]. A queue that has not moved for the
/// whole window suggests the window.
pub fn retry_after(excess: usize, rate: f64) -> Duration {
    if rate.is_nan() || rate <= 0.0 {
        return WINDOW;
    }
    let secs = excess.max(1) as f64 / rate;
    Duration::from_secs_f64(secs.min(MAX_WAIT.as_secs_f64())).clamp(MIN_WAIT, MAX_WAIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_admissions_over_the_window() {
        let mut m = DrainMeter::default();
        let t0 = Instant::now();
        assert_eq!(m.record(t0, 0), 0.0);
        // 2 per second for 20 s: the window sees 10 s of it.
        let mut rate = 0.0;
        for s in 1..=20 {
            rate = m.record(t0 + Duration::from_secs(s), 2 * s);
        }
        assert!((rate - 2.0).abs() < 0.01, "{rate}");
        // Nothing for 30 s: the rate falls to zero.
        let idle = m.record(t0 + Duration::from_secs(50), 40);
        assert_eq!(idle, 0.0);
    }

    #[test]
    fn the_wait_is_the_excess_over_the_rate_within_bounds() {
        assert_eq!(retry_after(10, 2.0), Duration::from_secs(5));
        assert_eq!(retry_after(1, 100.0), MIN_WAIT);
        assert_eq!(retry_after(1000, 1.0), MAX_WAIT);
        assert_eq!(retry_after(3, 0.0), WINDOW);
    }
}
