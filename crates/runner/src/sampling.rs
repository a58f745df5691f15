//! What a backend needs to pick a row's next token itself (so logits need
//! not leave the device), and the reference implementation on the host.
//!
//! Order follows vLLM and HF: penalties on the raw logits, then temperature,
//! then top-k, min-p (relative to the best token) and top-p (over the top-k
//! mass), then a draw among the survivors.

use ingot_core::{SamplingParams, TokenId};

/// One row's sampling knobs (already validated), the tokens seen for the
/// penalties and this draw's randomness.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowSampling<'a> {
    /// Temperature, truncation and penalties.
    pub params: &'a SamplingParams,
    /// Tokens of prompt and output, each once, with their count in the
    /// output (0 for prompt-only tokens). Empty without penalties.
    pub seen: &'a [(TokenId, u32)],
    /// Random bits for this draw (the sequence's seeded stream).
    pub random: u64,
}

impl RowSampling<'_> {
    /// A plain argmax row.
    pub const GREEDY: RowSampling<'static> = RowSampling {
        params: &SamplingParams::GREEDY,
        seen: &[],
        random: 0,
    };

    /// True when the choice is the argmax of the (penalised) logits.
    pub fn is_greedy(&self) -> bool {
        self.params.is_greedy()
    }

    /// True when any penalty or logit bias changes the logits.
    pub fn has_penalties(&self) -> bool {
        self.params.has_penalties()
    }

    /// A uniform draw in [0, 1) from the row's random bits (24 bits, like
    /// `rand`'s f32).
    pub fn uniform(&self) -> f32 {
        (self.random >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }
}

/// A token with its log-probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: TokenId,
    /// Natural-log probability under the raw model distribution.
    pub logprob: f32,
}

/// The logprobs a row asked for (`SamplingParams::logprobs`), reported
/// from the raw model distribution (vLLM's default), so they do not
/// depend on the sampling knobs.
#[derive(Debug, Clone, PartialEq)]
pub struct Logprobs {
    /// The picked token's.
    pub chosen: f32,
    /// The row's most likely tokens, largest first (ties: lower id first).
    pub top: Vec<TokenLogprob>,
}

/// A row's picked token, with its logprobs when the row asked for them.
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    /// The chosen token.
    pub token: TokenId,
    /// `Some` exactly when the row's parameters ask for logprobs.
    pub logprobs: Option<Logprobs>,
}

impl From<TokenId> for Pick {
    fn from(token: TokenId) -> Self {
        Self {
            token,
            logprobs: None,
        }
    }
}

/// The row's pick from its raw logits (rewritten in place): its logit
/// bias added (as a grammar mask is applied, before the logprobs), the
/// logprobs it asks for from that row, then [`sample_row`].
pub fn pick_row(logits: &mut [f32], row: &RowSampling<'_>, order: &mut Vec<u32>) -> Pick {
    pick_row_given(logits, row, None, order)
}

/// [`pick_row`] for a row with a proposed token (speculative decoding),
/// chosen by [`sample_row_given`]: the proposal is kept or replaced so that
/// the pick follows the row's distribution exactly.
pub fn pick_row_given(
    logits: &mut [f32],
    row: &RowSampling<'_>,
    draft: Option<TokenId>,
    order: &mut Vec<u32>,
) -> Pick {
    apply_logit_bias(logits, &row.params.logit_bias);
    let Some(n) = row.params.logprobs else {
        return sample_row_given(logits, row, draft, order).into();
    };
    let log_z = log_sum_exp(logits);
    let top = top_n(logits, n)
        .into_iter()
        .map(|token| TokenLogprob {
            token,
            logprob: logits[token as usize] - log_z,
        })
        .collect();
    // Penalties rewrite the seen tokens' logits; keep the raw ones.
    let raw_seen: Vec<(TokenId, f32)> = row
        .seen
        .iter()
        .filter_map(|&(t, _)| Some((t, *logits.get(t as usize)?)))
        .collect();
    let token = sample_row_given(logits, row, draft, order);
    let raw = raw_seen
        .iter()
        .find(|&&(t, _)| t == token)
        .map_or(logits[token as usize], |&(_, l)| l);
    Pick {
        token,
        logprobs: Some(Logprobs {
            chosen: raw - log_z,
            top,
        }),
    }
}

