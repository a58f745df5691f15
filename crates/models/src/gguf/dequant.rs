//! Block dequantization: ggml's storage types to f32.
//!
//! Each kernel is a transcription of the matching `dequantize_row_*` in
//! llama.cpp's `ggml/src/ggml-quants.c` (reference, non-SIMD paths), with the
//! same f32 operations in the same order and no fused multiply-adds, so the
//! output is bit-identical to ggml's and to `gguf.quants.dequantize` of the
//! `gguf` Python package. Block layouts are the structs of `ggml-common.h`.
//!
//! Large inputs are split into chunks of whole blocks dequantized in
//! parallel on the rayon pool.

use half::f16;
use rayon::prelude::*;

use super::types::QK_K;
use super::{GgmlType, GgufError};

/// Below this many output elements one thread does the work.
const PAR_MIN_ELEMENTS: usize = 1 << 16;
/// Output elements per parallel task.
const PAR_CHUNK_ELEMENTS: usize = 1 << 15;

/// Dequantizes one block: `bytes` is exactly one block, `out` its elements.
type BlockKernel = fn(&[u8], &mut [f32]);

/// Dequantizes `bytes`, a whole number of `ty` blocks, into `out`, which must
/// hold exactly the elements those blocks encode.
///
/// Errors with [`GgufError::UnsupportedType`] (empty tensor name) for types
/// without a kernel (see [`GgmlType::can_dequantize`]) and with
/// [`GgufError::LengthMismatch`] when the lengths disagree.
pub fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), GgufError> {
    let kernel = kernel(ty).ok_or(GgufError::UnsupportedType {
        tensor: String::new(),
        ty,
    })?;
    let (block_size, type_size) = (ty.block_size(), ty.type_size());
    let n_blocks = bytes.len() / type_size;
    if !bytes.len().is_multiple_of(type_size) || n_blocks.checked_mul(block_size) != Some(out.len())
    {
        return Err(GgufError::LengthMismatch {
            ty,
            bytes: bytes.len(),
            elements: out.len(),
            block_size,
            type_size,
        });
    }
    let run = |bytes: &[u8], out: &mut [f32]| {
        for (block, y) in bytes
            .chunks_exact(type_size)
            .zip(out.chunks_exact_mut(block_size))
        {
            kernel(block, y);
        }
    };
    if out.len() < PAR_MIN_ELEMENTS {
        run(bytes, out);
    } else {
        let blocks_per_task = (PAR_CHUNK_ELEMENTS / block_size).max(1);
        bytes
            .par_chunks(blocks_per_task * type_size)
            .zip(out.par_chunks_mut(blocks_per_task * block_size))
            .for_each(|(bytes, out)| run(bytes, out));
    }
    Ok(())
}

fn kernel(ty: GgmlType) -> Option<BlockKernel> {
    Some(match ty {
        GgmlType::F32 => block_f32,
        GgmlType::F16 => block_f16,
        GgmlType::BF16 => block_bf16,
        GgmlType::Q4_0 => block_q4_0,
        GgmlType::Q4_1 => block_q4_1,
        GgmlType::Q5_0 => block_q5_0,
        GgmlType::Q5_1 => block_q5_1,
        GgmlType::Q8_0 => block_q8_0,
        GgmlType::Q2_K => block_q2_k,
        GgmlType::Q3_K => block_q3_k,
        GgmlType::Q4_K => block_q4_k,
        GgmlType::Q5_K => block_q5_k,
        GgmlType::Q6_K => block_q6_k,
        _ => return None,
    })
}

/// The little-endian f16 at `b[at..at + 2]`, widened (exactly) to f32.
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn block_f32(b: &[u8], y: &mut [f32]) {
    y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
}

fn block_f16(b: &[u8], y: &mut [f32]) {
    y[0] = f16_at(b, 0);
}

