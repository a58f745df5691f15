//! `[[experiments]]` and `[[canary]]` in `router.toml`: raw (every key
//! optional where a default exists) and validated.

use std::collections::BTreeSet;
use std::time::Duration as StdDuration;

use ingot_config::Duration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::{invalid, RouterConfigError};

/// How long samples count in a split's statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowKind {
    /// Only the samples of the last this-long.
    Sliding(StdDuration),
    /// Every sample since the router started (bounded by
    /// [`super::window::MAX_SAMPLES`] per series).
    Cumulative,
}

/// `window = "cumulative"` or a duration ("60s").
fn parse_window(
    key: &'static str,
    text: Option<&str>,
    default: WindowKind,
) -> Result<WindowKind, RouterConfigError> {
    match text {
        None => Ok(default),
        Some("cumulative") => Ok(WindowKind::Cumulative),
        Some(t) => match humantime_duration(t) {
            Some(d) if !d.is_zero() => Ok(WindowKind::Sliding(d)),
            _ => Err(invalid(
                key,
                "\"cumulative\" or a non-zero duration (\"60s\")",
                t,
            )),
        },
    }
}

fn humantime_duration(text: &str) -> Option<StdDuration> {
    text.parse::<Duration>().ok().map(Duration::get)
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

fn check_name(key: &'static str, name: &str) -> Result<(), RouterConfigError> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(invalid(key, "a non-empty name of [A-Za-z0-9_.-]", name))
    }
}

fn check_group(
    key: &'static str,
    group: &str,
    groups: &BTreeSet<String>,
) -> Result<(), RouterConfigError> {
    if groups.contains(group) {
        Ok(())
    } else {
        Err(invalid(
            key,
            "a group of workers.groups (or \"default\")",
            group,
        ))
    }
}

fn fraction(key: &'static str, v: f64, lo_open: bool) -> Result<f64, RouterConfigError> {
    let ok = if lo_open {
        v > 0.0 && v < 1.0
    } else {
        (0.0..=1.0).contains(&v)
    };
    if ok {
        Ok(v)
    } else {
        Err(invalid(key, "a fraction in (0, 1)", v))
    }
}

impl ExperimentSection {
    /// Checks it against the known `groups`.
    pub fn validate(
        self,
        groups: &BTreeSet<String>,
    ) -> Result<ExperimentConfig, RouterConfigError> {
        check_name("experiments.id", &self.id)?;
        let [a, b]: [ArmSection; 2] = self.arms.try_into().map_err(|v: Vec<ArmSection>| {
            invalid("experiments.arms", "exactly two arms", v.len())
        })?;
        let arms = [a, b].map(|s| Arm {
            name: s.name,
            group: s.group,
            model: s.model,
        });
        for arm in &arms {
            check_name("experiments.arms.name", &arm.name)?;
            check_group("experiments.arms.group", &arm.group, groups)?;
        }
        if arms[0].name == arms[1].name {
            return Err(invalid(
                "experiments.arms.name",
                "two different names",
                &arms[0].name,
            ));
        }
        if arms[0].group == arms[1].group && arms[0].model == arms[1].model {
            return Err(invalid(
                "experiments.arms",
                "arms that differ in group or model",
                &arms[0].group,
            ));
        }
        let split_percent = self.split_percent.unwrap_or(50.0);
        if !(0.0..=100.0).contains(&split_percent) {
            return Err(invalid(
                "experiments.split_percent",
                "a percent in [0, 100]",
                split_percent,
            ));
        }
        let min_samples = self.min_samples.unwrap_or(30);
        if min_samples < 2 {
            return Err(invalid(
                "experiments.min_samples",
                "at least 2",
                min_samples,
            ));
        }
        Ok(ExperimentConfig {
            id: self.id,
            model: self.model,
            arms,
            split_percent,
            significance: fraction(
                "experiments.significance",
                self.significance.unwrap_or(0.05),
                true,
            )?,
            min_samples,
            window: parse_window(
                "experiments.window",
                self.window.as_deref(),
                WindowKind::Cumulative,
            )?,
        })
    }
}

