//! Starting the router: workers (static and supervised), health probes, the
//! listener; stopping it: SIGTERM/SIGINT drains the HTTP server, then the
//! local workers get SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::app::app;
use crate::config::ValidRouterConfig;
use crate::discovery::discovery_task;
use crate::health::health_task;
use crate::state::RouterState;
use crate::supervisor::supervise_task;
use crate::worker::{Worker, DEFAULT_GROUP};

/// Evaluates the canaries every `eval_interval` (the shortest of them):
/// steps, promotions and automatic rollbacks happen here, then the `[slo]`
/// canary rollback.
async fn canary_task(state: Arc<RouterState>) {
    let Some(tick) = state.splits.canaries.tick() else {
        return;
    };
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let now = std::time::Instant::now();
        state.splits.canaries.evaluate(now);
        crate::canary_slo::evaluate(&state.config.route_away, &state.splits.canaries, now);
    }
}

/// Why the router could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot bind {addr}")]
    Bind {
        /// The address.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The server failed.
    #[error("the HTTP server failed")]
    Serve(#[source] std::io::Error),
    /// `[redis]` cannot be used.
    #[error("redis: {0}")]
    Redis(#[source] ingot_fleet::FleetError),
}

/// Runs the router until `shutdown` resolves (the binary passes SIGTERM or
/// SIGINT), then finishes in-flight requests and stops its local workers.
pub async fn serve(
    config: ValidRouterConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let metrics = crate::metrics::install();
    let mut workers = static_workers(&config);
    let mut restarts: Vec<_> = workers.iter().map(|_| None).collect();
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut supervisors = Vec::new();
    let locals = std::iter::once((DEFAULT_GROUP, "local".to_string(), &config.local)).chain(
        config
            .groups
            .iter()
            .map(|g| (g.name.as_str(), format!("{}-local", g.name), &g.local)),
    );
    for (group, prefix, local) in locals {
        for i in 0..local.count {
            let id = workers.len();
            let label = format!("{prefix}-{i}");
            let w = Worker::new(id, label, String::new(), true, config.breaker);
            let w = Arc::new(w.with_group(group));
            let (tx, rx) = mpsc::unbounded_channel();
            supervisors.push(tokio::spawn(supervise_task(
                Arc::clone(&w),
                local.clone(),
                rx,
                shutdown_rx.clone(),
            )));
            workers.push(w);
            restarts.push(Some(tx));
        }
    }
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: addr.clone(),
            source,
        })?;
    let local: SocketAddr = listener.local_addr().map_err(ServeError::Serve)?;
    let fleet = ingot_fleet::FleetSettings::from_section(&config.redis)
        .map(|s| ingot_fleet::Fleet::connect(&s))
        .transpose()
        .map_err(ServeError::Redis)?;
    let heartbeat = fleet.clone().map(|f| register(f, &config, local));
    let mut state = RouterState::new(config, workers, restarts, metrics);
    state.fleet = fleet;
    let state = Arc::new(state);
    let health = tokio::spawn(health_task(Arc::clone(&state)));
    let discovery = tokio::spawn(discovery_task(Arc::clone(&state)));
    let canaries = tokio::spawn(canary_task(Arc::clone(&state)));
    tracing::info!(
        workers = state.workers().len(),
        policy = state.config.policy.as_str(),
        "router started"
    );
    // The same line as `ingot serve`, so scripts find either the same way.
    eprintln!("listening on http://{local}");
    let served = axum::serve(listener, app(Arc::clone(&state)))
        .with_graceful_shutdown(shutdown)
        .await;
    health.abort();
    discovery.abort();
    canaries.abort();
    if let Some(beat) = heartbeat {
        beat.stop().await;
    }
    let _ = shutdown_tx.send(true);
    for s in supervisors {
        let _ = s.await;
    }
    served.map_err(ServeError::Serve)
}

/// The workers at the static URLs of `workers.urls` (group "default") and
/// of each `[[workers.groups]]`, in that order (ids are their indices).
pub(crate) fn static_workers(config: &ValidRouterConfig) -> Vec<Arc<Worker>> {
    let default = config.urls.iter().map(|url| (DEFAULT_GROUP, url));
    let grouped = config
        .groups
        .iter()
        .flat_map(|g| g.urls.iter().map(move |url| (g.name.as_str(), url)));
    default
        .chain(grouped)
        .enumerate()
        .map(|(id, (group, url))| {
            let w = Worker::new(id, url.clone(), url.clone(), false, config.breaker);
            Arc::new(w.with_group(group))
        })
        .collect()
}

/// Announces this router in the registry (for visibility: `ingot route`
/// instances are listed beside the workers).
fn register(
    fleet: ingot_fleet::Fleet,
    config: &ValidRouterConfig,
    local: SocketAddr,
) -> ingot_fleet::Heartbeat {
    let url = config
        .redis
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("http://{local}"));
    let me = ingot_fleet::Instance::this_process(ingot_fleet::Role::Router, url, Vec::new());
    ingot_fleet::Heartbeat::start(
        fleet,
        me,
        config.redis.heartbeat_interval.get(),
        config.redis.heartbeat_ttl.get(),
    )
}
