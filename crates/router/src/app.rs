//! The router's HTTP surface: the proxied endpoints (OpenAI's, the
//! tokenizer's, Anthropic's Messages and Ollama's), the aggregated
//! `/v1/models`, its own `/health`, `/ready` and `/metrics`, and the admin
//! API (workers, drain, rolling restart).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::RouteError;
use crate::health::probe;
use crate::proxy::{by_response, forward};
use crate::state::RouterState;
use crate::worker::Worker;

/// Longest wait for a worker's in-flight requests in a drain.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest wait for a restarted worker to be ready.
const READY_TIMEOUT: Duration = Duration::from_secs(300);

/// The router's routes and the web page, answering browsers of
/// `cors_allowed_origins` (CORS, outermost: a preflight carries no API key).
pub fn app(state: Arc<RouterState>) -> Router {
    let origins = state.config.cors_allowed_origins.clone();
    let page = ingot_web::page_routes().method_not_allowed_fallback(method_not_allowed);
    ingot_edge::with_cors(page.merge(routes(state)), &origins)
}

async fn method_not_allowed(method: Method, uri: Uri) -> RouteError {
    RouteError::MethodNotAllowed(format!("{method} {}", uri.path()))
}

fn routes(state: Arc<RouterState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(forward))
        .route("/v1/completions", post(forward))
        .route("/v1/embeddings", post(forward))
        .route("/v1/responses", post(forward))
        .route("/v1/responses/{id}", get(by_response).delete(by_response))
        .route("/v1/messages", post(forward))
        .route("/tokenize", post(forward))
        .route("/detokenize", post(forward))
        .route("/tokenizer_info", get(forward))
        .route("/api/chat", post(forward))
        .route("/api/generate", post(forward))
        .route("/api/embed", post(forward))
        .route("/api/show", post(forward))
        .route("/api/tags", get(forward))
        .route("/api/version", get(forward))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/admin/workers", get(workers))
        .route("/admin/workers/{id}/{action}", post(worker_action))
        .route("/admin/restart", post(rolling_restart))
        .route("/admin/experiments", get(experiments))
        .route("/admin/experiments/{id}", get(experiment))
        .route("/admin/canaries", get(canaries))
        .route("/admin/canaries/{name}", get(canary))
        .route("/admin/canaries/{name}/{action}", post(canary_action))
        .route("/ui/live", get(crate::live::live))
        // OpenAI-shaped like every other error (as `ingot serve` answers).
        .fallback(|uri: Uri| async move { RouteError::RouteNotFound(uri.path().to_string()) })
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// The union of the healthy workers' models (first entry per id wins).
async fn models(State(state): State<Arc<RouterState>>) -> Json<Value> {
    let mut by_id = BTreeMap::new();
    for w in state
        .workers()
        .iter()
        .filter(|w| w.is_healthy() && !w.is_removed())
    {
        for entry in w.models() {
            if let Some(id) = entry.get("id").and_then(Value::as_str) {
                by_id.entry(id.to_string()).or_insert(entry);
            }
        }
    }
    Json(json!({"object": "list", "data": by_id.into_values().collect::<Vec<_>>()}))
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// 200 when at least one worker is healthy.
async fn ready(State(state): State<Arc<RouterState>>) -> Response {
    let workers = state.workers();
    let listed: Vec<_> = workers.iter().filter(|w| !w.is_removed()).collect();
    let healthy = listed.iter().filter(|w| w.is_healthy()).count();
    let body = Json(json!({"healthy_workers": healthy, "workers": listed.len()}));
    if healthy > 0 {
        (StatusCode::OK, body).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}

async fn metrics(State(state): State<Arc<RouterState>>) -> Response {
    let now = Instant::now();
    for w in &state.workers() {
        crate::metrics::worker_state(
            &w.label,
            w.is_healthy(),
            w.outstanding(),
            w.breaker_state(now).gauge(),
        );
    }
    match &state.metrics {
        Some(h) => h.render().into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are disabled").into_response(),
    }
}

pub(crate) fn describe(w: &Worker, now: Instant) -> Value {
    json!({
        "id": w.id,
        "label": w.label,
        "group": w.group,
        "url": w.url(),
        "local": w.local,
        "pid": w.pid(),
        "healthy": w.is_healthy(),
        "draining": w.is_draining(),
        "discovered": w.discovered,
        "removed": w.is_removed(),
        "outstanding": w.outstanding(),
        "breaker": format!("{:?}", w.breaker_state(now)).to_lowercase(),
        "restarts": w.restarts(),
        "load": w.load(),
        "ttft_ewma_s": w.latency().ttft,
        "itl_ewma_s": w.latency().itl,
        "routed_away": w.route_away_state().until.is_some_and(|t| t > now),
        "slo_probation": w.route_away_state().probation,
        "models": w.models().iter().filter_map(|m| m.get("id").cloned()).collect::<Vec<_>>(),
    })
}

/// `GET /admin/workers`.
async fn workers(State(state): State<Arc<RouterState>>) -> Json<Value> {
    let now = Instant::now();
    Json(json!({"workers": state.workers().iter().map(|w| describe(w, now)).collect::<Vec<_>>()}))
}

fn admin_error(status: StatusCode, message: String) -> Response {
    let body = json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}});
    (status, Json(body)).into_response()
}

