//! `GET /ui/live`: what the web page's dashboard plots, read from the
//! server's own state once a second by each open page: every model's
//! state, memory and engine (running and waiting by tier, KV use, prefix
//! cache, tokens out, TTFT/ITL percentiles over the last minute), and the
//! server's counters (response cache, coalescing, refusals by reason).
//! Counters are running totals; the page turns them into rates.

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use ingot_core::window::quantile;
use ingot_core::Priority;
use ingot_engine::{EngineControls, EngineStats, Measure};
use ingot_registry::{ModelState, ModelStatus};
use ingot_web::{tally, unix_ms};
use serde_json::{json, Map, Value};

use super::Shared;
use crate::AppState;

/// How far back the latency percentiles look.
const WINDOW: Duration = Duration::from_secs(60);

/// The percentiles shown.
const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// `GET /ui/live`.
pub async fn live(State((state, _)): State<Shared>) -> Json<Value> {
    Json(snapshot(&state))
}

fn snapshot(state: &AppState) -> Value {
    let t = tally();
    let models: Vec<Value> = state
        .models()
        .status()
        .into_iter()
        .map(|s| model(state, s))
        .collect();
    let slo = state.slo().report(&state.runtime().config);
    json!({
        "kind": "server",
        "time_ms": unix_ms(),
        "ready": state.is_ready(),
        "draining": state.is_draining(),
        "in_flight": state.inflight(),
        "connections": t.gauge(crate::conn::CONNECTIONS, &[]),
        "models": models,
        "response_cache": {
            "hits": t.counter("ingot_response_cache_hits_total", &[]),
            "misses": t.counter("ingot_response_cache_misses_total", &[]),
            "entries": t.gauge("ingot_response_cache_entries", &[]),
        },
        "coalesced": t.counter("ingot_coalesced_requests_total", &[]),
        "rejections": t.counter_by(crate::error::REJECTIONS, "reason", &[]),
        "streams_cut": t.counter_by(super::STREAMS_CUT, "reason", &[]),
        "http": t.counter_by(crate::http_metrics::HTTP_REQUESTS, "status", &[]),
        "slo": {"mode": slo["mode"], "slos": slo["slos"]},
    })
}

/// One model: its registry entry and, while an engine is up, the engine.
fn model(state: &AppState, s: ModelStatus) -> Value {
    let front = state.models().built_front(&s.id);
    let watch = front.as_ref().map(|f| f.engine_watch());
    let engine = watch
        .as_ref()
        .and_then(|w| w.get())
        .map(|(stats, controls)| engine(&stats, &controls));
    let kv_tiers = watch.and_then(|w| w.kv_tiers());
    json!({
        "id": s.id,
        "state": state_name(&s),
        "kind": front.map(|f| if f.endpoints() == crate::models::EMBEDDING_ENDPOINTS { "embedding" } else { "generate" }),
        "pinned": s.pinned,
        "in_flight": s.in_flight,
        "device_bytes": s.device_bytes,
        "host_bytes": s.host_bytes,
        "engine": engine,
        "kv_tiers": kv_tiers.map(|t| super::admin::tier_use(&t)),
    })
}

/// Where a model is, as a person reads it: `loaded`, `loading`, `asleep`
/// (a warm copy in host memory) or `on disk`.
fn state_name(s: &ModelStatus) -> &'static str {
    match s.state {
        ModelState::Unloaded if s.host_bytes > 0 => "asleep",
        ModelState::Unloaded => "on disk",
        other => other.as_str(),
    }
}

fn engine(stats: &EngineStats, controls: &EngineControls) -> Value {
    use std::sync::atomic::Ordering::Relaxed;
    let by_tier = |counts: &[std::sync::atomic::AtomicUsize]| -> Map<String, Value> {
        Priority::ALL
            .iter()
            .map(|p| {
                (
                    p.as_str().to_string(),
                    counts[p.rank()].load(Relaxed).into(),
                )
            })
            .collect()
    };
    // Nearest-rank, as the SLO evaluation judges the same windows.
    let percentiles = |measure| {
        let mut samples = controls.recent(&Priority::ALL, measure, WINDOW);
        let [p50, p90, p99] = QUANTILES.map(|q| quantile(&mut samples, q));
        p50.map(|_| json!({"p50": p50, "p90": p90, "p99": p99}))
    };
    json!({
        "running": stats.running.load(Relaxed),
        "waiting": stats.waiting.load(Relaxed),
        "running_by_tier": by_tier(&stats.running_by_tier),
        "waiting_by_tier": by_tier(&stats.waiting_by_tier),
        "kv_usage": stats.kv_usage(),
        "kv_blocks_total": stats.kv_blocks_total.load(Relaxed),
        "prefix_cache_queries": stats.prefix_cache_queries.load(Relaxed),
        "prefix_cache_hits": stats.prefix_cache_hits.load(Relaxed),
        "generated_tokens": stats.generated_tokens.load(Relaxed),
        "preemptions": stats.preemptions.load(Relaxed),
        "ttft_s": percentiles(Measure::Ttft),
        "itl_s": percentiles(Measure::Itl),
    })
}
