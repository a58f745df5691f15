//! Latency-aware: the worker with the lowest expected wait, estimated as its
//! measured time-to-first-byte average (EWMA, measured by this router) times
//! (requests in flight + 1). A slow worker (a busier GPU, a noisy neighbour,
//! thermal throttling) gets proportionally less traffic even at equal queue
//! lengths, which least-outstanding cannot see. A worker without samples
//! counts as zero wait, so new and restarted workers are tried at once; ties
//! go to the fewest in flight, then the lowest id.

use std::sync::Arc;

use super::{Policy, RequestInfo};
use crate::worker::{Worker, WorkerId};

/// Lowest expected wait.
#[derive(Debug, Default)]
pub struct LatencyAwarePolicy;

fn expected_wait(w: &Worker) -> f64 {
    w.latency().ttft.unwrap_or(0.0) * (w.outstanding() as f64 + 1.0)
}

impl Policy for LatencyAwarePolicy {
    fn select(&self, _: &RequestInfo, workers: &[Arc<Worker>]) -> Option<WorkerId> {
        workers
            .iter()
            .min_by(|a, b| {
                expected_wait(a)
                    .total_cmp(&expected_wait(b))
                    .then(a.outstanding().cmp(&b.outstanding()))
                    .then(a.id.cmp(&b.id))
            })
            .map(|w| w.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_workers::with_load;

    #[test]
    fn a_slow_worker_gets_less_traffic_at_equal_load() {
        let (w, _g) = with_load(&[1, 1]);
        w[0].record_ttft(0.5);
        w[1].record_ttft(0.1);
        assert_eq!(
            LatencyAwarePolicy.select(&RequestInfo::default(), &w),
            Some(1)
        );
    }

    #[test]
    fn load_outweighs_a_small_latency_edge() {
        // 0.1 s × 6 in flight > 0.2 s × 1.
        let (w, _g) = with_load(&[5, 0]);
        w[0].record_ttft(0.1);
        w[1].record_ttft(0.2);
        assert_eq!(
            LatencyAwarePolicy.select(&RequestInfo::default(), &w),
            Some(1)
        );
    }

    #[test]
    fn an_unmeasured_worker_is_tried_first() {
        let (w, _g) = with_load(&[0, 0]);
        w[0].record_ttft(0.05);
        assert_eq!(
            LatencyAwarePolicy.select(&RequestInfo::default(), &w),
            Some(1)
        );
        assert_eq!(
            LatencyAwarePolicy.select(&RequestInfo::default(), &[]),
            None
        );
    }
}
