//! [`EncoderOps`] on the CPU: f32 weights and activations, a
//! batch-invariant packed-panel matmul ([`crate::panel_matmul`]), and
//! per-row kernels parallel over rows with rayon. Every row's result
//! depends only on its own sequence: the same sentence gets the same bits
//! whatever it is batched with.

use ingot_arch::bert::{EncoderBatch, EncoderOps, Heads, Linear, Norm};
use ingot_arch::{ArchError, Bert};
use ingot_models::bert::{BertFiles, Pooling};
use ingot_models::{HostTensor, TensorSource};
use std::sync::OnceLock;

use rayon::prelude::*;

use crate::panel_matmul::{self, Panels};

/// Rows of `width` f32 values.
pub struct Rows {
    data: Vec<f32>,
    width: usize,
}

impl Rows {
    fn zeros(rows: usize, width: usize) -> Self {
        Self {
            data: vec![0.0; rows * width],
            width,
        }
    }

    fn count(&self) -> usize {
        self.data.len().checked_div(self.width).unwrap_or(0)
    }
}

/// A weight as the CPU keeps it: the host tensor, and for a matrix used
/// by [`EncoderOps::linear`] its packed panels, made on first use (tables
/// and vectors are never packed).
pub struct CpuWeight {
    host: HostTensor,
    panels: OnceLock<Panels>,
}

impl CpuWeight {
    fn panels(&self, n: usize, k: usize) -> &Panels {
        self.panels
            .get_or_init(|| Panels::pack(&self.host.data, n, k))
    }
}

impl std::ops::Deref for CpuWeight {
    type Target = HostTensor;

    fn deref(&self) -> &HostTensor {
        &self.host
    }
}

/// The CPU encoder backend.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuEncoder;

/// Loads a BERT directory's weights as f32 onto the CPU.
pub fn load_bert(files: &BertFiles) -> Result<Bert<CpuEncoder>, ArchError> {
    let tensors = &files.tensors;
    Bert::load(
        CpuEncoder,
        files.config.clone(),
        &|name| tensors.load(name),
        &|name| tensors.contains(name),
    )
}

fn mismatch(what: &str) -> ArchError {
    ArchError::Backend(format!("{what}: operand sizes do not match"))
}

impl EncoderOps for CpuEncoder {
    type Weight = CpuWeight;
    type Act = Rows;

    fn device_name(&self) -> &str {
        "cpu"
    }

    fn weight(&self, tensor: HostTensor) -> Result<CpuWeight, ArchError> {
        Ok(CpuWeight {
            host: tensor,
            panels: OnceLock::new(),
        })
    }

    fn gather_sum(&self, tables: &[(&CpuWeight, &[u32])]) -> Result<Rows, ArchError> {
        let (first, ids) = tables.first().ok_or_else(|| mismatch("gather_sum"))?;
        let width = first.shape.last().copied().unwrap_or(0);
        let mut out = Rows::zeros(ids.len(), width);
        for (table, ids) in tables {
            if ids.len() != out.count() || table.shape.last() != Some(&width) {
                return Err(mismatch("gather_sum"));
            }
            for (row, &id) in out.data.chunks_exact_mut(width).zip(ids.iter()) {
                let start = id as usize * width;
                let src = table
                    .data
                    .get(start..start + width)
                    .ok_or_else(|| ArchError::Input(format!("row {id} is out of the table")))?;
                row.iter_mut().zip(src).for_each(|(o, s)| *o += s);
            }
        }
        Ok(out)
    }

    fn linear(&self, x: &Rows, layer: &Linear<CpuWeight>) -> Result<Rows, ArchError> {
        let (n, k) = match layer.weight.shape[..] {
            [n, k] => (n, k),
            _ => return Err(mismatch("linear")),
        };
        if x.width != k || layer.bias.len() != n {
            return Err(mismatch("linear"));
        }
        let m = x.count();
        let mut out = Rows::zeros(m, n);
        if m > 0 {
            panel_matmul::matmul(&x.data, layer.weight.panels(n, k), &mut out.data, m);
        }
        out.data
            .par_chunks_mut(n)
            .for_each(|row| crate::ops::add_bias(row, &layer.bias.data));
        Ok(out)
    }

    fn attention(&self, qkv: &Rows, heads: Heads, batch: &EncoderBatch) -> Result<Rows, ArchError> {
        let h = heads.count * heads.dim;
        if qkv.width != 3 * h || qkv.count() != batch.tokens.len() {
            return Err(mismatch("attention"));
        }
        let starts = sequence_starts(&batch.seq_lens);
        let mut out = Rows::zeros(qkv.count(), h);
        out.data.par_chunks_mut(h).enumerate().for_each(|(t, row)| {
            let (start, len) = starts[t];
            attend_token(qkv, t, start, len, heads, row);
        });
        Ok(out)
    }

