//! The SLO and remediation series.

use ingot_config::RemediationMode;
use metrics::{counter, describe_counter, describe_gauge, gauge};

use super::{RemediationEvent, SloStatus};

/// HELP text of every series (once the recorder is installed).
pub(super) fn describe() {
    describe_gauge!(
        "ingot_slo_compliance",
        "1 while the SLO is met (or has too few samples in its window to judge), 0 while breached"
    );
    describe_gauge!(
        "ingot_slo_measured",
        "The SLO's measured quantile (seconds) or error ratio over its window"
    );
    describe_gauge!(
        "ingot_slo_target",
        "The SLO's bound: seconds for latency SLOs, a ratio for error_rate"
    );
    describe_counter!(
        "ingot_remediation_actions_total",
        "Remediation decisions by action (shed, delay, batching) and direction; mode dry_run counts what would have been done"
    );
    describe_gauge!(
        "ingot_remediation_active",
        "Remediation in force: the shed/delay level (tiers covered), or 1 while batching holds the budget under its maximum"
    );
    describe_gauge!(
        "ingot_engine_step_token_budget",
        "The engine's step token budget in force (adaptive batching moves it)"
    );
}

/// Compliance, measured value and target of every evaluated SLO.
pub(super) fn export_statuses(statuses: &[SloStatus]) {
    for s in statuses {
        let labels = [
            ("slo", s.slo.clone()),
            ("model", s.model.clone()),
            ("tier", s.tier.clone()),
        ];
        gauge!("ingot_slo_compliance", &labels).set(if s.met { 1.0 } else { 0.0 });
        gauge!("ingot_slo_target", &labels).set(s.target);
        if let Some(m) = s.measured {
            gauge!("ingot_slo_measured", &labels).set(m);
        }
    }
}

/// Counts one decision.
pub(super) fn action(e: &RemediationEvent, mode: RemediationMode) {
    counter!(
        "ingot_remediation_actions_total",
        "model" => e.model.clone(),
        "action" => e.action,
        "direction" => e.direction,
        "mode" => mode.as_str()
    )
    .increment(1);
}

/// The active gauges of one model.
pub(super) fn active(model: &str, shed_level: usize, batching: bool) {
    gauge!("ingot_remediation_active", "model" => model.to_string(), "action" => "shed")
        .set(shed_level as f64);
    gauge!("ingot_remediation_active", "model" => model.to_string(), "action" => "batching")
        .set(if batching { 1.0 } else { 0.0 });
}

/// The step token budget in force.
pub(super) fn budget(model: &str, tokens: usize) {
    gauge!("ingot_engine_step_token_budget", "model" => model.to_string()).set(tokens as f64);
}
