//! How many tokens to propose: each proposed token pays only if it is
//! likely enough to be kept. A step's forward time grows about linearly
//! with its tokens (`a + b·tokens`, fitted online from the steps run); a
//! sequence keeps its j-th proposal with probability about `α^j` (α its
//! recent rate of kept proposals). Adding the j-th token to a step of `n`
//! tokens costs `b` and yields `α^j` tokens, where the step yields about
//! `n` tokens for `a + b·n`: it pays when `α^j > n / (a/b + n)`. So a
//! memory-bound step (a GPU at batch 1: `a ≫ b`) speculates deeply, a
//! compute-bound one (a large batch, the CPU) barely or not at all. A
//! proposer that runs a model adds its seconds per proposed token `c`:
//! the token then pays when `α^j > n (b + c) / (a + b n)`.

/// Forgetting factor of the step-time fit (per step recorded).
const FORGET: f64 = 0.995;
/// The fixed share of a step before it is measured: `a/b` of a step whose
/// fixed cost is twice a token's.
const PRIOR_FIXED_PER_TOKEN: f64 = 2.0;
/// Forgetting factor of a sequence's acceptance counts (per verification).
const ACCEPT_DECAY: f64 = 0.8;
/// A sequence that proposed nothing for this many steps proposes one
/// token anyway: its acceptance, and the step-cost fit, stay measured (a
/// bad estimate would otherwise never be corrected).
const PROBE_EVERY: u32 = 32;

/// An online least-squares fit of forward seconds against step tokens,
/// recent steps weighing most.
#[derive(Debug, Clone, Default)]
pub(crate) struct StepCost {
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

impl StepCost {
    /// Records a decode step of `tokens` that took `seconds` to compute.
    pub(crate) fn record(&mut self, tokens: usize, seconds: f64) {
        let x = tokens as f64;
        for (s, v) in [
            (&mut self.w, 1.0),
            (&mut self.x, x),
            (&mut self.y, seconds),
            (&mut self.xx, x * x),
            (&mut self.xy, x * seconds),
        ] {
            *s = *s * FORGET + v;
        }
    }

    /// `(a, b)` in seconds once the steps measured differ enough in size
    /// to fit them.
    fn fit(&self) -> Option<(f64, f64)> {
        let var = self.w * self.xx - self.x * self.x;
        if self.w < 4.0 || var <= 1e-9 * self.w * self.w {
            return None;
        }
        let b = (self.w * self.xy - self.x * self.y) / var;
        Some(((self.y - b * self.x) / self.w, b))
    }

    /// `a/b`: the step's fixed cost in tokens' worth (the prior until the
    /// steps measured differ enough in size to fit it).
    pub(crate) fn fixed_per_token(&self) -> f64 {
        match self.fit() {
            None => PRIOR_FIXED_PER_TOKEN,
            // Time does not grow with tokens: bound by the weights' reads.
            Some((_, b)) if b <= 0.0 => f64::INFINITY,
            Some((a, b)) => (a / b).max(0.0),
        }
    }

    /// The rate a proposed token must be kept at to pay in a step of
    /// `tokens` without proposals, when proposing one costs
    /// `proposal_seconds` besides its place in the step (a draft model's
    /// forward; 0 for prompt lookup, and until the step is fitted).
    pub(crate) fn threshold(&self, tokens: usize, proposal_seconds: f64) -> f64 {
        let n = tokens.max(1) as f64;
        let plain = n / (self.fixed_per_token() + n);
        match self.fit() {
            Some((a, b)) if proposal_seconds > 0.0 && a + b * n > 0.0 => {
                (n * (b.max(0.0) + proposal_seconds) / (a + b * n)).max(plain)
            }
            _ => plain,
        }
    }
}

/// A sequence's recent rate of kept proposals: decayed counts of kept
/// tokens and of refusals, from an even prior.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Acceptance {
    kept: f64,
    refused: f64,
    /// Steps since the last proposal.
    quiet: u32,
}

impl Default for Acceptance {
    fn default() -> Self {
        Self {
            kept: 1.0,
            refused: 1.0,
            quiet: 0,
        }
    }
}

