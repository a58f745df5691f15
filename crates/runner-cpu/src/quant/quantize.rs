//! Quantization at load (`--quantization q8_0|q4_0|q4_k`): rows of f32
//! weights to ggml blocks, in the files' own layouts, so the blocks run on
//! the same kernels as a quantized GGUF's and dequantize with ggml's rules.

use super::QuantKind;

/// Quantizes `x` (whole rows of `cols`) to `kind`. A row length the format's
/// block does not divide falls back to Q8_0 (k-quants need 256 per row;
/// SmolLM2's 576-wide rows are such a case), or `None` when not even 32
/// does. Returns the format used and the blocks.
pub fn quantize(kind: QuantKind, x: &[f32], cols: usize) -> Option<(QuantKind, Vec<u8>)> {
    if cols == 0 || !x.len().is_multiple_of(cols) || !cols.is_multiple_of(32) {
        return None;
    }
    let kind = if cols.is_multiple_of(kind.ggml().block_size()) {
        kind
    } else {
        QuantKind::Q8_0
    };
    let blocks = match kind {
        QuantKind::Q4_0 => quantize_q4_0(x),
        QuantKind::Q4K => quantize_q4_k(x),
        _ => quantize_q8_0(x),
    };
    let kind = match kind {
        QuantKind::Q4_0 | QuantKind::Q4K => kind,
        _ => QuantKind::Q8_0,
    };
    Some((kind, blocks))
}

/// Q8_0 (`x.len()` a multiple of 32): `d = amax / 127` stored as f16,
/// `q = round(x / d)` with the stored (rounded) `d`, so dequantizing gives
/// back `x` within `d / 2`.
pub fn quantize_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 34);
    for blk in x.chunks_exact(32) {
        let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = half::f16::from_f32(amax / 127.0);
        let inv = inverse(d.to_f32());
        out.extend_from_slice(&d.to_le_bytes());
        out.extend(
            blk.iter()
                .map(|&v| (v * inv).round().clamp(-127.0, 127.0) as i8 as u8),
        );
    }
    out
}

/// Q4_0 (`x.len()` a multiple of 32), ggml's rule: the value of largest
/// magnitude maps to -8, `d = it / -8`, `q = min(15, x / d + 8.5)`
/// truncated; element `j` in the low nibble of byte `j`, `j + 16` in its
/// high nibble. Error within `|d| / 2` (`|d|` at the clamped top).
pub fn quantize_q4_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 18);
    for blk in x.chunks_exact(32) {
        let max = blk
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -8.0;
        let inv = inverse(d);
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        let q = |v: f32| ((v * inv + 8.5) as i32).clamp(0, 15) as u8;
        out.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
    }
    out
}

/// Q4_K (`x.len()` a multiple of 256): per sub-block of 32 a scale and a
/// min from its range (`x ≈ d·sc·q − dmin·m`, `q` in 0..=15), the 6-bit
/// `sc` and `m` relative to the super-block's f16 `d` and `dmin`, and each
/// `q` rounded against the stored (rounded) scale and min. A min/max fit,
/// simpler than llama.cpp's iterative search: a little less accurate.
pub fn quantize_q4_k(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 256 * 144);
    for sb in x.chunks_exact(256) {
        let mut scale = [0f32; 8];
        let mut min = [0f32; 8];
        for (j, sub) in sb.chunks_exact(32).enumerate() {
            let lo = sub.iter().fold(0f32, |a, &v| a.min(v));
            let hi = sub.iter().fold(f32::MIN, |a, &v| a.max(v));
            scale[j] = (hi - lo) / 15.0;
            min[j] = -lo;
        }
        let d = half::f16::from_f32(scale.iter().fold(0f32, |a, &v| a.max(v)) / 63.0);
        let dmin = half::f16::from_f32(min.iter().fold(0f32, |a, &v| a.max(v)) / 63.0);
        let (id, idmin) = (inverse(d.to_f32()), inverse(dmin.to_f32()));
        // Scales round up so the top of each range still fits in 15 steps.
        let sc = scale.map(|s| (s * id).ceil().clamp(0.0, 63.0) as u8);
        let mn = min.map(|m| (m * idmin).round().clamp(0.0, 63.0) as u8);
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&dmin.to_le_bytes());
        out.extend_from_slice(&pack_scales_mins_k4(&sc, &mn));
        let mut q = [0u8; 256];
        for (j, sub) in sb.chunks_exact(32).enumerate() {
            let step = d.to_f32() * f32::from(sc[j]);
            let off = dmin.to_f32() * f32::from(mn[j]);
            let inv = inverse(step);
            for (l, &v) in sub.iter().enumerate() {
                q[32 * j + l] = ((v + off) * inv).round().clamp(0.0, 15.0) as u8;
            }
        }
        for c in 0..4 {
            out.extend((0..32).map(|l| q[64 * c + l] | (q[64 * c + 32 + l] << 4)));
        }
    }
    out
}

/// The 12-byte packing of eight 6-bit scales and mins (the inverse of
/// ggml's `get_scale_min_k4`).
fn pack_scales_mins_k4(sc: &[u8; 8], mn: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            q[j] = sc[j];
            q[j + 4] = mn[j];
        } else {
            q[j + 4] = (sc[j] & 0xF) | ((mn[j] & 0xF) << 4);
            q[j - 4] |= (sc[j] >> 4) << 6;
            q[j] |= (mn[j] >> 4) << 6;
        }
    }
    q
}

/// `1 / v`, or 0 for an all-zero block.
fn inverse(v: f32) -> f32 {
    if v != 0.0 {
        1.0 / v
    } else {
        0.0
    }
}