fn block_bf16(b: &[u8], y: &mut [f32]) {
    // ggml_compute_bf16_to_fp32: the 16 bits are the top half of an f32.
    y[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
}

/// `block_q4_0 { f16 d; u8 qs[16]; }`: `y = (q - 8) * d`, low nibbles first.
fn block_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    let (lo, hi) = y[..32].split_at_mut(16);
    for ((&q, lo), hi) in qs.iter().zip(lo).zip(hi) {
        *lo = (i32::from(q & 0x0F) - 8) as f32 * d;
        *hi = (i32::from(q >> 4) - 8) as f32 * d;
    }
}

/// `block_q4_1 { f16 d, m; u8 qs[16]; }`: `y = q * d + m`.
fn block_q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    let (lo, hi) = y[..32].split_at_mut(16);
    for ((&q, lo), hi) in qs.iter().zip(lo).zip(hi) {
        *lo = f32::from(q & 0x0F) * d + m;
        *hi = f32::from(q >> 4) * d + m;
    }
}

/// The 5-bit values of a Q5 block: low nibbles from `qs`, fifth bits from
/// `qh` (bit `j` for element `j`, bit `j + 16` for element `j + 16`).
#[inline(always)]
fn q5_values(qh: [u8; 4], qs: &[u8]) -> ([u8; 16], [u8; 16]) {
    let qh = u32::from_le_bytes(qh);
    let (mut lo, mut hi) = ([0u8; 16], [0u8; 16]);
    for (j, &q) in qs[..16].iter().enumerate() {
        let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
        lo[j] = (q & 0x0F) | xh_0;
        hi[j] = (q >> 4) | xh_1;
    }
    (lo, hi)
}

/// `block_q5_0 { f16 d; u8 qh[4]; u8 qs[16]; }`: `y = (q - 16) * d`.
fn block_q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let (lo_q, hi_q) = q5_values([b[2], b[3], b[4], b[5]], &b[6..22]);
    let (lo, hi) = y[..32].split_at_mut(16);
    for j in 0..16 {
        lo[j] = (i32::from(lo_q[j]) - 16) as f32 * d;
        hi[j] = (i32::from(hi_q[j]) - 16) as f32 * d;
    }
}

/// `block_q5_1 { f16 d, m; u8 qh[4]; u8 qs[16]; }`: `y = q * d + m`.
fn block_q5_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let (lo_q, hi_q) = q5_values([b[4], b[5], b[6], b[7]], &b[8..24]);
    let (lo, hi) = y[..32].split_at_mut(16);
    for j in 0..16 {
        lo[j] = f32::from(lo_q[j]) * d + m;
        hi[j] = f32::from(hi_q[j]) * d + m;
    }
}

/// `block_q8_0 { f16 d; i8 qs[32]; }`: `y = q * d`.
fn block_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (&q, y) in b[2..34].iter().zip(&mut y[..32]) {
        *y = f32::from(q as i8) * d;
    }
}

/// `block_q2_K { u8 scales[16]; u8 qs[64]; f16 d, dmin; }`: sixteen groups
/// of 16 with 4-bit scale and min, `y = (d * sc) * q - dmin * m`.
fn block_q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[..QK_K / 16];
    let d = f16_at(b, 80);
    let min = f16_at(b, 82);
    let mut is = 0;
    for (n, q) in b[16..80].chunks_exact(32).enumerate() {
        for (j, shift) in [0u32, 2, 4, 6].into_iter().enumerate() {
            for half in 0..2 {
                let sc = scales[is];
                is += 1;
                let dl = d * f32::from(sc & 0x0F);
                let ml = min * f32::from(sc >> 4);
                let base = n * 128 + j * 32 + half * 16;
                for (l, y) in y[base..base + 16].iter_mut().enumerate() {
                    let q = (q[l + half * 16] >> shift) & 3;
                    *y = dl * f32::from(q) - ml;
                }
            }
        }
    }
}

