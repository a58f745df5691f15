//! f32 kernels of the CPU forward pass. Row-major throughout; parallel over
//! rows with rayon; no allocation.

use ingot_arch::Activation;
use rayon::prelude::*;

/// Adds `bias` to every row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// RMSNorm of each row of `x` into `out`: `x / sqrt(mean(x²) + eps) * w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(o, xr)| rms_norm_row(xr, w, eps, o));
}

/// RMSNorm of one row.
pub fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let sum_sq: f32 = x.iter().map(|v| v * v).sum();
    let scale = 1.0 / (sum_sq / x.len() as f32 + eps).sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// RMSNorm applied in place to every `w.len()`-wide head of `x` (Qwen3 q/k norm).
pub fn rms_norm_heads_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let mut tmp = [0f32; 512];
    for head in x.chunks_exact_mut(w.len()) {
        let t = &mut tmp[..head.len()];
        rms_norm_row(head, w, eps, t);
        head.copy_from_slice(t);
    }
}

/// Rotates every head of one token in place ("rotate half" layout).
/// `cos`/`sin` hold `head_dim / 2` values for this token's position.
pub fn rope_in_place(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        let (a, b) = head.split_at_mut(half);
        for i in 0..half {
            let (x1, x2) = (a[i], b[i]);
            a[i] = x1 * cos[i] - x2 * sin[i];
            b[i] = x2 * cos[i] + x1 * sin[i];
        }
    }
}

/// `gate_up` rows hold `[gate | up]`; writes `act(gate) * up` into `out`.
pub fn gated_mul(act: Activation, gate_up: &[f32], out: &mut [f32], ff: usize) {
    match act {
        Activation::Silu => silu_mul(gate_up, out, ff),
        Activation::GeluTanh => gelu_tanh_mul(gate_up, out, ff),
    }
}

/// `gate_up` rows hold `[gate | up]`; writes `silu(gate) * up` into `out`.
fn silu_mul(gate_up: &[f32], out: &mut [f32], ff: usize) {
    out.par_chunks_mut(ff)
        .zip(gate_up.par_chunks(2 * ff))
        .for_each(|(o, gu)| {
            let (g, u) = gu.split_at(ff);
            for i in 0..ff {
                o[i] = g[i] / (1.0 + (-g[i]).exp()) * u[i];
            }
        });
}

/// `gate_up` rows hold `[gate | up]`; writes `gelu_tanh(gate) * up` into
/// `out` (GELU with the tanh approximation, PyTorch's `gelu(approximate="tanh")`).
fn gelu_tanh_mul(gate_up: &[f32], out: &mut [f32], ff: usize) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    out.par_chunks_mut(ff)
        .zip(gate_up.par_chunks(2 * ff))
        .for_each(|(o, gu)| {
            let (g, u) = gu.split_at(ff);
            for i in 0..ff {
                let x = g[i];
                let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
                o[i] = 0.5 * x * (1.0 + inner.tanh()) * u[i];
            }
        });
}

/// `x = cap * tanh(x / cap)` elementwise (logit soft-capping).
pub fn softcap_in_place(x: &mut [f32], cap: f32) {
    x.par_iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
}

/// `x += y` elementwise.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    x.par_iter_mut()
        .zip(y.par_iter())
        .for_each(|(a, b)| *a += b);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rotates_pairs_across_halves() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        let (c, s) = (0.5f32, (0.75f32).sqrt());
        rope_in_place(&mut x, 4, &[c, 1.0], &[s, 0.0]);
        assert!((x[0] - (c - 3.0 * s)).abs() < 1e-6);
        assert!((x[2] - (3.0 * c + s)).abs() < 1e-6);
        assert_eq!((x[1], x[3]), (2.0, 4.0));
    }

    #[test]
    fn gelu_tanh_matches_known_values() {
        // gelu_tanh(1) = 0.841192, gelu_tanh(-2) = -0.045402 (PyTorch).
        let mut out = [0.0; 2];
        gelu_tanh_mul(&[1.0, -2.0, 2.0, 1.0], &mut out, 2);
        assert!((out[0] - 2.0 * 0.841_192).abs() < 1e-5, "{}", out[0]);
        assert!((out[1] + 0.045_402).abs() < 1e-5, "{}", out[1]);
    }

    #[test]
    fn softcap_bounds_and_keeps_small_values() {
        let mut x = [1e6, -1e6, 0.01];
        softcap_in_place(&mut x, 30.0);
        assert!((x[0] - 30.0).abs() < 1e-4 && (x[1] + 30.0).abs() < 1e-4);
        assert!((x[2] - 0.01).abs() < 1e-6);
    }

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0, 4.0];
        let mut out = [0.0; 2];
        rms_norm_row(&x, &[1.0, 2.0], 0.0, &mut out);
        let s = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / s).abs() < 1e-6 && (out[1] - 8.0 / s).abs() < 1e-6);
    }
}