impl Acceptance {
    /// A verification kept `kept` of `proposed` tokens.
    pub(crate) fn record(&mut self, proposed: usize, kept: usize) {
        if proposed == 0 {
            return;
        }
        self.quiet = 0;
        self.kept = self.kept * ACCEPT_DECAY + kept as f64;
        self.refused = self.refused * ACCEPT_DECAY + f64::from(u8::from(kept < proposed));
    }

    /// The estimated chance that a proposed token is kept, given those
    /// before it were.
    pub(crate) fn rate(&self) -> f64 {
        self.kept / (self.kept + self.refused)
    }

    /// Tokens worth proposing (at most `max`): the j-th pays while
    /// `rate^j` exceeds `threshold`; one, as a probe, after
    /// [`PROBE_EVERY`] steps without.
    pub(crate) fn tokens_worth(&mut self, threshold: f64, max: usize) -> usize {
        let worth = self.worth(threshold, max);
        if worth > 0 {
            return worth;
        }
        self.quiet += 1;
        usize::from(self.quiet >= PROBE_EVERY).min(max)
    }

    /// Whether the next [`Self::tokens_worth`] may propose anything.
    pub(crate) fn may_propose(&self, threshold: f64) -> bool {
        self.worth(threshold, 1) > 0 || self.quiet + 1 >= PROBE_EVERY
    }

    fn worth(&self, threshold: f64, max: usize) -> usize {
        let rate = self.rate();
        let mut p = 1.0;
        for j in 0..max {
            p *= rate;
            if p <= threshold {
                return j;
            }
        }
        max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_finds_the_fixed_cost_of_a_step() {
        let mut c = StepCost::default();
        assert_eq!(c.fixed_per_token(), PRIOR_FIXED_PER_TOKEN);
        // 10 ms fixed, 2 ms a token.
        for i in 0..50 {
            let tokens = 1 + i % 5;
            c.record(tokens, 0.010 + 0.002 * tokens as f64);
        }
        assert!(
            (c.fixed_per_token() - 5.0).abs() < 1e-6,
            "{}",
            c.fixed_per_token()
        );
        assert!((c.threshold(1, 0.0) - 1.0 / 6.0).abs() < 1e-6);
        // A proposal that costs a draft forward of 4 ms: (2 + 4) / 12.
        assert!((c.threshold(1, 0.004) - 0.5).abs() < 1e-6);
        // Steps of one size only: the prior.
        let mut c = StepCost::default();
        for _ in 0..50 {
            c.record(1, 0.01);
        }
        assert_eq!(c.fixed_per_token(), PRIOR_FIXED_PER_TOKEN);
        // Time that does not grow: every proposal pays.
        let mut c = StepCost::default();
        for i in 0..50 {
            c.record(1 + i % 3, 0.01);
        }
        assert_eq!(c.threshold(1, 0.0), 0.0);
        // There a drafted token costs only the draft: 5 ms of a 10 ms step.
        assert!((c.threshold(1, 0.005) - 0.5).abs() < 1e-6);
    }

    #[test]
    fn likely_sequences_propose_more_and_big_batches_less() {
        let mut a = Acceptance::default();
        for _ in 0..20 {
            a.record(4, 4);
        }
        let mut b = Acceptance::default();
        for _ in 0..20 {
            b.record(4, 0);
        }
        assert!(a.rate() > 0.9 && b.rate() < 0.1);
        let cheap = 1.0 / (20.0 + 1.0);
        assert_eq!(a.tokens_worth(cheap, 8), 8);
        // A sequence that proposes nothing probes now and then.
        let mut probes = 0;
        for _ in 0..2 * PROBE_EVERY {
            if b.tokens_worth(cheap, 8) > 0 {
                probes += 1;
                b.record(1, 0);
            }
        }
        assert_eq!(probes, 2);
        assert_eq!(b.tokens_worth(cheap, 8), 0);
        let mut half = Acceptance::default();
        for _ in 0..20 {
            half.record(2, 1);
        }
        assert_eq!(half.tokens_worth(cheap, 8), 4);
        assert_eq!(half.tokens_worth(0.4, 8), 1);
        // At a threshold near 1 (a large compute-bound batch) only a
        // near-certain proposal pays.
        assert_eq!(half.tokens_worth(0.99, 8), 0);
        assert!(a.tokens_worth(0.99, 8) > 0);
        // The even prior proposes while 0.5^j beats the threshold.
        assert_eq!(Acceptance::default().tokens_worth(0.2, 8), 2);
    }
}