    fn add_layer_norm(
        &self,
        x: &mut Rows,
        residual: Option<&Rows>,
        norm: &Norm<CpuWeight>,
        eps: f32,
    ) -> Result<(), ArchError> {
        let w = x.width;
        if norm.weight.len() != w || residual.is_some_and(|r| r.data.len() != x.data.len()) {
            return Err(mismatch("add_layer_norm"));
        }
        let (g, b) = (&norm.weight.data, &norm.bias.data);
        x.data.par_chunks_mut(w).enumerate().for_each(|(i, row)| {
            if let Some(r) = residual {
                row.iter_mut()
                    .zip(&r.data[i * w..(i + 1) * w])
                    .for_each(|(v, r)| *v += r);
            }
            layer_norm_row(row, g, b, eps);
        });
        Ok(())
    }

    fn gelu(&self, x: &mut Rows) -> Result<(), ArchError> {
        let w = x.width.max(1);
        x.data.par_chunks_mut(w).for_each(gelu_row);
        Ok(())
    }

    fn pool(&self, x: &Rows, pooling: Pooling, batch: &EncoderBatch) -> Result<Rows, ArchError> {
        if x.count() != batch.tokens.len() {
            return Err(mismatch("pool"));
        }
        let w = x.width;
        let mut out = Rows::zeros(batch.seq_lens.len(), w);
        let mut start = 0;
        for (row, &len) in out.data.chunks_exact_mut(w).zip(&batch.seq_lens) {
            let tokens = &x.data[start * w..(start + len) * w];
            match pooling {
                Pooling::Cls => row.copy_from_slice(&tokens[..w.min(tokens.len())]),
                Pooling::Mean => mean_rows(tokens, row),
            }
            start += len;
        }
        Ok(out)
    }

    fn l2_normalize(&self, x: &mut Rows) -> Result<(), ArchError> {
        let w = x.width.max(1);
        x.data.par_chunks_mut(w).for_each(|row| {
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            // sentence-transformers divides by max(norm, 1e-12).
            let scale = 1.0 / norm.max(1e-12);
            row.iter_mut().for_each(|v| *v *= scale);
        });
        Ok(())
    }

    fn to_host(&self, x: &Rows) -> Result<Vec<f32>, ArchError> {
        Ok(x.data.clone())
    }
}

/// For every token, its sequence's first token and length.
fn sequence_starts(seq_lens: &[usize]) -> Vec<(usize, usize)> {
    let mut starts = Vec::with_capacity(seq_lens.iter().sum());
    let mut start = 0;
    for &len in seq_lens {
        starts.extend(std::iter::repeat_n((start, len), len));
        start += len;
    }
    starts
}

/// Token `t`'s attention output over the keys of its sequence
/// `[start, start + len)`, every head, into `out`.
fn attend_token(qkv: &Rows, t: usize, start: usize, len: usize, heads: Heads, out: &mut [f32]) {
    let (d, h) = (heads.dim, heads.count * heads.dim);
    let row = |i: usize| &qkv.data[i * qkv.width..(i + 1) * qkv.width];
    let scale = 1.0 / (d as f32).sqrt();
    let mut scores = vec![0f32; len];
    for head in 0..heads.count {
        let q = &row(t)[head * d..(head + 1) * d];
        for (j, s) in scores.iter_mut().enumerate() {
            let k = &row(start + j)[h + head * d..h + (head + 1) * d];
            *s = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale;
        }
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            total += *s;
        }
        let o = &mut out[head * d..(head + 1) * d];
        for (j, s) in scores.iter().enumerate() {
            let v = &row(start + j)[2 * h + head * d..2 * h + (head + 1) * d];
            let p = s / total;
            o.iter_mut().zip(v).for_each(|(o, v)| *o += p * v);
        }
    }
}

/// GELU (erf form) of every value in `row`, vectorized with FMA where
/// the CPU has it (`mul_add` is fused either way: same bits).
fn gelu_row(row: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the features were just detected.
            unsafe { gelu_row_avx2(row) };
            return;
        }
    }
    gelu_values(row);
}

/// # Safety
/// AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_row_avx2(row: &mut [f32]) {
    gelu_values(row);
}

#[inline(always)]
fn gelu_values(row: &mut [f32]) {
    for v in row {
        *v = 0.5 * *v * (1.0 + erf(*v * std::f32::consts::FRAC_1_SQRT_2));
    }
}

/// erf(x) to within 5e-7 absolute, branch-free so the GELU loop
/// vectorizes (libm's erff is exact to an ulp but branches and took a
/// fifth of a MiniLM pass). Abramowitz & Stegun 7.1.26:
/// `1 - (a1 t + … + a5 t⁵) e^(-x²)` with `t = 1 / (1 + p|x|)`.
#[inline(always)]
fn erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_7,
        -1.453_152,
        1.061_405_4,
    ];
    // Past 4, erf is 1 to f32 precision.
    let a = x.abs().min(4.0);
    let t = 1.0 / P.mul_add(a, 1.0);
    let poly = A.iter().rev().fold(0.0f32, |acc, &c| acc.mul_add(t, c)) * t;
    let y = poly.mul_add(-exp_neg(a * a), 1.0);
    y.copysign(x)
}

