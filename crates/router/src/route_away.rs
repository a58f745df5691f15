//! SLO remediation in the router: route away from a worker whose measured
//! latency breaches the router's `[slo]` targets.
//!
//! The router already keeps each worker's TTFT and ITL as moving averages
//! (`Worker::latency`). A worker whose average is over a target is taken
//! out of rotation for `hold`; then it is re-admitted on probation with its
//! averages cleared, so fresh samples judge it. Breaching again on
//! probation doubles the hold (up to `hold_max`); measuring under
//! `exit_ratio` × target ends probation and resets the hold. Hysteresis
//! (enter over the target, leave under a lower bound) and the growing hold
//! keep a worker near its target from flapping in and out.
//!
//! Never at the cost of a request: when every candidate is routed away,
//! they are all used ([`RouteAway::filter`]). In `dry_run` the decisions
//! are made, logged and counted, but nothing is excluded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, gauge};

pub use crate::config::{RouteAwayConfig, RouteAwayMode, RouterSloSection};
use crate::metrics::{ROUTED_AWAY, ROUTE_AWAY_ACTIONS};
pub use crate::worker::RouteAwayState;
use crate::worker::{Latency, Worker};

/// What one evaluation of a worker decided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decision {
    /// Nothing changes.
    Keep,
    /// Taken out of rotation for this long.
    Exclude(Duration),
    /// Hold over: back in rotation on probation.
    Readmit,
    /// Measured under the exit bound on probation: fully healthy again.
    Clear,
}

impl RouteAwayConfig {
    /// Whether `latency` is over a target (after enough samples).
    pub(crate) fn breaches(&self, latency: Latency) -> bool {
        if latency.samples < self.min_samples {
            return false;
        }
        let over = |avg: Option<f64>, target: Option<f64>| matches!((avg, target), (Some(a), Some(t)) if a > t);
        over(latency.ttft, self.ttft) || over(latency.itl, self.itl)
    }

    /// Whether every measured average is under `ratio` × its target (and
    /// at least one is measured, after enough samples).
    fn within(&self, latency: Latency, ratio: f64) -> bool {
        let pairs = [(latency.ttft, self.ttft), (latency.itl, self.itl)];
        if latency.samples < self.min_samples {
            return false;
        }
        let mut measured = false;
        for (avg, target) in pairs {
            if let (Some(a), Some(t)) = (avg, target) {
                measured = true;
                if a >= ratio * t {
                    return false;
                }
            }
        }
        measured
    }

    /// Whether every measured average is under its exit bound.
    fn recovered(&self, latency: Latency) -> bool {
        self.within(latency, self.exit_ratio)
    }

    /// Whether `latency` is measured and meets every target: a canary is
    /// only blamed for a breach its stable group does not share.
    pub(crate) fn meets(&self, latency: Latency) -> bool {
        self.within(latency, 1.0)
    }

    /// Advances `state` for a worker measured at `latency` at `now`.
    pub fn step(&self, state: &mut RouteAwayState, latency: Latency, now: Instant) -> Decision {
        if let Some(until) = state.until {
            if now < until {
                return Decision::Keep;
            }
            state.until = None;
            state.probation = true;
            return Decision::Readmit;
        }
        if self.breaches(latency) {
            let hold = if state.next_hold.is_zero() {
                self.hold
            } else {
                state.next_hold
            };
            state.until = Some(now + hold);
            state.next_hold = (hold * 2).min(self.hold_max);
            return Decision::Exclude(hold);
        }
        if state.probation && self.recovered(latency) {
            *state = RouteAwayState::default();
            return Decision::Clear;
        }
        Decision::Keep
    }
}

/// Advances `w`'s route-away state on its current latency; with `act`, a
/// re-admitted worker's averages are cleared so fresh samples judge it.
pub fn step_worker(config: &RouteAwayConfig, w: &Worker, now: Instant, act: bool) -> Decision {
    let decision = w.update_route_away(|state| config.step(state, w.latency(), now));
    if act && decision == Decision::Readmit {
        w.reset_latency();
    }
    decision
}

/// The router's route-away remediation.
#[derive(Debug, Default)]
pub struct RouteAway {
    config: RouteAwayConfig,
}

impl RouteAway {
    /// Remediation per `config`.
    pub fn new(config: RouteAwayConfig) -> Self {
        Self { config }
    }

    /// Evaluates `w` now; true when it is out of rotation (mode `on` only).
    pub fn avoids(&self, w: &Worker, now: Instant) -> bool {
        let mode = self.config.mode;
        if mode == RouteAwayMode::Off {
            return false;
        }
        let decision = step_worker(&self.config, w, now, mode == RouteAwayMode::On);
        self.report(w, decision);
        mode == RouteAwayMode::On && w.route_away_state().until.is_some()
    }

    /// `candidates` less the workers routed away, unless that leaves none.
    pub fn filter(&self, candidates: Vec<Arc<Worker>>, now: Instant) -> Vec<Arc<Worker>> {
        if self.config.mode == RouteAwayMode::Off {
            return candidates;
        }
        let (kept, avoided): (Vec<_>, Vec<_>) =
            candidates.into_iter().partition(|w| !self.avoids(w, now));
        if kept.is_empty() {
            avoided
        } else {
            kept
        }
    }

