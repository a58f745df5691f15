//! `[[experiments]]` and `[[canary]]`: raw (every key optional where a
//! default exists) and validated.

use std::time::Duration as StdDuration;

use ingot_config::Duration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How long samples count in a split's statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowKind {
    /// Only the samples of the last this-long.
    Sliding(StdDuration),
    /// Every sample since the router started (a bounded number per
    /// series: `split::window`).
    Cumulative,
}

/// One arm of an experiment.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ArmSection {
    /// The arm's name (the `arm` label of its metrics).
    pub name: String,
    /// The worker group that serves it.
    pub group: String,
    /// Sends the arm's requests with this `model` instead of the client's
    /// (comparing two models or two configs served under different names).
    /// Default: the client's model.
    pub model: Option<String>,
}

/// `[[experiments]]`: an A/B test.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ExperimentSection {
    /// Its id (`bucket(id, unit)` assigns the arm; `experiment` label).
    pub id: String,
    /// The model whose requests it splits. Default: every request.
    pub model: Option<String>,
    /// Exactly two arms: the first is the control (a), the second the
    /// treatment (b).
    pub arms: Vec<ArmSection>,
    /// Percent of units in the second arm, 0 to 100. Default 50.
    pub split_percent: Option<f64>,
    /// Significance level of the verdict. Default 0.05.
    pub significance: Option<f64>,
    /// Samples per arm before a verdict. Default 30.
    pub min_samples: Option<usize>,
    /// "cumulative" or a sliding window ("10m"). Default "cumulative".
    pub window: Option<String>,
}

/// `[[canary]]`: a canary release of one model (or of every request).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CanarySection {
    /// Its name (`bucket("canary:" + name, unit)`; `canary` label).
    pub name: String,
    /// The model it applies to. Default: every request.
    pub model: Option<String>,
    /// The group serving now.
    pub stable_group: String,
    /// The group being released.
    pub canary_group: String,
    /// Canary shares, percent, increasing, ending at 100. Default [5, 25, 50, 100].
    pub steps: Option<Vec<f64>>,
    /// Least time at each step before the next (while healthy and with
    /// `min_samples` canary requests). Default "60s".
    pub step_duration: Option<Duration>,
    /// The sliding window both arms are compared over. Default "60s".
    pub window: Option<Duration>,
    /// Between health evaluations. Default "1s".
    pub eval_interval: Option<Duration>,
    /// Requests (for the error rate) and latency samples per arm before a
    /// judgement. Default 20.
    pub min_samples: Option<usize>,
    /// Roll back when the canary's error rate exceeds the stable one's by
    /// more than this (0 to 1). Default 0.05.
    pub max_error_rate_delta: Option<f64>,
    /// The latency quantile compared (0 to 1). Default 0.95.
    pub quantile: Option<f64>,
    /// Roll back when the canary's TTFT quantile is more than this times
    /// the stable one's and Welch's test says its mean is higher. Default 1.5.
    pub max_ttft_ratio: Option<f64>,
    /// The same for inter-token latency. Default 1.5.
    pub max_itl_ratio: Option<f64>,
    /// Significance level of the latency tests. Default 0.01.
    pub significance: Option<f64>,
}

/// A validated arm.
#[derive(Clone, Debug, PartialEq)]
pub struct Arm {
    /// Name.
    pub name: String,
    /// Worker group.
    pub group: String,
    /// Model override.
    pub model: Option<String>,
}

/// A validated experiment.
#[derive(Clone, Debug)]
pub struct ExperimentConfig {
    /// Id.
    pub id: String,
    /// Model filter.
    pub model: Option<String>,
    /// Control, treatment.
    pub arms: [Arm; 2],
    /// Percent of units in the treatment.
    pub split_percent: f64,
    /// Significance level.
    pub significance: f64,
    /// Samples per arm before a verdict.
    pub min_samples: usize,
    /// Window.
    pub window: WindowKind,
}

/// Rollback thresholds of a canary.
#[derive(Clone, Copy, Debug)]
pub struct Thresholds {
    /// Error-rate excess.
    pub max_error_rate_delta: f64,
    /// Quantile compared.
    pub quantile: f64,
    /// TTFT quantile ratio.
    pub max_ttft_ratio: f64,
    /// ITL quantile ratio.
    pub max_itl_ratio: f64,
    /// Welch significance.
    pub significance: f64,
    /// Samples per arm.
    pub min_samples: usize,
}

/// A validated canary.
#[derive(Clone, Debug)]
pub struct CanaryConfig {
    /// Name.
    pub name: String,
    /// Model filter.
    pub model: Option<String>,
    /// Stable group.
    pub stable_group: String,
    /// Canary group.
    pub canary_group: String,
    /// Shares, percent, increasing, the last 100.
    pub steps: Vec<f64>,
    /// Time per step.
    pub step_duration: StdDuration,
    /// Sliding window.
    pub window: StdDuration,
    /// Between evaluations.
    pub eval_interval: StdDuration,
    /// Thresholds.
    pub thresholds: Thresholds,
}
