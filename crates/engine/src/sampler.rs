//! Per-sequence sampling state: the seeded RNG and the tokens seen (for the
//! penalties), lent to the backend as a [`RowSampling`] each step.
//!
//! The choice itself (and the logprobs, from the raw model distribution,
//! vLLM's default) is the backend's: [`ingot_runner::sampling`] on the host,
//! or the device's sampler.

use ingot_core::{SamplingParams, TokenId};
use ingot_runner::sampling::RowSampling;
pub use ingot_runner::sampling::TokenLogprob;
use ingot_runner::Pick;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

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
        Self { params, rng, seen }
    }

    /// The parameters this sampler applies.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// True when the choice is the plain argmax of the raw logits and no
    /// logprobs are wanted: the backend may then pick on its device.
    pub fn is_plain_greedy(&self) -> bool {
        self.params.is_greedy() && !self.params.has_penalties() && self.params.logprobs.is_none()
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
    pub fn accept_picked(&mut self, pick: Pick) -> SampledToken {
        self.record(pick.token);
        let (logprob, top_logprobs) = pick
            .logprobs
            .map_or((0.0, Vec::new()), |l| (l.chosen, l.top));
        SampledToken {
            token: pick.token,
            logprob,
            top_logprobs,
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

#[cfg(test)]
mod tests {
    use super::*;

    impl Sampler {
        /// The host backend's pick from `logits`, recorded.
        fn sample(&mut self, logits: &mut [f32]) -> SampledToken {
            let random = self.draw_random();
            let pick = ingot_runner::sampling::pick_row(logits, &self.row(random), &mut Vec::new());
            self.accept_picked(pick)
        }
    }

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
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.logprobs = Some(0);
            }),
            &[],
        );
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