/// How long an admin call may wait.
#[derive(Deserialize)]
struct WaitQuery {
    /// Seconds (default 300).
    timeout: Option<f64>,
}

/// `POST /admin/workers/{id}/drain|undrain`. A drain stops new requests to
/// the worker and answers once its in-flight requests are done (or 504 when
/// `timeout` passes first); the worker stays out of rotation until undrained.
async fn worker_action(
    State(state): State<Arc<RouterState>>,
    Path((id, action)): Path<(usize, String)>,
    Query(q): Query<WaitQuery>,
) -> Response {
    let Some(w) = state.worker(id) else {
        return admin_error(StatusCode::NOT_FOUND, format!("no worker {id}"));
    };
    let timeout = q.timeout.map_or(DRAIN_TIMEOUT, Duration::from_secs_f64);
    match action.as_str() {
        "drain" => {
            w.set_draining(true);
            if !wait_idle(&w, timeout).await {
                return admin_error(
                    StatusCode::GATEWAY_TIMEOUT,
                    format!(
                        "worker {id} still has {} requests in flight",
                        w.outstanding()
                    ),
                );
            }
        }
        "undrain" => w.set_draining(false),
        other => {
            return admin_error(
                StatusCode::NOT_FOUND,
                format!("unknown action `{other}` (expected drain or undrain)"),
            )
        }
    }
    Json(describe(&w, Instant::now())).into_response()
}

async fn wait_idle(w: &Worker, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while w.outstanding() > 0 {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// `POST /admin/restart`: for each local worker in turn, drain it, restart
/// its process, wait until the new one is ready, put it back. Other workers
/// carry the load meanwhile, so no request fails.
async fn rolling_restart(State(state): State<Arc<RouterState>>) -> Response {
    let mut done = Vec::new();
    for (w, restart) in state.workers().iter().zip(&state.restarts) {
        let Some(restart) = restart else { continue };
        let old_pid = w.pid();
        w.set_draining(true);
        let idle = wait_idle(w, DRAIN_TIMEOUT).await;
        if !idle || restart.send(()).is_err() {
            w.set_draining(false);
            return admin_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "cannot restart {} (drain timed out or supervisor gone)",
                    w.label
                ),
            );
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let pid = w.pid();
            if pid != 0 && pid != old_pid {
                probe(&state, w).await;
                if w.is_healthy() {
                    break;
                }
            }
            if Instant::now() >= deadline {
                w.set_draining(false);
                return admin_error(
                    StatusCode::GATEWAY_TIMEOUT,
                    format!(
                        "{} was not ready within {READY_TIMEOUT:?} of its restart",
                        w.label
                    ),
                );
            }
        }
        w.set_draining(false);
        done.push(json!({"worker": w.label, "old_pid": old_pid, "pid": w.pid()}));
    }
    Json(json!({"restarted": done})).into_response()
}

/// `GET /admin/experiments`: every experiment's report.
async fn experiments(State(state): State<Arc<RouterState>>) -> Json<Value> {
    let reports = state.splits.experiment_reports(Instant::now());
    Json(json!({"experiments": reports}))
}

/// `GET /admin/experiments/{id}`: per-arm sizes, means, quantiles, Welch's
/// t, df, p-value and the verdict for TTFT, ITL and end-to-end latency.
async fn experiment(State(state): State<Arc<RouterState>>, Path(id): Path<String>) -> Response {
    match state.splits.experiment(&id) {
        Some(e) => Json(e.report(Instant::now())).into_response(),
        None => admin_error(StatusCode::NOT_FOUND, format!("no experiment `{id}`")),
    }
}

/// `GET /admin/canaries`: every canary's phase, share, windows and events.
async fn canaries(State(state): State<Arc<RouterState>>) -> Json<Value> {
    let all = state.splits.canary_statuses(Instant::now());
    Json(json!({"canaries": all}))
}

/// `GET /admin/canaries/{name}`.
async fn canary(State(state): State<Arc<RouterState>>, Path(name): Path<String>) -> Response {
    match state.splits.canaries.get(&name) {
        Ok(c) => Json(c.status(Instant::now())).into_response(),
        Err(e) => admin_error(StatusCode::NOT_FOUND, e.to_string()),
    }
}

/// `POST /admin/canaries/{name}/rollback|promote|pause|resume`.
async fn canary_action(
    State(state): State<Arc<RouterState>>,
    Path((name, action)): Path<(String, String)>,
) -> Response {
    let canaries = &state.splits.canaries;
    let c = match canaries.get(&name) {
        Ok(c) => c,
        Err(e) => return admin_error(StatusCode::NOT_FOUND, e.to_string()),
    };
    let done = match action.as_str() {
        "rollback" => c.rollback("manual"),
        "promote" => c.promote("manual"),
        "pause" => c.pause(true),
        "resume" => c.pause(false),
        other => {
            return admin_error(
                StatusCode::NOT_FOUND,
                format!("unknown action `{other}` (expected rollback, promote, pause or resume)"),
            )
        }
    };
    match done {
        Ok(()) => Json(c.status(Instant::now())).into_response(),
        Err(e) => admin_error(StatusCode::CONFLICT, e.to_string()),
    }
}
