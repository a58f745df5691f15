//! Mixture-of-experts MLPs on the CPU: the router, top-k, and one matmul
//! per expert over the step's tokens routed to it (gathered), added back
//! into each token's row weighted by its router probability.
//!
//! A token's expert outputs are summed in ascending expert order and each
//! expert's matmul is batch-invariant ([`crate::matmul`], [`crate::quant`]),
//! so a token's result does not depend on which other tokens share the step
//! or which experts they chose.

use ingot_arch::{MoeSpec, Routing};

use crate::matrix::Matrix;
use crate::quant::{ActScratch, Product, QuantMatrix};
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
    /// Where each expert's rows start in the buffers below (and the end).
    offsets: Vec<usize>,
    /// The routed rows, expert by expert: gathered inputs, gate/up
    /// products, activations and the experts' outputs.
    input: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    output: Vec<f32>,
    /// Quantized activations of each expert's products.
    acts: Vec<ActScratch>,
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
        // The routed rows, expert by expert.
        s.offsets.clear();
        s.offsets.push(0);
        for routed in &s.routed {
            let at = s.offsets.last().copied().unwrap_or(0);
            s.offsets.push(at + routed.len());
        }
        let (rows, ff) = (t * spec.top_k.min(e), self.width);
        grow(&mut s.input, rows * d);
        grow(&mut s.gate_up, rows * 2 * ff);
        grow(&mut s.act, rows * ff);
        grow(&mut s.output, rows * d);
        for (routed, &at) in s.routed.iter().zip(&s.offsets) {
            for (i, &(row, _)) in routed.iter().enumerate() {
                let dst = &mut s.input[(at + i) * d..(at + i + 1) * d];
                dst.copy_from_slice(&xn[row * d..(row + 1) * d]);
            }
        }
        let offsets = &s.offsets;
        let io = (&s.input[..], &mut s.gate_up[..]);
        products(&self.gate_up, offsets, io, (d, 2 * ff), acts, &mut s.acts);
        ops::gated_mul(
            spec.act,
            &s.gate_up[..rows * 2 * ff],
            &mut s.act[..rows * ff],
            ff,
        );
        let io = (&s.act[..], &mut s.output[..]);
        products(&self.down, offsets, io, (ff, d), acts, &mut s.acts);
        out[..t * d].fill(0.0);
        for (routed, &at) in s.routed.iter().zip(&s.offsets) {
            for (i, &(row, w)) in routed.iter().enumerate() {
                let y = &s.output[(at + i) * d..(at + i + 1) * d];
                for (o, &y) in out[row * d..(row + 1) * d].iter_mut().zip(y) {
                    *o += w * y;
                }
            }
        }
    }
}

/// Each routed expert's product of its rows of `input` (`offsets[e] ..
/// offsets[e + 1]`) with `matrices[e]` (`[n, k]`) into the same rows of
/// `output`: one parallel pass over every expert on the native kernels
/// (`many`: each product's quantized activations), else one matmul per
/// expert.
fn products(
    matrices: &[Matrix],
    offsets: &[usize],
    (input, output): (&[f32], &mut [f32]),
    (k, n): (usize, usize),
    acts: &mut ActScratch,
    many: &mut Vec<ActScratch>,
) {
    let used = || (0..matrices.len()).filter(|&e| offsets[e + 1] > offsets[e]);
    let quant: Option<Vec<&QuantMatrix>> = used()
        .map(|e| match &matrices[e] {
            Matrix::Quant(q) => Some(q),
            _ => None,
        })
        .collect();
    let mut outputs = output;
    let mut products = Vec::new();
    for (i, e) in used().enumerate() {
        let (from, to) = (offsets[e], offsets[e + 1]);
        let (mine, rest) = std::mem::take(&mut outputs).split_at_mut((to - from) * n);
        outputs = rest;
        let x = &input[from * k..to * k];
        match &quant {
            Some(q) => products.push(Product {
                matrix: q[i],
                x,
                m: to - from,
                out: mine,
            }),
            None => matrices[e].linear(x, mine, (to - from, k, n), acts),
        }
    }
    if !products.is_empty() {
        QuantMatrix::linear_many(&mut products, many);
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
    use ingot_arch::Activation;

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
