//! The registry's series, all labelled with the model id.

use std::time::Duration;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};

use crate::registry::ModelState;

/// Describes the series (HELP text); call once the recorder is installed.
pub fn describe() {
    describe_gauge!(
        "ingot_model_state",
        Unit::Count,
        "1 for the model's current state (unloaded, loading, loaded), 0 for the others."
    );
    describe_counter!(
        "ingot_model_loads_total",
        Unit::Count,
        "Model loads, by result (ok, error) and source (file, warm)."
    );
    describe_counter!(
        "ingot_model_evictions_total",
        Unit::Count,
        "Models unloaded, by reason (lru, idle, admin)."
    );
    describe_counter!(
        "ingot_model_prefetches_total",
        Unit::Count,
        "Models brought into host memory ahead of a request, from recent demand."
    );
    describe_histogram!(
        "ingot_model_load_seconds",
        Unit::Seconds,
        "Time to load a model."
    );
    describe_histogram!(
        "ingot_model_wait_seconds",
        Unit::Seconds,
        "Time requests waited for their model to load."
    );
    describe_gauge!(
        "ingot_model_device_bytes",
        Unit::Bytes,
        "Device bytes a loaded (or loading) model holds."
    );
    describe_gauge!(
        "ingot_model_host_bytes",
        Unit::Bytes,
        "Host bytes of an evicted model's warm copy."
    );
    describe_gauge!(
        "ingot_registry_budget_bytes",
        Unit::Bytes,
        "The device budget models are loaded under."
    );
}

pub fn state(id: &str, now: ModelState) {
    for s in [
        ModelState::Unloaded,
        ModelState::Loading,
        ModelState::Loaded,
    ] {
        let v = if s == now { 1.0 } else { 0.0 };
        gauge!("ingot_model_state", "model" => id.to_string(), "state" => s.as_str()).set(v);
    }
}

pub fn loaded(id: &str, ok: bool, warm: bool, took: Duration) {
    let result = if ok { "ok" } else { "error" };
    let source = if warm { "warm" } else { "file" };
    counter!("ingot_model_loads_total", "model" => id.to_string(), "result" => result, "source" => source).increment(1);
    if ok {
        histogram!("ingot_model_load_seconds", "model" => id.to_string())
            .record(took.as_secs_f64());
    }
}

pub fn prefetched(id: &str) {
    counter!("ingot_model_prefetches_total", "model" => id.to_string()).increment(1);
}

pub fn evicted(id: &str, reason: &'static str) {
    counter!("ingot_model_evictions_total", "model" => id.to_string(), "reason" => reason)
        .increment(1);
}

pub fn waited(id: &str, took: Duration) {
    histogram!("ingot_model_wait_seconds", "model" => id.to_string()).record(took.as_secs_f64());
}

pub fn bytes(id: &str, device: u64, host: u64) {
    gauge!("ingot_model_device_bytes", "model" => id.to_string()).set(device as f64);
    gauge!("ingot_model_host_bytes", "model" => id.to_string()).set(host as f64);
}

pub fn budget(bytes: u64) {
    gauge!("ingot_registry_budget_bytes").set(bytes as f64);
}

/// Registers a model's counters at zero, so rates and alerts see them
/// before the first load or eviction.
pub fn zero(id: &str) {
    for result in ["ok", "error"] {
        for source in ["file", "warm"] {
            counter!("ingot_model_loads_total", "model" => id.to_string(), "result" => result, "source" => source).increment(0);
        }
    }
    for reason in ["lru", "idle", "admin"] {
        counter!("ingot_model_evictions_total", "model" => id.to_string(), "reason" => reason)
            .increment(0);
    }
    counter!("ingot_model_prefetches_total", "model" => id.to_string()).increment(0);
}
