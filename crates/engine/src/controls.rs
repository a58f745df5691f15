//! What the SLO policy engine reads from and steers in a running engine:
//! live latency windows per priority tier (written by the engine thread),
//! and the step token budget, the running-sequence cap and the held tiers
//! (read by the engine thread before every step). Changing them needs no
//! restart: the next step uses the new values.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ingot_core::{Priority, SampleWindow};

/// Samples kept per tier and measure: at CPU rates a window of tens of
/// seconds fits; at GPU rates the ring holds the most recent ones.
const WINDOW_CAPACITY: usize = 8192;

/// The measures an SLO can be set on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// Arrival to first token (seconds).
    Ttft,
    /// Gap between two tokens of one request (seconds).
    Itl,
    /// Arrival to last token (seconds).
    E2e,
    /// 1 for a request the engine failed, 0 for one that finished.
    Outcome,
}

impl Measure {
    const ALL: [Measure; 4] = [Measure::Ttft, Measure::Itl, Measure::E2e, Measure::Outcome];

    fn index(self) -> usize {
        self as usize
    }
}

/// Live, runtime-adjustable engine settings and latency windows.
#[derive(Debug)]
pub struct EngineControls {
    /// The configured values (the bounds steering returns to).
    configured_budget: usize,
    configured_seqs: usize,
    token_budget: AtomicUsize,
    max_num_seqs: AtomicUsize,
    /// Bit `rank` set: that tier is held (not admitted, not stepped).
    held: AtomicU8,
    /// `[tier][measure]`.
    windows: Mutex<Vec<Vec<SampleWindow>>>,
}

impl EngineControls {
    /// Controls starting at the configured limits.
    pub fn new(max_num_batched_tokens: usize, max_num_seqs: usize) -> Self {
        let windows = Priority::ALL
            .iter()
            .map(|_| {
                Measure::ALL
                    .iter()
                    .map(|_| SampleWindow::new(WINDOW_CAPACITY))
                    .collect()
            })
            .collect();
        Self {
            configured_budget: max_num_batched_tokens,
            configured_seqs: max_num_seqs,
            token_budget: AtomicUsize::new(max_num_batched_tokens),
            max_num_seqs: AtomicUsize::new(max_num_seqs),
            held: AtomicU8::new(0),
            windows: Mutex::new(windows),
        }
    }

    /// `scheduler.max_num_batched_tokens` as configured.
    pub fn configured_token_budget(&self) -> usize {
        self.configured_budget
    }

    /// The step token budget in force.
    pub fn token_budget(&self) -> usize {
        self.token_budget.load(Ordering::Relaxed)
    }

    /// Sets the step token budget (at least 1). The running-sequence cap
    /// follows it down, so every running sequence still decodes each step.
    pub fn set_token_budget(&self, tokens: usize) {
        let tokens = tokens.max(1);
        self.token_budget.store(tokens, Ordering::Relaxed);
        self.max_num_seqs
            .store(self.configured_seqs.min(tokens), Ordering::Relaxed);
    }

    /// The running-sequence cap in force.
    pub fn max_num_seqs(&self) -> usize {
        self.max_num_seqs.load(Ordering::Relaxed)
    }

    /// Holds the given tiers (replacing any earlier set).
    pub fn set_held(&self, tiers: &[Priority]) {
        let bits = tiers.iter().fold(0u8, |b, p| b | (1 << p.rank()));
        self.held.store(bits, Ordering::Relaxed);
    }

    /// Whether `tier` is held.
    pub fn is_held(&self, tier: Priority) -> bool {
        self.held.load(Ordering::Relaxed) & (1 << tier.rank()) != 0
    }

    /// The held tiers as a bit set (bit `rank`).
    pub(crate) fn held_bits(&self) -> u8 {
        self.held.load(Ordering::Relaxed)
    }

    /// Records one sample (the engine thread does, per token and request).
    pub fn record(&self, tier: Priority, measure: Measure, value: f64, at: Instant) {
        let mut w = self
            .windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        w[tier.rank()][measure.index()].push(at, value);
    }

    /// The samples of `measure` no older than `age`, across `tiers`.
    pub fn recent(&self, tiers: &[Priority], measure: Measure, age: Duration) -> Vec<f64> {
        let now = Instant::now();
        let w = self
            .windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tiers
            .iter()
            .flat_map(|t| w[t.rank()][measure.index()].recent(now, age))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_caps_running_sequences() {
        let c = EngineControls::new(512, 64);
        c.set_token_budget(32);
        assert_eq!((c.token_budget(), c.max_num_seqs()), (32, 32));
        c.set_token_budget(512);
        assert_eq!((c.token_budget(), c.max_num_seqs()), (512, 64));
        c.set_token_budget(0);
        assert_eq!(c.token_budget(), 1);
    }

    #[test]
    fn held_tiers_and_windows() {
        let c = EngineControls::new(512, 64);
        c.set_held(&[Priority::Low, Priority::Background]);
        assert!(c.is_held(Priority::Low) && !c.is_held(Priority::High));
        c.set_held(&[]);
        assert!(!c.is_held(Priority::Low));
        let now = Instant::now();
        c.record(Priority::High, Measure::Ttft, 0.3, now);
        c.record(Priority::Low, Measure::Ttft, 0.9, now);
        let high = c.recent(&[Priority::High], Measure::Ttft, Duration::from_secs(5));
        assert_eq!(high, vec![0.3]);
        let all = c.recent(&Priority::ALL, Measure::Ttft, Duration::from_secs(5));
        assert_eq!(all.len(), 2);
    }
}