/// The sixteen 6-bit scales of a Q3_K block, unpacked from 12 bytes: low
/// nibbles in `s[0..8]`, high 2 bits in `s[8..12]` (ggml's `kmask` shuffle).
#[inline(always)]
fn q3_k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (k, out) in out.iter_mut().enumerate() {
        let low = if k < 8 { s[k] & 0x0F } else { s[k - 8] >> 4 };
        let high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        *out = ((low | (high << 4)) as i8) - 32;
    }
    out
}

/// `block_q3_K { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d; }`: 2 low
/// bits in `qs`, the third in `hmask` (clear means subtract 4).
fn block_q3_k(b: &[u8], y: &mut [f32]) {
    let hm = &b[..32];
    let scales = q3_k_scales(&b[96..108]);
    let d_all = f16_at(b, 108);
    let mut is = 0;
    let mut m = 1u8;
    for (n, q) in b[32..96].chunks_exact(32).enumerate() {
        for (j, shift) in [0u32, 2, 4, 6].into_iter().enumerate() {
            for half in 0..2 {
                let dl = d_all * f32::from(scales[is]);
                is += 1;
                let base = n * 128 + j * 32 + half * 16;
                for (l, y) in y[base..base + 16].iter_mut().enumerate() {
                    let i = l + half * 16;
                    let low = ((q[i] >> shift) & 3) as i8;
                    let q = low - if hm[i] & m != 0 { 0 } else { 4 };
                    *y = dl * f32::from(q);
                }
            }
            m <<= 1;
        }
    }
}

/// Scale and min of sub-block `j` of a Q4_K/Q5_K block (`get_scale_min_k4`).
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `block_q4_K { f16 d, dmin; u8 scales[12]; u8 qs[128]; }`: eight groups
/// of 32 with 6-bit scale and min, `y = (d * sc) * q - dmin * m`.
fn block_q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let scales = &b[4..16];
    for (n, (q, y)) in b[16..144]
        .chunks_exact(32)
        .zip(y[..QK_K].chunks_exact_mut(64))
        .enumerate()
    {
        let (sc1, m1) = scale_min_k4(2 * n, scales);
        let (sc2, m2) = scale_min_k4(2 * n + 1, scales);
        let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
        let (lo, hi) = y.split_at_mut(32);
        for ((&q, lo), hi) in q.iter().zip(lo).zip(hi) {
            *lo = d1 * f32::from(q & 0x0F) - m1;
            *hi = d2 * f32::from(q >> 4) - m2;
        }
    }
}

/// `block_q5_K { f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }`:
/// Q4_K plus a fifth bit per weight from `qh`.
fn block_q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    for (n, (ql, y)) in b[48..176]
        .chunks_exact(32)
        .zip(y[..QK_K].chunks_exact_mut(64))
        .enumerate()
    {
        let (sc1, m1) = scale_min_k4(2 * n, scales);
        let (sc2, m2) = scale_min_k4(2 * n + 1, scales);
        let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
        let (u1, u2) = (1u8 << (2 * n), 2u8 << (2 * n));
        let (lo, hi) = y.split_at_mut(32);
        for (((&q, &h), lo), hi) in ql.iter().zip(qh).zip(lo).zip(hi) {
            let h1 = if h & u1 != 0 { 16 } else { 0 };
            let h2 = if h & u2 != 0 { 16 } else { 0 };
            *lo = d1 * f32::from((q & 0x0F) + h1) - m1;
            *hi = d2 * f32::from((q >> 4) + h2) - m2;
        }
    }
}

