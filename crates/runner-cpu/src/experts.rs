//! Mixture-of-experts MLPs on the CPU: the router, top-k, and one matmul
//! per expert over the step's tokens routed to it (gathered), added back
//! into each token's row weighted by its router probability.
//!
//! A token's expert outputs are summed in ascending expert order and each
//! expert's matmul is batch-invariant ([`crate::matmul`], [`crate::quant`]),
//! so a token's result does not depend on which other tokens share the step
//! or which experts they chose.

use ingot_arch::{Activation, MoeSpec, Routing};

use crate::matrix::Matrix;
use crate::quant::ActScratch;
use crate::{grow, matmul, ops};

/// One sparse layer's MLP.
pub(crate) struct Experts {
    /// `[experts, hidden]`, f32 (llama.cpp keeps routers unquantized too:
    /// they are small and decide which weights are read at all).
    pub router: Vec<f32>,
    /// Per expert, `[2 * expert_intermediate, hidden]`: gate rows, then up.
    pub gate_up: Vec<Matrix>,
    /// Per expert, `[hidden, expert_intermediate]`.
    pub down: Vec<Matrix>,
    /// `expert_intermediate`.
    pub width: usize,
}

/// Buffers of the expert block, grown to the largest step seen.
#[derive(Default)]
pub(crate) struct ExpertScratch {
    /// `[tokens, experts]` router logits.
    logits: Vec<f32>,
    /// Per expert: the (token row, weight) pairs routed to it this step.
    routed: Vec<Vec<(usize, f32)>>,
    /// One token's top-k (expert, weight).
    top: Vec<(usize, f32)>,
    /// Gathered input rows, and the expert's output rows.
    input: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    output: Vec<f32>,
}

impl Experts {
    /// Number of experts.
    pub fn len(&self) -> usize {
        self.down.len()
    }

    /// Every weight matrix.
    pub fn matrices(&self) -> impl Iterator<Item = &Matrix> {
        self.gate_up.iter().chain(&self.down)
    }

    /// `out[t, d] = Σ_k w_k · expert_k(xn[t])` for the `t` normed rows in
    /// `xn` (`out` is overwritten).
    pub fn forward(
        &self,
        spec: &MoeSpec,
        xn: &[f32],
        out: &mut [f32],
        (t, d): (usize, usize),
        s: &mut ExpertScratch,
        acts: &mut ActScratch,
    ) {
        let e = self.len();
        grow(&mut s.logits, t * e);
        matmul::linear(xn, &self.router, &mut s.logits, t, d, e);
        s.routed.resize_with(e, Vec::new);
        s.routed.iter_mut().for_each(Vec::clear);
        for row in 0..t {
            let logits = &s.logits[row * e..(row + 1) * e];
            route(spec, logits, &mut s.top);
            for &(expert, w) in &s.top {
                s.routed[expert].push((row, w));
            }
        }
        out[..t * d].fill(0.0);
        for (expert, routed) in s.routed.iter().enumerate() {
            if routed.is_empty() {
                continue;
            }
            let n = routed.len();
            let ff = self.width;
            grow(&mut s.input, n * d);
            grow(&mut s.gate_up, n * 2 * ff);
            grow(&mut s.act, n * ff);
            grow(&mut s.output, n * d);
            for (i, &(row, _)) in routed.iter().enumerate() {
                s.input[i * d..(i + 1) * d].copy_from_slice(&xn[row * d..(row + 1) * d]);
            }
            self.gate_up[expert].linear(&s.input, &mut s.gate_up, (n, d, 2 * ff), acts);
            let gated = match spec.act {
                Activation::Silu => ops::silu_mul,
                Activation::GeluTanh => ops::gelu_tanh_mul,
            };
            gated(&s.gate_up[..n * 2 * ff], &mut s.act[..n * ff], ff);
            self.down[expert].linear(&s.act, &mut s.output, (n, ff, d), acts);
            for (i, &(row, w)) in routed.iter().enumerate() {
                let y = &s.output[i * d..(i + 1) * d];
                for (o, &y) in out[row * d..(row + 1) * d].iter_mut().zip(y) {
                    *o += w * y;
                }
            }
        }
    }
}

/// The experts one token goes to and their weights, into `top` (in
/// descending weight order). Softmax routing: the top-k logits (ties to the
/// lower expert index), weighted by their probabilities under the softmax
/// of all logits, divided by their sum when `spec.normalize`.
pub(crate) fn route(spec: &MoeSpec, logits: &[f32], top: &mut Vec<(usize, f32)>) {
    match spec.routing {
        Routing::SoftmaxTopK => {}
    }
    let k = spec.top_k.min(logits.len());
    top.clear();
    top.extend(logits.iter().copied().enumerate());
    // Stable: equal logits keep ascending expert order.
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    top.truncate(k);
    let max = top.first().map_or(0.0, |&(_, l)| l);
    let total: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    for (_, w) in top.iter_mut() {
        *w = (*w - max).exp() / total;
    }
    if spec.normalize {
        let sum: f32 = top.iter().map(|&(_, w)| w).sum();
        top.iter_mut().for_each(|(_, w)| *w /= sum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(top_k: usize, normalize: bool) -> MoeSpec {
        MoeSpec {
            act: Activation::Silu,
            routing: Routing::SoftmaxTopK,
            top_k,
            normalize,
        }
    }

    #[test]
    fn top_k_of_the_softmax_with_ties_to_the_lower_index() {
        let mut top = Vec::new();
        // Experts 1 and 3 tie for second place: 1 wins.
        let logits = [0.5, 1.0, 2.0, 1.0];
        route(&spec(2, false), &logits, &mut top);
        let z: f32 = logits.iter().map(|l| (l - 2.0f32).exp()).sum();
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![2, 1]);
        assert!((top[0].1 - 1.0 / z).abs() < 1e-7);
        assert!((top[1].1 - (-1.0f32).exp() / z).abs() < 1e-7);
        // Renormalised: the two weights sum to one, in the same ratio.
        route(&spec(2, true), &logits, &mut top);
        assert!((top[0].1 + top[1].1 - 1.0).abs() < 1e-6);
        assert!((top[0].1 / top[1].1 - 1f32.exp()).abs() < 1e-5);
        // Every expert: the weights are the softmax.
        route(&spec(4, false), &logits, &mut top);
        let sum: f32 = top.iter().map(|t| t.1).sum();
        assert!((sum - 1.0).abs() < 1e-6);
        assert_eq!(
            top.iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![2, 1, 3, 0]
        );
    }
}
