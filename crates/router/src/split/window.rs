//! One arm's live measurements: time-stamped samples of TTFT, inter-token
//! latency, end-to-end latency and request outcomes, pruned to a sliding
//! window (or kept, up to a bound, for a cumulative one).

use std::collections::VecDeque;
use std::time::Instant;

use ingot_stats::Summary;
use serde::Serialize;

use crate::config::WindowKind;

/// Most samples kept per series: bounds a cumulative window's memory
/// (about 1.6 MB per series); the oldest go first.
pub const MAX_SAMPLES: usize = 100_000;

/// What one finished request measured on an arm (seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Request sent → first body byte.
    pub ttft_s: Option<f64>,
    /// The request's mean gap between body chunks (streams of ≥ 2 chunks):
    /// one value per request, since gaps within a request are correlated.
    pub itl_s: Option<f64>,
    /// Request sent → body end.
    pub e2e_s: Option<f64>,
    /// Whether it succeeded (a failed attempt or a 5xx is an error).
    pub ok: bool,
}

#[derive(Debug, Default)]
struct Series(VecDeque<(Instant, f64)>);

impl Series {
    fn push(&mut self, at: Instant, v: f64) {
        if self.0.len() == MAX_SAMPLES {
            self.0.pop_front();
        }
        self.0.push_back((at, v));
    }

    fn prune(&mut self, oldest: Instant) {
        while self.0.front().is_some_and(|(t, _)| *t < oldest) {
            self.0.pop_front();
        }
    }

    fn values(&self) -> Vec<f64> {
        self.0.iter().map(|(_, v)| *v).collect()
    }
}

/// One arm's samples.
#[derive(Debug, Default)]
pub struct ArmWindow {
    ttft: Series,
    itl: Series,
    e2e: Series,
    /// 1.0 per error, 0.0 per success.
    errors: Series,
}

/// Request count and error rate of an arm's window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Outcomes {
    /// Requests (successes and errors).
    pub requests: usize,
    /// Errors among them.
    pub errors: usize,
    /// errors / requests (0 without requests).
    pub error_rate: f64,
}

impl ArmWindow {
    /// Adds `sample`, measured at `at`.
    pub fn record(&mut self, at: Instant, sample: Sample) {
        let put = |s: &mut Series, v: Option<f64>| {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                s.push(at, v);
            }
        };
        put(&mut self.ttft, sample.ttft_s);
        put(&mut self.itl, sample.itl_s);
        put(&mut self.e2e, sample.e2e_s);
        self.errors.push(at, if sample.ok { 0.0 } else { 1.0 });
    }

    /// Drops what `kind` no longer counts at `now`.
    pub fn prune(&mut self, now: Instant, kind: WindowKind) {
        let WindowKind::Sliding(len) = kind else {
            return;
        };
        let Some(oldest) = now.checked_sub(len) else {
            return;
        };
        for s in [
            &mut self.ttft,
            &mut self.itl,
            &mut self.e2e,
            &mut self.errors,
        ] {
            s.prune(oldest);
        }
    }

    /// Forgets every sample (a canary's new step starts a fresh window).
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// TTFT samples, seconds.
    pub fn ttft(&self) -> Vec<f64> {
        self.ttft.values()
    }

    /// Per-request mean ITL samples, seconds.
    pub fn itl(&self) -> Vec<f64> {
        self.itl.values()
    }

    /// End-to-end samples, seconds.
    pub fn e2e(&self) -> Vec<f64> {
        self.e2e.values()
    }

    /// Requests and errors.
    pub fn outcomes(&self) -> Outcomes {
        let requests = self.errors.0.len();
        let errors = self.errors.0.iter().filter(|(_, v)| *v > 0.0).count();
        Outcomes {
            requests,
            errors,
            error_rate: if requests == 0 {
                0.0
            } else {
                errors as f64 / requests as f64
            },
        }
    }

    /// Summaries for the admin API, in milliseconds.
    pub fn summaries_ms(&self) -> [Summary; 3] {
        [self.ttft(), self.itl(), self.e2e()]
            .map(|v| Summary::of(&v.iter().map(|s| s * 1e3).collect::<Vec<_>>()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sliding_windows_forget_old_samples_and_count_errors() {
        let mut w = ArmWindow::default();
        let t0 = Instant::now();
        let ok = Sample {
            ttft_s: Some(0.1),
            itl_s: None,
            e2e_s: Some(0.5),
            ok: true,
        };
        w.record(t0, ok);
        w.record(
            t0 + Duration::from_secs(5),
            Sample {
                ok: false,
                ..Sample::default()
            },
        );
        w.record(t0 + Duration::from_secs(9), ok);
        assert_eq!(
            w.outcomes(),
            Outcomes {
                requests: 3,
                errors: 1,
                error_rate: 1.0 / 3.0
            }
        );
        assert_eq!(w.ttft(), [0.1, 0.1]);
        assert!(w.itl().is_empty());
        w.prune(
            t0 + Duration::from_secs(12),
            WindowKind::Sliding(Duration::from_secs(10)),
        );
        assert_eq!(w.outcomes().requests, 2);
        assert_eq!(w.ttft(), [0.1]);
        w.prune(t0 + Duration::from_secs(1000), WindowKind::Cumulative);
        assert_eq!(w.outcomes().requests, 2);
        w.clear();
        assert_eq!(w.outcomes(), Outcomes::default());
    }
}
