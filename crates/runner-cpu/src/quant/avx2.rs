//! AVX2 dot products (same contract and formulas as [`super::scalar`]).
//!
//! Integer products use `maddubs` (u8 × i8 → pairs summed into i16) then
//! `madd` (i16 × i16 → pairs summed into i32). `maddubs` needs one unsigned
//! operand: unsigned formats (Q4_1, Q5_1, the k-quants) feed their raw
//! `q` and correct the offset through the activation block sums; Q4_0 and
//! Q5_0 (weights `q - 8`, `q - 16`) feed their raw `q` too and subtract
//! `8 * sum(x)` (`16 * ...`) from each integer lane, the same integers;
//! Q8_0, truly signed, moves the weight's sign onto the activation
//! (`|w| * sign(x, w)`). Every i16 pair sum stays below 2 * 63 * 127, so
//! nothing saturates. f16 scales are widened with F16C.

use std::arch::x86_64::*;

use super::act::ActRow;
use super::scalar::scales_mins_k4;
use super::TILE_W;

/// Sums the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)))
}

/// The f16 at `p` and the one after it, as f32 (`(d, m)` of a block).
///
/// # Safety
/// `p` must be valid for 4 reads.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_pair(p: *const u8) -> (f32, f32) {
    // SAFETY: 4 bytes readable (caller contract); unaligned read.
    let bits = unsafe { std::ptr::read_unaligned(p as *const i32) };
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// The f16 at `p` as f32.
///
/// # Safety
/// `p` must be valid for 2 reads.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_one(p: *const u8) -> f32 {
    // SAFETY: 2 bytes readable (caller contract); unaligned read.
    let bits = unsafe { std::ptr::read_unaligned(p as *const u16) };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// 16 bytes of packed nibbles → 32 bytes: low nibbles, then high nibbles
/// (the element order of the 32-blocks).
///
/// # Safety
/// `p` must be valid for 16 reads.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: 16 bytes readable (caller contract).
    let raw = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(raw, m);
    let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
    _mm256_set_m128i(hi, lo)
}

/// Bit `j` of `bits` → byte `j` = 0x10 or 0 (the fifth bit of Q5 blocks).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fifth_bits(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    // Byte j takes source byte j / 8 (in-lane shuffle; both lanes hold all
    // four bytes).
    let pick = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let v = _mm256_shuffle_epi8(v, pick);
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(v, mask), mask);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Sum of the four `u8 × i8` products in each i32 lane: one VNNI
/// `vpdpbusd`, or `maddubs` + `madd` (never saturating here, see the module
/// note), so both give the same exact integers.
///
/// # Safety
/// AVX2 available, and AVX512-VNNI with AVX512VL when `VNNI`.
#[inline(always)]
unsafe fn dot_u8i8<const VNNI: bool>(w: __m256i, x: __m256i) -> __m256i {
    // SAFETY: the features each branch needs (caller contract).
    unsafe {
        if VNNI {
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
        } else {
            _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
        }
    }
}

/// How far ahead of the block being read the weight rows are prefetched.
const PREFETCH_BYTES: usize = 2048;

/// Asks for the cache lines of the `BYTES`-byte block `ahead` bytes past
/// `p`: one line for the 32-blocks, three or four for the k-quants'
/// super-blocks. The rows stream from memory (+55 % on a 49,152-row Q8_0
/// product when added, quant_speed).
#[inline(always)]
fn prefetch_ahead<const BYTES: usize>(p: *const u8, ahead: usize) {
    let at = p.wrapping_add(ahead);
    for line in 0..BYTES.div_ceil(64) {
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * line) as *const i8) };
    }
}

/// Block `b` of [`dot32`]'s loop: every (weight, activation) pair's
/// product added to its accumulator. Always inlined into the kernels, which
/// carry the target features.
///
/// # Safety
/// As [`dot32`]; `b` is below the rows' block count.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn dot32_block<
    const BYTES: usize,
    const SIGNED: bool,
    const OFFSET: u8,
    const MIN: bool,
    const VNNI: bool,
    const W: usize,
    const R: usize,