    fn report(&self, w: &Worker, decision: Decision) {
        let mode = match self.config.mode {
            RouteAwayMode::On => "on",
            _ => "dry_run",
        };
        let (direction, away) = match decision {
            Decision::Keep => return,
            Decision::Exclude(hold) => {
                tracing::warn!(worker = %w.label, mode, hold_s = hold.as_secs_f64(), latency = ?w.latency(),
                    "SLO breached: routing away from the worker");
                ("apply", 1.0)
            }
            Decision::Readmit => {
                tracing::info!(worker = %w.label, mode, "hold over: the worker is back on probation");
                ("undo", 0.0)
            }
            Decision::Clear => {
                tracing::info!(worker = %w.label, mode, "the worker meets its SLO again");
                ("clear", 0.0)
            }
        };
        let labels = [("worker", w.label.clone()), ("mode", mode.to_string())];
        gauge!(ROUTED_AWAY, &labels).set(away);
        let [worker, mode] = labels;
        counter!(
            ROUTE_AWAY_ACTIONS,
            &[worker, mode, ("direction", direction.to_string())]
        )
        .increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RouteAwayConfig {
        RouteAwayConfig {
            mode: RouteAwayMode::On,
            ttft: Some(1.0),
            itl: None,
            ..RouteAwayConfig::default()
        }
    }

    fn ttft(s: f64) -> Latency {
        Latency {
            ttft: Some(s),
            itl: None,
            samples: 5,
        }
    }

    #[test]
    fn a_breach_excludes_then_readmits_on_probation_then_clears() {
        let c = config();
        let t0 = Instant::now();
        let mut s = RouteAwayState::default();
        assert_eq!(c.step(&mut s, ttft(0.5), t0), Decision::Keep);
        assert_eq!(c.step(&mut s, ttft(1.5), t0), Decision::Exclude(c.hold));
        assert_eq!(c.step(&mut s, ttft(0.1), t0 + c.hold / 2), Decision::Keep);
        assert!(s.until.is_some());
        assert_eq!(c.step(&mut s, ttft(1.5), t0 + c.hold), Decision::Readmit);
        assert!(s.probation && s.until.is_none());
        // Between the exit bound and the target: still on probation.
        assert_eq!(c.step(&mut s, ttft(0.9), t0 + c.hold), Decision::Keep);
        assert!(s.probation);
        assert_eq!(c.step(&mut s, ttft(0.7), t0 + c.hold), Decision::Clear);
        assert_eq!(s, RouteAwayState::default());
    }

    #[test]
    fn relapses_double_the_hold_up_to_the_max() {
        let c = RouteAwayConfig {
            hold: Duration::from_secs(10),
            hold_max: Duration::from_secs(25),
            ..config()
        };
        let mut now = Instant::now();
        let mut s = RouteAwayState::default();
        let mut holds = Vec::new();
        for _ in 0..4 {
            match c.step(&mut s, ttft(2.0), now) {
                Decision::Exclude(h) => holds.push(h.as_secs()),
                other => panic!("expected an exclusion, got {other:?}"),
            }
            now = s.until.expect("excluded");
            assert_eq!(c.step(&mut s, ttft(2.0), now), Decision::Readmit);
        }
        assert_eq!(holds, [10, 20, 25, 25]);
    }

    #[test]
    fn unmeasured_targets_and_workers_never_breach() {
        let c = config();
        let mut s = RouteAwayState::default();
        let itl_only = Latency {
            ttft: None,
            itl: Some(5.0),
            samples: 5,
        };
        let few = Latency {
            samples: 4,
            ..ttft(5.0)
        };
        assert_eq!(c.step(&mut s, few, Instant::now()), Decision::Keep);
        assert_eq!(c.step(&mut s, itl_only, Instant::now()), Decision::Keep);
        assert_eq!(
            c.step(&mut s, Latency::default(), Instant::now()),
            Decision::Keep
        );
    }

    fn breaker() -> crate::config::BreakerConfig {
        crate::config::BreakerConfig {
            failure_threshold: 3,
            cooldown: Duration::from_secs(5),
        }
    }

    #[test]
    fn all_routed_away_means_all_are_used() {
        let away = RouteAway::new(config());
        let now = Instant::now();
        let workers: Vec<Arc<Worker>> = (0..2)
            .map(|i| {
                let w = Worker::new(i, format!("w{i}"), String::new(), false, breaker());
                Arc::new(w)
            })
            .collect();
        for _ in 0..5 {
            workers[0].record_ttft(3.0);
        }
        let kept = away.filter(workers.clone(), now);
        assert_eq!(kept.iter().map(|w| w.id).collect::<Vec<_>>(), [1]);
        for _ in 0..5 {
            workers[1].record_ttft(3.0);
        }
        let kept = away.filter(workers.clone(), now);
        assert_eq!(kept.len(), 2, "never refuse a request for route-away alone");
        let dry = RouteAway::new(RouteAwayConfig {
            mode: RouteAwayMode::DryRun,
            ..config()
        });
        let fresh = Arc::new(Worker::new(2, "w2".into(), String::new(), false, breaker()));
        for _ in 0..5 {
            fresh.record_ttft(3.0);
        }
        assert_eq!(dry.filter(vec![fresh.clone()], now).len(), 1);
        assert!(
            fresh.route_away_state().until.is_some(),
            "dry run decides too"
        );
    }
}
