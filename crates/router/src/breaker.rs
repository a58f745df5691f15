//! A circuit breaker per worker: closed → (threshold consecutive failures)
//! → open → (cool-down) → half-open: one trial request; success closes it,
//! failure opens it again for another cool-down.
//!
//! Pure state with the clock passed in, so the transitions are unit-tested
//! without sleeping.

use std::time::{Duration, Instant};

use crate::config::BreakerConfig;

/// Where a breaker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Requests flow.
    Closed,
    /// Requests are refused until the cool-down ends.
    Open,
    /// One trial request is let through.
    HalfOpen,
}

impl BreakerState {
    /// The `ingot_router_breaker_state` gauge value: 0 closed, 1 open, 2 half-open.
    pub fn gauge(self) -> f64 {
        match self {
            Self::Closed => 0.0,
            Self::Open => 1.0,
            Self::HalfOpen => 2.0,
        }
    }
}

/// One worker's breaker.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cooldown: Duration,
    failures: u32,
    opened_at: Option<Instant>,
    trial_in_flight: bool,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            threshold: config.failure_threshold,
            cooldown: config.cooldown,
            failures: 0,
            opened_at: None,
            trial_in_flight: false,
        }
    }

    /// The state at `now`.
    pub fn state(&self, now: Instant) -> BreakerState {
        match self.opened_at {
            None => BreakerState::Closed,
            Some(t) if now.duration_since(t) < self.cooldown => BreakerState::Open,
            Some(_) => BreakerState::HalfOpen,
        }
    }

    /// How long until an open breaker lets a trial through (`None` unless
    /// open at `now`).
    pub fn reopens_in(&self, now: Instant) -> Option<Duration> {
        let opened = self.opened_at?;
        let left = self.cooldown.checked_sub(now.duration_since(opened))?;
        (!left.is_zero()).then_some(left)
    }

    /// Whether a request may go to this worker now (without taking the trial).
    pub fn allows(&self, now: Instant) -> bool {
        match self.state(now) {
            BreakerState::Closed => true,
            BreakerState::Open => false,
            BreakerState::HalfOpen => !self.trial_in_flight,
        }
    }

    /// Called when a request is sent: in half-open it takes the one trial.
    pub fn on_send(&mut self, now: Instant) {
        if self.state(now) == BreakerState::HalfOpen {
            self.trial_in_flight = true;
        }
    }

    /// A request (or probe) succeeded: closes the breaker.
    pub fn on_success(&mut self) {
        self.failures = 0;
        self.opened_at = None;
        self.trial_in_flight = false;
    }

    /// A request failed (connect error, 5xx, timeout). Returns true when this
    /// failure opened the breaker.
    pub fn on_failure(&mut self, now: Instant) -> bool {
        let before = self.state(now);
        self.trial_in_flight = false;
        self.failures = self.failures.saturating_add(1);
        let opens = match before {
            BreakerState::Closed => self.failures >= self.threshold,
            BreakerState::HalfOpen => true,
            BreakerState::Open => false,
        };
        if opens {
            self.opened_at = Some(now);
        }
        opens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(BreakerConfig {
            failure_threshold: 2,
            cooldown: Duration::from_secs(5),
        })
    }

    #[test]
    fn opens_after_threshold_consecutive_failures() {
        let t = Instant::now();
        let mut b = breaker();
        assert!(!b.on_failure(t));
        assert_eq!(b.state(t), BreakerState::Closed);
        b.on_success();
        assert!(!b.on_failure(t), "a success resets the count");
        assert!(b.on_failure(t));
        assert_eq!(b.state(t), BreakerState::Open);
        assert!(!b.allows(t + Duration::from_secs(4)));
    }

    #[test]
    fn half_open_lets_one_trial_then_closes_or_reopens() {
        let t = Instant::now();
        let mut b = breaker();
        b.on_failure(t);
        b.on_failure(t);
        let later = t + Duration::from_secs(5);
        assert_eq!(b.state(later), BreakerState::HalfOpen);
        assert!(b.allows(later));
        b.on_send(later);
        assert!(!b.allows(later), "only one trial at a time");
        b.on_failure(later);
        assert_eq!(b.state(later), BreakerState::Open, "a failed trial reopens");
        let again = later + Duration::from_secs(5);
        b.on_send(again);
        b.on_success();
        assert_eq!(b.state(again), BreakerState::Closed);
        assert!(b.allows(again));
    }

    #[test]
    fn an_open_breaker_says_when_it_lets_a_trial_through() {
        let mut b = breaker();
        let t0 = Instant::now();
        assert_eq!(b.reopens_in(t0), None, "closed");
        while !b.on_failure(t0) {}
        assert_eq!(b.reopens_in(t0), Some(Duration::from_secs(5)));
        assert_eq!(
            b.reopens_in(t0 + Duration::from_secs(2)),
            Some(Duration::from_secs(3))
        );
        assert_eq!(b.reopens_in(t0 + Duration::from_secs(5)), None, "half-open");
    }
}
