//! A/B experiments: a unit's arm is `bucket(id, unit) < split_percent × 100`
//! (the treatment, arm b) else the control (arm a), so a unit keeps its arm;
//! the report compares the arms' TTFT, ITL and end-to-end latency with
//! Welch's test, the three verdicts corrected together (Holm): one
//! report asks one question, whether arm b differs.
//!
//! The unit here is the request, unlike `ingot bench compare`, which tests
//! between whole runs (issue 31): the two arms serve interleaved requests
//! in the same window, so a slow minute of the machine slows both arms
//! alike instead of one run, and what is left between requests is
//! request-to-request noise, which Welch's test models.

use std::sync::Mutex;
use std::time::Instant;

use ingot_stats::{compare, holm_correct, Comparison};
use serde::Serialize;

use super::window::{ArmWindow, Outcomes, Sample};
use crate::config::{ExperimentConfig, WindowKind};

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
        let (mut ttft_ms, mut itl_ms, mut e2e_ms) = (
            cmp(ArmWindow::ttft),
            cmp(ArmWindow::itl),
            cmp(ArmWindow::e2e),
        );
        holm_correct(&mut [&mut ttft_ms, &mut itl_ms, &mut e2e_ms]);
        ExperimentReport {
            id: c.id.clone(),
            model: c.model.clone(),
            split_percent: c.split_percent,
            window: window_name(c.window),
            significance: c.significance,
            min_samples: c.min_samples,
            arms: [arm(0), arm(1)],
            ttft_ms,
            itl_ms,
            e2e_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Arm;

    fn experiment(split_percent: f64) -> Experiment {
        let arm = |name: &str, group: &str| Arm {
            name: name.into(),
            group: group.into(),
            model: None,
        };
        Experiment::new(ExperimentConfig {
            id: "exp".into(),
            model: None,
            arms: [arm("a", "g1"), arm("b", "g2")],
            split_percent,
            significance: 0.01,
            min_samples: 5,
            window: WindowKind::Cumulative,
        })
    }

    #[test]
    fn units_keep_their_arm_and_the_split_holds() {
        let units: Vec<String> = (0..4000).map(|i| format!("k{i}")).collect();
        let in_b = |e: &Experiment| units.iter().filter(|u| e.arm_for(u) == 1).count();
        assert_eq!(in_b(&experiment(0.0)), 0);
        assert_eq!(in_b(&experiment(100.0)), 4000);
        let e = experiment(50.0);
        let b = in_b(&e);
        assert!((1800..=2200).contains(&b), "{b}");
        assert!(units.iter().all(|u| e.arm_for(u) == e.arm_for(u)));
        // The arm is the flag decision for the experiment's id.
        assert_eq!(
            e.arm_for("alice"),
            usize::from(ingot_config::bucket("exp", "alice") < 5000)
        );
    }

    #[test]
    fn the_report_compares_the_arms() {
        let e = experiment(50.0);
        let now = Instant::now();
        for i in 0..20 {
            let jitter = (i % 5) as f64 * 0.001;
            for (arm, ttft) in [(0, 0.1), (1, 0.2)] {
                let sample = Sample {
                    ttft_s: Some(ttft + jitter),
                    itl_s: Some(0.02),
                    e2e_s: Some(ttft + 0.3),
                    ok: true,
                };
                e.record(arm, now, sample);
            }
        }
        let r = e.report(now);
        assert_eq!(
            (r.arms[0].outcomes.requests, r.arms[1].outcomes.requests),
            (20, 20)
        );
        assert_eq!(r.ttft_ms.verdict, ingot_stats::Verdict::BHigher);
        assert!(r.ttft_ms.welch.unwrap().p < 0.01);
        assert!((r.ttft_ms.a.mean - 102.0).abs() < 1e-9);
        // Identical ITL on both arms: no difference.
        assert_eq!(r.itl_ms.verdict, ingot_stats::Verdict::NotSignificant);
        assert_eq!(r.window, "cumulative");
    }
}
