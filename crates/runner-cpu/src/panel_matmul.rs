//! `out[m, n] = x[m, k] · w[n, k]ᵀ` for many input rows (encoder batches).
//!
//! The decoder's [`crate::matmul`] takes weight rows as they are stored and
//! computes each element as a dot product; that suits decode (few rows,
//! weights streamed once) but loads six vectors for every eight FMAs. Here
//! the weight is packed once into panels of [`NR`] columns, k-major, and a
//! register tile of up to [`MR`] rows × 16 columns accumulates outer
//! products: two weight loads and one broadcast per row feed twelve FMAs.
//! Every output element is still one FMA chain over k in order, whatever
//! the tile or the batch, so a row's result has the same bits however it
//! is batched (the portable kernel follows the same order).

use rayon::prelude::*;

/// Columns per panel: two 8-lane vectors.
pub const NR: usize = 16;
/// Rows per register tile: 6 × 2 accumulators + 2 weights + 1 broadcast
/// fill 15 of the 16 vector registers.
const MR: usize = 6;
/// Rows per task: a block of x stays in L2 while the task's panels pass.
const ROW_BLOCK: usize = 8 * MR;
/// Panels per task.
const PANEL_GROUP: usize = 4;

/// A `[n, k]` weight packed as panels of [`NR`] columns: panel `p` holds
/// columns `p*NR..` as `k` runs of `NR` values (zero past `n`).
#[derive(Debug, Clone)]
pub struct Panels {
    data: Vec<f32>,
    n: usize,
    k: usize,
}

impl Panels {
    /// Packs row-major `w` of `n` rows by `k`.
    pub fn pack(w: &[f32], n: usize, k: usize) -> Self {
        let panels = n.div_ceil(NR);
        let mut data = vec![0.0; panels * k * NR];
        for (j, row) in w.chunks_exact(k.max(1)).take(n).enumerate() {
            let (p, c) = (j / NR, j % NR);
            let panel = &mut data[p * k * NR..(p + 1) * k * NR];
            for (t, &v) in row.iter().enumerate() {
                panel[t * NR + c] = v;
            }
        }
        Self { data, n, k }
    }

    /// Output columns.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input width.
    pub fn k(&self) -> usize {
        self.k
    }

    fn panel(&self, p: usize) -> &[f32] {
        &self.data[p * self.k * NR..(p + 1) * self.k * NR]
    }
}

/// Output pointer shared by tasks that write disjoint rectangles.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes only its own rows × columns rectangle.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The element `offset` past the start (a method, so closures capture
    /// the whole `Send` wrapper rather than the raw pointer field).
    ///
    /// # Safety
    /// `offset` must stay inside the output.
    unsafe fn at(self, offset: usize) -> *mut f32 {
        // SAFETY: the caller's contract.
        unsafe { self.0.add(offset) }
    }
}

/// `out[m, n] = x[m, k] · wᵀ`, parallel over row blocks × panel groups.
pub fn matmul(x: &[f32], w: &Panels, out: &mut [f32], m: usize) {
    let (n, k) = (w.n, w.k);
    assert!(x.len() >= m * k && out.len() >= m * n);
    let panels = n.div_ceil(NR);
    let groups = panels.div_ceil(PANEL_GROUP);
    let blocks = m.div_ceil(ROW_BLOCK);
    let ptr = OutPtr(out.as_mut_ptr());
    let x = &x[..m * k];
    (0..blocks * groups).into_par_iter().for_each(move |task| {
        let (block, group) = (task / groups, task % groups);
        let rows = block * ROW_BLOCK..((block + 1) * ROW_BLOCK).min(m);
        let first = group * PANEL_GROUP;
        for p in first..(first + PANEL_GROUP).min(panels) {
            let cols = (n - p * NR).min(NR);
            let mut i = rows.start;
            while i < rows.end {
                let r = (rows.end - i).min(MR);
                // SAFETY: rows i..i+r < m and columns p*NR..p*NR+cols <= n
                // lie inside `out` (m × n), in this task's rectangle only.
                unsafe {
                    tile(
                        &x[i * k..(i + r) * k],
                        r,
                        k,
                        w.panel(p),
                        ptr.at(i * n + p * NR),
                        n,
                        cols,
                    )
                };
                i += r;
            }
        }
    });
}

