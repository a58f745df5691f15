//! What every handler shares: the workers, the policy, the worker client,
//! the retry budget and the resolved config.

use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::mpsc;

use crate::client::{HyperClient, WorkerClient};
use crate::config::ValidRouterConfig;
use crate::policy::{self, Policy, RequestInfo};
use crate::retry::RetryBudget;
use crate::split::Splits;
use crate::worker::{Worker, WorkerId};

/// The router's shared state.
pub struct RouterState {
    /// Every worker, indexed by id. Discovery only appends (a worker that
    /// disappears is marked removed, and re-used if it comes back), so ids
    /// stay stable.
    workers: RwLock<Vec<Arc<Worker>>>,
    /// The policy.
    pub policy: Box<dyn Policy>,
    /// The resolved config.
    pub config: ValidRouterConfig,
    /// How requests reach the workers.
    pub client: Box<dyn WorkerClient>,
    /// The Prometheus handle (absent when another recorder was installed).
    pub metrics: Option<PrometheusHandle>,
    /// Per worker: asks its supervisor to restart the child (local ones).
    pub restarts: Vec<Option<mpsc::UnboundedSender<()>>>,
    /// A/B experiments and canaries (`CanaryController::rollback` is the
    /// handle for remediation).
    pub splits: Splits,
    /// Shared state in Redis, when `[redis]` is configured.
    pub fleet: Option<ingot_fleet::Fleet>,
    /// `[slo]`: routing away from workers that breach latency targets.
    pub route_away: crate::route_away::RouteAway,
    budget: Mutex<RetryBudget>,
}

impl RouterState {
    /// The state for `config`; `workers` and `restarts` come from the
    /// supervisor and the static URLs.
    pub fn new(
        config: ValidRouterConfig,
        workers: Vec<Arc<Worker>>,
        restarts: Vec<Option<mpsc::UnboundedSender<()>>>,
        metrics: Option<PrometheusHandle>,
    ) -> Self {
        let client = HyperClient::new(config.retry.first_byte_timeout);
        Self::with_client(config, workers, restarts, metrics, Box::new(client))
    }

    /// The same with requests sent through `client` (tests: fake workers).
    pub fn with_client(
        config: ValidRouterConfig,
        workers: Vec<Arc<Worker>>,
        restarts: Vec<Option<mpsc::UnboundedSender<()>>>,
        metrics: Option<PrometheusHandle>,
        client: Box<dyn WorkerClient>,
    ) -> Self {
        Self {
            splits: Splits::new(config.experiments.clone(), config.canaries.clone()),
            route_away: crate::route_away::RouteAway::new(config.route_away.clone()),
            policy: policy::build(config.policy),
            budget: Mutex::new(RetryBudget::new(&config.retry)),
            workers: RwLock::new(workers),
            config,
            client,
            metrics,
            restarts,
            fleet: None,
        }
    }

    /// A snapshot of every worker.
    pub fn workers(&self) -> Vec<Arc<Worker>> {
        self.workers.read().map(|w| w.clone()).unwrap_or_default()
    }

    /// The refusal when no worker can take a request at `now`: retry when
    /// the first open breaker lets a trial through, or after the next
    /// health probe when workers are down or draining (1 to 60 s).
    pub fn no_worker(&self, detail: String, now: Instant) -> crate::error::RouteError {
        let probe = self.config.health.interval;
        let soonest = self
            .workers()
            .iter()
            .filter(|w| !w.is_removed())
            .map(|w| {
                if w.is_healthy() && !w.is_draining() {
                    w.breaker().reopens_in(now).unwrap_or(Duration::ZERO)
                } else {
                    probe
                }
            })
            .min()
            .unwrap_or(probe);
        crate::error::RouteError::NoWorker {
            detail,
            retry_after: soonest.clamp(Duration::from_secs(1), Duration::from_secs(60)),
        }
    }

    /// Whether any worker satisfies `f` (under the read lock, no snapshot).
    fn any_worker(&self, f: impl Fn(&Worker) -> bool) -> bool {
        self.workers.read().is_ok_and(|w| w.iter().any(|w| f(w)))
    }

    /// The worker with id `id`.
    pub fn worker(&self, id: WorkerId) -> Option<Arc<Worker>> {
        self.workers.read().ok()?.get(id).cloned()
    }

    /// Makes the discovered (non-local) workers exactly those at `urls`: new
    /// URLs become workers (returned, to be probed at once), missing ones are
    /// marked removed (drained: their in-flight requests finish), and a
    /// removed one that is listed again comes back. Static URLs from
    /// `workers.urls` are never removed.
    pub fn reconcile(&self, urls: &[String]) -> Vec<Arc<Worker>> {
        let Ok(mut workers) = self.workers.write() else {
            return Vec::new();
        };
        for w in workers.iter().filter(|w| w.discovered) {
            let listed = urls.contains(&w.url());
            if w.is_removed() == listed {
                tracing::info!(worker = %w.label, listed, "discovery changed a worker");
                w.set_removed(!listed);
            }
        }
        let mut added = Vec::new();
        for url in urls {
            if workers.iter().any(|w| w.url() == *url && !w.local) {
                continue;
            }
            let mut w = Worker::new(
                workers.len(),
                url.clone(),
                url.clone(),
                false,
                self.config.breaker,
            );
            w.discovered = true;
            let w = Arc::new(w);
            tracing::info!(worker = %w.label, "discovered a worker");
            workers.push(Arc::clone(&w));
            added.push(w);
        }
        added
    }

    /// The retry budget.
    pub fn budget(&self) -> MutexGuard<'_, RetryBudget> {
        self.budget.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The workers that may take `request` now, not counting `tried`.
    pub fn candidates(
        &self,
        request: &RequestInfo,
        tried: &[WorkerId],
        now: Instant,
    ) -> Vec<Arc<Worker>> {
        self.candidates_in(None, request.model.as_deref(), tried, now)
    }

    /// The workers of `group` (any group when `None`) that may take a
    /// request for `model` now, not counting `tried`.
    pub fn candidates_in(
        &self,
        group: Option<&str>,
        model: Option<&str>,
        tried: &[WorkerId],
        now: Instant,
    ) -> Vec<Arc<Worker>> {
        // Per request: only the candidates are cloned, not every worker.
        let Ok(workers) = self.workers.read() else {
            return Vec::new();
        };
        let available = workers
            .iter()
            .filter(|w| {
                group.is_none_or(|g| w.group == g)
                    && !tried.contains(&w.id)
                    && w.is_available(now)
                    && w.serves(model)
            })
            .cloned()
            .collect();
        self.route_away.filter(available, now)
    }

    /// Whether any worker (healthy or not) has listed `model`.
    pub fn knows_model(&self, model: &str) -> bool {
        self.any_worker(|w| !w.is_removed() && w.serves(Some(model)))
    }

    /// Whether at least one worker is healthy.
    pub fn is_ready(&self) -> bool {
        self.any_worker(|w| w.is_healthy() && !w.is_removed())
    }
}
