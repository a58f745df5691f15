//! Binding, loading, serving and graceful shutdown.
//!
//! The listener comes up first (`/health` answers, `/ready` is 503) while
//! the model loads on a blocking thread. When `shutdown` resolves (the
//! binary passes SIGTERM/SIGINT) the server drains: `/ready` and new
//! generation requests get 503, in-flight ones run to completion (at most
//! `shutdown_timeout`), then the process exits.

use std::net::SocketAddr;
use std::time::Duration;

use crate::models::Models;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::reload::{LogLevelFn, ReloadFn};
use crate::{app, AppState};

/// How often idle models are looked for (their timeouts are seconds or
/// more).
const IDLE_SWEEP: Duration = Duration::from_secs(1);

/// Server settings.
#[derive(Clone)]
pub struct ServeConfig {
    /// Address to bind (port 0: any free port).
    pub addr: SocketAddr,
    /// The default model (requests without `model`); also the `model`
    /// label of series that belong to no one model.
    pub model_name: String,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Longest wait for in-flight requests at shutdown.
    pub shutdown_timeout: Duration,
    /// Header timeout and connection cap.
    pub connections: crate::conn::ConnLimits,
    /// The effective config with the source of every value (flags, the
    /// response cache and the stall timeout are read from it).
    pub runtime: ingot_config::Loaded,
    /// Loads the config again (SIGHUP, `POST /admin/reload`).
    pub reload: Option<ReloadFn>,
    /// Swaps the log filter on reload.
    pub set_log_level: Option<LogLevelFn>,
    /// Ids of the embedding models (`/v1/models` lists their endpoints
    /// before they load).
    pub embedding_models: Vec<String>,
}

/// Installs the Prometheus recorder (once per process). Every series gets
/// the served model's name as its `model` label, so one Prometheus can tell
/// the models of several servers apart without relabelling.
fn install_metrics(model_name: &str) -> Option<PrometheusHandle> {
    let latency = [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0,
    ];
    let tokens = [
        1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
    ];
    // Grammar masks take microseconds to a few milliseconds.
    let masks = [
        5e-6, 1e-5, 2e-5, 3e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2e-4, 3e-4, 5e-4, 7.5e-4, 1e-3, 2e-3,
        5e-3, 1e-2, 2.5e-2, 0.1,
    ];
    // Server-side parts of a request's latency: well under a millisecond
    // when nothing is wrong.
    let fine = [
        1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0,
    ];
    let steps = [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0, 64.0];
    let builder = PrometheusBuilder::new()
        .add_global_label("model", model_name)
        .set_buckets(&latency)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full("ingot_iteration_tokens".into()), &tokens)
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(crate::http_metrics::PREPARE_SECONDS.into()),
                &fine,
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full("ingot_request_prefill_steps".into()), &steps)
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full("ingot_structured_mask_seconds".into()),
                &masks,
            )
        })
        .and_then(|b| {
            ingot_engine::TOKEN_COUNT_HISTOGRAMS
                .iter()
                .try_fold(b, |b, name| {
                    b.set_buckets_for_metric(
                        Matcher::Full((*name).into()),
                        &ingot_engine::TOKEN_COUNT_BUCKETS,
                    )
                })
        });
    let handle = ingot_web::install_metrics(builder)
        .map_err(|e| tracing::warn!(error = %e, "metrics disabled"))
        .ok()?;
    crate::http_metrics::describe();
    Some(handle)
}

