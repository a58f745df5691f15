//! Adaptive batching: steers one engine's step token budget toward a
//! target inter-token latency. A step's time grows with the tokens it holds,
//! so the budget is scaled by target / measured (a proportional step on the
//! ratio, each step bounded to [×0.5, ×1.25] so one noisy window cannot
//! swing it), within [min, max]. Inside the dead band around the target
//! nothing changes (the hysteresis); changes are at least a cool-down apart
//! and judged only on ITL samples taken since the last change.

use std::time::{Duration, Instant};

/// The controller's bounds and target.
#[derive(Debug, Clone, Copy)]
pub struct BudgetPolicy {
    /// Target ITL, seconds.
    pub target: f64,
    /// Dead band, a share of the target.
    pub band: f64,
    /// Smallest budget.
    pub min: usize,
    /// Largest budget (the configured one).
    pub max: usize,
    /// Least time between changes.
    pub cooldown: Duration,
}

/// Largest cut and growth of one step.
const MAX_CUT: f64 = 0.5;
const MAX_GROWTH: f64 = 1.25;

/// One model's budget.
#[derive(Debug, Clone)]
pub struct BudgetController {
    budget: usize,
    last_change: Option<Instant>,
}

impl BudgetController {
    /// Starts at `budget`.
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            last_change: None,
        }
    }

    /// The budget now.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// When the budget last changed.
    pub fn last_change(&self) -> Option<Instant> {
        self.last_change
    }

    /// Applies one measurement (`None`: too few samples); returns the new
    /// budget when it changed.
    pub fn step(&mut self, measured: Option<f64>, p: BudgetPolicy, now: Instant) -> Option<usize> {
        // A changed configuration moves the bounds under a running budget.
        let clamped = self.budget.clamp(p.min, p.max);
        if clamped != self.budget {
            return Some(self.set(clamped, now));
        }
        let measured = measured.filter(|m| *m > 0.0)?;
        let cooled = self
            .last_change
            .is_none_or(|t| now.saturating_duration_since(t) >= p.cooldown);
        let inside = (measured - p.target).abs() <= p.band * p.target;
        if !cooled || inside {
            return None;
        }
        let factor = (p.target / measured).clamp(MAX_CUT, MAX_GROWTH);
        let scaled = (self.budget as f64 * factor).round() as usize;
        // At least one token either way, so a small budget still moves.
        let next = if factor < 1.0 {
            scaled.min(self.budget.saturating_sub(1))
        } else {
            scaled.max(self.budget + 1)
        }
        .clamp(p.min, p.max);
        (next != self.budget).then(|| self.set(next, now))
    }

    fn set(&mut self, budget: usize, now: Instant) -> usize {
        self.budget = budget;
        self.last_change = Some(now);
        budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: BudgetPolicy = BudgetPolicy {
        target: 0.050,
        band: 0.1,
        min: 16,
        max: 512,
        cooldown: Duration::from_secs(1),
    };

    /// A step costs 10 ms plus 0.2 ms per token: the budget that meets
    /// 50 ms is 200.
    fn itl(budget: usize) -> f64 {
        0.010 + 0.0002 * budget as f64
    }

    #[test]
    fn converges_into_the_band_and_stays() {
        let t0 = Instant::now();
        let mut c = BudgetController::new(512);
        for i in 0..30 {
            let now = t0 + Duration::from_secs(i);
            c.step(Some(itl(c.budget())), P, now);
        }
        let got = itl(c.budget());
        assert!(
            (got - 0.050).abs() <= 0.1 * 0.050,
            "budget {} gives {got}",
            c.budget()
        );
        let settled = c.budget();
        assert_eq!(
            c.step(Some(itl(settled)), P, t0 + Duration::from_secs(60)),
            None
        );
    }

    #[test]
    fn grows_back_to_max_when_fast_and_respects_bounds_and_cooldown() {
        let t0 = Instant::now();
        let mut c = BudgetController::new(16);
        assert_eq!(c.step(Some(0.001), P, t0), Some(20));
        assert_eq!(c.step(Some(0.001), P, t0), None, "cooling down");
        for i in 1..40 {
            c.step(Some(0.001), P, t0 + Duration::from_secs(i));
        }
        assert_eq!(c.budget(), 512);
        c.step(Some(10.0), P, t0 + Duration::from_secs(100));
        assert_eq!(c.budget(), 256, "one step cuts at most half");
        assert_eq!(c.step(None, P, t0 + Duration::from_secs(200)), None);
    }
}
