//! One SLO judged against one engine's latency windows.

use std::time::Duration;

use ingot_config::{SloMetric, SloSpec};
use ingot_core::window::{mean, quantile};
use ingot_core::Priority;
use ingot_engine::{EngineControls, Measure};
use serde::Serialize;

/// An SLO's state at one evaluation.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SloStatus {
    /// The `slo` label.
    pub slo: String,
    /// The model it was judged on.
    pub model: String,
    /// The tier (`*`: all).
    pub tier: String,
    /// `ttft`, `itl`, `e2e` or `error_rate`.
    pub metric: &'static str,
    /// The quantile compared (latency metrics).
    pub quantile: Option<f64>,
    /// The bound, seconds or a ratio.
    pub target: f64,
    /// The measured quantile or ratio; `None` without samples.
    pub measured: Option<f64>,
    /// Samples in the window.
    pub samples: usize,
    /// Met, or too few samples to judge.
    pub met: bool,
}

impl SloStatus {
    /// Judged and over its target.
    pub fn breached(&self) -> bool {
        !self.met
    }

    /// Judged and at most `ratio × target`, or no sample at all (nobody of
    /// the tier left to protect). The exit threshold of the hysteresis; a
    /// few samples, too few to judge, are not clear.
    pub fn clear(&self, ratio: f64, min_samples: usize) -> bool {
        match self.measured {
            _ if self.samples == 0 => true,
            Some(m) if self.samples >= min_samples => m <= self.target * ratio,
            _ => false,
        }
    }
}

/// The tiers an SLO covers.
pub fn tiers_of(spec: &SloSpec) -> Vec<Priority> {
    match spec.tier.parse::<Priority>() {
        Ok(p) => vec![p],
        Err(_) => Priority::ALL.to_vec(),
    }
}

fn measure_of(metric: SloMetric) -> Measure {
    match metric {
        SloMetric::Ttft => Measure::Ttft,
        SloMetric::Itl => Measure::Itl,
        SloMetric::E2e => Measure::E2e,
        SloMetric::ErrorRate => Measure::Outcome,
    }
}

/// Judges `spec` on `model`'s windows over the last `age` (the SLO's window,
/// or less to look only at what followed a remediation change).
pub fn evaluate(
    spec: &SloSpec,
    model: &str,
    controls: &EngineControls,
    age: Duration,
) -> SloStatus {
    let mut values = controls.recent(&tiers_of(spec), measure_of(spec.metric), age);
    let samples = values.len();
    let measured = if spec.metric.is_latency() {
        quantile(&mut values, spec.quantile)
    } else {
        mean(&values)
    };
    let target = spec.target.value();
    let met = samples < spec.min_samples || measured.is_none_or(|m| m <= target);
    SloStatus {
        slo: spec.label(),
        model: model.to_string(),
        tier: spec.tier.clone(),
        metric: spec.metric.as_str(),
        quantile: spec.metric.is_latency().then_some(spec.quantile),
        target,
        measured,
        samples,
        met,
    }
}

/// Whether `spec` applies to `model` (`*` or its name).
pub fn applies_to(spec: &SloSpec, model: &str) -> bool {
    spec.model == "*" || spec.model == model
}