/// Sets the logits of the tokens `mask` refuses to -inf (bit `t % 32` of
/// word `t / 32` allows token `t`; ids past the mask are refused).
pub fn apply_mask(logits: &mut [f32], mask: &[u32]) {
    for (i, chunk) in logits.chunks_mut(32).enumerate() {
        let word = mask.get(i).copied().unwrap_or(0);
        if word == u32::MAX {
            continue;
        }
        for (b, l) in chunk.iter_mut().enumerate() {
            if word & (1 << b) == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

/// Adds each (token, bias) to that token's logit (ids past the row are
/// skipped; the engine refuses them at submission).
pub fn apply_logit_bias(logits: &mut [f32], bias: &[(TokenId, f32)]) {
    for &(token, b) in bias {
        if let Some(l) = logits.get_mut(token as usize) {
            *l += b;
        }
    }
}

/// `ln(sum(exp(v)))`, computed stably.
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

/// Applies the repetition, frequency and presence penalties in place.
pub fn apply_penalties(logits: &mut [f32], row: &RowSampling<'_>) {
    let p = row.params;
    for &(token, count) in row.seen {
        let Some(l) = logits.get_mut(token as usize) else {
            continue;
        };
        if p.repetition_penalty != 1.0 {
            *l = if *l > 0.0 {
                *l / p.repetition_penalty
            } else {
                *l * p.repetition_penalty
            };
        }
        if count > 0 {
            *l -= p.frequency_penalty * count as f32 + p.presence_penalty;
        }
    }
}

/// Penalties, then the row's choice: the argmax for greedy rows, else a
/// draw among the truncated survivors. `order` is scratch space.
///
/// Without top-k and top-p the survivors need no ranking (min-p is relative
/// to the best token): one inverse-CDF pass in vocabulary order. Otherwise
/// the draw walks the survivors most likely first; top-p without top-k
/// ranks only as many of the best tokens as the nucleus needs.
pub fn sample_row(logits: &mut [f32], row: &RowSampling<'_>, order: &mut Vec<u32>) -> TokenId {
    sample_row_given(logits, row, None, order)
}

/// [`sample_row`] given a proposed token `draft` (speculative decoding's
/// rejection rule for a proposal drawn from a point mass): a greedy row
/// takes its argmax; a sampled row keeps `draft` with its probability
/// under the row's distribution p (truncation included), else draws from
/// p without it, renormalised. Either way the token is distributed as p,
/// whatever was proposed. The first uniform draw decides the proposal, a
/// second (the row's low random bits) draws the replacement.
pub fn sample_row_given(
    logits: &mut [f32],
    row: &RowSampling<'_>,
    draft: Option<TokenId>,
    order: &mut Vec<u32>,
) -> TokenId {
    if row.has_penalties() {
        apply_penalties(logits, row);
    }
    if row.is_greedy() {
        return crate::argmax(logits);
    }
    let (logits, p) = (&*logits, row.params);
    let inv_t = 1.0 / p.temperature;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) * inv_t;
    // Weight relative to the most likely token (1 for it).
    let weight = |t: u32| (logits[t as usize] * inv_t - max).exp();
    let v = logits.len();
    let top_k = match p.top_k {
        0 => v,
        k => k.min(v),
    };
    let draw = Draw {
        first: row.uniform(),
        second: (row.random & 0xff_ffff) as f32 * (1.0 / (1u32 << 24) as f32),
        draft,
    };
    if top_k == v && p.top_p >= 1.0 {
        return draw_unranked(v, weight, p.min_p, draw);
    }
    // top-p is a share of the top-k set's mass (all tokens without top-k).
    let total = (top_k == v).then(|| (0..v as u32).map(weight).sum::<f32>());
    order.clear();
    order.extend(0..v as u32);
    let mut ranked = if top_k < v { top_k } else { v.min(256) };
    loop {
        rank_best(order, logits, ranked);
        let probs: Vec<f32> = order[..ranked].iter().map(|&t| weight(t)).collect();
        let z = total.unwrap_or_else(|| probs.iter().sum());
        if let Some(keep) = survivors(&probs, p.min_p, p.top_p, z, ranked == top_k) {
            return draw_ranked(&order[..keep], &probs[..keep], draw);
        }
        ranked = (ranked * 8).min(v);
    }
}

/// Moves the `k` most likely tokens to the front of `order`, most likely
/// first (ties: lower id first).
fn rank_best(order: &mut [u32], logits: &[f32], k: usize) {
    let by_logit_desc = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if k < order.len() {
        order.select_nth_unstable_by(k - 1, by_logit_desc);
    }
    order[..k].sort_unstable_by(by_logit_desc);
}

/// How many of the ranked tokens survive min-p and top-p, or None when the
/// cut may lie beyond them (`all` says they are every candidate).
fn survivors(probs: &[f32], min_p: f32, top_p: f32, z: f32, all: bool) -> Option<usize> {
    let by_min_p = probs.iter().take_while(|&&x| x >= min_p).count();
    let mut keep = by_min_p.max(1);
    let mut decided = all || by_min_p < probs.len();
    if top_p < 1.0 {
        let mut cum = 0.0;
        for (n, &x) in probs[..keep].iter().enumerate() {
            cum += x / z;
            if cum >= top_p {
                keep = n + 1;
                decided = true;
                break;
            }
        }
    }
    decided.then_some(keep)
}

/// One row's uniform draws in [0, 1) and the proposed token, if any.
#[derive(Debug, Clone, Copy)]
struct Draw {
    /// Picks the token, or (with a proposal) decides whether it is kept.
    first: f32,
    /// Picks the replacement of a refused proposal.
    second: f32,
    draft: Option<TokenId>,
}

impl Draw {
    /// Over candidates of weight `total` of which the proposal weighs
    /// `w_draft`: `Ok` with the proposal when it is kept, else the point in
    /// the other candidates' cumulative weight at which to draw (the
    /// proposal skipped).
    fn start(&self, total: f32, w_draft: f32) -> Result<TokenId, f32> {
        match self.draft {
            Some(d) if self.first * total < w_draft => Ok(d),
            Some(_) => Err(self.second * (total - w_draft)),
            None => Err(self.first * total),
        }
    }

    /// Inverse-CDF walk from `u` over `(token, weight)` candidates, the
    /// proposal skipped; the last candidate walked (or the proposal, when
    /// it is the only one) on rounding.
    fn walk(&self, mut u: f32, candidates: impl Iterator<Item = (TokenId, f32)>) -> TokenId {
        let mut last = self.draft.unwrap_or(0);
        for (t, w) in candidates {
            if w <= 0.0 || self.draft == Some(t) {
                continue;
            }
            if u < w {
                return t;
            }
            u -= w;
            last = t;
        }
        last
    }
}

/// Inverse-CDF draw over tokens ranked most likely first.
fn draw_ranked(tokens: &[u32], probs: &[f32], draw: Draw) -> TokenId {
    let total: f32 = probs.iter().sum();
    let w_draft = draw
        .draft
        .and_then(|d| tokens.iter().position(|&t| t == d))
        .map_or(0.0, |i| probs[i]);
    match draw.start(total, w_draft) {
        Ok(d) => d,
        Err(u) => draw.walk(u, tokens.iter().copied().zip(probs.iter().copied())),
    }
}

/// Inverse-CDF draw in vocabulary order over the tokens whose weight
/// reaches `min_p` (the best token always does).
fn draw_unranked(v: usize, weight: impl Fn(u32) -> f32, min_p: f32, draw: Draw) -> TokenId {
    let kept = |t: u32| {
        let w = weight(t);
        if w >= min_p {
            w
        } else {
            0.0
        }
    };
    let total: f32 = (0..v as u32).map(kept).sum();
    let w_draft = draw.draft.filter(|&d| (d as usize) < v).map_or(0.0, kept);
    match draw.start(total, w_draft) {
        Ok(d) => d,
        Err(u) => draw.walk(u, (0..v as u32).map(|t| (t, kept(t)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams::default();
        f(&mut p);
        p
    }

    #[test]
    fn logit_bias_bans_and_forces_before_the_logprobs() {
        let logits = [2.0, 1.0, 0.5, 0.0];
        let ban = params(|p| p.logit_bias = vec![(0, -100.0)]);
        let force = params(|p| {
            p.logit_bias = vec![(3, 100.0)];
            p.logprobs = Some(1);
        });
        let mut order = Vec::new();
        // From 1: a uniform draw of exactly 0 picks the first token of any
        // weight, and e^-98 is still a (subnormal) f32 weight.
        for i in 1..=100u64 {
            let random = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let row = |params| RowSampling {
                params,
                seen: &[],
                random,
            };
            let banned = pick_row(&mut logits.to_vec(), &row(&ban), &mut order);
            assert_ne!(banned.token, 0);
            let forced = pick_row(&mut logits.to_vec(), &row(&force), &mut order);
            assert_eq!(forced.token, 3);
            let lp = forced.logprobs.unwrap();
            assert!(lp.chosen > -1e-3 && lp.top[0].token == 3, "{lp:?}");
        }
    }

    fn draws(p: &SamplingParams, logits: &[f32], n: u64) -> Vec<TokenId> {
        let mut order = Vec::new();
        (0..n)
            .map(|i| {
                let r = RowSampling {
                    params: p,
                    seen: &[],
                    random: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                };
                sample_row(&mut logits.to_vec(), &r, &mut order)
            })
            .collect()
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        for p in [params(|p| p.top_k = 1), params(|p| p.top_p = 1e-6)] {
            assert!(draws(&p, &[0.1, 0.3, 0.2], 50).iter().all(|&t| t == 1));
        }
    }

    #[test]
    fn top_k_never_samples_outside_the_k_best() {
        let got = draws(&params(|p| p.top_k = 2), &[1.0, 0.9, 0.95, 0.0], 200);
        assert!(got.iter().all(|&t| t == 0 || t == 2), "{got:?}");
        assert!(got.contains(&0) && got.contains(&2));
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // exp(-1) ≈ 0.37 < 0.5 relative to the best: only token 0 survives.
        let got = draws(&params(|p| p.min_p = 0.5), &[1.0, 0.0, 0.0], 200);
        assert!(got.iter().all(|&t| t == 0));
    }

    #[test]
    fn draws_follow_the_distribution() {
        // p = [0.5, 0.25, 0.25]
        let l = [2f32.ln(), 0.0, 0.0];
        let got = draws(&params(|_| {}), &l, 4000);
        let share = got.iter().filter(|&&t| t == 0).count() as f32 / 4000.0;
        assert!((share - 0.5).abs() < 0.04, "{share}");
    }

    #[test]
    fn a_wide_nucleus_is_ranked_as_far_as_it_reaches() {
        // 3,000 near-equal tokens: the 0.9 nucleus holds ~2,700 of them,
        // beyond the first 256 ranked; every draw must fall inside it.
        let logits: Vec<f32> = (0..3000).map(|i| 1.0 - i as f32 * 1e-5).collect();
        let got = draws(&params(|p| p.top_p = 0.9), &logits, 2000);
        let nucleus = (0.9f64 * 3000.0).ceil() as u32 + 1;
        assert!(got.iter().all(|&t| t < nucleus), "{:?}", got.iter().max());
        assert!(
            got.iter().any(|&t| t >= 256),
            "never past the first rank step"
        );
    }

    #[test]
    fn unranked_draws_skip_tokens_below_min_p() {
        // p relative to the best: [1, e^-3 ≈ 0.05, 0.9]: min-p 0.1 keeps 0 and 2.
        let got = draws(
            &params(|p| p.min_p = 0.1),
            &[1.0, -2.0, 1.0 + 0.9f32.ln()],
            500,
        );
        assert!(got.iter().all(|&t| t != 1));
        assert!(got.contains(&0) && got.contains(&2));
    }

    #[test]
    fn penalties_touch_only_seen_tokens() {
        let seen = [(0, 0), (1, 2)];
        let p = params(|p| {
            p.repetition_penalty = 2.0;
            p.frequency_penalty = 0.5;
            p.presence_penalty = 0.25;
        });
        let r = RowSampling {
            params: &p,
            seen: &seen,
            random: 0,
        };
        let mut l = vec![1.0, -1.0, 3.0];
        apply_penalties(&mut l, &r);
        assert_eq!(l, vec![0.5, -2.0 - 1.0 - 0.25, 3.0]);
    }

    #[test]
    fn masks_refuse_tokens_and_every_id_past_their_end() {
        let mut l = vec![5.0; 70];
        // Word 0 allows 1 and 3; word 1 allows 32..64; no word 2.
        apply_mask(&mut l, &[0b1010, u32::MAX]);
        let allowed: Vec<usize> = (0..70).filter(|&i| l[i].is_finite()).collect();
        let want: Vec<usize> = [1, 3].into_iter().chain(32..64).collect();
        assert_eq!(allowed, want);
        // A greedy pick over a masked row never takes a refused token.
        let mut row = vec![9.0, 1.0, 0.0, 2.0];
        apply_mask(&mut row, &[0b0110]);
        assert_eq!(
            sample_row(&mut row, &RowSampling::GREEDY, &mut Vec::new()),
            1
        );
    }

    #[test]
    fn pick_logprobs_come_from_the_raw_row() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            logprobs: Some(2),
            ..SamplingParams::GREEDY
        };
        let seen = [(1, 0)];
        let row = RowSampling {
            params: &p,
            seen: &seen,
            random: 0,
        };
        // Token 1 is penalised to 1.5 and still wins over 1.4.
        let mut logits = vec![1.0, 3.0, 1.4];
        let pick = pick_row(&mut logits, &row, &mut Vec::new());
        assert_eq!(pick.token, 1);
        let z = (1f32.exp() + 3f32.exp() + 1.4f32.exp()).ln();
        let lp = pick.logprobs.unwrap();
        assert!((lp.chosen - (3.0 - z)).abs() < 1e-6);
        let top: Vec<_> = lp.top.iter().map(|t| t.token).collect();
        assert_eq!(top, [1, 2]);
        assert!((lp.top[1].logprob - (1.4 - z)).abs() < 1e-6);
        // Without logprobs asked for, none are reported.
        let plain = RowSampling::GREEDY;
        assert_eq!(
            pick_row(&mut [0.0, 1.0], &plain, &mut Vec::new()).logprobs,
            None
        );
    }
    /// splitmix64: independent random bits per draw.
    fn random_bits(i: u64) -> u64 {
        let mut z = i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The row's distribution as the sampling order defines it (a plain
    /// reference: softmax at the temperature, top-k, min-p, then top-p over
    /// the top-k mass).
    fn reference_probs(logits: &[f32], p: &SamplingParams) -> Vec<f64> {
        let w: Vec<f64> = logits
            .iter()
            .map(|&l| ((l as f64 - 3.0) / p.temperature as f64).exp())
            .collect();
        let max = w.iter().copied().fold(0.0, f64::max);
        let mut order: Vec<usize> = (0..w.len()).collect();
        order.sort_by(|&a, &b| w[b].total_cmp(&w[a]));
        let k = if p.top_k == 0 { w.len() } else { p.top_k };
        order.truncate(k);
        let z: f64 = order.iter().map(|&t| w[t]).sum();
        let mut keep = Vec::new();
        let mut cum = 0.0;
        for &t in &order {
            if w[t] / max < p.min_p as f64 && !keep.is_empty() {
                break;
            }
            keep.push(t);
            cum += w[t] / z;
            if cum >= p.top_p as f64 {
                break;
            }
        }
        let kept: f64 = keep.iter().map(|&t| w[t]).sum();
        (0..w.len())
            .map(|t| if keep.contains(&t) { w[t] / kept } else { 0.0 })
            .collect()
    }

    /// Pearson's chi-square of `counts` against `probs` (cells of
    /// probability 0 must stay empty: any draw there is infinite).
    fn chi_square(counts: &[u64], probs: &[f64]) -> f64 {
        let n: u64 = counts.iter().sum();
        counts
            .iter()
            .zip(probs)
            .map(|(&c, &p)| {
                let e = p * n as f64;
                if e == 0.0 {
                    if c == 0 {
                        0.0
                    } else {
                        f64::INFINITY
                    }
                } else {
                    (c as f64 - e).powi(2) / e
                }
            })
            .sum()
    }

    /// Chi-square critical values at significance 1e-4 by degrees of freedom.
    fn critical(df: usize) -> f64 {
        [0.0, 15.14, 18.42, 21.11, 23.51, 25.74][df]
    }

    const DRAWS: u64 = 20_000;
    const LOGITS: [f32; 6] = [2.0, 1.5, 1.2, 0.4, 0.0, -1.0];

    fn draft_counts(
        p: &SamplingParams,
        draft: TokenId,
        pick: impl Fn(&mut [f32], &RowSampling<'_>, &mut Vec<u32>) -> TokenId,
    ) -> Vec<u64> {
        let mut counts = vec![0u64; LOGITS.len()];
        let mut order = Vec::new();
        for i in 0..DRAWS {
            let row = RowSampling {
                params: p,
                seen: &[],
                random: random_bits(i + u64::from(draft) * DRAWS),
            };
            let t = pick(&mut LOGITS.to_vec(), &row, &mut order);
            counts[t as usize] += 1;
        }
        counts
    }

    #[test]
    fn kept_or_replaced_proposals_keep_the_distribution() {
        let settings = [
            params(|_| {}),
            params(|p| p.temperature = 0.6),
            params(|p| p.top_k = 3),
            params(|p| p.top_p = 0.8),
            params(|p| p.min_p = 0.3),
        ];
        for p in &settings {
            let want = reference_probs(&LOGITS, p);
            let df = want.iter().filter(|&&x| x > 0.0).count() - 1;
            // Every token proposed in turn, those the row truncates too.
            for draft in 0..LOGITS.len() as TokenId {
                let got = draft_counts(p, draft, |l, r, o| sample_row_given(l, r, Some(draft), o));
                let chi = chi_square(&got, &want);
                assert!(
                    chi < critical(df),
                    "{p:?}, proposal {draft}: {got:?} vs {want:?}: chi-square {chi:.1}"
                );
            }
        }
    }

    #[test]
    fn the_chi_square_test_refuses_naive_acceptance() {
        // Keeping a proposal with its probability but drawing the
        // replacement from the whole distribution (the proposal included)
        // favours the proposal: the test must see it.
        let p = params(|_| {});
        let want = reference_probs(&LOGITS, &p);
        for draft in [0, 2, 4] {
            let naive = draft_counts(&p, draft, |l, r, o| {
                let kept = sample_row_given(&mut l.to_vec(), r, Some(draft), o) == draft;
                let fresh = RowSampling {
                    random: r.random << 24,
                    ..*r
                };
                if kept {
                    draft
                } else {
                    sample_row(l, &fresh, o)
                }
            });
            assert!(chi_square(&naive, &want) > critical(5), "{naive:?}");
        }
    }

    #[test]
    fn greedy_rows_take_the_argmax_whatever_is_proposed() {
        let p = params(|p| p.temperature = 0.0);
        for draft in 0..LOGITS.len() as TokenId {
            let r = RowSampling {
                params: &p,
                seen: &[],
                random: 0,
            };
            assert_eq!(
                sample_row_given(&mut LOGITS.to_vec(), &r, Some(draft), &mut Vec::new()),
                0
            );
        }
    }

    #[test]
    fn without_a_proposal_draws_are_unchanged() {
        // The second draw is only used to replace a refused proposal.
        let p = params(|p| p.top_k = 4);
        for i in 0..200 {
            let r = |random| RowSampling {
                params: &p,
                seen: &[],
                random,
            };
            let bits = random_bits(i);
            let a = sample_row(&mut LOGITS.to_vec(), &r(bits), &mut Vec::new());
            let b = sample_row(&mut LOGITS.to_vec(), &r(bits ^ 0xff_ffff), &mut Vec::new());
            assert_eq!(a, b);
        }
    }
}
