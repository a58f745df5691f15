//! [`EncoderOps`] on the CPU: f32 weights and activations, the decoder's
//! batch-invariant matmul, and per-row kernels parallel over rows with
//! rayon. Every row's result depends only on its own sequence: the same
//! sentence gets the same bits whatever it is batched with.

use ingot_arch::bert::{EncoderBatch, EncoderOps, Heads, Linear, Norm};
use ingot_arch::{ArchError, Bert};
use ingot_models::bert::{BertFiles, Pooling};
use ingot_models::{HostTensor, TensorSource};
use rayon::prelude::*;

use crate::matmul;

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
    type Weight = HostTensor;
    type Act = Rows;

    fn device_name(&self) -> &str {
        "cpu"
    }

    fn weight(&self, tensor: HostTensor) -> Result<HostTensor, ArchError> {
        Ok(tensor)
    }

    fn gather_sum(&self, tables: &[(&HostTensor, &[u32])]) -> Result<Rows, ArchError> {
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

    fn linear(&self, x: &Rows, layer: &Linear<HostTensor>) -> Result<Rows, ArchError> {
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
            matmul::linear(&x.data, &layer.weight.data, &mut out.data, m, k, n);
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
        norm: &Norm<HostTensor>,
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
        x.data.par_chunks_mut(w).for_each(|row| {
            for v in row {
                *v = 0.5 * *v * (1.0 + libm::erff(*v * std::f32::consts::FRAC_1_SQRT_2));
            }
        });
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
        let layer = Linear {
            weight: w,
            bias: HostTensor::new(vec![3], vec![0.1, 0.2, 0.3]),
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
