//! A/B experiments: a unit's arm is `bucket(id, unit) < split_percent × 100`
//! (the treatment, arm b) else the control (arm a), so a unit keeps its arm;
//! the report compares the arms' TTFT, ITL and end-to-end latency with
//! Welch's test.

use std::sync::Mutex;
use std::time::Instant;

use ingot_stats::{compare, Comparison};
use serde::Serialize;

use super::config::{ExperimentConfig, WindowKind};
use super::window::{ArmWindow, Outcomes, Sample};

/// One running experiment.
#[derive(Debug)]
pub struct Experiment {
    /// Its config.
    pub config: ExperimentConfig,
    windows: Mutex<[ArmWindow; 2]>,
}

/// One arm in a report.
#[derive(Debug, Serialize)]
pub struct ArmReport {
    /// Name.
    pub name: String,
    /// Worker group.
    pub group: String,
    /// Model override.
    pub model: Option<String>,
    /// Requests and errors in the window.
    #[serde(flatten)]
    pub outcomes: Outcomes,
}

/// `GET /admin/experiments/{id}`.
#[derive(Debug, Serialize)]
pub struct ExperimentReport {
    /// Id.
    pub id: String,
    /// Model it splits (null: every request).
    pub model: Option<String>,
    /// Percent of units in arm b.
    pub split_percent: f64,
    /// "cumulative" or the sliding window's length.
    pub window: String,
    /// Significance level of the verdicts.
    pub significance: f64,
    /// Samples per arm before a verdict.
    pub min_samples: usize,
    /// Arm a (control) and arm b (treatment).
    pub arms: [ArmReport; 2],
    /// TTFT, ms: per-arm n, mean, variance, p50/p95/p99; Welch's t, df, p;
    /// verdict (`b_higher`, `b_lower`, `not_significant`,
    /// `insufficient_samples`).
    pub ttft_ms: Comparison,
    /// Per-request mean inter-token latency, ms (streams only).
    pub itl_ms: Comparison,
    /// End-to-end latency, ms.
    pub e2e_ms: Comparison,
}

/// A window's description in reports.
pub fn window_name(kind: WindowKind) -> String {
    match kind {
        WindowKind::Cumulative => "cumulative".into(),
        WindowKind::Sliding(d) => format!("{}s", d.as_secs_f64()),
    }
}

impl Experiment {
    /// A fresh experiment.
    pub fn new(config: ExperimentConfig) -> Self {
        Self {
            config,
            windows: Mutex::new(Default::default()),
        }
    }

    /// The arm of `unit`: 1 (b) when its bucket is below the split.
    pub fn arm_for(&self, unit: &str) -> usize {
        let threshold = (self.config.split_percent * 100.0).round() as u32;
        usize::from(ingot_config::bucket(&self.config.id, unit) < threshold)
    }

    /// Adds a finished request's sample to `arm`.
    pub fn record(&self, arm: usize, at: Instant, sample: Sample) {
        let mut w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = w.get_mut(arm) {
            w.record(at, sample);
        }
    }

    /// The report at `now`.
    pub fn report(&self, now: Instant) -> ExperimentReport {
        let c = &self.config;
        let mut w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        for arm in w.iter_mut() {
            arm.prune(now, c.window);
        }
        let ms = |v: Vec<f64>| v.into_iter().map(|s| s * 1e3).collect::<Vec<_>>();
        let cmp = |f: fn(&ArmWindow) -> Vec<f64>| {
            compare(&ms(f(&w[0])), &ms(f(&w[1])), c.significance, c.min_samples)
        };
        let arm = |i: usize| ArmReport {
            name: c.arms[i].name.clone(),
            group: c.arms[i].group.clone(),
            model: c.arms[i].model.clone(),
            outcomes: w[i].outcomes(),
        };
        ExperimentReport {
            id: c.id.clone(),
            model: c.model.clone(),
            split_percent: c.split_percent,
            window: window_name(c.window),
            significance: c.significance,
            min_samples: c.min_samples,
            arms: [arm(0), arm(1)],
            ttft_ms: cmp(ArmWindow::ttft),
            itl_ms: cmp(ArmWindow::itl),
            e2e_ms: cmp(ArmWindow::e2e),
        }
    }
}
