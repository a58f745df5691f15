//! Least outstanding requests: the worker with the smallest queue depth
//! ([`Worker::queue_depth`]: this router's requests in flight on it, exact
//! and immediate, plus other routers' requests from its last scraped
//! `/metrics`; ties: the lowest id). With one router it is its own
//! in-flight count; with several, each also sees the others' load.

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
            .min_by(|a, b| a.queue_depth().total_cmp(&b.queue_depth()))
            .map(|w| w.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_workers::{scraped, with_load};

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

    #[test]
    fn other_routers_scraped_requests_count_too() {
        // Worker 0 has 1 of ours; worker 1 none of ours but 3 of another
        // router's, seen at the last scrape.
        let (w, _g) = with_load(&[1, 0]);
        let req = RequestInfo::default();
        assert_eq!(LeastOutstandingPolicy.select(&req, &w), Some(1));
        w[1].set_load(scraped(3.0), true);
        assert_eq!(LeastOutstandingPolicy.select(&req, &w), Some(0));
        w[1].set_load(scraped(3.0), false);
        assert_eq!(LeastOutstandingPolicy.select(&req, &w), Some(1));
    }
}
