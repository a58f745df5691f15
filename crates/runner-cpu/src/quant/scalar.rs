//! Portable dot products of one weight row (whole blocks) with one
//! quantized activation row: integer sums per block, one f32 multiply-add
//! per block (per super-block for the k-quants). The reference the SIMD
//! kernels are tested against, and the fallback on other CPUs.
//!
//! Block layouts are ggml's (see `ingot_models::gguf::dequant`, whose
//! formulas these follow): `w = d * q` (Q4_0: `q - 8`, Q5_0: `q - 16`),
//! `w = d * q + m` (Q4_1, Q5_1), `w = d * sc * q - dmin * mn` per 32
//! (Q4_K, Q5_K), `w = d * sc * (q - 32)` per 16 (Q6_K).

use half::f16;

use super::act::ActRow;

/// The little-endian f16 at `b[at..at + 2]` as f32.
#[inline(always)]
pub(super) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Scale and min of sub-block `j` of a Q4_K/Q5_K block: 6 bits each,
/// packed in 12 bytes (`j < 4` in the low 6 bits of bytes `j`, `j + 4`;
/// the others split over a nibble of byte `j + 4` and the top 2 bits of
/// bytes `j - 4` and `j`).
#[inline(always)]
pub(super) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All eight (scale, min) pairs of a Q4_K/Q5_K block.
#[inline(always)]
pub(super) fn scales_mins_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (sc[j], mn[j]) = scale_min_k4(j, q);
    }
    (sc, mn)
}

/// `Σ q[i] * x[i]` over 32 unsigned weights given as low/high halves.
#[inline(always)]
fn dot32(lo: impl Fn(usize) -> i32, hi: impl Fn(usize) -> i32, x: &[i8]) -> i32 {
    let mut s = 0;
    for j in 0..16 {
        s += lo(j) * i32::from(x[j]) + hi(j) * i32::from(x[j + 16]);
    }
    s
}

/// The fifth bit of element `e` of a Q5 block, as 16 or 0.
#[inline(always)]
fn q5_high(qh: u32, e: usize) -> i32 {
    (((qh >> e) & 1) << 4) as i32
}

pub fn dot_q4_0(w: &[u8], x: ActRow<'_>) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in w.chunks_exact(18).enumerate() {
        let q = &blk[2..18];
        let xs = &x.qs[b * 32..b * 32 + 32];
        let s = dot32(
            |j| i32::from(q[j] & 15) - 8,
            |j| i32::from(q[j] >> 4) - 8,
            xs,
        );
        acc += f16_at(blk, 0) * x.d[b] * s as f32;
    }
    acc
}

pub fn dot_q4_1(w: &[u8], x: ActRow<'_>) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in w.chunks_exact(20).enumerate() {
        let q = &blk[4..20];
        let xs = &x.qs[b * 32..b * 32 + 32];
        let s = dot32(|j| i32::from(q[j] & 15), |j| i32::from(q[j] >> 4), xs);
        acc += f16_at(blk, 0) * x.d[b] * s as f32 + f16_at(blk, 2) * x.s[b];
    }
    acc
}

pub fn dot_q5_0(w: &[u8], x: ActRow<'_>) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in w.chunks_exact(22).enumerate() {
        let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
        let q = &blk[6..22];
        let xs = &x.qs[b * 32..b * 32 + 32];
        let s = dot32(
            |j| (i32::from(q[j] & 15) | q5_high(qh, j)) - 16,
            |j| (i32::from(q[j] >> 4) | q5_high(qh, j + 16)) - 16,
            xs,
        );
        acc += f16_at(blk, 0) * x.d[b] * s as f32;
    }
    acc
}

pub fn dot_q5_1(w: &[u8], x: ActRow<'_>) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in w.chunks_exact(24).enumerate() {
        let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
        let q = &blk[8..24];
        let xs = &x.qs[b * 32..b * 32 + 32];
        let s = dot32(
            |j| i32::from(q[j] & 15) | q5_high(qh, j),
            |j| i32::from(q[j] >> 4) | q5_high(qh, j + 16),
            xs,
        );
        acc += f16_at(blk, 0) * x.d[b] * s as f32 + f16_at(blk, 2) * x.s[b];
    }
    acc
}