/// `block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; }`: 6-bit
/// weights in groups of 16 with signed 8-bit scales, `y = (d * sc) * (q - 32)`.
fn block_q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    let scales = &b[192..208];
    for n in 0..2 {
        let ql = &b[n * 64..n * 64 + 64];
        let qh = &b[128 + n * 32..128 + n * 32 + 32];
        let sc = &scales[n * 8..n * 8 + 8];
        let y = &mut y[n * 128..n * 128 + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            y[l] = d * f32::from(sc[is] as i8) * f32::from(q1);
            y[l + 32] = d * f32::from(sc[is + 2] as i8) * f32::from(q2);
            y[l + 64] = d * f32::from(sc[is + 4] as i8) * f32::from(q3);
            y[l + 96] = d * f32::from(sc[is + 6] as i8) * f32::from(q4);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    fn deq(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
        let mut out = vec![f32::NAN; bytes.len() / ty.type_size() * ty.block_size()];
        dequantize_into(ty, bytes, &mut out).expect("dequantize");
        out
    }

    #[test]
    fn plain_types() {
        let mut b = Vec::new();
        for x in [1.5f32, -2.25, 0.0] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        assert_eq!(deq(GgmlType::F32, &b), [1.5, -2.25, 0.0]);
        let b: Vec<u8> = [0.5f32, -3.0].iter().flat_map(|&x| f16_bytes(x)).collect();
        assert_eq!(deq(GgmlType::F16, &b), [0.5, -3.0]);
        // bf16 0x3FC0 = 1.5, 0xC040 = -3.0.
        assert_eq!(deq(GgmlType::BF16, &[0xC0, 0x3F, 0x40, 0xC0]), [1.5, -3.0]);
    }

    #[test]
    fn q4_0_and_q4_1_blocks() {
        let mut b = f16_bytes(0.5).to_vec();
        // qs[j] = j (low nibble) | (15 - j) << 4 (high nibble).
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = deq(GgmlType::Q4_0, &b);
        for j in 0..16 {
            assert_eq!(y[j], (j as f32 - 8.0) * 0.5, "low {j}");
            assert_eq!(y[j + 16], (7.0 - j as f32) * 0.5, "high {j}");
        }
        let mut b = f16_bytes(0.25).to_vec();
        b.extend(f16_bytes(-1.0));
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = deq(GgmlType::Q4_1, &b);
        assert_eq!(y[3], 3.0 * 0.25 - 1.0);
        assert_eq!(y[16], 15.0 * 0.25 - 1.0);
    }

    #[test]
    fn q5_0_and_q5_1_blocks() {
        // Fifth bit set for elements 1 and 17 only.
        let qh = (1u32 << 1) | (1u32 << 17);
        let mut b = f16_bytes(2.0).to_vec();
        b.extend(qh.to_le_bytes());
        b.extend([0x31u8; 16]); // low nibble 1, high nibble 3
        let y = deq(GgmlType::Q5_0, &b);
        assert_eq!(y[0], (1.0 - 16.0) * 2.0);
        assert_eq!(y[1], (17.0 - 16.0) * 2.0);
        assert_eq!(y[16], (3.0 - 16.0) * 2.0);
        assert_eq!(y[17], (19.0 - 16.0) * 2.0);
        let mut b = f16_bytes(2.0).to_vec();
        b.extend(f16_bytes(0.5));
        b.extend(qh.to_le_bytes());
        b.extend([0x31u8; 16]);
        let y = deq(GgmlType::Q5_1, &b);
        assert_eq!(y[1], 17.0 * 2.0 + 0.5);
        assert_eq!(y[18], 3.0 * 2.0 + 0.5);
    }

    #[test]
    fn q8_0_block() {
        let mut b = f16_bytes(0.125).to_vec();
        b.extend((0..32).map(|j: i32| ((j - 16) * 8) as i8 as u8));
        let y = deq(GgmlType::Q8_0, &b);
        for (j, &v) in y.iter().enumerate() {
            assert_eq!(v, ((j as i32 - 16) * 8) as f32 * 0.125);
        }
    }

    /// Packs eight 6-bit (scale, min) pairs the way `get_scale_min_k4` reads them.
    fn pack_k4_scales(sc: [u8; 8], m: [u8; 8]) -> [u8; 12] {
        let mut q = [0u8; 12];
        for j in 0..4 {
            q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            q[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            q[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
        }
        q
    }

    #[test]
    fn k4_scales_unpack() {
        let sc = [1, 20, 33, 63, 5, 40, 17, 62];
        let m = [63, 0, 9, 31, 48, 2, 60, 7];
        let packed = pack_k4_scales(sc, m);
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &packed), (sc[j], m[j]), "sub-block {j}");
        }
    }

    #[test]
    fn q4_k_and_q5_k_blocks() {
        let sc = [1, 2, 3, 4, 5, 6, 7, 63];
        let m = [0, 1, 2, 3, 4, 5, 6, 40];
        let mut b = f16_bytes(0.5).to_vec();
        b.extend(f16_bytes(0.25));
        b.extend(pack_k4_scales(sc, m));
        b.extend((0..128u32).map(|i| (i % 16) as u8 | (((i + 1) % 16) as u8) << 4));
        let y = deq(GgmlType::Q4_K, &b);
        for (i, &v) in y.iter().enumerate() {
            let (chunk, l, high) = (i / 64, i % 32, (i % 64) >= 32);
            let sub = 2 * chunk + usize::from(high);
            let byte = chunk * 32 + l;
            let q = if high { (byte + 1) % 16 } else { byte % 16 };
            let want = 0.5 * sc[sub] as f32 * q as f32 - 0.25 * m[sub] as f32;
            assert_eq!(v, want, "element {i}");
        }
        // Q5_K: same, with the fifth bit set for every weight of sub-block 7
        // (bit 7 of every qh byte).
        let mut b5 = b[..16].to_vec();
        b5.extend([0x80u8; 32]);
        b5.extend(&b[16..]);
        let y5 = deq(GgmlType::Q5_K, &b5);
        for i in 0..224 {
            assert_eq!(y5[i], y[i], "element {i}");
        }
        for (l, &v) in y5[224..].iter().enumerate() {
            let q = (l + 1) % 16 + 16;
            assert_eq!(
                v,
                0.5 * 63.0 * q as f32 - 0.25 * 40.0,
                "element {}",
                224 + l
            );
        }
    }

    #[test]
    fn q6_k_block() {
        let mut b = vec![0u8; 210];
        // Element 0: ql[0] low nibble 5, qh[0] bits 0-1 = 2 -> q = 37 - 32 = 5.
        b[0] = 0x05;
        b[128] = 0x02;
        // Element 96 (q4 of the first half, l = 0): ql[32] high nibble 15,
        // qh[0] bits 6-7 = 0 -> q = 15 - 32 = -17, scale index 6.
        b[32] = 0xF0;
        for (i, s) in b[192..208].iter_mut().enumerate() {
            *s = (i as i8 - 8) as u8;
        }
        b[208..210].copy_from_slice(&f16_bytes(0.5));
        let y = deq(GgmlType::Q6_K, &b);
        assert_eq!(y[0], 0.5 * -8.0 * 5.0);
        assert_eq!(y[96], 0.5 * -2.0 * -17.0);
        // Element 1: all-zero bits -> q = -32, scale index 0.
        assert_eq!(y[1], 0.5 * -8.0 * -32.0);
        // Element 16 uses scale index 1 (l / 16 = 1).
        assert_eq!(y[16], 0.5 * -7.0 * -32.0);
        // Second half (elements 128..): scales 8.., all bits zero.
        assert_eq!(y[128], 0.5 * 0.0 * -32.0);
        assert_eq!(y[255], 0.5 * 7.0 * -32.0);
    }

    #[test]
    fn q2_k_block() {
        let mut b = vec![0u8; 84];
        // Group 0 (elements 0..16): scale 3, min 2; group 1 (16..32): 5, 1.
        b[0] = 0x23;
        b[1] = 0x15;
        // qs[0] = 0b11_10_01_00: element 0 -> 0, element 32 -> 1, 64 -> 2, 96 -> 3.
        b[16] = 0b1110_0100;
        b[16 + 16] = 0b0000_0011; // element 16 -> 3
        b[2] = 0x07; // group 2 (elements 32..48): scale 7, min 0
        b[80..82].copy_from_slice(&f16_bytes(0.5));
        b[82..84].copy_from_slice(&f16_bytes(0.25));
        let y = deq(GgmlType::Q2_K, &b);
        assert_eq!(y[0], 0.5 * 3.0 * 0.0 - 0.25 * 2.0);
        assert_eq!(y[16], 0.5 * 5.0 * 3.0 - 0.25 * 1.0);
        assert_eq!(y[32], 0.5 * 7.0 * 1.0);
        assert_eq!(y[1], -0.5);
    }

    #[test]
    fn q3_k_block() {
        let scales_in: [i8; 16] = [-32, -1, 0, 1, 31, 7, -7, 12, 3, -3, 20, -20, 9, 0, 5, -5];
        let mut packed = [0u8; 12];
        for (k, &s) in scales_in.iter().enumerate() {
            let v = (s + 32) as u8;
            if k < 8 {
                packed[k] |= v & 0x0F;
            } else {
                packed[k - 8] |= (v & 0x0F) << 4;
            }
            packed[8 + k % 4] |= (v >> 4) << (2 * (k / 4));
        }
        assert_eq!(q3_k_scales(&packed), scales_in);
        let mut b = vec![0u8; 110];
        b[96..108].copy_from_slice(&packed);
        b[108..110].copy_from_slice(&f16_bytes(0.5));
        b[0] = 0x01; // hmask bit 0 of byte 0: element 0 has no -4 offset
        b[32] = 0b0000_0010; // qs[0] low 2 bits = 2 -> element 0
        let y = deq(GgmlType::Q3_K, &b);
        assert_eq!(y[0], 0.5 * -32.0 * 2.0);
        assert_eq!(y[1], 0.5 * -32.0 * -4.0);
        assert_eq!(y[16], -0.5 * -4.0);
        assert_eq!(y[255], 0.5 * -5.0 * -4.0);
    }

    #[test]
    fn parallel_path_matches_serial() {
        // 4096 Q8_0 blocks = 131072 elements, above PAR_MIN_ELEMENTS.
        let mut bytes = Vec::new();
        for i in 0..4096u32 {
            bytes.extend(f16_bytes((i % 7) as f32 * 0.125));
            bytes.extend((0..32u32).map(|j| (i.wrapping_mul(31) ^ j) as u8));
        }
        let all = deq(GgmlType::Q8_0, &bytes);
        assert!(all.len() >= PAR_MIN_ELEMENTS);
        for (i, block) in bytes.chunks_exact(34).enumerate().step_by(97) {
            assert_eq!(deq(GgmlType::Q8_0, block), all[i * 32..i * 32 + 32]);
        }
    }

    #[test]
    fn length_and_type_errors() {
        let mut out = [0.0f32; 32];
        let err = dequantize_into(GgmlType::Q8_0, &[0u8; 33], &mut out).unwrap_err();
        assert!(matches!(err, GgufError::LengthMismatch { .. }), "{err}");
        let err = dequantize_into(GgmlType::Q8_0, &[0u8; 68], &mut out).unwrap_err();
        assert!(
            err.to_string().contains("68 bytes of Q8_0 into 32 floats"),
            "{err}"
        );
        let err = dequantize_into(GgmlType::IQ2_XXS, &[0u8; 66], &mut [0.0; 256]).unwrap_err();
        assert!(matches!(
            err,
            GgufError::UnsupportedType {
                ty: GgmlType::IQ2_XXS,
                ..
            }
        ));
        assert!(dequantize_into(GgmlType::Q4_K, &[], &mut []).is_ok());
    }
}
