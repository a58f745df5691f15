//! Weight matrices in their storage type: f32 (exact, the default),
//! bf16 (half the bytes per decoded token; widened to f32 on load, so
//! products and sums stay f32 and batch invariance holds), or the file's
//! own quantized blocks ([`crate::quant`]).

use half::bf16;

use crate::matmul;
use crate::quant::{ActScratch, QuantMatrix};

/// How weight matrices are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightDtype {
    /// f32: bit-faithful to the dequantized file; the reference backend.
    #[default]
    F32,
    /// bf16: rounded (nearest even) at load; about 2x faster decode, logits
    /// differ from the f32 path by bf16 rounding of the weights.
    Bf16,
}

/// One weight matrix `[rows, cols]`, row-major.
pub enum Matrix {
    /// f32 values.
    F32(Vec<f32>),
    /// bf16 values.
    Bf16(Vec<bf16>),
    /// GGUF blocks, multiplied natively with int8 activations.
    Quant(QuantMatrix),
}

impl Matrix {
    /// Bytes of weights held (for quantized blocks, the mapped file's).
    pub fn bytes(&self) -> usize {
        match self {
            Matrix::F32(v) => v.len() * 4,
            Matrix::Bf16(v) => v.len() * 2,
            Matrix::Quant(q) => q.bytes(),
        }
    }

    /// Stores `data` as `dtype` (consumes the f32 copy).
    pub fn new(data: Vec<f32>, dtype: WeightDtype) -> Self {
        match dtype {
            WeightDtype::F32 => Matrix::F32(data),
            WeightDtype::Bf16 => Matrix::Bf16(data.into_iter().map(bf16::from_f32).collect()),
        }
    }

    /// `out[m, n] = x[m, k] · selfᵀ` where self is `[n, k]`; `scratch`
    /// holds quantized activations (only the quantized variant uses it).
    pub fn linear(
        &self,
        x: &[f32],
        out: &mut [f32],
        (m, k, n): (usize, usize, usize),
        scratch: &mut ActScratch,
    ) {
        match self {
            Matrix::F32(w) => matmul::linear(x, w, out, m, k, n),
            Matrix::Bf16(w) => matmul::linear(x, w, out, m, k, n),
            Matrix::Quant(q) => {
                debug_assert_eq!(q.rows(), n);
                q.linear(x, out, m, scratch)
            }
        }
    }

    /// Copies row `r` (of width `out.len()`) into `out` as f32.
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let d = out.len();
        match self {
            Matrix::F32(w) => out.copy_from_slice(&w[r * d..(r + 1) * d]),
            Matrix::Bf16(w) => {
                for (o, v) in out.iter_mut().zip(&w[r * d..(r + 1) * d]) {
                    *o = v.to_f32();
                }
            }
            Matrix::Quant(q) => q.row_into(r, out),
        }
    }
}