>(
    w: &[&[u8]; W],
    x: &[ActRow<'_>; R],
    q: &impl Fn(*const u8) -> __m256i,
    b: usize,
    ahead: usize,
    acc: &mut [[__m256; R]; W],
    mins: &mut [[f32; R]; W],
) {
    // SAFETY: block b of every row is in bounds (caller contract).
    unsafe {
        let mut dm = [(0f32, 0f32); W];
        let mut dv = [_mm256_setzero_ps(); W];
        let mut qv = [_mm256_setzero_si256(); W];
        let mut wu = [_mm256_setzero_si256(); W];
        for j in 0..W {
            let p = w[j].as_ptr().add(b * BYTES);
            prefetch_ahead::<BYTES>(p, ahead);
            dm[j] = f16_pair(p);
            dv[j] = _mm256_set1_ps(dm[j].0);
            qv[j] = q(p);
            wu[j] = if SIGNED {
                _mm256_sign_epi8(qv[j], qv[j])
            } else {
                qv[j]
            };
        }
        for r in 0..R {
            let xr = &x[r];
            let xv = _mm256_loadu_si256(xr.qs.as_ptr().add(b * 32) as *const __m256i);
            // Broadcast from memory (a load, no shuffle); the vector
            // product is the same IEEE product as the scalar one.
            let xd = _mm256_broadcast_ss(xr.d.get_unchecked(b));
            // Unsigned quants q of weights q - OFFSET: the exact integer
            // sum of (q - OFFSET) x is sum(q x) - OFFSET sum(x), lane by
            // lane, the second term once per activation block.
            let xo = if OFFSET > 0 {
                dot_u8i8::<VNNI>(_mm256_set1_epi8(OFFSET as i8), xv)
            } else {
                _mm256_setzero_si256()
            };
            for j in 0..W {
                let xs = if SIGNED {
                    _mm256_sign_epi8(xv, qv[j])
                } else {
                    xv
                };
                let mut s = dot_u8i8::<VNNI>(wu[j], xs);
                if OFFSET > 0 {
                    s = _mm256_sub_epi32(s, xo);
                }
                let dd = _mm256_mul_ps(dv[j], xd);
                acc[j][r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(s), acc[j][r]);
                if MIN {
                    mins[j][r] += dm[j].1 * *xr.s.get_unchecked(b);
                }
            }
        }
    }
}

/// The shared loop of the 32-block formats over `W` weight rows and `R`
/// activation rows (each weight block is decoded once for all `R` rows,
/// each activation block loaded once for all `W`): `q(p)` gives the 32
/// weights of the block at `p`, signed or unsigned per `SIGNED` (unsigned
/// with `OFFSET` subtracted from each when that is not 0); `MIN` adds
/// `m * s`. Every (weight, activation) pair runs the same operations in the
/// same order whatever `W`, `R` and `VNNI` are, so all tiles give
/// bit-identical results (batch invariance).
///
/// # Safety
/// AVX2, FMA and F16C available (and AVX512-VNNI/VL when `VNNI`); each `w`
/// is whole blocks of `BYTES` bytes and every row of `x` holds at least as
/// many blocks.
#[inline(always)]
unsafe fn dot32<
    const BYTES: usize,
    const SIGNED: bool,
    const OFFSET: u8,
    const MIN: bool,
    const VNNI: bool,
    const W: usize,
    const R: usize,
>(
    w: [&[u8]; W],
    x: &[ActRow<'_>; R],
    q: impl Fn(*const u8) -> __m256i,
) -> [[f32; R]; W] {
    let nb = w[0].len() / BYTES;
    debug_assert!(w.iter().all(|w| w.len() == nb * BYTES));
    debug_assert!(x.iter().all(|x| x.qs.len() >= nb * 32 && x.d.len() >= nb));
    // SAFETY: block b reads w[j][b * BYTES..(b + 1) * BYTES] and, per row,
    // qs[32b..32b + 32] and d[b] (s[b] with MIN), all in bounds (caller
    // contract).
    unsafe {
        // One row streams alone: a fixed distance ahead. A tile's rows
        // stream side by side: the same block of the next tile's rows.
        let ahead = if W == 1 {
            PREFETCH_BYTES
        } else {
            W * w[0].len()
        };
        let mut acc = [[_mm256_setzero_ps(); R]; W];
        let mut mins = [[0f32; R]; W];
        // A lone row runs four blocks a turn: the next blocks' loads issue
        // while the accumulator chain finishes (what LLVM's Zen tuning does
        // with -C target-cpu=native, +20 % on streamed Q8_0 rows); the
        // order of each accumulator's additions is unchanged.
        // (No closure around the step: a closure would not carry the
        // caller's target features, and its intrinsics would not inline.)
        let mut b = 0;
        if W * R == 1 {
            while b + 4 <= nb {
                for u in 0..4 {
                    dot32_block::<BYTES, SIGNED, OFFSET, MIN, VNNI, W, R>(
                        &w,
                        x,
                        &q,
                        b + u,
                        ahead,
                        &mut acc,
                        &mut mins,
                    );
                }
                b += 4;
            }
        }
        for b in b..nb {
            dot32_block::<BYTES, SIGNED, OFFSET, MIN, VNNI, W, R>(
                &w, x, &q, b, ahead, &mut acc, &mut mins,
            );
        }
        let mut out = [[0f32; R]; W];
        for j in 0..W {
            for r in 0..R {
                out[j][r] = hsum(acc[j][r]) + mins[j][r];
            }
        }
        out
    }
}

/// Defines, for a 32-block format, the one-row, two-row, four-row and 4 × 4,
/// 4 × 2 and 4 × 1 tile kernels in a module `$m`, with `$feat` enabled,
/// `$vnni` picking the integer product and `$wide1` whether the 4 × 1 tile
/// runs its rows together.
macro_rules! dot32_mod {
    ($m:ident, $feat:literal, $vnni:literal, $bytes:literal, $signed:literal, $off:literal, $min:literal, $wide1:literal, $q:expr) => {
        pub mod $m {
            use super::*;

            /// # Safety
            /// The module's CPU features available; `x` holds as many
            /// blocks as `w`.
            #[target_feature(enable = $feat)]
            pub unsafe fn one(w: &[u8], x: ActRow<'_>) -> f32 {
                // SAFETY: forwarded contract; the block layout matches `$q`.
                unsafe { dot32::<$bytes, $signed, $off, $min, $vnni, 1, 1>([w], &[x], $q)[0][0] }
            }

            /// # Safety
            /// As [`one`], for each row.
            #[target_feature(enable = $feat)]
            pub unsafe fn two(w: &[u8], x: &[ActRow<'_>; 2]) -> [f32; 2] {
                // SAFETY: forwarded contract; the block layout matches `$q`.
                unsafe { dot32::<$bytes, $signed, $off, $min, $vnni, 1, 2>([w], x, $q)[0] }
            }

            /// # Safety
            /// As [`one`], for each row.
            #[target_feature(enable = $feat)]
            pub unsafe fn four(w: &[u8], x: &[ActRow<'_>; 4]) -> [f32; 4] {
                // SAFETY: forwarded contract; the block layout matches `$q`.
                unsafe { dot32::<$bytes, $signed, $off, $min, $vnni, 1, 4>([w], x, $q)[0] }
            }

            /// # Safety
            /// As [`one`], for each pair; the weight rows of equal length.
            #[target_feature(enable = $feat)]
            pub unsafe fn tile(w: [&[u8]; TILE_W], x: &[ActRow<'_>; 4]) -> [[f32; 4]; TILE_W] {
                // SAFETY: forwarded contract; the block layout matches `$q`.
                unsafe { dot32::<$bytes, $signed, $off, $min, $vnni, TILE_W, 4>(w, x, $q) }
            }

            /// Batch-1 decode: with `$wide1` the four weight rows stream
            /// side by side (one activation load for four rows; signed
            /// formats +20-70 % on DRAM-streamed rows, `stream_speed`),
            /// otherwise one row at a time (Q4_1, Q5_1 and Q8_0 measured
            /// slower as four: SmolLM2 Q4_1 decode -6 to -10 %).
            ///
            /// # Safety
            /// As [`tile`], for one activation row.
            #[target_feature(enable = $feat)]
            pub unsafe fn tile1(w: [&[u8]; TILE_W], x: &[ActRow<'_>; 1]) -> [[f32; 1]; TILE_W] {
                // SAFETY: forwarded contract; the block layout matches `$q`.
                unsafe {
                    if !$wide1 {
                        w.map(|w| dot32::<$bytes, $signed, $off, $min, $vnni, 1, 1>([w], x, $q)[0])
                    } else {
                        dot32::<$bytes, $signed, $off, $min, $vnni, TILE_W, 1>(w, x, $q)
                    }
                }
            }

            /// # Safety
            /// As [`tile`], for two activation rows.
            #[target_feature(enable = $feat)]
            pub unsafe fn tile2(w: [&[u8]; TILE_W], x: &[ActRow<'_>; 2]) -> [[f32; 2]; TILE_W] {
                // SAFETY: forwarded contract; the block layout matches `$q`.
                unsafe { dot32::<$bytes, $signed, $off, $min, $vnni, TILE_W, 2>(w, x, $q) }
            }
        }
    };
}

/// Defines a 32-block format's kernels for AVX2 (`$avx2`) and for
/// AVX512-VNNI (`$vnni`, same results).
macro_rules! dot32_fns {
    ($avx2:ident, $vnni:ident, $bytes:literal, $signed:literal, $off:literal, $min:literal, $wide1:literal, $q:expr) => {
        dot32_mod!(
            $avx2,
            "avx2,fma,f16c",
            false,
            $bytes,
            $signed,
            $off,
            $min,
            $wide1,
            $q
        );
        dot32_mod!(
            $vnni,
            "avx2,fma,f16c,avx512vnni,avx512vl",
            true,
            $bytes,
            $signed,
            $off,
            $min,
            $wide1,
            $q
        );
    };
}

// Q4_0: 18-byte blocks, nibbles at 2..18, q - 8.
dot32_fns!(q4_0, q4_0_vnni, 18, false, 8, false, true, |p| {
    nibbles(p.add(2))
});
// Q4_1: 20-byte blocks, nibbles at 4..20.
dot32_fns!(q4_1, q4_1_vnni, 20, false, 0, true, false, |p| {
    nibbles(p.add(4))
});
// Q5_0: 22-byte blocks, qh at 2..6, nibbles at 6..22, q - 16.
dot32_fns!(q5_0, q5_0_vnni, 22, false, 16, false, true, |p| {
    let qh = std::ptr::read_unaligned(p.add(2) as *const u32);
    _mm256_or_si256(nibbles(p.add(6)), fifth_bits(qh))
});
// Q5_1: 24-byte blocks, qh at 4..8, nibbles at 8..24.
dot32_fns!(q5_1, q5_1_vnni, 24, false, 0, true, false, |p| {
    let qh = std::ptr::read_unaligned(p.add(4) as *const u32);
    _mm256_or_si256(nibbles(p.add(8)), fifth_bits(qh))
});
// Q8_0: 34-byte blocks, int8 values at 2..34.
dot32_fns!(q8_0, q8_0_vnni, 34, true, 0, false, false, |p| {
    _mm256_loadu_si256(p.add(2) as *const __m256i)
});

/// Q4_K (`FIFTH = false`, 144-byte blocks) and Q5_K (176-byte blocks),
/// over `R` activation rows.
///
/// # Safety
/// AVX2, FMA and F16C available; every row of `x` is Q8K and holds as many
/// super-blocks as `w`.
#[inline(always)]
unsafe fn dot_k4<const BYTES: usize, const FIFTH: bool, const R: usize>(
    w: &[u8],
    x: &[ActRow<'_>; R],
) -> [f32; R] {
    let nb = w.len() / BYTES;
    debug_assert!(x
        .iter()
        .all(|x| x.qs.len() >= nb * 256 && x.bsums.len() >= nb * 16));
    // SAFETY: super-block b reads w[b * BYTES..(b + 1) * BYTES] and, per
    // row, qs[256b..256b + 256], d[b] and bsums[16b..16b + 16].
    unsafe {
        let wp = w.as_ptr();
        let low = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let mut acc = [_mm256_setzero_ps(); R];
        let mut mins = [0f32; R];
        for b in 0..nb {
            let p = wp.add(b * BYTES);
            prefetch_ahead::<BYTES>(p, PREFETCH_BYTES);
            let (d, dmin) = f16_pair(p);
            let (sc, mn) = scales_mins_k4(std::slice::from_raw_parts(p.add(4), 12));
            let qs = p.add(if FIFTH { 48 } else { 16 });
            let mut hb = if FIFTH {
                _mm256_loadu_si256(p.add(16) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            let mut isum = [_mm256_setzero_si256(); R];
            for g in 0..4 {
                let raw = _mm256_loadu_si256(qs.add(32 * g) as *const __m256i);
                let mut lo = _mm256_and_si256(raw, low);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                if FIFTH {
                    // Bits 2g and 2g + 1 of each qh byte, moved to bit 4;
                    // 16-bit shifts of at most 7 keep each byte's bits.
                    let h0 = _mm256_and_si256(hb, one);
                    let h1 = _mm256_and_si256(_mm256_srli_epi16(hb, 1), one);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
                    hb = _mm256_srli_epi16(hb, 2);
                }
                let sl = _mm256_set1_epi16(i16::from(sc[2 * g]));
                let sh = _mm256_set1_epi16(i16::from(sc[2 * g + 1]));
                for r in 0..R {
                    let xb = x[r].qs.as_ptr().add(b * 256 + 64 * g);
                    let xl = _mm256_loadu_si256(xb as *const __m256i);
                    let xh = _mm256_loadu_si256(xb.add(32) as *const __m256i);
                    let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), sl);
                    let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), sh);
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(pl, ph));
                }
            }
            for r in 0..R {
                let dx = *x[r].d.get_unchecked(b);
                let bs = x[r].bsums.get_unchecked(b * 16..b * 16 + 16);
                let mut msum = 0i32;
                for j in 0..8 {
                    msum += i32::from(mn[j]) * (i32::from(bs[2 * j]) + i32::from(bs[2 * j + 1]));
                }
                let dd = _mm256_set1_ps(d * dx);
                acc[r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum[r]), acc[r]);
                mins[r] += dmin * dx * msum as f32;
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum(acc[r]) - mins[r];
        }
        out
    }
}

/// Q6_K over `R` activation rows.
///
/// # Safety
/// As [`dot_k4`].
#[inline(always)]
unsafe fn dot_k6<const R: usize>(w: &[u8], x: &[ActRow<'_>; R]) -> [f32; R] {
    let nb = w.len() / 210;
    debug_assert!(x
        .iter()
        .all(|x| x.qs.len() >= nb * 256 && x.bsums.len() >= nb * 16));
    // SAFETY: super-block b reads w[210b..210b + 210] and, per row,
    // qs[256b..256b + 256], d[b] and bsums[16b..16b + 16].
    unsafe {
        let wp = w.as_ptr();
        let low = _mm256_set1_epi8(0x0F);
        let two = _mm256_set1_epi8(3);
        let mut acc = [_mm256_setzero_ps(); R];
        let mut offs = [0f32; R];
        for b in 0..nb {
            let p = wp.add(b * 210);
            prefetch_ahead::<210>(p, PREFETCH_BYTES);
            let d = f16_one(p.add(208));
            let sc = std::slice::from_raw_parts(p.add(192) as *const i8, 16);
            let mut isum = [_mm256_setzero_si256(); R];
            for n in 0..2 {
                let ql0 = _mm256_loadu_si256(p.add(64 * n) as *const __m256i);
                let ql1 = _mm256_loadu_si256(p.add(64 * n + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(p.add(128 + 32 * n) as *const __m256i);
                // Two high bits per element, shifted to bits 4..6 (values
                // <= 0x30 never cross a byte in the 16-bit shift).
                let h = |v: __m256i| _mm256_slli_epi16(_mm256_and_si256(v, two), 4);
                let q = [
                    _mm256_or_si256(_mm256_and_si256(ql0, low), h(qh)),
                    _mm256_or_si256(_mm256_and_si256(ql1, low), h(_mm256_srli_epi16(qh, 2))),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                        h(_mm256_srli_epi16(qh, 4)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
                        h(_mm256_srli_epi16(qh, 6)),
                    ),
                ];
                for (t, q) in q.into_iter().enumerate() {
                    // The 32 elements span two sub-blocks of 16: the low
                    // 128-bit lane holds the first, the high lane the second.
                    let k = 8 * n + 2 * t;
                    let sv = _mm256_set_m128i(
                        _mm_set1_epi16(i16::from(sc[k + 1])),
                        _mm_set1_epi16(i16::from(sc[k])),
                    );
                    for r in 0..R {
                        let xp = x[r].qs.as_ptr().add(b * 256 + 128 * n + 32 * t);
                        let xv = _mm256_loadu_si256(xp as *const __m256i);
                        let pr = _mm256_maddubs_epi16(q, xv);
                        isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(pr, sv));
                    }
                }
            }
            for r in 0..R {
                let dd = d * *x[r].d.get_unchecked(b);
                let bs = x[r].bsums.get_unchecked(b * 16..b * 16 + 16);
                let mut off = 0i32;
                for k in 0..16 {
                    off += i32::from(sc[k]) * i32::from(bs[k]);
                }
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(isum[r]), acc[r]);
                offs[r] += dd * (32 * off) as f32;
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum(acc[r]) - offs[r];
        }
        out
    }
}

/// Defines the one-row and four-row entry points of a k-quant kernel.
macro_rules! dotk_fns {
    ($name:ident, $name2:ident, $name4:ident, $call:ident $(, $arg:tt)*) => {
        /// # Safety
        /// AVX2, FMA and F16C available; `x` is Q8K with as many
        /// super-blocks as `w`.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name(w: &[u8], x: ActRow<'_>) -> f32 {
            // SAFETY: forwarded contract.
            unsafe { $call::<$($arg,)* 1>(w, &[x])[0] }
        }

        /// # Safety
        /// As the one-row kernel, for each row.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name2(w: &[u8], x: &[ActRow<'_>; 2]) -> [f32; 2] {
            // SAFETY: forwarded contract.
            unsafe { $call::<$($arg,)* 2>(w, x) }
        }

        /// # Safety
        /// As the one-row kernel, for each row.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name4(w: &[u8], x: &[ActRow<'_>; 4]) -> [f32; 4] {
            // SAFETY: forwarded contract.
            unsafe { $call::<$($arg,)* 4>(w, x) }
        }
    };
}

dotk_fns!(dot_q4_k, dot_q4_k_x2, dot_q4_k_x4, dot_k4, 144, false);
dotk_fns!(dot_q5_k, dot_q5_k_x2, dot_q5_k_x4, dot_k4, 176, true);
dotk_fns!(dot_q6_k, dot_q6_k_x2, dot_q6_k_x4, dot_k6);
