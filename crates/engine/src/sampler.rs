//! Turning one row of logits into the next token: penalties, temperature,
//! top-k / top-p / min-p truncation, seeded sampling and logprobs.
//!
//! Order follows vLLM and HF: penalties on the raw logits, then temperature,
//! then truncation, then a draw. Logprobs are reported from the raw model
//! distribution (vLLM's default), so they do not depend on the sampling knobs.

use std::collections::HashMap;

use ingot_core::{SamplingParams, TokenId};
use rand::{Rng, SeedableRng};
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
    /// Its logprob (always computed; cheap next to the forward pass).
    pub logprob: f32,
    /// The `n` most likely alternatives when logprobs were requested.
    pub top_logprobs: Vec<TokenLogprob>,
}

/// Per-sequence sampling state: the RNG and output token counts.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// Occurrences of each token in the generated output.
    output_counts: HashMap<TokenId, u32>,
    /// Tokens of the prompt (for the repetition penalty).
    prompt_tokens: Vec<TokenId>,
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
        let mut prompt_tokens = prompt.to_vec();
        prompt_tokens.sort_unstable();
        prompt_tokens.dedup();
        Self {
            params,
            rng,
            output_counts: HashMap::new(),
            prompt_tokens,
            order: Vec::new(),
        }
    }

    /// The parameters this sampler applies.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Chooses the next token; `logits` is modified in place.
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
        let penalised = self.has_penalties();
        // Penalties rewrite logits in place; keep the raw row for the logprob.
        let raw_copy = penalised.then(|| logits.to_vec());
        if penalised {
            self.apply_penalties(logits);
        }
        let token = if self.params.is_greedy() {
            argmax(logits)
        } else {
            self.draw(logits)
        };
        let raw = raw_copy.as_deref().unwrap_or(logits);
        let logprob = raw[token as usize] - log_z;
        *self.output_counts.entry(token).or_insert(0) += 1;
        SampledToken {
            token,
            logprob,
            top_logprobs,
        }
    }

    /// True when the choice is the plain argmax of the raw logits and no
    /// logprobs are wanted: the backend may then pick on its device.
    pub fn is_plain_greedy(&self) -> bool {
        self.params.is_greedy() && !self.has_penalties() && self.params.logprobs.is_none()
    }

    /// Records a token the backend picked by argmax (see [`Self::is_plain_greedy`]).
    pub fn accept_greedy(&mut self, token: TokenId) -> SampledToken {
        *self.output_counts.entry(token).or_insert(0) += 1;
        SampledToken {
            token,
            // Not computed on this path; only reported when logprobs are asked for.
            logprob: 0.0,
            top_logprobs: Vec::new(),
        }
    }

    fn has_penalties(&self) -> bool {
        let p = &self.params;
        p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            let seen = self
                .prompt_tokens
                .iter()
                .copied()
                .chain(self.output_counts.keys().copied());
            for t in seen {
                let l = &mut logits[t as usize];
                *l = if *l > 0.0 {
                    *l / p.repetition_penalty
                } else {
                    *l * p.repetition_penalty
                };
            }
        }
        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            for (&t, &n) in &self.output_counts {
                logits[t as usize] -= p.frequency_penalty * n as f32 + p.presence_penalty;
            }
        }
    }

    /// Temperature, truncation, then an inverse-CDF draw over the survivors.
    fn draw(&mut self, logits: &[f32]) -> TokenId {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        self.order.clear();
        self.order.extend(0..logits.len() as u32);
        let by_logit_desc = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        let k = if p.top_k > 0 {
            p.top_k.min(logits.len())
        } else {
            logits.len()
        };
        if k < logits.len() {
            self.order.select_nth_unstable_by(k - 1, by_logit_desc);
            self.order.truncate(k);
        }
        self.order.sort_unstable_by(by_logit_desc);
        let max = logits[self.order[0] as usize] * inv_t;
        let mut probs: Vec<f32> = self
            .order
            .iter()
            .map(|&t| (logits[t as usize] * inv_t - max).exp())
            .collect();
        let z: f32 = probs.iter().sum();
        // min-p: relative to the most likely token (probs[0] == 1 before normalising).
        let mut keep = probs.len();
        if p.min_p > 0.0 {
            keep = probs.iter().take_while(|&&x| x >= p.min_p).count().max(1);
        }
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            let mut n = 0;
            for &x in &probs[..keep] {
                n += 1;
                cum += x / z;
                if cum >= p.top_p {
                    break;
                }
            }
            keep = n.max(1);
        }
        probs.truncate(keep);
        let total: f32 = probs.iter().sum();
        let mut u = self.rng.random::<f32>() * total;
        for (i, &x) in probs.iter().enumerate() {
            if u < x {
                return self.order[i];
            }
            u -= x;
        }
        self.order[keep - 1]
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
    fn top_k_one_and_tiny_top_p_are_greedy() {
        for p in [params(|p| p.top_k = 1), params(|p| p.top_p = 1e-6)] {
            let mut s = Sampler::new(p, &[]);
            for _ in 0..20 {
                assert_eq!(s.sample(&mut [0.1, 0.3, 0.2]).token, 1);
            }
        }
    }

    #[test]
    fn top_k_never_samples_outside_the_k_best() {
        let mut s = Sampler::new(params(|p| p.top_k = 2), &[]);
        for _ in 0..200 {
            let t = s.sample(&mut [1.0, 0.9, 0.95, 0.0]).token;
            assert!(t == 0 || t == 2, "got {t}");
        }
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        let mut s = Sampler::new(params(|p| p.min_p = 0.5), &[]);
        for _ in 0..200 {
            // exp(-1) ≈ 0.37 < 0.5 relative to the best: only token 0 survives.
            assert_eq!(s.sample(&mut [1.0, 0.0, 0.0]).token, 0);
        }
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
