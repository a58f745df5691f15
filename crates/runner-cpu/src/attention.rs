//! Paged causal attention on the CPU: each query reads its sequence's keys
//! and values through the block table, with an online softmax (one pass, no
//! score buffer; Milakov & Gimelshein 2018, <https://arxiv.org/abs/1805.02867>).

use crate::kv_memory::KvSlots;
use rayon::prelude::*;

use crate::simd::{dot_fn, exp_shifted};

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
    /// The softmax weights from an 8-lane polynomial exp instead of the C
    /// library's (`model.cpu_fast_exp`; within 2 ulp, not the same bits).
    pub fast_exp: bool,
}

/// Where a batch token sits: its sequence's block table and its position.
#[derive(Debug, Clone, Copy)]
pub struct TokenSite<'a> {
    /// The sequence's blocks.
    pub block_table: &'a [u32],
    /// Position of the token; it attends to positions `0..=pos`.
    pub pos: usize,
}

/// Most query heads one task attends with (sharing its key/value head's
/// reads): the group of a grouped-query layer, or a divisor of it.
const MAX_HEADS_PER_TASK: usize = 8;

/// `out[t, h*hd..]` = softmax(q·Kᵀ·scale)·V over each token's causal prefix
/// (its last `window` positions on sliding layers).
/// `q` is `[tokens, num_heads * head_dim]`, as is `out`.
///
/// A task takes one token's query heads that share a key/value head (up to
/// [`MAX_HEADS_PER_TASK`]), so each key and value row is read once for all
/// of them; every head's arithmetic is [`attend_one`]'s, in its order, so
/// the result is the same to the bit however the heads are grouped.
pub fn paged_attention(
    shape: AttentionShape,
    q: &[f32],
    kv: &LayerKv,
    sites: &[TokenSite<'_>],
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let group = shape.num_heads / shape.num_kv_heads;
    let heads = (1..=MAX_HEADS_PER_TASK.min(group))
        .rev()
        .find(|n| group.is_multiple_of(*n))
        .unwrap_or(1);
    let dot = dot_fn();
    let wide = crate::simd::avx2_fma();
    out.par_chunks_mut(heads * hd)
        .enumerate()
        .for_each(|(task, o)| {
            let first = task * heads;
            let (t, h) = (first / shape.num_heads, first % shape.num_heads);
            let task = HeadTask {
                q: &q[first * hd..(first + heads) * hd],
                site: sites[t],
                kv_head: h / group,
            };
            if wide {
                // SAFETY: `avx2_fma` found AVX2 and FMA.
                unsafe { attend_heads_avx2(shape, kv, task, o) }
            } else {
                attend_heads(shape, kv, task, (dot, exp_shifted), o);
            }
        });
}

/// One task's query heads (consecutive, one key/value head).
#[derive(Clone, Copy)]
struct HeadTask<'a> {
    /// `[heads, head_dim]`.
    q: &'a [f32],
    site: TokenSite<'a>,
    kv_head: usize,
}