/// e^(-y) for y in [0, 16], relative error below 2e-7, branch-free:
/// 2^(-y·log2 e) split into an integer power (exponent bits) and a
/// degree-6 Taylor polynomial of e^r for |r| <= ln2/2.
#[inline(always)]
fn exp_neg(y: f32) -> f32 {
    // Adding and taking away 1.5 · 2²³ rounds to the nearest integer
    // without a rounding instruction the baseline target lacks.
    const ROUND: f32 = 12_582_912.0;
    let z = -y * std::f32::consts::LOG2_E;
    let n = (z + ROUND) - ROUND;
    let r = (z - n) * std::f32::consts::LN_2;
    let mut p: f32 = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p.mul_add(r, c);
    }
    // n is in [-24, 0]: the exponent stays normal.
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * scale
}

/// `(x - mean) / sqrt(var + eps) * g + b`, in place.
fn layer_norm_row(x: &mut [f32], g: &[f32], b: &[f32], eps: f32) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, g), b) in x.iter_mut().zip(g).zip(b) {
        *v = (*v - mean) * inv * g + b;
    }
}

/// The mean of `rows` (each `out.len()` wide) into `out`.
fn mean_rows(rows: &[f32], out: &mut [f32]) {
    let w = out.len();
    let n = (rows.len() / w.max(1)).max(1) as f32;
    for r in rows.chunks_exact(w) {
        out.iter_mut().zip(r).for_each(|(o, v)| *o += v);
    }
    out.iter_mut().for_each(|o| *o /= n);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(data: Vec<f32>, width: usize) -> Rows {
        Rows { data, width }
    }

    #[test]
    fn attention_stays_inside_each_sequence() {
        // One head of width 1: q = k = 0 gives uniform weights, so each
        // token's output is the mean of its own sequence's values.
        let qkv = rows(vec![0., 0., 1., 0., 0., 3., 0., 0., 10.], 3);
        let batch = EncoderBatch {
            tokens: vec![1, 2, 3],
            seq_lens: vec![2, 1],
        };
        let heads = Heads { count: 1, dim: 1 };
        let out = CpuEncoder.attention(&qkv, heads, &batch).unwrap();
        assert_eq!(out.data, [2.0, 2.0, 10.0]);
    }

    #[test]
    fn rows_do_not_depend_on_the_batch() {
        let w = HostTensor::new(vec![3, 2], vec![0.5, -1.0, 2.0, 0.25, 1.5, 1.0]);
        let weight = |t| CpuEncoder.weight(t).unwrap();
        let layer = Linear {
            weight: weight(w),
            bias: weight(HostTensor::new(vec![3], vec![0.1, 0.2, 0.3])),
        };
        let one = CpuEncoder.linear(&rows(vec![1.0, 2.0], 2), &layer).unwrap();
        let many = rows(
            [vec![3.0, -4.0], vec![1.0, 2.0], vec![7.0, 0.5]].concat(),
            2,
        );
        let many = CpuEncoder.linear(&many, &layer).unwrap();
        assert_eq!(one.data, many.data[3..6]);
        assert_eq!(one.data, [-1.4, 2.7, 3.8]);
    }

    #[test]
    fn mean_pooling_and_unit_length() {
        let x = rows(vec![1.0, 0.0, 3.0, 4.0, 0.0, 2.0], 2);
        let batch = EncoderBatch {
            tokens: vec![0, 0, 0],
            seq_lens: vec![2, 1],
        };
        let mut p = CpuEncoder.pool(&x, Pooling::Mean, &batch).unwrap();
        assert_eq!(p.data, [2.0, 2.0, 0.0, 2.0]);
        CpuEncoder.l2_normalize(&mut p).unwrap();
        let s = std::f32::consts::FRAC_1_SQRT_2;
        assert_eq!(p.data, [s, s, 0.0, 1.0]);
    }

    #[test]
    fn erf_is_within_5e7_of_libm() {
        let worst = (-6000..=6000)
            .map(|i| i as f32 * 1e-3)
            .map(|x| (erf(x) - libm::erff(x)).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 5e-7, "worst {worst}");
        assert!(erf(0.0).abs() < 1e-7);
        assert_eq!(erf(9.0), 1.0);
        assert_eq!(erf(-9.0), -1.0);
    }

    #[test]
    fn gelu_is_the_erf_form() {
        let mut x = rows(vec![-1.0, 0.0, 1.0], 3);
        CpuEncoder.gelu(&mut x).unwrap();
        // torch.nn.functional.gelu(tensor([-1., 0., 1.]))
        let want = [-0.158_655_26, 0.0, 0.841_344_7];
        for (a, b) in x.data.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }
}
