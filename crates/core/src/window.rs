//! A sliding time window of samples: a bounded ring of timestamped values
//! whose quantiles and means are computed over the samples younger than a
//! given age. Exact (it sorts what is in the window), which at the few
//! thousand samples a window holds costs microseconds per evaluation.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Timestamped samples, oldest first, at most `capacity` of them.
#[derive(Debug, Clone)]
pub struct SampleWindow {
    samples: VecDeque<(Instant, f64)>,
    capacity: usize,
}

impl SampleWindow {
    /// An empty window keeping at most `capacity` samples (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            samples: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Adds a sample; the oldest goes when the ring is full.
    pub fn push(&mut self, at: Instant, value: f64) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back((at, value));
    }

    /// Drops samples older than `max_age` at `now`.
    pub fn expire(&mut self, now: Instant, max_age: Duration) {
        while let Some(&(at, _)) = self.samples.front() {
            if now.saturating_duration_since(at) <= max_age {
                break;
            }
            self.samples.pop_front();
        }
    }

    /// The values no older than `age` at `now`.
    pub fn recent(&self, now: Instant, age: Duration) -> Vec<f64> {
        self.samples
            .iter()
            .rev()
            .take_while(|(at, _)| now.saturating_duration_since(*at) <= age)
            .map(|&(_, v)| v)
            .collect()
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True when no sample is held.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// The `q` quantile (0 < q ≤ 1) of `values` by the nearest-rank method (the
/// smallest value with at least `q` of the values at or below it); `None`
/// when empty.
pub fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = (q.clamp(0.0, 1.0) * values.len() as f64).ceil() as usize;
    Some(values[rank.clamp(1, values.len()) - 1])
}

/// The arithmetic mean; `None` when empty.
pub fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&mut v, 0.95), Some(95.0));
        assert_eq!(quantile(&mut v, 0.5), Some(50.0));
        assert_eq!(quantile(&mut v, 1.0), Some(100.0));
        assert_eq!(quantile(&mut v, 0.001), Some(1.0));
        assert_eq!(quantile(&mut [], 0.5), None);
        let mut unsorted = [3.0, 1.0, 2.0];
        assert_eq!(quantile(&mut unsorted, 0.5), Some(2.0));
    }

    #[test]
    fn window_keeps_only_recent_samples() {
        let t0 = Instant::now();
        let mut w = SampleWindow::new(10);
        for i in 0..5 {
            w.push(t0 + Duration::from_secs(i), i as f64);
        }
        let now = t0 + Duration::from_secs(4);
        let mut recent = w.recent(now, Duration::from_secs(2));
        recent.sort_by(f64::total_cmp);
        assert_eq!(recent, vec![2.0, 3.0, 4.0]);
        w.expire(now, Duration::from_secs(1));
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn ring_is_bounded() {
        let t0 = Instant::now();
        let mut w = SampleWindow::new(3);
        for i in 0..10 {
            w.push(t0, i as f64);
        }
        assert_eq!(w.len(), 3);
        let mut r = w.recent(t0, Duration::from_secs(1));
        r.sort_by(f64::total_cmp);
        assert_eq!(r, vec![7.0, 8.0, 9.0]);
        assert_eq!(mean(&r), Some(8.0));
    }
}
