//! Power of two choices (Mitzenmacher 2001): two distinct workers at random,
//! the one with the smaller queue depth (this router's in flight plus other
//! routers' scraped from the worker's `/metrics`). Nearly as balanced as
//! least-outstanding, without every router herding onto the same idle worker.

use std::sync::Arc;

use rand::Rng;

use super::{Policy, RequestInfo};
use crate::worker::{Worker, WorkerId};

/// Best of two random workers.
#[derive(Debug, Default)]
pub struct PowerOfTwoPolicy;

impl Policy for PowerOfTwoPolicy {
    fn select(&self, _: &RequestInfo, workers: &[Arc<Worker>]) -> Option<WorkerId> {
        match workers.len() {
            0 => None,
            1 => Some(workers[0].id),
            n => {
                let mut rng = rand::rng();
                let a = rng.random_range(0..n);
                let b = (a + rng.random_range(1..n)) % n;
                let (wa, wb) = (&workers[a], &workers[b]);
                Some(if wb.queue_depth() < wa.queue_depth() {
                    wb.id
                } else {
                    wa.id
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_workers::{scraped, with_load};

    #[test]
    fn never_picks_the_most_loaded_of_two() {
        let (w, _g) = with_load(&[0, 9]);
        for _ in 0..100 {
            assert_eq!(
                PowerOfTwoPolicy.select(&RequestInfo::default(), &w),
                Some(0)
            );
        }
    }

    #[test]
    fn spreads_over_all_idle_workers() {
        let (w, _g) = with_load(&[0, 0, 0, 0]);
        let mut seen = [false; 4];
        for _ in 0..200 {
            seen[PowerOfTwoPolicy
                .select(&RequestInfo::default(), &w)
                .unwrap()] = true;
        }
        assert_eq!(seen, [true; 4]);
    }

    #[test]
    fn avoids_a_worker_busy_with_another_routers_requests() {
        let (w, _g) = with_load(&[0, 0]);
        w[0].set_load(scraped(5.0), true);
        for _ in 0..100 {
            assert_eq!(
                PowerOfTwoPolicy.select(&RequestInfo::default(), &w),
                Some(1)
            );
        }
    }
}
