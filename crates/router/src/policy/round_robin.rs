//! Round-robin: each worker in turn, blind to load. The baseline the other
//! policies are measured against.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{Policy, RequestInfo};
use crate::worker::{Worker, WorkerId};

/// Each worker in turn.
#[derive(Debug, Default)]
pub struct RoundRobinPolicy {
    next: AtomicUsize,
}

impl Policy for RoundRobinPolicy {
    fn select(&self, _: &RequestInfo, workers: &[Arc<Worker>]) -> Option<WorkerId> {
        if workers.is_empty() {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % workers.len();
        Some(workers[i].id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_workers::with_load;

    #[test]
    fn visits_every_worker_in_turn() {
        let (w, _g) = with_load(&[5, 0, 0]);
        let p = RoundRobinPolicy::default();
        let picks: Vec<_> = (0..6)
            .map(|_| p.select(&RequestInfo::default(), &w))
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2].map(Some));
        assert_eq!(p.select(&RequestInfo::default(), &[]), None);
    }
}
