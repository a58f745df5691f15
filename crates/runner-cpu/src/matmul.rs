//! `out[m, n] = x[m, k] · w[n, k]ᵀ` with a fixed reduction order per output
//! element, so every row's result is bit-identical whatever else is in the
//! batch (batch invariance: a request's tokens do not depend on how it was
//! batched or chunked; see Thinking Machines, "Defeating Nondeterminism in
//! LLM Inference", 2025).
//!
//! GEMM libraries choose their blocking from (m, n, k), which changes the
//! order of the k-sum with the batch size; they also pack operands, which
//! costs more than the product for decode. Here each element is one 8-lane
//! FMA chain over k followed by a fixed horizontal sum; tiles of 2 input rows
//! × 4 weight rows only share loads, never partial sums. Work is split over
//! weight rows (rayon), so decode streams the weights once across cores.

use rayon::prelude::*;

/// Input rows per cache block inside a task.
const ROW_BLOCK: usize = 32;

/// Output pointer shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each task writes only the columns of its own weight rows.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// A weight element the kernels read: f32, or bf16 widened to f32 on load
/// (half the memory traffic; products and sums stay f32).
pub trait Weight: Copy + Send + Sync + 'static {
    /// Stored as bf16.
    const BF16: bool;
    /// The value as f32.
    fn to_f32(self) -> f32;
}

