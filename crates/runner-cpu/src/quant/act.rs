//! Activations quantized to int8 per block, so a weight block and an
//! activation block meet in an integer dot product.
//!
//! Two layouts, one per weight family: [`ActFormat::Q8`] has one scale per
//! 32 values (pairs with Q4_0..Q8_0) and keeps `d * Σq` per block for the
//! formats with a min; [`ActFormat::Q8K`] has one scale per 256 values
//! (pairs with the k-quants) and keeps `Σq` per 16 values, which the
//! k-quants' per-sub-block mins and offsets need. Scales are `amax / 127`,
//! so values lie in `[-127, 127]` and `i8 * u8` pair sums cannot saturate.

use rayon::prelude::*;

/// Which activation layout a weight format pairs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActFormat {
    /// Blocks of 32, f32 scale, `d * Σq` per block.
    Q8,
    /// Blocks of 256, f32 scale, `Σq` per 16.
    Q8K,
}

impl ActFormat {
    /// Values per scale.
    pub const fn block(self) -> usize {
        match self {
            ActFormat::Q8 => 32,
            ActFormat::Q8K => 256,
        }
    }
}

/// One quantized activation row, as the dot kernels read it.
#[derive(Clone, Copy)]
pub struct ActRow<'a> {
    /// The int8 values.
    pub qs: &'a [i8],
    /// One scale per block.
    pub d: &'a [f32],
    /// Q8: `d * Σq` per block of 32 (empty for Q8K).
    pub s: &'a [f32],
    /// `Σq` per block of 32 (Q8) or per 16 values (Q8K).
    pub bsums: &'a [i16],
}

/// `m` rows of quantized activations; buffers grow and are reused.
#[derive(Default)]
pub struct QuantActs {
    qs: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    bsums: Vec<i16>,
    k: usize,
    format: Option<ActFormat>,
}

/// One row's input and outputs: `((x, qs), (d, sums))`.
type RowBufs<'a, S> = ((&'a [f32], &'a mut [i8]), (&'a mut [f32], &'a mut [S]));

/// Rows below this are quantized on the calling thread.
const PAR_MIN_ROWS: usize = 8;

