//! Load-balancing policies: one file each behind [`Policy`], built from
//! [`PolicyKind`] by [`build`].

mod latency_aware;
mod least_outstanding;
mod power_of_two;
mod prefix_cache;
mod round_robin;

use std::sync::Arc;

pub use latency_aware::LatencyAwarePolicy;
pub use least_outstanding::LeastOutstandingPolicy;
pub use power_of_two::PowerOfTwoPolicy;
pub use prefix_cache::{chunk_hashes, PrefixCachePolicy};
pub use round_robin::RoundRobinPolicy;

pub use crate::config::PolicyKind;

use crate::worker::{Worker, WorkerId};

/// What a policy may look at in a request.
#[derive(Debug, Default)]
pub struct RequestInfo {
    /// The request's `model`.
    pub model: Option<String>,
    /// The request's `user` (a split's unit when there is no API key).
    pub user: Option<String>,
    /// Whether it asked for a stream.
    pub stream: bool,
    /// Its prompt text (chat messages' contents joined, or the prompt), for
    /// the prefix-cache-aware policy.
    pub text: String,
    /// Per leading chunk of `text`, the worker URLs other routers sent it
    /// to (the shared prefix index; empty without Redis).
    pub holders: Vec<Vec<String>>,
}

/// Chooses a worker for a request.
pub trait Policy: Send + Sync {
    /// Picks one of `workers` (already filtered to those that may take the
    /// request: healthy, not draining, breaker closed, serving its model,
    /// not yet tried for it); `None` only when `workers` is empty.
    fn select(&self, request: &RequestInfo, workers: &[Arc<Worker>]) -> Option<WorkerId>;
}

/// The policy `kind` names.
pub fn build(kind: PolicyKind) -> Box<dyn Policy> {
    match kind {
        PolicyKind::RoundRobin => Box::new(RoundRobinPolicy::default()),
        PolicyKind::LeastOutstanding => Box::new(LeastOutstandingPolicy),
        PolicyKind::PowerOfTwo => Box::new(PowerOfTwoPolicy),
        PolicyKind::LatencyAware => Box::new(LatencyAwarePolicy),
        PolicyKind::PrefixCache => Box::new(PrefixCachePolicy::default()),
    }
}

#[cfg(test)]
pub(crate) mod test_workers {
    use std::sync::Arc;

    use crate::config::BreakerConfig;
    use crate::worker::{InFlight, Worker, WorkerLoad};

    /// A scrape showing `n` requests waiting at a worker.
    pub fn scraped(n: f64) -> WorkerLoad {
        WorkerLoad {
            waiting: n,
            ..WorkerLoad::default()
        }
    }

    /// `n` workers, worker i with `load[i]` requests in flight (the guards
    /// keep them counted).
    pub fn with_load(load: &[usize]) -> (Vec<Arc<Worker>>, Vec<InFlight>) {
        let cfg = BreakerConfig {
            failure_threshold: 1,
            cooldown: std::time::Duration::from_secs(1),
        };
        let workers: Vec<_> = load
            .iter()
            .enumerate()
            .map(|(i, _)| Arc::new(Worker::new(i, format!("w{i}"), String::new(), false, cfg)))
            .collect();
        let guards = workers
            .iter()
            .zip(load)
            .flat_map(|(w, &n)| (0..n).map(|_| w.begin()).collect::<Vec<_>>())
            .collect();
        (workers, guards)
    }
}
