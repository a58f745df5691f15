//! The router's Prometheus series, named like the server's (`ingot_*`,
//! `_total` counters, seconds).

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Requests forwarded, by worker, policy and final status.
pub const REQUESTS: &str = "ingot_router_requests_total";
/// Failed attempts, by worker and reason (connect, timeout, status_503, ...).
pub const ERRORS: &str = "ingot_router_errors_total";
/// Retries, by reason.
pub const RETRIES: &str = "ingot_router_retries_total";
/// Retries refused by the retry budget.
pub const RETRIES_DENIED: &str = "ingot_router_retry_budget_exhausted_total";
/// Streams cut off after their first byte (client got an error event).
pub const INTERRUPTED: &str = "ingot_router_streams_interrupted_total";
/// Policy choices, by worker and policy.
pub const SELECTIONS: &str = "ingot_router_selections_total";
/// Breaker state per worker: 0 closed, 1 open, 2 half-open.
pub const BREAKER_STATE: &str = "ingot_router_breaker_state";
/// Breaker openings per worker.
pub const BREAKER_OPENS: &str = "ingot_router_breaker_opens_total";
/// 1 when the worker's last probe succeeded.
pub const WORKER_HEALTHY: &str = "ingot_router_worker_healthy";
/// Requests in flight per worker.
pub const WORKER_OUTSTANDING: &str = "ingot_router_worker_outstanding_requests";
/// Restarts of local workers.
pub const WORKER_RESTARTS: &str = "ingot_router_worker_restarts_total";
/// Time the router adds before forwarding (parse, select), seconds.
pub const OVERHEAD: &str = "ingot_router_added_latency_seconds";
/// Time from the client's request to the worker's response headers, seconds.
pub const UPSTREAM_HEADERS: &str = "ingot_router_upstream_header_seconds";

/// Requests answered per worker group, by group and status ("error" for a
/// failed attempt).
pub const GROUP_REQUESTS: &str = "ingot_router_group_requests_total";
/// Time to first byte per worker group, seconds.
pub const GROUP_TTFT: &str = "ingot_router_group_ttft_seconds";
/// End-to-end latency per worker group, seconds.
pub const GROUP_E2E: &str = "ingot_router_group_e2e_seconds";
/// Requests per experiment/canary arm, by `experiment` (an experiment's id
/// or `canary:NAME`), `arm`, `group` and `outcome` (ok, error).
pub const ARM_REQUESTS: &str = "ingot_router_arm_requests_total";
/// Time to first byte per arm, seconds.
pub const ARM_TTFT: &str = "ingot_router_arm_ttft_seconds";
/// A request's mean inter-token latency per arm (streams), seconds.
pub const ARM_ITL: &str = "ingot_router_arm_itl_seconds";
/// End-to-end latency per arm, seconds.
pub const ARM_E2E: &str = "ingot_router_arm_e2e_seconds";
/// A canary's share of its model's traffic, percent.
pub const CANARY_SHARE: &str = "ingot_canary_share";
/// Canary rollbacks, by canary and reason.
pub const CANARY_ROLLBACKS: &str = "ingot_canary_rollbacks_total";
/// Route-away decisions (`[slo]`), by worker, mode and direction (apply,
/// undo, clear).
pub const ROUTE_AWAY_ACTIONS: &str = "ingot_router_route_away_actions_total";
/// 1 while a worker is routed away for breaching `[slo]` (in dry_run: would
/// be), by worker and mode.
pub const ROUTED_AWAY: &str = "ingot_router_routed_away";
/// `[slo] canary_rollback` decisions, by canary and mode (on: rolled back;
/// dry_run: would have).
pub const CANARY_SLO_ACTIONS: &str = "ingot_router_canary_slo_actions_total";
/// Canary promotions, by canary.
pub const CANARY_PROMOTIONS: &str = "ingot_canary_promotions_total";