pub fn dot_q8_0(w: &[u8], x: ActRow<'_>) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in w.chunks_exact(34).enumerate() {
        let xs = &x.qs[b * 32..b * 32 + 32];
        let s: i32 = blk[2..34]
            .iter()
            .zip(xs)
            .map(|(&q, &v)| i32::from(q as i8) * i32::from(v))
            .sum();
        acc += f16_at(blk, 0) * x.d[b] * s as f32;
    }
    acc
}

/// Q4_K and Q5_K: `qh` is `Some` for Q5_K (bit `2g` / `2g + 1` of byte `l`
/// is the fifth bit of element `l` of sub-block `2g` / `2g + 1`).
#[inline(always)]
fn dot_k4(blk: &[u8], qs: &[u8], qh: Option<&[u8]>, x: ActRow<'_>, b: usize) -> f32 {
    let (sc, mn) = scales_mins_k4(&blk[4..16]);
    let xs = &x.qs[b * 256..b * 256 + 256];
    let bs = &x.bsums[b * 16..b * 16 + 16];
    let (mut isum, mut msum) = (0i32, 0i32);
    for g in 0..4 {
        let q = &qs[32 * g..32 * g + 32];
        let (mut lo, mut hi) = (0i32, 0i32);
        for l in 0..32 {
            let (h1, h2) = match qh {
                Some(h) => (
                    i32::from((h[l] >> (2 * g)) & 1) << 4,
                    i32::from((h[l] >> (2 * g + 1)) & 1) << 4,
                ),
                None => (0, 0),
            };
            lo += (i32::from(q[l] & 15) | h1) * i32::from(xs[64 * g + l]);
            hi += (i32::from(q[l] >> 4) | h2) * i32::from(xs[64 * g + 32 + l]);
        }
        isum += i32::from(sc[2 * g]) * lo + i32::from(sc[2 * g + 1]) * hi;
        msum += i32::from(mn[2 * g]) * (i32::from(bs[4 * g]) + i32::from(bs[4 * g + 1]));
        msum += i32::from(mn[2 * g + 1]) * (i32::from(bs[4 * g + 2]) + i32::from(bs[4 * g + 3]));
    }
    x.d[b] * (f16_at(blk, 0) * isum as f32 - f16_at(blk, 2) * msum as f32)
}

pub fn dot_q4_k(w: &[u8], x: ActRow<'_>) -> f32 {
    w.chunks_exact(144)
        .enumerate()
        .map(|(b, blk)| dot_k4(blk, &blk[16..144], None, x, b))
        .sum()
}

pub fn dot_q5_k(w: &[u8], x: ActRow<'_>) -> f32 {
    w.chunks_exact(176)
        .enumerate()
        .map(|(b, blk)| dot_k4(blk, &blk[48..176], Some(&blk[16..48]), x, b))
        .sum()
}

pub fn dot_q6_k(w: &[u8], x: ActRow<'_>) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in w.chunks_exact(210).enumerate() {
        let xs = &x.qs[b * 256..b * 256 + 256];
        let bs = &x.bsums[b * 16..b * 16 + 16];
        let sc = &blk[192..208];
        // Unsigned 6-bit q per element in file order, then the -32 offset
        // through the per-16 activation sums.
        let mut isum = 0i32;
        for n in 0..2 {
            let ql = &blk[64 * n..64 * n + 64];
            let qh = &blk[128 + 32 * n..128 + 32 * n + 32];
            for t in 0..4 {
                let (lbytes, lshift) = (&ql[32 * (t & 1)..], 4 * (t as u32 / 2));
                for half in 0..2 {
                    let mut s = 0i32;
                    for l in 16 * half..16 * half + 16 {
                        let q = ((lbytes[l] >> lshift) & 15) | (((qh[l] >> (2 * t)) & 3) << 4);
                        s += i32::from(q) * i32::from(xs[128 * n + 32 * t + l]);
                    }
                    isum += i32::from(sc[8 * n + 2 * t + half] as i8) * s;
                }
            }
        }
        let off: i32 = sc
            .iter()
            .zip(bs)
            .map(|(&s, &b)| i32::from(s as i8) * i32::from(b))
            .sum();
        acc += f16_at(blk, 208) * x.d[b] * (isum - 32 * off) as f32;
    }
    acc
}
