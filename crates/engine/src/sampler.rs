//! Turning one row of logits into the next token: penalties, temperature,
//! top-k / top-p / min-p truncation, seeded sampling and logprobs.
//!
//! The choice itself is [`ingot_runner::sampling`]'s, shared with backends
//! that sample on their device; this keeps the per-sequence state (seeded
//! RNG, tokens seen) and the logprobs. Logprobs are reported from the raw
//! model distribution (vLLM's default), so they do not depend on the
//! sampling knobs.

use ingot_core::{SamplingParams, TokenId};
use ingot_runner::sampling::{sample_row, RowSampling};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A token with its log-probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: TokenId,
    /// Natural-log probability under the raw model distribution.
    pub logprob: f32,
}

/// What the sampler chose.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    /// The chosen token.
    pub token: TokenId,
    /// Its logprob (computed when the host saw the logits; 0 otherwise).
    pub logprob: f32,
    /// The `n` most likely alternatives when logprobs were requested.
    pub top_logprobs: Vec<TokenLogprob>,
}

/// Per-sequence sampling state: the RNG and the tokens seen so far.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// Prompt (when the repetition penalty is on) and output tokens, sorted
    /// by id, with their count in the output.
    seen: Vec<(TokenId, u32)>,
    /// Scratch: candidate indices.
    order: Vec<u32>,
}

impl Sampler {
    /// A sampler for one sequence. Without a seed the RNG is seeded from the OS.
    pub fn new(params: SamplingParams, prompt: &[TokenId]) -> Self {
        let rng = match params.seed {
            Some(s) => ChaCha8Rng::seed_from_u64(s),
            None => ChaCha8Rng::from_os_rng(),
        };
        let mut seen: Vec<(TokenId, u32)> = Vec::new();
        if params.repetition_penalty != 1.0 {
            seen = prompt.iter().map(|&t| (t, 0)).collect();
            seen.sort_unstable();
            seen.dedup_by_key(|e| e.0);
        }
        Self {
            params,
            rng,
            seen,
            order: Vec::new(),
        }
    }

    /// The parameters this sampler applies.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Chooses the next token from the host's copy of the logits (modified
    /// in place) and reports logprobs when asked for.
    pub fn sample(&mut self, logits: &mut [f32]) -> SampledToken {
        let log_z = log_sum_exp(logits);
        let top_logprobs = match self.params.logprobs {
            Some(n) if n > 0 => top_n(logits, n)
                .into_iter()
                .map(|token| TokenLogprob {
                    token,
                    logprob: logits[token as usize] - log_z,
                })
                .collect(),
            _ => Vec::new(),
        };
        let random = self.draw_random();
        let mut order = std::mem::take(&mut self.order);
        let row = self.row(random);
        // Penalties rewrite logits in place; keep the raw row for the logprob.
        let raw_copy = row.has_penalties().then(|| logits.to_vec());
        let token = sample_row(logits, &row, &mut order);
        self.order = order;
        let raw = raw_copy.as_deref().unwrap_or(logits);
        let logprob = raw[token as usize] - log_z;
        self.record(token);
        SampledToken {
            token,
            logprob,
            top_logprobs,
        }
    }

    /// True when the choice is the plain argmax of the raw logits and no
    /// logprobs are wanted: the backend may then pick on its device.
    pub fn is_plain_greedy(&self) -> bool {
        self.params.is_greedy() && !self.params.has_penalties() && self.params.logprobs.is_none()
    }

    /// True when logprobs are asked for: the host needs the logits row.
    pub fn needs_logits(&self) -> bool {
        self.params.logprobs.is_some()
    }

    /// Random bits for the next draw (none are used by greedy choices, so
    /// a seeded sequence draws the same stream on every backend).
    pub fn draw_random(&mut self) -> u64 {
        if self.params.is_greedy() {
            0
        } else {
            self.rng.next_u64()
        }
    }