/// Installs the recorder (once per process) and describes the series.
pub fn install() -> Option<PrometheusHandle> {
    let buckets = [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0, 10.0, 30.0,
    ];
    let builder = PrometheusBuilder::new().set_buckets(&buckets);
    let handle = ingot_web::install_metrics(builder)
        .map_err(|e| tracing::warn!(error = %e, "metrics disabled"))
        .ok()?;
    describe_counter!(
        REQUESTS,
        "Requests the router answered, by worker, policy and status"
    );
    describe_counter!(ERRORS, "Failed attempts to a worker, by reason");
    describe_counter!(RETRIES, "Attempts retried on another worker, by reason");
    describe_counter!(RETRIES_DENIED, "Retries refused by the retry budget");
    describe_counter!(INTERRUPTED, "Streams that failed after their first byte");
    describe_counter!(SELECTIONS, "Workers chosen by the policy");
    describe_gauge!(
        BREAKER_STATE,
        "Circuit breaker: 0 closed, 1 open, 2 half-open"
    );
    describe_counter!(BREAKER_OPENS, "Times a worker's breaker opened");
    describe_gauge!(
        WORKER_HEALTHY,
        "1 when the worker's last health probe succeeded"
    );
    describe_gauge!(
        WORKER_OUTSTANDING,
        "Requests in flight on the worker from this router"
    );
    describe_counter!(
        WORKER_RESTARTS,
        "Restarts of a local worker by the supervisor"
    );
    describe_histogram!(
        OVERHEAD,
        "Router time before forwarding a request (seconds)"
    );
    describe_histogram!(
        UPSTREAM_HEADERS,
        "Client request to worker response headers (seconds)"
    );
    describe_fleet();
    Some(handle)
}

fn describe_fleet() {
    describe_counter!(GROUP_REQUESTS, "Requests per worker group, by status");
    describe_histogram!(GROUP_TTFT, "Time to first byte per worker group (seconds)");
    describe_histogram!(GROUP_E2E, "End-to-end latency per worker group (seconds)");
    describe_counter!(
        ARM_REQUESTS,
        "Requests per experiment or canary arm, by outcome"
    );
    describe_histogram!(ARM_TTFT, "Time to first byte per arm (seconds)");
    describe_histogram!(
        ARM_ITL,
        "Mean inter-token latency of a request per arm (seconds)"
    );
    describe_histogram!(ARM_E2E, "End-to-end latency per arm (seconds)");
    describe_gauge!(CANARY_SHARE, "A canary's share of its traffic (percent)");
    describe_counter!(CANARY_ROLLBACKS, "Canary rollbacks, by reason");
    describe_counter!(
        CANARY_SLO_ACTIONS,
        "[slo] canary rollbacks, by canary and mode (dry_run: would have)"
    );
    describe_counter!(CANARY_PROMOTIONS, "Canaries promoted to stable");
    describe_counter!(
        ROUTE_AWAY_ACTIONS,
        "Route-away decisions for workers breaching [slo], by direction"
    );
    describe_gauge!(
        ROUTED_AWAY,
        "1 while a worker is routed away for breaching [slo]"
    );
}

/// Records one finished request of a worker group.
pub fn group_sample(group: &str, status: &str, sample: &crate::split::window::Sample) {
    counter!(GROUP_REQUESTS, "group" => group.to_string(), "status" => status.to_string())
        .increment(1);
    if let Some(v) = sample.ttft_s {
        histogram!(GROUP_TTFT, "group" => group.to_string()).record(v);
    }
    if let Some(v) = sample.e2e_s {
        histogram!(GROUP_E2E, "group" => group.to_string()).record(v);
    }
}

/// Records one finished request of an experiment's or canary's arm.
pub fn arm_sample(
    experiment: String,
    arm: String,
    group: String,
    sample: &crate::split::window::Sample,
) {
    let outcome = if sample.ok { "ok" } else { "error" };
    counter!(ARM_REQUESTS, "experiment" => experiment.clone(), "arm" => arm.clone(), "group" => group, "outcome" => outcome)
        .increment(1);
    let labels = [("experiment", experiment), ("arm", arm)];
    for (name, v) in [
        (ARM_TTFT, sample.ttft_s),
        (ARM_ITL, sample.itl_s),
        (ARM_E2E, sample.e2e_s),
    ] {
        if let Some(v) = v {
            histogram!(name, &labels).record(v);
        }
    }
}

/// Counts a failed attempt.
pub fn error(worker: &str, reason: &'static str) {
    counter!(ERRORS, "worker" => worker.to_string(), "reason" => reason).increment(1);
}

/// Records the router-added latency of one attempt.
pub fn overhead(seconds: f64) {
    histogram!(OVERHEAD).record(seconds);
}

/// Sets a worker's gauges.
pub fn worker_state(worker: &str, healthy: bool, outstanding: usize, breaker: f64) {
    gauge!(WORKER_HEALTHY, "worker" => worker.to_string()).set(if healthy { 1.0 } else { 0.0 });
    gauge!(WORKER_OUTSTANDING, "worker" => worker.to_string()).set(outstanding as f64);
    gauge!(BREAKER_STATE, "worker" => worker.to_string()).set(breaker);
}
