//! Vector kernels with run-time CPU feature dispatch (the binary is built
//! for baseline x86-64 so it runs anywhere, including the GPU machine).

/// A dot-product implementation.
pub type DotFn = fn(&[f32], &[f32]) -> f32;

/// The fastest dot product this CPU supports.
pub fn dot_fn() -> DotFn {
    #[cfg(target_arch = "x86_64")]
    {
        if avx2_fma() {
            return |a, b| {
                // SAFETY: the features were detected above.
                unsafe { x86::dot_avx2(a, b) }
            };
        }
    }
    dot_portable
}

/// Whether this CPU has AVX2 and FMA: what [`dot_fn`] picks [`dot_avx2`]
/// on, and what code inlining it must check.
pub(crate) fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{dot_avx2, exp_shifted_avx2};

/// `xs[i] = e^(xs[i] - m)` with the C library's `expf`, one at a time:
/// attention's softmax weights, to the bit what a scalar loop gives.
#[inline]
pub fn exp_shifted(xs: &mut [f32], m: f32) {
    for x in xs {
        *x = (*x - m).exp();
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Dot product with four 8-wide FMA accumulators.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY: every load reads 8 floats at i + 8u + 8 <= n.
        unsafe {
            while i + 32 <= n {
                for (u, acc) in acc.iter_mut().enumerate() {
                    let va = _mm256_loadu_ps(pa.add(i + 8 * u));
                    let vb = _mm256_loadu_ps(pb.add(i + 8 * u));
                    *acc = _mm256_fmadd_ps(va, vb, *acc);
                }
                i += 32;
            }
            while i + 8 <= n {
                let va = _mm256_loadu_ps(pa.add(i));
                let vb = _mm256_loadu_ps(pb.add(i));
                acc[0] = _mm256_fmadd_ps(va, vb, acc[0]);
                i += 8;
            }
            let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let hi = _mm256_extractf128_ps(s, 1);
            let lo = _mm256_castps256_ps128(s);
            let q = _mm_add_ps(hi, lo);
            let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
            let q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
            let mut sum = _mm_cvtss_f32(q);
            while i < n {
                sum += *pa.add(i) * *pb.add(i);
                i += 1;
            }
            sum
        }
    }

    /// e^x in 8 lanes, Cephes' `expf` scheme: n = round(x / ln 2), the
    /// remainder r = x - n ln 2 (ln 2 in two parts, so r is exact), e^r by
    /// its degree-7 polynomial, times 2^n through the exponent bits. Within
    /// 2 ulp of the true value on [-87, 88] (clamped at 88, where n stays
    /// at most 127: 2^128 has no exponent bits); below -87 it flushes to 0
    /// (a softmax weight that small adds nothing to a sum that has 1 in it).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn exp8(x: __m256) -> __m256 {
        let x = _mm256_max_ps(
            _mm256_min_ps(x, _mm256_set1_ps(88.0)),
            _mm256_set1_ps(-87.336_54),
        );
        let n = _mm256_round_ps(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let r2 = _mm256_mul_ps(r, r);
        let e = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
        let bits = _mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
            23,
        );
        let scaled = _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
        // 2^n underflows the exponent field below n = -126: flush to 0.
        _mm256_and_ps(
            scaled,
            _mm256_cmp_ps(x, _mm256_set1_ps(-87.336_5), _CMP_GT_OQ),
        )
    }

    /// [`super::exp_shifted`] 8 lanes at a time with [`exp8`] (not the C
    /// library's bits: `model.cpu_fast_exp`).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub unsafe fn exp_shifted_avx2(xs: &mut [f32], m: f32) {
        let mut chunks = xs.chunks_exact_mut(8);
        let mv = _mm256_set1_ps(m);
        for c in &mut chunks {
            // SAFETY: c holds exactly 8 floats.
            unsafe {
                let v = _mm256_loadu_ps(c.as_ptr());
                _mm256_storeu_ps(c.as_mut_ptr(), exp8(_mm256_sub_ps(v, mv)));
            }
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let mut lane = [f32::NEG_INFINITY; 8];
            lane[..rest.len()].copy_from_slice(rest);
            // SAFETY: lane holds 8 floats.
            unsafe {
                let v = _mm256_loadu_ps(lane.as_ptr());
                _mm256_storeu_ps(lane.as_mut_ptr(), exp8(_mm256_sub_ps(v, mv)));
            }
            rest.copy_from_slice(&lane[..rest.len()]);
        }
    }
}

/// Dot product with eight independent accumulators (lets the compiler vectorise).
#[inline]
pub fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for i in chunks * 8..a.len() {
        sum += a[i] * b[i];
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8-lane exp against f64 over its range (a softmax's x - max <= 0
    /// and up to 88), remainders included: within 2 ulp, flushed to 0
    /// below -87.3.
    #[test]
    fn fast_exp_is_within_two_ulp() {
        if !avx2_fma() {
            eprintln!("skipped: no AVX2/FMA on this CPU");
            return;
        }
        let xs: Vec<f32> = (0..39_554).map(|i| -90.0 + i as f32 * 0.0045).collect();
        let mut got = xs.clone();
        // SAFETY: AVX2 and FMA were detected above.
        unsafe { exp_shifted_avx2(&mut got, 0.0) };
        for (x, g) in xs.iter().zip(&got) {
            let want = (*x as f64).exp();
            if *x < -87.3 {
                assert!(*g == 0.0 || (*g as f64 - want).abs() < 1e-37, "{x}: {g}");
                continue;
            }
            let ulp = (want as f32).to_bits().abs_diff(g.to_bits());
            assert!(ulp <= 2, "e^{x}: {g} vs {want} ({ulp} ulp)");
        }
        let mut shifted = vec![1.0f32, 2.0, 3.0];
        // SAFETY: as above.
        unsafe { exp_shifted_avx2(&mut shifted, 3.0) };
        let want = [(-2f32).exp(), (-1f32).exp(), 1.0];
        for (g, w) in shifted.iter().zip(want) {
            assert!(g.to_bits().abs_diff(w.to_bits()) <= 2, "{g} vs {w}");
        }
    }
}
