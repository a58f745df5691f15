//! Paged causal attention on the CPU: each query reads its sequence's keys
//! and values through the block table, with an online softmax (one pass, no
//! score buffer; Milakov & Gimelshein 2018, <https://arxiv.org/abs/1805.02867>).

use crate::kv_memory::KvSlots;
use rayon::prelude::*;

use crate::simd::{dot_fn, DotFn};

/// Largest head width the stack buffers hold.
pub const MAX_HEAD_DIM: usize = 512;
/// Largest KV block the stack buffers hold.
pub const MAX_BLOCK_SIZE: usize = 256;

/// One layer's K and V for every slot of the pool: `[slot, kv_head, head_dim]`.
pub struct LayerKv {
    /// Keys.
    pub k: KvSlots,
    /// Values.
    pub v: KvSlots,
}

/// Shapes and parameters of one layer's attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Slots per block.
    pub block_size: usize,
    /// Scores are `q·k * scale` (usually `head_dim^-0.5`).
    pub scale: f32,
    /// Sliding window: a token at `pos` attends to `pos + 1 - window ..= pos`
    /// only; `None`: its whole causal prefix.
    pub window: Option<usize>,
    /// The layer's group lists this many pages per block in its tables...
    pub pages_per_block: usize,
    /// ...and the layer reads page `part` of each block.
    pub part: usize,
}

/// Where a batch token sits: its sequence's block table and its position.
#[derive(Debug, Clone, Copy)]
pub struct TokenSite<'a> {
    /// The sequence's blocks.
    pub block_table: &'a [u32],
    /// Position of the token; it attends to positions `0..=pos`.
    pub pos: usize,
}

/// `out[t, h*hd..]` = softmax(q·Kᵀ·scale)·V over each token's causal prefix
/// (its last `window` positions on sliding layers).
/// `q` is `[tokens, num_heads * head_dim]`, as is `out`.
pub fn paged_attention(
    shape: AttentionShape,
    q: &[f32],
    kv: &LayerKv,
    sites: &[TokenSite<'_>],
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let group = shape.num_heads / shape.num_kv_heads;
    let scale = shape.scale;
    let dot = dot_fn();
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (t, h) = (idx / shape.num_heads, idx % shape.num_heads);
        let qh = &q[idx * hd..(idx + 1) * hd];
        attend_one(shape, qh, kv, sites[t], (h / group, scale), dot, o);
    });
}