/// [`attend_heads`] with [`dot_fn`]'s AVX2 dot product inlined and the
/// element loops vectorised 8 wide. Each lane does the scalar code's
/// multiply and add (no fused multiply-add), so the bits are the same.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_heads_avx2(
    shape: AttentionShape,
    kv: &LayerKv,
    task: HeadTask<'_>,
    out: &mut [f32],
) {
    // SAFETY: this function's features are the dot product's and the
    // fast exp's.
    let dot = |a: &[f32], b: &[f32]| unsafe { crate::simd::dot_avx2(a, b) };
    if shape.fast_exp {
        let exp = |xs: &mut [f32], m| unsafe { crate::simd::exp_shifted_avx2(xs, m) };
        attend_heads(shape, kv, task, (dot, exp), out);
    } else {
        attend_heads(shape, kv, task, (dot, exp_shifted), out);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn attend_heads_avx2(
    shape: AttentionShape,
    kv: &LayerKv,
    task: HeadTask<'_>,
    out: &mut [f32],
) {
    attend_heads(
        shape,
        kv,
        task,
        (crate::simd::dot_portable, exp_shifted),
        out,
    );
}

/// Online-softmax attention of `task`'s heads, block by block: per head the
/// operations of [`attend_one`], in the same order. Each key row is loaded
/// once for all the heads' scores; a head's block of scores then becomes
/// its softmax weights (`exp`: `xs[i] = e^(xs[i] - max)`, [`exp_shifted`]'s
/// bits unless `fast_exp`), and the value rows run head by head (a head's
/// accumulator stays in registers across a block's positions).
#[inline(always)]
fn attend_heads(
    shape: AttentionShape,
    kv: &LayerKv,
    task: HeadTask<'_>,
    (dot, exp): (impl Fn(&[f32], &[f32]) -> f32, impl Fn(&mut [f32], f32)),
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let heads = task.q.len() / hd;
    let bs = shape.block_size;
    let row = shape.num_kv_heads * hd;
    let mut acc = [[0f32; MAX_HEAD_DIM]; MAX_HEADS_PER_TASK];
    let mut scores = [[0f32; MAX_BLOCK_SIZE]; MAX_HEADS_PER_TASK];
    let mut max = [f32::NEG_INFINITY; MAX_HEADS_PER_TASK];
    let mut denom = [0f32; MAX_HEADS_PER_TASK];
    let site = task.site;
    let len = site.pos + 1;
    // First visible position: blocks wholly before it are skipped, and the
    // block holding it is read from its offset on.
    let first = shape.window.map_or(0, |w| len.saturating_sub(w));
    let (ppb, part) = (shape.pages_per_block, shape.part);
    let blocks = len.div_ceil(bs);
    for b in first / bs..blocks {
        let block = site.block_table[b * ppb + part];
        let lo = first.saturating_sub(b * bs);
        let n = bs.min(len - b * bs);
        let base = block as usize * bs * row + task.kv_head * hd;
        if b + 1 < blocks {
            // Blocks are scattered in the pool: ask for the next one's rows
            // while this one is computed.
            let next =
                site.block_table[(b + 1) * ppb + part] as usize * bs * row + task.kv_head * hd;
            prefetch_rows(kv, next, (bs.min(len - (b + 1) * bs), row, hd));
        }
        let mut block_max = [f32::NEG_INFINITY; MAX_HEADS_PER_TASK];
        for (j, k) in kv.k[base..].chunks(row).enumerate().take(n).skip(lo) {
            let k = &k[..hd];
            let per_head = task.q.chunks_exact(hd).zip(&mut scores).zip(&mut block_max);
            for ((q, scores), block_max) in per_head {
                let s = dot(q, k) * shape.scale;
                scores[j] = s;
                *block_max = block_max.max(s);
            }
        }
        let per_head = scores
            .iter_mut()
            .zip(&block_max)
            .zip(&mut max)
            .zip(&mut denom)
            .zip(&mut acc);
        for ((((scores, block_max), max), denom), acc) in per_head.take(heads) {
            let new_max = max.max(*block_max);
            let correction = (*max - new_max).exp();
            *denom *= correction;
            let acc = &mut acc[..hd];
            for a in acc.iter_mut() {
                *a *= correction;
            }
            *max = new_max;
            exp(&mut scores[lo..n], new_max);
            for (v, &e) in kv.v[base..].chunks(row).zip(&scores[..n]).skip(lo) {
                *denom += e;
                for (a, x) in acc.iter_mut().zip(&v[..hd]) {
                    *a += e * x;
                }
            }
        }
    }
    for (g, o) in out.chunks_mut(hd).enumerate() {
        let inv = 1.0 / denom[g];
        for (o, a) in o.iter_mut().zip(&acc[g][..hd]) {
            *o = a * inv;
        }
    }
}

/// Prefetches `n` key and value rows of `hd` floats, `row` apart, from
/// slot offset `base` (a hint: no effect on results).
#[inline(always)]
fn prefetch_rows(kv: &LayerKv, base: usize, (n, row, hd): (usize, usize, usize)) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for j in 0..n {
            let at = base + j * row;
            for line in (0..hd).step_by(16) {
                for m in [&kv.k, &kv.v] {
                    if let Some(x) = m.get(at + line) {
                        // SAFETY: a prefetch of an address inside the slice.
                        unsafe { _mm_prefetch::<_MM_HINT_T0>((x as *const f32).cast()) };
                    }
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (kv, base, n, row, hd);
}

/// One head's attention, alone: what [`attend_heads`] computes for each of
/// its heads (the reference its bit-identity is tested against).
#[cfg(test)]
fn attend_one(
    shape: AttentionShape,
    q: &[f32],
    kv: &LayerKv,
    site: TokenSite<'_>,
    (kv_head, scale): (usize, f32),
    dot: crate::simd::DotFn,
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
    fn check_against_naive(window: Option<usize>, table: [u32; 3], fast_exp: bool) {
        let shape = AttentionShape {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            block_size: 4,
            scale: 1.0 / 8f32.sqrt(),
            window,
            pages_per_block: 1,
            part: 0,
            fast_exp,
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
                    "window {window:?} head {h} fast exp {fast_exp}"
                );
            }
        }
    }

    /// Heads attended together, sharing their key/value rows (and the
    /// element loops vectorised), give every head's one-at-a-time result to
    /// the bit: grouped-query layers of 3, 8, 5 (prime) and 12 (two tasks)
    /// heads a key/value head, several tokens, sliding windows.
    #[test]
    fn grouped_heads_equal_one_head_at_a_time() {
        let mut seed = 7u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for (num_heads, num_kv_heads, window) in [
            (9, 3, None),
            (16, 2, Some(13)),
            (5, 1, None),
            (24, 2, Some(40)),
        ] {
            let shape = AttentionShape {
                num_heads,
                num_kv_heads,
                head_dim: 64,
                block_size: 16,
                scale: 0.125,
                window,
                pages_per_block: 1,
                part: 0,
                fast_exp: false,
            };
            let row = num_kv_heads * 64;
            let slots = 8 * 16;
            let k: Vec<f32> = (0..slots * row).map(|_| rnd()).collect();
            let v: Vec<f32> = (0..slots * row).map(|_| rnd()).collect();
            let kv = LayerKv {
                k: KvSlots::from_values(&k).unwrap(),
                v: KvSlots::from_values(&v).unwrap(),
            };
            let table = [6u32, 0, 3, 7, 2, 5, 1, 4];
            let sites: Vec<TokenSite<'_>> = [0, 15, 16, 57, 127]
                .iter()
                .map(|&pos| TokenSite {
                    block_table: &table,
                    pos,
                })
                .collect();
            let q: Vec<f32> = (0..sites.len() * num_heads * 64).map(|_| rnd()).collect();
            let mut out = vec![0.0; q.len()];
            paged_attention(shape, &q, &kv, &sites, &mut out);
            let group = num_heads / num_kv_heads;
            for (idx, got) in out.chunks(64).enumerate() {
                let (t, h) = (idx / num_heads, idx % num_heads);
                let mut want = vec![0.0; 64];
                let qh = &q[idx * 64..(idx + 1) * 64];
                attend_one(
                    shape,
                    qh,
                    &kv,
                    sites[t],
                    (h / group, 0.125),
                    dot_fn(),
                    &mut want,
                );
                let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(got),
                    bits(&want),
                    "{num_heads}/{num_kv_heads} heads, token {t}, head {h}"
                );
            }
        }
    }

    /// Both softmax exps (the C library's, the 8-lane polynomial).
    #[test]
    fn paged_matches_naive_across_scattered_blocks() {
        for fast_exp in [false, true] {
            check_against_naive(None, [5, 1, 3], fast_exp);
        }
    }

    #[test]
    fn sliding_window_sees_only_the_last_positions() {
        for fast_exp in [false, true] {
            // Windows ending inside a block, on a block edge, covering the
            // whole prefix and larger than it.
            for w in [1, 3, 4, 5, 6, 10, 64] {
                check_against_naive(Some(w), [5, 1, 3], fast_exp);
            }
            // Blocks wholly outside the window are never read: a table
            // entry past the pool (a freed block) is harmless.
            check_against_naive(Some(6), [1000, 1, 3], fast_exp);
        }
    }
}
