//! `GET /ui/live` on the router: what the web page's dashboard plots of
//! the fleet, read from the router's own state: each worker (health,
//! breaker, load, latency, models), the requests answered by status and
//! worker, retries and failures by reason, canaries and experiments.
//! Counters are running totals; the page turns them into rates.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::Json;
use ingot_web::{tally, unix_ms};
use serde_json::{json, Value};

use crate::metrics as m;
use crate::state::RouterState;

/// `GET /ui/live`.
pub async fn live(State(state): State<Arc<RouterState>>) -> Json<Value> {
    let now = Instant::now();
    let t = tally();
    let workers: Vec<Value> = state
        .workers()
        .iter()
        .filter(|w| !w.is_removed())
        .map(|w| {
            let mut d = crate::app::describe(w, now);
            d["answered"] = t.counter(m::REQUESTS, &[("worker", &w.label)]).into();
            d
        })
        .collect();
    Json(json!({
        "kind": "router",
        "time_ms": unix_ms(),
        "ready": state.is_ready(),
        "policy": state.config.policy.as_str(),
        "workers": workers,
        "requests": t.counter_by(m::REQUESTS, "status", &[]),
        "retries": t.counter_by(m::RETRIES, "reason", &[]),
        "errors": t.counter_by(m::ERRORS, "reason", &[]),
        "canaries": state.splits.canary_statuses(now),
        "experiments": state.splits.experiment_reports(now),
        "slo_actions": {
            "route_away": t.counter(m::ROUTE_AWAY_ACTIONS, &[]),
            "canary": t.counter(m::CANARY_SLO_ACTIONS, &[]),
        },
    }))
}