impl CanarySection {
    /// Checks it against the known `groups`.
    pub fn validate(self, groups: &BTreeSet<String>) -> Result<CanaryConfig, RouterConfigError> {
        check_name("canary.name", &self.name)?;
        check_group("canary.stable_group", &self.stable_group, groups)?;
        check_group("canary.canary_group", &self.canary_group, groups)?;
        if self.stable_group == self.canary_group {
            return Err(invalid(
                "canary.canary_group",
                "a group other than stable_group",
                &self.canary_group,
            ));
        }
        let steps = self.steps.unwrap_or_else(|| vec![5.0, 25.0, 50.0, 100.0]);
        let increasing = steps.windows(2).all(|w| w[0] < w[1]);
        if steps.is_empty() || !increasing || steps[0] <= 0.0 || steps.last() != Some(&100.0) {
            return Err(invalid(
                "canary.steps",
                "increasing percents above 0, the last 100",
                format!("{steps:?}"),
            ));
        }
        let d = |v: Option<Duration>, default_s: u64| {
            v.map_or(StdDuration::from_secs(default_s), Duration::get)
        };
        let (step_duration, window, eval_interval) = (
            d(self.step_duration, 60),
            d(self.window, 60),
            d(self.eval_interval, 1),
        );
        if step_duration.is_zero() || window.is_zero() || eval_interval.is_zero() {
            return Err(invalid(
                "canary",
                "non-zero step_duration, window and eval_interval",
                "0s",
            ));
        }
        let min_samples = self.min_samples.unwrap_or(20);
        if min_samples < 2 {
            return Err(invalid("canary.min_samples", "at least 2", min_samples));
        }
        let ratio = |key: &'static str, v: Option<f64>| match v.unwrap_or(1.5) {
            r if r >= 1.0 && r.is_finite() => Ok(r),
            r => Err(invalid(key, "a ratio of at least 1", r)),
        };
        let thresholds = Thresholds {
            max_error_rate_delta: fraction(
                "canary.max_error_rate_delta",
                self.max_error_rate_delta.unwrap_or(0.05),
                false,
            )?,
            quantile: fraction("canary.quantile", self.quantile.unwrap_or(0.95), false)?,
            max_ttft_ratio: ratio("canary.max_ttft_ratio", self.max_ttft_ratio)?,
            max_itl_ratio: ratio("canary.max_itl_ratio", self.max_itl_ratio)?,
            significance: fraction(
                "canary.significance",
                self.significance.unwrap_or(0.01),
                true,
            )?,
            min_samples,
        };
        Ok(CanaryConfig {
            name: self.name,
            model: self.model,
            stable_group: self.stable_group,
            canary_group: self.canary_group,
            steps,
            step_duration,
            window,
            eval_interval,
            thresholds,
        })
    }
}

/// At most one split (experiment or canary) per model, and unique names.
pub fn check_unique(
    experiments: &[ExperimentConfig],
    canaries: &[CanaryConfig],
) -> Result<(), RouterConfigError> {
    let mut models = BTreeSet::new();
    let mut names = BTreeSet::new();
    let all = experiments
        .iter()
        .map(|e| (&e.model, format!("experiment {}", e.id), e.id.clone()))
        .chain(canaries.iter().map(|c| {
            (
                &c.model,
                format!("canary {}", c.name),
                format!("canary:{}", c.name),
            )
        }));
    for (model, what, name) in all {
        if !names.insert(name) {
            return Err(invalid("experiments/canary", "unique ids and names", what));
        }
        if !models.insert(model.clone()) {
            return Err(invalid(
                "experiments/canary",
                "at most one experiment or canary per model",
                format!("{what} on {}", model.as_deref().unwrap_or("every model")),
            ));
        }
    }
    Ok(())
}
