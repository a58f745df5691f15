//! Engine metrics through the `metrics` facade; the server installs a
//! Prometheus recorder. Names follow vLLM's with an `ingot:` prefix.

use std::time::Duration;

use ingot_core::{FinishReason, Priority};
use metrics::{counter, gauge, histogram};

use crate::handle::Completion;

/// Registers every gauge and counter at zero, so `/metrics` lists them
/// before the first request.
pub fn register() {
    gauges(0, 0, 0.0);
    prefix_cache(0, 0);
    preemptions(0);
    counter!("ingot:prompt_tokens_total").increment(0);
    counter!("ingot:generation_tokens_total").increment(0);
    counter!("ingot:engine_requests_total").increment(0);
}

/// A request entered the engine (one generation; coalesced and cached
/// answers never reach here).
pub fn request_submitted() {
    counter!("ingot:engine_requests_total").increment(1);
}

/// Running / waiting gauges and KV usage (fraction in [0, 1]).
pub fn gauges(running: usize, waiting: usize, kv_usage: f64) {
    gauge!("ingot:num_requests_running").set(running as f64);
    gauge!("ingot:num_requests_waiting").set(waiting as f64);
    gauge!("ingot:kv_cache_usage_perc").set(kv_usage);
}

/// Prefix-cache lookups and hits, in tokens.
pub fn prefix_cache(queries: u64, hits: u64) {
    counter!("ingot:prefix_cache_queries").increment(queries);
    counter!("ingot:prefix_cache_hits").increment(hits);
}

/// Preemptions since the last call.
pub fn preemptions(n: u64) {
    counter!("ingot:num_preemptions_total").increment(n);
}

/// One engine step.
pub fn iteration(tokens: usize, elapsed: Duration) {
    histogram!("ingot:iteration_tokens_total").record(tokens as f64);
    histogram!("ingot:step_duration_seconds").record(elapsed.as_secs_f64());
}

/// Arrival to first scheduling.
pub fn queue_time(d: Duration, p: Priority) {
    histogram!("ingot:request_queue_time_seconds", "priority" => p.as_str())
        .record(d.as_secs_f64());
}

/// Arrival to first token.
pub fn time_to_first_token(d: Duration, p: Priority) {
    histogram!("ingot:time_to_first_token_seconds", "priority" => p.as_str())
        .record(d.as_secs_f64());
}

/// Gap between consecutive tokens of a request.
pub fn inter_token_latency(d: Duration) {
    histogram!("ingot:inter_token_latency_seconds").record(d.as_secs_f64());
}

/// A request that ran to its end.
pub fn request_done(c: &Completion, e2e: Duration, p: Priority) {
    counter!("ingot:prompt_tokens_total").increment(c.prompt_tokens as u64);
    counter!("ingot:generation_tokens_total").increment(c.completion_tokens as u64);
    histogram!("ingot:e2e_request_latency_seconds", "priority" => p.as_str())
        .record(e2e.as_secs_f64());
    request_finished(c.reason, p);
}

/// Counts a request by how it ended.
pub fn request_finished(reason: FinishReason, p: Priority) {
    counter!("ingot:request_success_total", "finish_reason" => reason.as_str(), "priority" => p.as_str())
        .increment(1);
}
