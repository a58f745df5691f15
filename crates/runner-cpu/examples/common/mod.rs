//! What the quantized-kernel examples share.

use ingot_runner_cpu::quant::QuantKind;

/// `rows` rows of `k` weights as random-looking blocks of `kind` (`seed`
/// shifts the pattern, so copies differ), every f16 scale set to a small
/// finite value so the sums stay finite.
pub fn blocks(kind: QuantKind, rows: usize, k: usize, seed: usize) -> Vec<u8> {
    let t = kind.ggml();
    let size = t.type_size();
    let mut out: Vec<u8> = (0..rows * k / t.block_size() * size)
        .map(|i| ((i + seed).wrapping_mul(2_654_435_761) >> 7) as u8)
        .collect();
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    let at: &[usize] = match kind {
        QuantKind::Q6K => &[208],
        QuantKind::Q4_1 | QuantKind::Q5_1 | QuantKind::Q4K | QuantKind::Q5K => &[0, 2],
        _ => &[0],
    };
    for blk in out.chunks_exact_mut(size) {
        for &a in at {
            blk[a..a + 2].copy_from_slice(&scale);
        }
    }
    out
}
