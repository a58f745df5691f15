//! Least outstanding requests: the worker with the fewest requests this
//! router has in flight on it (ties: the lowest id). Exact for one router;
//! it reacts at once, unlike a scraped queue depth.

use std::sync::Arc;

use super::{Policy, RequestInfo};
use crate::worker::{Worker, WorkerId};

/// Fewest requests in flight.
#[derive(Debug, Default)]
pub struct LeastOutstandingPolicy;

impl Policy for LeastOutstandingPolicy {
    fn select(&self, _: &RequestInfo, workers: &[Arc<Worker>]) -> Option<WorkerId> {
        workers
            .iter()
            .min_by_key(|w| (w.outstanding(), w.id))
            .map(|w| w.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_workers::with_load;

    #[test]
    fn picks_the_least_loaded() {
        let (w, _g) = with_load(&[3, 1, 2]);
        assert_eq!(
            LeastOutstandingPolicy.select(&RequestInfo::default(), &w),
            Some(1)
        );
        let (w, _g) = with_load(&[2, 2]);
        assert_eq!(
            LeastOutstandingPolicy.select(&RequestInfo::default(), &w),
            Some(0)
        );
    }
}
