//! What a backend needs to pick a row's next token itself (so logits need
//! not leave the device), and the reference implementation on the host.
//!
//! Order follows vLLM and HF: penalties on the raw logits, then temperature,
//! then top-k, min-p (relative to the best token) and top-p (over the top-k
//! mass), then a draw among the survivors.

use ingot_core::TokenId;

/// One row's sampling knobs (already validated) and this draw's randomness.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowSampling<'a> {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub min_p: f32,
    /// 1 disables; applies to every token of `seen`.
    pub repetition_penalty: f32,
    /// Per occurrence in the output.
    pub frequency_penalty: f32,
    /// Once per token present in the output.
    pub presence_penalty: f32,
    /// Tokens of prompt and output, each once, with their count in the
    /// output (0 for prompt-only tokens). Empty without penalties.
    pub seen: &'a [(TokenId, u32)],
    /// Random bits for this draw (the sequence's seeded stream).
    pub random: u64,
}

impl RowSampling<'_> {
    /// A plain argmax row.
    pub const GREEDY: RowSampling<'static> = RowSampling {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        seen: &[],
        random: 0,
    };

    /// True when the choice is the argmax of the (penalised) logits.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// True when any penalty changes the logits.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
    }

    /// A uniform draw in [0, 1) from the row's random bits (24 bits, like
    /// `rand`'s f32).
    pub fn uniform(&self) -> f32 {
        (self.random >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }
}

/// Applies the repetition, frequency and presence penalties in place.
pub fn apply_penalties(logits: &mut [f32], row: &RowSampling<'_>) {
    for &(token, count) in row.seen {
        let Some(l) = logits.get_mut(token as usize) else {
            continue;
        };
        if row.repetition_penalty != 1.0 {
            *l = if *l > 0.0 {
                *l / row.repetition_penalty
            } else {
                *l * row.repetition_penalty
            };
        }
        if count > 0 {
            *l -= row.frequency_penalty * count as f32 + row.presence_penalty;
        }
    }
}

/// Penalties, then the row's choice: the argmax for greedy rows, else an
/// inverse-CDF draw (most likely first) among the truncated survivors.
/// `order` is scratch space.
pub fn sample_row(logits: &mut [f32], row: &RowSampling<'_>, order: &mut Vec<u32>) -> TokenId {
    if row.has_penalties() {
        apply_penalties(logits, row);
    }
    if row.is_greedy() {
        return crate::argmax(logits);
    }
    let logits = &*logits;
    let inv_t = 1.0 / row.temperature;
    order.clear();
    order.extend(0..logits.len() as u32);
    let by_logit_desc = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let k = match row.top_k {
        0 => logits.len(),
        k => k.min(logits.len()),
    };
    if k < logits.len() {
        order.select_nth_unstable_by(k - 1, by_logit_desc);
        order.truncate(k);
    }
    order.sort_unstable_by(by_logit_desc);
    let max = logits[order[0] as usize] * inv_t;
    let mut probs: Vec<f32> = order
        .iter()
        .map(|&t| (logits[t as usize] * inv_t - max).exp())
        .collect();
    let z: f32 = probs.iter().sum();
    // min-p: relative to the most likely token (probs[0] == 1 before normalising).
    let mut keep = probs.len();
    if row.min_p > 0.0 {
        keep = probs.iter().take_while(|&&x| x >= row.min_p).count().max(1);
    }
    if row.top_p < 1.0 {
        let mut cum = 0.0;
        let mut n = 0;
        for &x in &probs[..keep] {
            n += 1;
            cum += x / z;
            if cum >= row.top_p {
                break;
            }
        }
        keep = n.max(1);
    }
    probs.truncate(keep);
    let total: f32 = probs.iter().sum();
    let mut u = row.uniform() * total;
    for (i, &x) in probs.iter().enumerate() {
        if u < x {
            return order[i];
        }
        u -= x;
    }
    order[keep - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(f: impl FnOnce(&mut RowSampling<'static>)) -> RowSampling<'static> {
        let mut r = RowSampling {
            temperature: 1.0,
            random: 0x1234_5678_9abc_def0,
            ..RowSampling::GREEDY
        };
        f(&mut r);
        r
    }

    fn draws(r: RowSampling<'_>, logits: &[f32], n: u64) -> Vec<TokenId> {
        let mut order = Vec::new();
        (0..n)
            .map(|i| {
                let r = RowSampling {
                    random: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    ..r
                };
                sample_row(&mut logits.to_vec(), &r, &mut order)
            })
            .collect()
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        for r in [row(|r| r.top_k = 1), row(|r| r.top_p = 1e-6)] {
            assert!(draws(r, &[0.1, 0.3, 0.2], 50).iter().all(|&t| t == 1));
        }
    }

    #[test]
    fn top_k_never_samples_outside_the_k_best() {
        let got = draws(row(|r| r.top_k = 2), &[1.0, 0.9, 0.95, 0.0], 200);
        assert!(got.iter().all(|&t| t == 0 || t == 2), "{got:?}");
        assert!(got.contains(&0) && got.contains(&2));
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // exp(-1) ≈ 0.37 < 0.5 relative to the best: only token 0 survives.
        let got = draws(row(|r| r.min_p = 0.5), &[1.0, 0.0, 0.0], 200);
        assert!(got.iter().all(|&t| t == 0));
    }

    #[test]
    fn draws_follow_the_distribution() {
        // p = [0.5, 0.25, 0.25]
        let l = [2f32.ln(), 0.0, 0.0];
        let got = draws(row(|_| {}), &l, 4000);
        let share = got.iter().filter(|&&t| t == 0).count() as f32 / 4000.0;
        assert!((share - 0.5).abs() < 0.04, "{share}");
    }

    #[test]
    fn penalties_touch_only_seen_tokens() {
        let seen = [(0, 0), (1, 2)];
        let r = RowSampling {
            repetition_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            seen: &seen,
            ..RowSampling::GREEDY
        };
        let mut l = vec![1.0, -1.0, 3.0];
        apply_penalties(&mut l, &r);
        assert_eq!(l, vec![0.5, -2.0 - 1.0 - 0.25, 3.0]);
    }
}