impl Weight for f32 {
    const BF16: bool = false;
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Weight for half::bf16 {
    const BF16: bool = true;
    #[inline]
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

type TileFn<W> = unsafe fn(&[f32], &[W], usize, usize, usize, OutPtr, usize);

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` (a PyTorch linear layer without bias).
pub fn linear<W: Weight>(x: &[f32], w: &[W], out: &mut [f32], m: usize, k: usize, n: usize) {
    assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
    let ptr = OutPtr(out.as_mut_ptr());
    let tile = tile_fn::<W>();
    let x = &x[..m * k];
    // Small tasks for decode (balance); larger ones for prefill, so each
    // block of x is reused by more weight rows.
    let rows_per_task = if m <= 4 { 16 } else { 64 };
    w[..n * k]
        .par_chunks(rows_per_task * k)
        .enumerate()
        .for_each(move |(task, rows)| {
            // SAFETY: rows holds whole weight rows starting at column
            // task * rows_per_task; `tile` writes out[i * n + j] only for
            // i < m and j among those rows, all inside `out`.
            unsafe { tile(x, rows, m, k, n, ptr, task * rows_per_task) }
        });
}

fn tile_fn<W: Weight>() -> TileFn<W> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return x86::rows_avx2::<W>;
        }
    }
    rows_portable::<W>
}

/// Portable kernel: the same per-element order (8 lanes, then a fixed
/// horizontal sum, then the tail) as the AVX2 kernel.
///
/// # Safety
/// `out` must be valid for `m * n` writes and `j0 + rows.len() / k <= n`.
unsafe fn rows_portable<W: Weight>(
    x: &[f32],
    rows: &[W],
    m: usize,
    k: usize,
    n: usize,
    out: OutPtr,
    j0: usize,
) {
    for (r, wr) in rows.chunks_exact(k).enumerate() {
        for i in 0..m {
            let xr = &x[i * k..(i + 1) * k];
            let mut lanes = [0f32; 8];
            let body = k / 8 * 8;
            for c in (0..body).step_by(8) {
                for l in 0..8 {
                    lanes[l] = xr[c + l].mul_add(wr[c + l].to_f32(), lanes[l]);
                }
            }
            let mut s = hsum8(&lanes);
            for t in body..k {
                s += xr[t] * wr[t].to_f32();
            }
            // SAFETY: i < m, j0 + r < n (caller contract).
            unsafe { *out.0.add(i * n + j0 + r) = s };
        }
    }
}

/// Horizontal sum in the order the AVX2 kernel uses.
#[inline]
fn hsum8(l: &[f32; 8]) -> f32 {
    let q = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    let h = [q[0] + q[2], q[1] + q[3]];
    h[0] + h[1]
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{OutPtr, Weight, ROW_BLOCK};

    /// Eight weights widened to f32 (bf16: zero-extend and shift into the
    /// high half, which is exact).
    ///
    /// # Safety
    /// `p` must be valid for 8 reads.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_w<W: Weight>(p: *const W) -> __m256 {
        // SAFETY: 8 elements readable (caller contract).
        unsafe {
            if W::BF16 {
                let h = _mm_loadu_si128(p as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
            } else {
                _mm256_loadu_ps(p as *const f32)
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        // Same order as `hsum8`: (l0+l4, l1+l5, l2+l6, l3+l7), then pairs.
        let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let h = _mm_add_ps(q, _mm_movehl_ps(q, q));
        _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)))
    }

    /// One output element: the reference order every tile reproduces.
    ///
    /// # Safety
    /// `x` and `w` must be valid for `k` reads.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot<W: Weight>(x: *const f32, w: *const W, k: usize) -> f32 {
        // SAFETY: reads stay below k (caller contract).
        unsafe {
            let body = k / 8 * 8;
            let mut acc = _mm256_setzero_ps();
            let mut c = 0;
            while c < body {
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(c)), load_w(w.add(c)), acc);
                c += 8;
            }
            let mut s = hsum(acc);
            for t in body..k {
                s += *x.add(t) * (*w.add(t)).to_f32();
            }
            s
        }
    }

    /// 2 input rows × 4 weight rows per inner tile; each of the 8 elements
    /// keeps its own accumulator, so the result equals `dot` exactly.
    ///
    /// # Safety
    /// Inputs valid for `k` reads, outputs valid for one write each.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_2x4<W: Weight>(
        x0: *const f32,
        x1: *const f32,
        w: [*const W; 4],
        k: usize,
        out: [[*mut f32; 4]; 2],
    ) {
        // SAFETY: reads stay below k, writes go to the given slots.
        unsafe {
            let body = k / 8 * 8;
            // Named accumulators: arrays indexed in a loop may spill.
            let z = _mm256_setzero_ps();
            let (mut a00, mut a01, mut a02, mut a03) = (z, z, z, z);
            let (mut a10, mut a11, mut a12, mut a13) = (z, z, z, z);
            let mut c = 0;
            while c < body {
                let xa = _mm256_loadu_ps(x0.add(c));
                let xb = _mm256_loadu_ps(x1.add(c));
                let w0 = load_w(w[0].add(c));
                a00 = _mm256_fmadd_ps(xa, w0, a00);
                a10 = _mm256_fmadd_ps(xb, w0, a10);
                let w1 = load_w(w[1].add(c));
                a01 = _mm256_fmadd_ps(xa, w1, a01);
                a11 = _mm256_fmadd_ps(xb, w1, a11);
                let w2 = load_w(w[2].add(c));
                a02 = _mm256_fmadd_ps(xa, w2, a02);
                a12 = _mm256_fmadd_ps(xb, w2, a12);
                let w3 = load_w(w[3].add(c));
                a03 = _mm256_fmadd_ps(xa, w3, a03);
                a13 = _mm256_fmadd_ps(xb, w3, a13);
                c += 8;
            }
            let a = [[a00, a01, a02, a03], [a10, a11, a12, a13]];
            for (i, x) in [x0, x1].into_iter().enumerate() {
                for j in 0..4 {
                    let mut s = hsum(a[i][j]);
                    for t in body..k {
                        s += *x.add(t) * (*w[j].add(t)).to_f32();
                    }
                    *out[i][j] = s;
                }
            }
        }
    }

    /// # Safety
    /// AVX2 and FMA must be available; `out` valid for `m * n` writes and
    /// `j0 + rows.len() / k <= n`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn rows_avx2<W: Weight>(
        x: &[f32],
        rows: &[W],
        m: usize,
        k: usize,
        n: usize,
        out: OutPtr,
        j0: usize,
    ) {
        let nr = rows.len() / k;
        let (xp, wp) = (x.as_ptr(), rows.as_ptr());
        // SAFETY: pointers stay inside x (m rows of k), rows (nr rows of k)
        // and out (m * n), per the caller contract.
        unsafe {
            let o = |i: usize, j: usize| out.0.add(i * n + j0 + j);
            let full = nr / 4 * 4;
            // Block over input rows so a block of x stays in L2 while every
            // weight row of this task passes over it.
            for ib in (0..m).step_by(ROW_BLOCK) {
                let ie = (ib + ROW_BLOCK).min(m);
                for j in (0..full).step_by(4) {
                    let w = [
                        wp.add(j * k),
                        wp.add((j + 1) * k),
                        wp.add((j + 2) * k),
                        wp.add((j + 3) * k),
                    ];
                    let mut i = ib;
                    while i + 2 <= ie {
                        let outs = [
                            [o(i, j), o(i, j + 1), o(i, j + 2), o(i, j + 3)],
                            [
                                o(i + 1, j),
                                o(i + 1, j + 1),
                                o(i + 1, j + 2),
                                o(i + 1, j + 3),
                            ],
                        ];
                        tile_2x4(xp.add(i * k), xp.add((i + 1) * k), w, k, outs);
                        i += 2;
                    }
                    if i < ie {
                        for (jj, &wr) in w.iter().enumerate() {
                            *o(i, j + jj) = dot(xp.add(i * k), wr, k);
                        }
                    }
                }
            }
            let j = full;
            for j in j..nr {
                for i in 0..m {
                    *o(i, j) = dot(xp.add(i * k), wp.add(j * k), k);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104_729) % 1013) as f32 / 1013.0 - 0.5) * 2.0)
            .collect()
    }

    #[test]
    fn matches_f64_naive_for_odd_shapes() {
        for (m, k, n) in [(1, 37, 70), (3, 64, 33), (5, 100, 129), (17, 576, 19)] {
            let (x, w) = (data(m * k, 1), data(n * k, 2));
            let mut out = vec![0.0; m * n];
            linear(&x, &w, &mut out, m, k, n);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|t| x[i * k + t] as f64 * w[j * k + t] as f64)
                        .sum();
                    assert!(
                        (out[i * n + j] as f64 - want).abs() < 1e-4,
                        "{m}x{k}x{n} at {i},{j}"
                    );
                }
            }
        }
    }

    #[test]
    fn rows_are_bit_identical_whatever_the_batch() {
        let (k, n) = (300, 45);
        let x = data(9 * k, 3);
        let w = data(n * k, 4);
        let mut full = vec![0.0; 9 * n];
        linear(&x, &w, &mut full, 9, k, n);
        for i in 0..9 {
            let mut one = vec![0.0; n];
            linear(&x[i * k..(i + 1) * k], &w, &mut one, 1, k, n);
            assert_eq!(one, full[i * n..(i + 1) * n], "row {i}");
        }
        // The portable kernel follows the same order.
        let mut portable = vec![0.0; 9 * n];
        // SAFETY: out has 9 * n slots and rows are all n weight rows.
        unsafe { rows_portable(&x, &w, 9, k, n, OutPtr(portable.as_mut_ptr()), 0) };
        let close = portable
            .iter()
            .zip(&full)
            .all(|(a, b)| (a - b).abs() < 1e-5);
        assert!(close);
    }

    #[test]
    fn bf16_weights_equal_f32_weights_holding_the_same_values() {
        let (m, k, n) = (5, 200, 37);
        let x = data(m * k, 5);
        let w16: Vec<half::bf16> = data(n * k, 6)
            .into_iter()
            .map(half::bf16::from_f32)
            .collect();
        let w32: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
        let (mut a, mut b) = (vec![0.0; m * n], vec![0.0; m * n]);
        linear(&x, &w16, &mut a, m, k, n);
        linear(&x, &w32, &mut b, m, k, n);
        assert_eq!(a, b, "widening is exact and the order is the same");
    }
}