/// Serves `models` until `shutdown` resolves (the binary passes
/// SIGTERM/SIGINT), then drains. The listener comes up first;
/// `/ready` turns 200 once the models marked `preload` are in (a failed
/// preload ends the process with its error); the others load on demand.
pub async fn serve(
    config: ServeConfig,
    models: Models,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    let redis = &config.runtime.config.redis;
    let fleet = match ingot_fleet::FleetSettings::from_section(redis) {
        Some(settings) => Some(
            ingot_fleet::Fleet::connect(&settings).map_err(|e| ServeError::Redis(e.to_string()))?,
        ),
        None => None,
    };
    let state = AppState::builder(
        config.model_name.clone(),
        config.runtime.clone(),
        models.clone(),
    )
    .metrics(install_metrics(&config.model_name))
    .reload(config.reload.clone(), config.set_log_level.clone())
    .fleet(fleet)
    .embedding_models(config.embedding_models.clone())
    .build()?;
    tokio::spawn(reload_on_hangup(state.clone()));
    tokio::spawn(crate::slo::run(state.clone()));
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.addr,
            source,
        })?;
    let local = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: config.addr,
        source,
    })?;
    eprintln!("listening on http://{local}");
    models.publish();
    let _sweeper = models.spawn_idle_sweeper(IDLE_SWEEP);
    let heartbeat = std::sync::Mutex::new(None);
    let loader = {
        let state = state.clone();
        let heartbeat = &heartbeat;
        let registration = registration(&config, local);
        async move {
            let failed = models.preload().await;
            if let Some(e) = failed.into_iter().next() {
                return Err(e.to_string());
            }
            state.set_ready();
            // The last line of the start-up summary, which the default
            // `log.level` shows (`warn,ingot::startup=info`).
            tracing::info!(target: "ingot::startup", "preloaded models in; ready on http://{local}");
            // Registered once ready: routers discovering it can route at once.
            if let (Some(fleet), Some((me, every, ttl))) = (state.fleet(), registration) {
                let beat = ingot_fleet::Heartbeat::start(fleet.clone(), me, every, ttl);
                *heartbeat.lock().unwrap_or_else(|p| p.into_inner()) = Some(beat);
            }
            Ok(())
        }
    };
    let router = app(state.clone(), config.max_body_bytes);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(crate::conn::serve_connections(
        listener,
        router,
        config.connections,
        stop_rx,
    ));
    // A failed load ends the process with its error; `shutdown` drains.
    tokio::pin!(shutdown);
    tokio::select! {
        loaded = loader => {
            if let Err(e) = loaded {
                return Err(ServeError::Load(e));
            }
            shutdown.await;
        }
        () = &mut shutdown => {}
    }
    tracing::info!(inflight = state.inflight(), "shutting down: draining");
    // Out of the registry first, so routers stop sending new requests.
    let beat = heartbeat.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(beat) = beat {
        beat.stop().await;
    }
    state.start_draining();
    if tokio::time::timeout(config.shutdown_timeout, state.wait_idle())
        .await
        .is_err()
    {
        tracing::warn!(
            inflight = state.inflight(),
            "shutdown timeout; closing in-flight requests"
        );
        // Open streams end with an error event and their terminator; they
        // do so at once, and the connections' graceful close below writes
        // those last bytes.
        state.close_streams();
        let _ = tokio::time::timeout(Duration::from_millis(500), state.wait_idle()).await;
    }
    let _ = stop_tx.send(true);
    // Connections still open (idle keep-alive, cut streams) get a moment.
    let _ = tokio::time::timeout(Duration::from_secs(1), server).await;
    Ok(())
}

/// This server's registry entry and heartbeat timing, when `[redis]` is
/// configured: advertised at `redis.advertise_url`, else the bound address.
fn registration(
    config: &ServeConfig,
    local: SocketAddr,
) -> Option<(ingot_fleet::Instance, Duration, Duration)> {
    let redis = &config.runtime.config.redis;
    redis.url.as_ref()?;
    let url = redis
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("http://{local}"));
    let mut models: Vec<String> = config
        .runtime
        .config
        .models
        .iter()
        .map(|m| m.id.clone())
        .collect();
    if models.is_empty() {
        models.push(config.model_name.clone());
    }
    let me = ingot_fleet::Instance::this_process(ingot_fleet::Role::Worker, url, models);
    Some((
        me,
        redis.heartbeat_interval.get(),
        redis.heartbeat_ttl.get(),
    ))
}

/// Reloads the config on every SIGHUP.
async fn reload_on_hangup(state: AppState) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return;
        };
        while hup.recv().await.is_some() {
            match crate::reload::reload(&state) {
                Ok(r) => eprintln!(
                    "ingot: config reloaded (applied: [{}]; needs restart: [{}])",
                    r.applied.join(", "),
                    r.needs_restart.join(", ")
                ),
                Err(e) => eprintln!("ingot: config not reloaded: {e}"),
            }
        }
    }
    #[cfg(not(unix))]
    let _ = state;
}

/// Why the server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot bind {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The model failed to load.
    #[error("{0}")]
    Load(String),
    /// The API keys cannot be loaded (a bad key file).
    #[error("{0}")]
    Auth(String),
    /// `[redis]` cannot be used (a malformed URL).
    #[error("redis: {0}")]
    Redis(String),
}