fn attend_one(
    shape: AttentionShape,
    q: &[f32],
    kv: &LayerKv,
    site: TokenSite<'_>,
    (kv_head, scale): (usize, f32),
    dot: DotFn,
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let bs = shape.block_size;
    let row = shape.num_kv_heads * hd;
    let mut acc = [0f32; MAX_HEAD_DIM];
    let acc = &mut acc[..hd];
    let mut scores = [0f32; MAX_BLOCK_SIZE];
    let (mut max, mut denom) = (f32::NEG_INFINITY, 0f32);
    let len = site.pos + 1;
    // First visible position: blocks wholly before it are skipped, and the
    // block holding it is read from its offset on.
    let first = shape.window.map_or(0, |w| len.saturating_sub(w));
    let first_block = first / bs;
    let (ppb, part) = (shape.pages_per_block, shape.part);
    for b in first_block..len.div_ceil(bs) {
        let block = site.block_table[b * ppb + part];
        let lo = first.saturating_sub(b * bs);
        let n = bs.min(len - b * bs);
        let base = block as usize * bs * row + kv_head * hd;
        let mut block_max = f32::NEG_INFINITY;
        for (j, s) in scores[..n].iter_mut().enumerate().skip(lo) {
            let k = &kv.k[base + j * row..base + j * row + hd];
            *s = dot(q, k) * scale;
            block_max = block_max.max(*s);
        }
        let new_max = max.max(block_max);
        let correction = (max - new_max).exp();
        denom *= correction;
        for a in acc.iter_mut() {
            *a *= correction;
        }
        for (j, &s) in scores[..n].iter().enumerate().skip(lo) {
            let e = (s - new_max).exp();
            denom += e;
            let v = &kv.v[base + j * row..base + j * row + hd];
            for (a, x) in acc.iter_mut().zip(v) {
                *a += e * x;
            }
        }
        max = new_max;
    }
    let inv = 1.0 / denom;
    for (o, a) in out.iter_mut().zip(acc.iter()) {
        *o = a * inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain two-pass softmax attention over contiguous K/V, in f64.
    fn naive(q: &[f32], k: &[Vec<f32>], v: &[Vec<f32>]) -> Vec<f64> {
        let scale = 1.0 / (q.len() as f64).sqrt();
        let s: Vec<f64> = k
            .iter()
            .map(|kr| {
                kr.iter()
                    .zip(q)
                    .map(|(a, b)| (*a as f64) * (*b as f64))
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..q.len())
            .map(|d| e.iter().zip(v).map(|(w, vr)| w * vr[d] as f64).sum::<f64>() / z)
            .collect()
    }

    /// Paged attention of one token at position 9 (10 positions over 3
    /// blocks of 4) against the naive softmax over its visible positions.
    fn check_against_naive(window: Option<usize>, table: [u32; 3]) {
        let shape = AttentionShape {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            block_size: 4,
            scale: 1.0 / 8f32.sqrt(),
            window,
            pages_per_block: 1,
            part: 0,
        };
        let row = shape.num_kv_heads * shape.head_dim;
        let num_blocks = 6;
        let mut seed = 1u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let k: Vec<f32> = (0..num_blocks * 4 * row).map(|_| rnd()).collect();
        let v: Vec<f32> = (0..num_blocks * 4 * row).map(|_| rnd()).collect();
        let kv = LayerKv {
            k: KvSlots::from_values(&k).unwrap(),
            v: KvSlots::from_values(&v).unwrap(),
        };
        let pos = 9;
        let first = window.map_or(0, |w| (pos + 1usize).saturating_sub(w));
        let q: Vec<f32> = (0..shape.num_heads * shape.head_dim)
            .map(|_| rnd())
            .collect();
        let mut out = vec![0.0; q.len()];
        let sites = [TokenSite {
            block_table: &table,
            pos,
        }];
        paged_attention(shape, &q, &kv, &sites, &mut out);
        for h in 0..shape.num_heads {
            let g = h / 2;
            let slot = |p: usize| table[p / 4] as usize * 4 + p % 4;
            let ks: Vec<Vec<f32>> = (first..=pos)
                .map(|p| kv.k[slot(p) * row + g * 8..slot(p) * row + g * 8 + 8].to_vec())
                .collect();
            let vs: Vec<Vec<f32>> = (first..=pos)
                .map(|p| kv.v[slot(p) * row + g * 8..slot(p) * row + g * 8 + 8].to_vec())
                .collect();
            let want = naive(&q[h * 8..h * 8 + 8], &ks, &vs);
            for d in 0..8 {
                assert!(
                    (out[h * 8 + d] as f64 - want[d]).abs() < 1e-5,
                    "window {window:?} head {h}"
                );
            }
        }
    }

    #[test]
    fn paged_matches_naive_across_scattered_blocks() {
        check_against_naive(None, [5, 1, 3]);
    }

    #[test]
    fn sliding_window_sees_only_the_last_positions() {
        // Windows ending inside a block, on a block edge, covering the whole
        // prefix and larger than it.
        for w in [1, 3, 4, 5, 6, 10, 64] {
            check_against_naive(Some(w), [5, 1, 3]);
        }
        // Blocks wholly outside the window are never read: a table entry
        // past the pool (a freed block) is harmless.
        check_against_naive(Some(6), [1000, 1, 3]);
    }
}