    /// What a backend needs to pick the next token itself.
    pub fn row(&self, random: u64) -> RowSampling<'_> {
        RowSampling {
            params: &self.params,
            seen: if self.params.has_penalties() {
                &self.seen
            } else {
                &[]
            },
            random,
        }
    }

    /// Records a token the backend picked (see [`Self::row`]).
    pub fn accept_picked(&mut self, token: TokenId) -> SampledToken {
        self.record(token);
        SampledToken {
            token,
            // Not computed on this path; only reported when logprobs are asked for.
            logprob: 0.0,
            top_logprobs: Vec::new(),
        }
    }

    fn record(&mut self, token: TokenId) {
        if !self.params.has_penalties() {
            return;
        }
        match self.seen.binary_search_by_key(&token, |e| e.0) {
            Ok(i) => self.seen[i].1 += 1,
            Err(i) => self.seen.insert(i, (token, 1)),
        }
    }
}

pub use ingot_runner::argmax;

/// `log Σ exp(v)`, stable.
pub fn log_sum_exp(v: &[f32]) -> f32 {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = v.iter().map(|x| (x - max).exp()).sum();
    max + sum.ln()
}

/// The `n` largest entries, largest first (ties: lower id first).
pub fn top_n(v: &[f32], n: usize) -> Vec<TokenId> {
    let mut idx: Vec<TokenId> = (0..v.len() as TokenId).collect();
    let n = n.min(v.len());
    let cmp = |a: &TokenId, b: &TokenId| v[*b as usize].total_cmp(&v[*a as usize]).then(a.cmp(b));
    if n == 0 {
        return Vec::new();
    }
    idx.select_nth_unstable_by(n - 1, cmp);
    idx.truncate(n);
    idx.sort_unstable_by(cmp);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams {
            seed: Some(7),
            ..SamplingParams::default()
        };
        f(&mut p);
        p
    }

    #[test]
    fn greedy_takes_argmax_and_reports_its_logprob() {
        let mut s = Sampler::new(params(|p| p.temperature = 0.0), &[]);
        let mut logits = vec![0.0, 2.0, 1.0];
        let out = s.sample(&mut logits);
        assert_eq!(out.token, 1);
        let z = (1.0f32 + 2f32.exp() + 1f32.exp()).ln();
        assert!((out.logprob - (2.0 - z)).abs() < 1e-6);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let run = |seed| {
            let mut s = Sampler::new(params(|p| p.seed = Some(seed)), &[]);
            (0..64)
                .map(|i| {
                    let mut l: Vec<f32> =
                        (0..50).map(|j| ((i * 7 + j) % 13) as f32 * 0.1).collect();
                    s.sample(&mut l).token
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn repetition_penalty_discourages_prompt_tokens() {
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.repetition_penalty = 2.0;
            }),
            &[0],
        );
        // 1.0 / 2 = 0.5 < 0.8.
        assert_eq!(s.sample(&mut [1.0, 0.8]).token, 1);
    }

    #[test]
    fn frequency_and_presence_penalties_count_output() {
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.frequency_penalty = 0.3;
                p.presence_penalty = 0.0;
            }),
            &[],
        );
        let row = [1.0, 0.5];
        assert_eq!(s.sample(&mut row.to_vec()).token, 0); // 1.0 vs 0.5
        assert_eq!(s.sample(&mut row.to_vec()).token, 0); // 0.7 vs 0.5
        assert_eq!(s.sample(&mut row.to_vec()).token, 1); // 0.4 vs 0.5
    }

    #[test]
    fn top_logprobs_are_sorted_and_normalised() {
        let mut s = Sampler::new(params(|p| p.logprobs = Some(2)), &[]);
        let out = s.sample(&mut [0.0, 3.0, 1.0, 2.0]);
        let ids: Vec<_> = out.top_logprobs.iter().map(|t| t.token).collect();
        assert_eq!(ids, vec![1, 3]);
        let total: f32 = [0.0f32, 3.0, 1.0, 2.0].iter().map(|x| x.exp()).sum();
        assert!((out.top_logprobs[0].logprob - (3f32.exp() / total).ln()).abs() < 1e-6);
    }
}
