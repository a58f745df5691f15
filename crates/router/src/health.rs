//! Active health: every `interval`, each worker's `/ready` (and, when ready,
//! its `/v1/models` and the load gauges of its `/metrics`) is probed with a
//! `timeout`. A worker enters rotation on
//! its first successful probe and leaves it on a failed one; a successful
//! probe also closes a half-open breaker (the probe is the trial).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use crate::breaker::BreakerState;
use crate::metrics as m;
use crate::state::RouterState;
use crate::worker::{Worker, WorkerLoad};

/// Probes every worker until the process ends.
pub async fn health_task(state: Arc<RouterState>) {
    let mut tick = tokio::time::interval(state.config.health.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let workers = state.workers();
        let probes = workers
            .iter()
            .filter(|w| !w.is_removed() || w.outstanding() > 0)
            .map(|w| probe(&state, w));
        futures_util::future::join_all(probes).await;
    }
}

/// One probe of one worker.
pub async fn probe(state: &RouterState, worker: &Arc<Worker>) {
    let url = worker.url();
    let ready = !url.is_empty() && get(state, &format!("{url}/ready")).await.is_some();
    if ready {
        if let Some(models) = get(state, &format!("{url}/v1/models"))
            .await
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v.get("data").and_then(Value::as_array).cloned())
        {
            worker.set_models(models);
        }
        if let Some(load) = get(state, &format!("{url}/metrics"))
            .await
            .and_then(|b| WorkerLoad::parse(&String::from_utf8_lossy(&b)))
        {
            worker.set_load(load, state.config.health.scraped_load);
        }
        if !worker.is_healthy() {
            tracing::info!(worker = %worker.label, %url, "worker healthy");
        }
        let now = Instant::now();
        let mut breaker = worker.breaker();
        if breaker.state(now) == BreakerState::HalfOpen {
            breaker.on_success();
        }
    } else if worker.is_healthy() {
        tracing::warn!(worker = %worker.label, %url, "worker failed its health probe");
    }
    worker.set_healthy(ready);
    let breaker = worker.breaker_state(Instant::now()).gauge();
    m::worker_state(&worker.label, ready, worker.outstanding(), breaker);
}

/// The body of a 200 answer to `GET url` within the probe timeout.
async fn get(state: &RouterState, url: &str) -> Option<Bytes> {
    let req = axum::http::Request::get(url)
        .body(Full::new(Bytes::new()))
        .ok()?;
    let timeout = state.config.health.timeout;
    let fetch = async {
        let resp = state.client.send(req).await.ok()?;
        if resp.status() != axum::http::StatusCode::OK {
            return None;
        }
        resp.into_body().collect().await.ok().map(|c| c.to_bytes())
    };
    tokio::time::timeout(timeout, fetch).await.ok().flatten()
}
