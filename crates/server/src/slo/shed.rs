//! The shed/delay level of one model: 0 (nothing held) up to the number of
//! covered tiers. A breach raises it one level (at most once per cool-down,
//! judged only on samples taken since the last change); an SLO held under
//! its exit threshold for the exit period lowers it one level.

use std::time::{Duration, Instant};

/// What the controller decided at one evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LevelChange {
    /// One more tier covered.
    Raise(usize),
    /// One tier released.
    Lower(usize),
}

/// The evidence of one evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A triggering SLO is over its target (on post-change samples).
    Breached,
    /// Every triggering SLO is under its exit threshold (or not judged).
    Clear,
    /// Neither: hold the level.
    Hold,
}

/// Timing of the hysteresis.
#[derive(Debug, Clone, Copy)]
pub struct ShedTiming {
    /// Least time between two changes.
    pub cooldown: Duration,
    /// Clear this long before a level is released.
    pub exit_after: Duration,
}

/// One model's level.
#[derive(Debug, Clone, Default)]
pub struct ShedLevel {
    level: usize,
    last_change: Option<Instant>,
    clear_since: Option<Instant>,
}

impl ShedLevel {
    /// Tiers covered now.
    pub fn level(&self) -> usize {
        self.level
    }

    /// When the level last changed.
    pub fn last_change(&self) -> Option<Instant> {
        self.last_change
    }

    /// Applies one evaluation's verdict; `max` is the number of tiers.
    pub fn decide(
        &mut self,
        verdict: Verdict,
        max: usize,
        timing: ShedTiming,
        now: Instant,
    ) -> Option<LevelChange> {
        let cooled = self
            .last_change
            .is_none_or(|t| now.saturating_duration_since(t) >= timing.cooldown);
        match verdict {
            Verdict::Breached => {
                self.clear_since = None;
                if self.level < max && cooled {
                    return Some(self.change(self.level + 1, now, LevelChange::Raise));
                }
            }
            Verdict::Hold => self.clear_since = None,
            Verdict::Clear => {
                let since = *self.clear_since.get_or_insert(now);
                let held = now.saturating_duration_since(since) >= timing.exit_after;
                if self.level > 0 && held && cooled {
                    // The next level down needs its own exit period.
                    self.clear_since = Some(now);
                    return Some(self.change(self.level - 1, now, LevelChange::Lower));
                }
            }
        }
        None
    }

    fn change(
        &mut self,
        level: usize,
        now: Instant,
        kind: fn(usize) -> LevelChange,
    ) -> LevelChange {
        self.level = level;
        self.last_change = Some(now);
        kind(level)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: ShedTiming = ShedTiming {
        cooldown: Duration::from_secs(2),
        exit_after: Duration::from_secs(10),
    };

    fn at(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    #[test]
    fn raises_once_per_cooldown_up_to_max() {
        let t0 = Instant::now();
        let mut l = ShedLevel::default();
        assert_eq!(
            l.decide(Verdict::Breached, 2, T, t0),
            Some(LevelChange::Raise(1))
        );
        assert_eq!(
            l.decide(Verdict::Breached, 2, T, at(t0, 1)),
            None,
            "cooling down"
        );
        assert_eq!(
            l.decide(Verdict::Breached, 2, T, at(t0, 2)),
            Some(LevelChange::Raise(2))
        );
        assert_eq!(l.decide(Verdict::Breached, 2, T, at(t0, 9)), None, "at max");
    }

    #[test]
    fn lowers_only_after_the_exit_period_and_does_not_flap() {
        let t0 = Instant::now();
        let mut l = ShedLevel::default();
        l.decide(Verdict::Breached, 2, T, t0);
        l.decide(Verdict::Breached, 2, T, at(t0, 2));
        // Clear, then a value between the thresholds resets the exit clock.
        assert_eq!(l.decide(Verdict::Clear, 2, T, at(t0, 3)), None);
        assert_eq!(l.decide(Verdict::Hold, 2, T, at(t0, 12)), None);
        assert_eq!(l.decide(Verdict::Clear, 2, T, at(t0, 13)), None);
        assert_eq!(l.decide(Verdict::Clear, 2, T, at(t0, 22)), None);
        assert_eq!(
            l.decide(Verdict::Clear, 2, T, at(t0, 23)),
            Some(LevelChange::Lower(1))
        );
        // The next level needs its own exit period.
        assert_eq!(l.decide(Verdict::Clear, 2, T, at(t0, 30)), None);
        assert_eq!(
            l.decide(Verdict::Clear, 2, T, at(t0, 33)),
            Some(LevelChange::Lower(0))
        );
        assert_eq!(
            l.decide(Verdict::Clear, 2, T, at(t0, 60)),
            None,
            "nothing to undo"
        );
    }
}