impl QuantActs {
    /// Quantizes `m` rows of `k` values of `x`; `k` must be a multiple of
    /// `format.block()` (the weight rows it pairs with are whole blocks).
    pub fn quantize(&mut self, x: &[f32], m: usize, k: usize, format: ActFormat) {
        let block = format.block();
        debug_assert!(k.is_multiple_of(block) && x.len() >= m * k);
        let nb = k / block;
        grow(&mut self.qs, m * k);
        grow(&mut self.d, m * nb);
        match format {
            ActFormat::Q8 => {
                grow(&mut self.s, m * nb);
                grow(&mut self.bsums, m * nb);
            }
            ActFormat::Q8K => grow(&mut self.bsums, m * k / 16),
        }
        self.k = k;
        self.format = Some(format);
        let x = &x[..m * k];
        let qs = &mut self.qs[..m * k];
        let d = &mut self.d[..m * nb];
        match format {
            ActFormat::Q8 => {
                let s = &mut self.s[..m * nb];
                let bs = &mut self.bsums[..m * nb];
                let row = |(((x, q), (d, s)), bs): (RowBufs<'_, f32>, &mut [i16])| {
                    quantize_row(x, q, d, 32);
                    for (((s, b), d), q) in
                        s.iter_mut().zip(bs).zip(d.iter()).zip(q.chunks_exact(32))
                    {
                        // |Σ| <= 32 * 127: fits i16.
                        *b = q.iter().map(|&v| i16::from(v)).sum();
                        *s = *d * f32::from(*b);
                    }
                };
                if m < PAR_MIN_ROWS {
                    x.chunks(k)
                        .zip(qs.chunks_mut(k))
                        .zip(d.chunks_mut(nb).zip(s.chunks_mut(nb)))
                        .zip(bs.chunks_mut(nb))
                        .for_each(row);
                } else {
                    x.par_chunks(k)
                        .zip(qs.par_chunks_mut(k))
                        .zip(d.par_chunks_mut(nb).zip(s.par_chunks_mut(nb)))
                        .zip(bs.par_chunks_mut(nb))
                        .for_each(row);
                }
            }
            ActFormat::Q8K => {
                let bs = &mut self.bsums[..m * k / 16];
                let row = |((x, q), (d, bs)): RowBufs<'_, i16>| {
                    quantize_row(x, q, d, 256);
                    for (b, q) in bs.iter_mut().zip(q.chunks_exact(16)) {
                        // |Σ| <= 16 * 127: fits i16.
                        *b = q.iter().map(|&v| i16::from(v)).sum();
                    }
                };
                if m < PAR_MIN_ROWS {
                    x.chunks(k)
                        .zip(qs.chunks_mut(k))
                        .zip(d.chunks_mut(nb).zip(bs.chunks_mut(k / 16)))
                        .for_each(row);
                } else {
                    x.par_chunks(k)
                        .zip(qs.par_chunks_mut(k))
                        .zip(d.par_chunks_mut(nb).zip(bs.par_chunks_mut(k / 16)))
                        .for_each(row);
                }
            }
        }
    }

    /// Values per row of the last [`QuantActs::quantize`].
    pub fn k(&self) -> usize {
        self.k
    }

    /// Every row's values, scales, `d * Σq` and `Σq` per block (Q8:
    /// `[m][k]` then `[m][k / 32]` each; the buffers may run past `m`).
    pub fn parts(&self) -> (&[i8], &[f32], &[f32], &[i16]) {
        (&self.qs, &self.d, &self.s, &self.bsums)
    }

    /// Rows `i..i + 2`, for the two-row kernels.
    #[inline]
    pub fn two_rows(&self, i: usize) -> [ActRow<'_>; 2] {
        std::array::from_fn(|a| self.row(i + a))
    }

    /// Rows `i..i + 4` of `m`, for the four-row kernels; the last row
    /// repeated past `m` (three rows through a four-row kernel).
    #[inline]
    pub fn four_rows(&self, i: usize, m: usize) -> [ActRow<'_>; 4] {
        std::array::from_fn(|a| self.row((i + a).min(m - 1)))
    }

    /// Row `i` of the last [`QuantActs::quantize`].
    #[inline]
    pub fn row(&self, i: usize) -> ActRow<'_> {
        let k = self.k;
        match self.format {
            Some(ActFormat::Q8) => ActRow {
                qs: &self.qs[i * k..(i + 1) * k],
                d: &self.d[i * k / 32..(i + 1) * k / 32],
                s: &self.s[i * k / 32..(i + 1) * k / 32],
                bsums: &self.bsums[i * k / 32..(i + 1) * k / 32],
            },
            Some(ActFormat::Q8K) => ActRow {
                qs: &self.qs[i * k..(i + 1) * k],
                d: &self.d[i * k / 256..(i + 1) * k / 256],
                s: &[],
                bsums: &self.bsums[i * k / 16..(i + 1) * k / 16],
            },
            None => ActRow {
                qs: &[],
                d: &[],
                s: &[],
                bsums: &[],
            },
        }
    }
}

fn grow<T: Default + Clone>(v: &mut Vec<T>, len: usize) {
    if v.len() < len {
        v.resize(len, T::default());
    }
}

/// Adding then subtracting 1.5 * 2^23 rounds an f32 of magnitude < 2^22 to
/// the nearest integer (ties to even) in two vectorizable adds; baseline
/// x86-64 has no rounding instruction and `f32::round` would be a call.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// Quantizes `x` in blocks of `block` values: `q = round(x / d)`, `d = amax / 127`.
fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], block: usize) {
    for ((x, q), d) in x
        .chunks_exact(block)
        .zip(q.chunks_exact_mut(block))
        .zip(d.iter_mut())
    {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        *d = amax / 127.0;
        for (q, &v) in q.iter_mut().zip(x) {
            *q = ((v * inv + ROUND_MAGIC) - ROUND_MAGIC) as i8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_within_half_a_step() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        for format in [ActFormat::Q8, ActFormat::Q8K] {
            let mut a = QuantActs::default();
            a.quantize(&x, 2, 256, format);
            for i in 0..2 {
                let r = a.row(i);
                let b = format.block();
                for (j, &v) in x[i * 256..(i + 1) * 256].iter().enumerate() {
                    let d = r.d[j / b];
                    let back = f32::from(r.qs[j]) * d;
                    assert!((back - v).abs() <= d * 0.5 + 1e-6, "{format:?} {i} {j}");
                }
                if format == ActFormat::Q8K {
                    let s: i32 = r.qs[16..32].iter().map(|&v| i32::from(v)).sum();
                    assert_eq!(i32::from(r.bsums[1]), s);
                }
            }
        }
    }
}
