//! What every handler shares: the workers, the policy, the HTTP client pool,
//! the retry budget and the resolved config.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::mpsc;

use crate::config::ValidRouterConfig;
use crate::policy::{self, Policy, RequestInfo};
use crate::retry::RetryBudget;
use crate::worker::{Worker, WorkerId};

/// The keep-alive pool of HTTP/1 connections to the workers.
pub type WorkerClient = Client<HttpConnector, Full<Bytes>>;

/// The router's shared state.
pub struct RouterState {
    /// Every worker, indexed by id.
    pub workers: Vec<Arc<Worker>>,
    /// The policy.
    pub policy: Box<dyn Policy>,
    /// The resolved config.
    pub config: ValidRouterConfig,
    /// The connection pool.
    pub client: WorkerClient,
    /// The Prometheus handle (absent when another recorder was installed).
    pub metrics: Option<PrometheusHandle>,
    /// Per worker: asks its supervisor to restart the child (local ones).
    pub restarts: Vec<Option<mpsc::UnboundedSender<()>>>,
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
        let mut connector = HttpConnector::new();
        // Token streams are many small writes: no Nagle delay.
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(config.retry.first_byte_timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(std::time::Duration::from_secs(90))
            .build(connector);
        Self {
            policy: policy::build(config.policy),
            budget: Mutex::new(RetryBudget::new(&config.retry)),
            workers,
            config,
            client,
            metrics,
            restarts,
        }
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
        self.workers
            .iter()
            .filter(|w| {
                !tried.contains(&w.id) && w.is_available(now) && w.serves(request.model.as_deref())
            })
            .cloned()
            .collect()
    }

    /// Whether any worker (healthy or not) has listed `model`.
    pub fn knows_model(&self, model: &str) -> bool {
        self.workers.iter().any(|w| w.serves(Some(model)))
    }

    /// Whether at least one worker is healthy.
    pub fn is_ready(&self) -> bool {
        self.workers.iter().any(|w| w.is_healthy())
    }
}