/// One tile of `r <= MR` rows against one panel.
///
/// # Safety
/// `out` must be valid for writes at `row * stride + c` for `row < r`,
/// `c < cols`, with `cols <= NR`.
unsafe fn tile(
    x: &[f32],
    r: usize,
    k: usize,
    panel: &[f32],
    out: *mut f32,
    stride: usize,
    cols: usize,
) {
    let mut acc = [[0f32; NR]; MR];
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA are present; x holds r rows of k and the
            // panel k runs of NR.
            unsafe { x86::tile(x, r, k, panel, &mut acc) };
            // SAFETY: the caller's contract on `out`.
            unsafe { store(&acc, r, out, stride, cols) };
            return;
        }
    }
    tile_portable(x, r, k, panel, &mut acc);
    // SAFETY: the caller's contract on `out`.
    unsafe { store(&acc, r, out, stride, cols) };
}

/// # Safety
/// As [`tile`].
unsafe fn store(acc: &[[f32; NR]; MR], r: usize, out: *mut f32, stride: usize, cols: usize) {
    for (row, a) in acc.iter().enumerate().take(r) {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), out.add(row * stride), cols) };
    }
}

/// The reference order: per element, `acc = fma(x[t], w[t], acc)` for t
/// from 0 to k.
fn tile_portable(x: &[f32], r: usize, k: usize, panel: &[f32], acc: &mut [[f32; NR]; MR]) {
    for (t, w) in panel.chunks_exact(NR).enumerate().take(k) {
        for (row, a) in acc.iter_mut().enumerate().take(r) {
            let xv = x[row * k + t];
            for (c, v) in a.iter_mut().enumerate() {
                *v = xv.mul_add(w[c], *v);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{MR, NR};

    /// Dispatches on the row count so each variant keeps its
    /// accumulators in registers.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `x` holds `r` rows of `k`, `panel`
    /// `k` runs of `NR`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile(x: &[f32], r: usize, k: usize, panel: &[f32], acc: &mut [[f32; NR]; MR]) {
        assert!(x.len() >= r * k && panel.len() >= k * NR && r <= MR);
        let (xp, wp) = (x.as_ptr(), panel.as_ptr());
        // SAFETY: the bounds were checked above.
        unsafe {
            match r {
                1 => rows::<1>(xp, k, wp, acc),
                2 => rows::<2>(xp, k, wp, acc),
                3 => rows::<3>(xp, k, wp, acc),
                4 => rows::<4>(xp, k, wp, acc),
                5 => rows::<5>(xp, k, wp, acc),
                _ => rows::<MR>(xp, k, wp, acc),
            }
        }
    }

    /// # Safety
    /// As [`tile`], with `R` rows.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows<const R: usize>(
        x: *const f32,
        k: usize,
        w: *const f32,
        acc: &mut [[f32; NR]; MR],
    ) {
        // SAFETY: reads x[row * k + t] for row < R, t < k, and w[t * NR +
        // 0..16] for t < k (caller contract).
        unsafe {
            let mut lo = [_mm256_setzero_ps(); R];
            let mut hi = [_mm256_setzero_ps(); R];
            for t in 0..k {
                let w0 = _mm256_loadu_ps(w.add(t * NR));
                let w1 = _mm256_loadu_ps(w.add(t * NR + 8));
                for row in 0..R {
                    let xv = _mm256_broadcast_ss(&*x.add(row * k + t));
                    lo[row] = _mm256_fmadd_ps(xv, w0, lo[row]);
                    hi[row] = _mm256_fmadd_ps(xv, w1, hi[row]);
                }
            }
            for row in 0..R {
                _mm256_storeu_ps(acc[row].as_mut_ptr(), lo[row]);
                _mm256_storeu_ps(acc[row].as_mut_ptr().add(8), hi[row]);
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
        for (m, k, n) in [(1, 37, 70), (7, 64, 33), (50, 100, 129), (13, 384, 16)] {
            let (x, w) = (data(m * k, 1), data(n * k, 2));
            let mut out = vec![0.0; m * n];
            matmul(&x, &Panels::pack(&w, n, k), &mut out, m);
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
        let (m, k, n) = (53, 300, 45);
        let (x, w) = (data(m * k, 3), data(n * k, 4));
        let panels = Panels::pack(&w, n, k);
        let mut full = vec![0.0; m * n];
        matmul(&x, &panels, &mut full, m);
        for i in 0..m {
            let mut one = vec![0.0; n];
            matmul(&x[i * k..(i + 1) * k], &panels, &mut one, 1);
            assert_eq!(one, full[i * n..(i + 1) * n], "row {i}");
        }
        // The portable kernel follows the same order, bit for bit.
        let mut acc = [[0f32; NR]; MR];
        tile_portable(&x[..MR * k], MR, k, panels.panel(0), &mut acc);
        for (i, a) in acc.iter().enumerate() {
            assert_eq!(a[..NR], full[i * n..i * n + NR], "row {i}");
        }
    }
}
