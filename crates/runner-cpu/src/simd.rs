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
pub(crate) use x86::dot_avx2;

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
