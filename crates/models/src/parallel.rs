//! Tensor parallelism's sharding plan: which slice of each weight a rank
//! holds, the config a rank computes with, and a [`TensorSource`] that
//! hands a rank its slices.
//!
//! Megatron-style: q/k/v and gate/up are column-parallel (each rank owns a
//! range of attention heads, KV heads and MLP columns: rows of the `[out,
//! in]` weights), o_proj and down are row-parallel (the matching columns),
//! so each block's output is a partial sum that one all-reduce completes.
//! Experts are split the same way along their width (every rank holds a
//! slice of every expert: the routing is replicated and the load is even
//! whatever the router picks). The LM head is vocabulary-parallel: each
//! rank holds `vocab_rows` rows (the last rank's tail zero-padded) and the
//! logits are gathered. Norms, biases of replicated outputs, the router
//! and the embedding table are replicated (a lookup reads only its own
//! rows, so a replicated table costs memory, not bandwidth, and saves an
//! all-reduce per step).

use std::ops::Range;

use rayon::prelude::*;

use crate::{Bf16Tensor, HostTensor, ModelConfig, ModelError, QuantTensor, TensorSource};

/// One rank's place in a tensor-parallel group, carried by its
/// [`ModelConfig`] (see [`ShardPlan::rank_config`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This rank, `0..size`.
    pub rank: usize,
    /// Ranks in the group.
    pub size: usize,
    /// The full vocabulary (the rank config's `vocab_size` is the same: the
    /// embedding is replicated).
    pub vocab: usize,
    /// LM-head rows per rank: `ceil(vocab / size)`; rank `r` holds
    /// vocabulary `r * vocab_rows ..` (padded with zero rows past `vocab`).
    pub vocab_rows: usize,
    /// The whole model's KV heads: with more ranks than KV heads, each
    /// rank holds one, shared by `size / kv_heads` ranks (as vLLM does).
    pub kv_heads: usize,
}

impl Shard {
    /// The vocabulary ids this rank's LM-head rows stand for (the padding
    /// rows excluded).
    pub fn vocab_range(&self) -> Range<usize> {
        let start = (self.rank * self.vocab_rows).min(self.vocab);
        start..((self.rank + 1) * self.vocab_rows).min(self.vocab)
    }
}

/// How one tensor is split: along `dim`, the rank holds `start..start +
/// len` of `full` (rows past `full` read as zeros: the LM head's padding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// The dimension split, outermost first.
    pub dim: usize,
    /// The rank's first index along `dim`.
    pub start: usize,
    /// Indices the rank holds along `dim`.
    pub len: usize,
    /// The tensor's size along `dim`.
    pub full: usize,
}

/// The sharding of one model over `size` ranks.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardPlan {
    config: ModelConfig,
    size: usize,
}

/// The name of the LM head's tensor (present on every rank under tensor
/// parallelism: a tied model's rows come from the embedding table).
pub const LM_HEAD: &str = "lm_head.weight";
const EMBED: &str = "model.embed_tokens.weight";

impl ShardPlan {
    /// The plan for `config` over `size` ranks, or an error naming what does
    /// not divide.
    pub fn new(config: &ModelConfig, size: usize) -> Result<Self, ModelError> {
        if size == 0 {
            return Err(invalid("tensor_parallel_size must be at least 1".into()));
        }
        let mut parts = vec![
            ("attention heads", config.num_heads),
            (
                "the MLP width (intermediate_size)",
                config.intermediate_size,
            ),
        ];
        if let Some(moe) = &config.block.moe {
            parts.push(("the expert width", moe.expert_intermediate_size));
        }
        for (what, n) in parts {
            if !n.is_multiple_of(size) {
                return Err(invalid(format!(
                    "tensor_parallel_size {size} does not divide {what} ({n}); use a size that does"
                )));
            }
        }
        let kv = config.num_kv_heads;
        if !kv.is_multiple_of(size) && !size.is_multiple_of(kv) {
            return Err(invalid(format!(
                "tensor_parallel_size {size} neither divides nor is a multiple of the KV heads ({kv}); use a size that is"
            )));
        }
        // The GEMV and expert kernels read rows in 16-byte pieces.
        let ff = config.intermediate_size / size;
        let width = config
            .block
            .moe
            .as_ref()
            .map_or(8, |m| m.expert_intermediate_size / size);
        if !ff.is_multiple_of(8) || !width.is_multiple_of(8) {
            return Err(invalid(format!(
                "tensor_parallel_size {size} leaves {ff} MLP / {width} expert columns per rank, not a multiple of 8; use a smaller size"
            )));
        }
        Ok(Self {
            config: config.clone(),
            size,
        })
    }

    /// What rank `rank` computes with: its heads, KV heads, MLP and expert
    /// columns, the full vocabulary for the (replicated) embedding, its
    /// own LM-head tensor (untied) and its [`Shard`] (which sizes it).
    pub fn rank_config(&self, rank: usize) -> ModelConfig {
        let n = self.size;
        let mut c = self.config.clone();
        c.num_heads /= n;
        // Fewer KV heads than ranks: one each, replicated.
        c.num_kv_heads = (c.num_kv_heads / n).max(1);
        c.intermediate_size /= n;
        if let Some(moe) = c.block.moe.as_mut() {
            moe.expert_intermediate_size /= n;
        }
        // Every rank holds its own rows of the head, tied or not.
        c.tie_word_embeddings = false;
        c.shard = Some(self.shard(rank));
        c
    }

    /// Rank `rank`'s place in the group.
    fn shard(&self, rank: usize) -> Shard {
        let vocab = self.config.vocab_size;
        Shard {
            rank,
            size: self.size,
            vocab,
            vocab_rows: vocab.div_ceil(self.size),
            kv_heads: self.config.num_kv_heads,
        }
    }

    /// How rank `rank` holds the canonical tensor `name` of shape `shape`
    /// (the whole model's); `None`: replicated.
    pub fn split(&self, name: &str, shape: &[usize], rank: usize) -> Option<Split> {
        let dim = split_dim(name)?;
        let full = *shape.get(dim)?;
        let (n, kv) = (self.size, self.config.num_kv_heads);
        let len = if name == LM_HEAD {
            full.div_ceil(n)
        } else if is_kv(name) && n > kv {
            full / kv
        } else {
            full / n
        };
        let mut rank_shape = shape.to_vec();
        rank_shape[dim] = len;
        self.shard(rank).split(name, &rank_shape)
    }
}

impl Shard {
    /// How this rank holds `name`, given its slice's shape (what a rank
    /// that sees only its own config knows); `None`: replicated.
    pub fn split(&self, name: &str, rank_shape: &[usize]) -> Option<Split> {
        let dim = split_dim(name)?;
        let len = *rank_shape.get(dim)?;
        let (start, full) = if name == LM_HEAD {
            (self.rank * len, self.vocab)
        } else if is_kv(name) {
            // `len` holds `max(1, kv_heads / size)` heads from head
            // `rank * kv_heads / size` on.
            let head_dim = len / (self.kv_heads / self.size).max(1);
            let first = self.rank * self.kv_heads / self.size;
            (first * head_dim, self.kv_heads * head_dim)
        } else {
            (self.rank * len, len * self.size)
        };
        Some(Split {
            dim,
            start,
            len,
            full,
        })
    }
}

/// A K or V projection (weight or bias): split by KV heads.
fn is_kv(name: &str) -> bool {
    name.contains("self_attn.k_proj.") || name.contains("self_attn.v_proj.")
}

/// The dimension a canonical tensor is split along; `None`: replicated.
fn split_dim(name: &str) -> Option<usize> {
    if name == LM_HEAD {
        return Some(0);
    }
    // `model.layers.{i}.<suffix>`
    let suffix = name.strip_prefix("model.layers.")?.split_once('.')?.1;
    match suffix {
        "self_attn.q_proj.weight"
        | "self_attn.q_proj.bias"
        | "self_attn.k_proj.weight"
        | "self_attn.k_proj.bias"
        | "self_attn.v_proj.weight"
        | "self_attn.v_proj.bias"
        | "mlp.gate_proj.weight"
        | "mlp.up_proj.weight" => Some(0),
        "self_attn.o_proj.weight" | "mlp.down_proj.weight" => Some(1),
        crate::llama::EXPERTS_GATE | crate::llama::EXPERTS_UP => Some(1),
        crate::llama::EXPERTS_DOWN => Some(2),
        _ => None,
    }
}

fn invalid(message: String) -> ModelError {
    ModelError::InvalidConfig(message)
}

/// Rank `rank`'s slices of `inner`'s tensors under `plan`: split tensors
/// come sliced (f32 or bf16; quantized blocks are not offered, so a
/// backend dequantizes), the rest as they are. [`LM_HEAD`] exists on
/// every rank (a tied model's comes from the embedding table).
pub struct ShardedSource<'a> {
    inner: &'a dyn TensorSource,
    plan: &'a ShardPlan,
    rank: usize,
}

impl<'a> ShardedSource<'a> {
    /// Rank `rank`'s view of `inner`.
    pub fn new(inner: &'a dyn TensorSource, plan: &'a ShardPlan, rank: usize) -> Self {
        Self { inner, plan, rank }
    }

    /// The stored tensor `name` comes from (the embedding for a tied head).
    fn stored<'n>(&self, name: &'n str) -> &'n str {
        if name == LM_HEAD && !self.inner.contains(LM_HEAD) {
            EMBED
        } else {
            name
        }
    }
}

/// `data` of `shape` sliced by `split`, each element `per` items of `T`
/// (an f32, or a bf16's two bytes): for every index of the dims before
/// `split.dim`, `split.len` slabs of the inner dims, zeros past the end.
fn slice<T: Copy + Default>(data: &[T], shape: &[usize], split: &Split, per: usize) -> Vec<T> {
    let outer: usize = shape[..split.dim].iter().product();
    let inner: usize = shape[split.dim + 1..].iter().product::<usize>() * per;
    let mut out = vec![T::default(); outer * split.len * inner];
    let present = split.full.saturating_sub(split.start).min(split.len);
    for o in 0..outer {
        let from = (o * split.full + split.start) * inner;
        let to = o * split.len * inner;
        out[to..to + present * inner].copy_from_slice(&data[from..from + present * inner]);
    }
    out
}

/// `shape` with `split.dim` at the rank's size.
fn sliced_shape(shape: &[usize], split: &Split) -> Vec<usize> {
    let mut s = shape.to_vec();
    s[split.dim] = split.len;
    s
}

/// Split `split` of the block-quantized `t` in f32, dequantizing only the
/// blocks it covers (zeros past the tensor's end, as [`slice`] pads);
/// `None` when a split of the innermost dimension falls inside blocks or
/// the bytes do not cover the shape.
pub(crate) fn dequantize_slice(
    t: &QuantTensor,
    split: &Split,
) -> Result<Option<HostTensor>, ModelError> {
    let ty = t.ggml_type;
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let Some(&cols) = t.shape.last() else {
        return Ok(None);
    };
    // Elements one index along the split dimension covers: whole rows
    // (whole blocks) unless the split is the innermost dimension itself.
    let inner: usize = t.shape[split.dim + 1..].iter().product();
    let outer: usize = t.shape[..split.dim].iter().product();
    let present = split.full.saturating_sub(split.start).min(split.len);
    let aligned = |n: usize| bs > 0 && n.is_multiple_of(bs);
    let elems = present * inner;
    let total: usize = t.shape.iter().product();
    let bytes = t.data.bytes();
    if !aligned(cols)
        || !aligned(split.start * inner)
        || !aligned(elems)
        || bytes.len() != total / bs * ts
    {
        return Ok(None);
    }
    let mut out = vec![0f32; outer * split.len * inner];
    out.par_chunks_mut((split.len * inner).max(1))
        .enumerate()
        .try_for_each(|(o, dst)| {
            let first = (o * split.full + split.start) * inner;
            let src = &bytes[first / bs * ts..(first + elems) / bs * ts];
            crate::gguf::dequantize_into(ty, src, &mut dst[..elems])
        })?;
    Ok(Some(HostTensor::new(sliced_shape(&t.shape, split), out)))
}

impl TensorSource for ShardedSource<'_> {
    fn load(&self, name: &str) -> Result<HostTensor, ModelError> {
        let rank_split = |shape: &[usize]| self.plan.split(name, shape, self.rank);
        if let Some(t) = self.inner.load_slice(self.stored(name), &rank_split)? {
            return Ok(t);
        }
        let t = self.inner.load(self.stored(name))?;
        let Some(split) = self.plan.split(name, &t.shape, self.rank) else {
            return Ok(t);
        };
        let data = slice(&t.data, &t.shape, &split, 1);
        Ok(HostTensor::new(sliced_shape(&t.shape, &split), data))
    }

    fn load_bf16(&self, name: &str) -> Result<Option<Bf16Tensor<'_>>, ModelError> {
        let Some(t) = self.inner.load_bf16(self.stored(name))? else {
            return Ok(None);
        };
        let Some(split) = self.plan.split(name, &t.shape, self.rank) else {
            return Ok(Some(t));
        };
        Ok(Some(Bf16Tensor {
            shape: sliced_shape(&t.shape, &split),
            bytes: slice(&t.bytes, &t.shape, &split, 2).into(),
        }))
    }

    /// Never: a slice of a block-quantized tensor is not offered (the
    /// backend takes the floats).
    fn load_blocks(&self, _name: &str) -> Result<Option<QuantTensor>, ModelError> {
        Ok(None)
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(self.stored(name))
    }

    fn dtype_summary(&self) -> Vec<(String, usize)> {
        self.inner.dtype_summary()
    }

    fn dtype_bytes(&self) -> Vec<(String, usize)> {
        self.inner.dtype_bytes()
    }

    /// The same seed: a backend that makes random weights in place makes
    /// the whole model's values at the slice's indices (see [`Split`]).
    fn random_seed(&self) -> Option<u64> {
        self.inner.random_seed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;
    use crate::llama::expected_shapes;
    use crate::BlockData;

    /// Q8_0 blocks of `rows × cols` (d = 1/64, quants cycling): and their
    /// f32 values.
    fn q8_0(rows: usize, cols: usize) -> (QuantTensor, Vec<f32>) {
        let mut bytes = Vec::new();
        let mut values = Vec::new();
        for b in 0..rows * cols / 32 {
            bytes.extend_from_slice(&half::f16::from_f32(1.0 / 64.0).to_le_bytes());
            for i in 0..32 {
                let q = ((b * 7 + i * 3) % 255) as i32 - 127;
                bytes.push(q as i8 as u8);
                values.push(q as f32 / 64.0);
            }
        }
        let t = QuantTensor {
            ggml_type: GgmlType::Q8_0,
            shape: vec![rows, cols],
            data: BlockData::Owned(bytes),
        };
        (t, values)
    }

    /// Slices of blocks equal the slices of the dequantized whole, rows
    /// (with the padded tail) and block-aligned columns; columns inside
    /// blocks are refused.
    #[test]
    fn dequantized_slices_equal_slices_of_the_whole() {
        let (t, whole) = q8_0(6, 128);
        let splits = [
            Split {
                dim: 0,
                start: 2,
                len: 2,
                full: 6,
            },
            Split {
                dim: 0,
                start: 4,
                len: 4,
                full: 6,
            },
            Split {
                dim: 1,
                start: 32,
                len: 64,
                full: 128,
            },
            Split {
                dim: 1,
                start: 96,
                len: 64,
                full: 128,
            },
        ];
        for split in splits {
            let got = dequantize_slice(&t, &split).unwrap().unwrap();
            assert_eq!(got.shape, sliced_shape(&t.shape, &split), "{split:?}");
            assert_eq!(got.data, slice(&whole, &t.shape, &split, 1), "{split:?}");
        }
        let inside = Split {
            dim: 1,
            start: 16,
            len: 32,
            full: 128,
        };
        assert!(dequantize_slice(&t, &inside).unwrap().is_none());
    }

    fn config(name: &str) -> ModelConfig {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/gpu/configs");
        let loaded = crate::hf::load_config(&dir.join(name).join("config.json"));
        loaded.unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// Each split tensor's rank slices tile it exactly; every rank's
    /// shapes are its config's expected shapes.
    #[test]
    fn rank_slices_tile_every_split_tensor() {
        for (name, sizes) in [
            ("llama-3.1-8b", &[1, 2, 4, 8][..]),
            ("qwen3-8b", &[2, 4, 8]),
            ("qwen3-30b-a3b", &[2, 4, 8]),
            ("llama-3.1-70b", &[2, 4, 8, 16]),
            ("mixtral-8x7b", &[2, 4, 8]),
        ] {
            let full = config(name);
            for &n in sizes {
                let plan = ShardPlan::new(&full, n).unwrap_or_else(|e| panic!("{name}/{n}: {e}"));
                let mut shapes: Vec<_> = expected_shapes(&full);
                if full.tie_word_embeddings {
                    shapes.push((LM_HEAD.into(), vec![full.vocab_size, full.hidden_size]));
                }
                for rank in 0..n {
                    let rank_shapes = expected_shapes(&plan.rank_config(rank));
                    for ((tensor, shape), (rank_tensor, rank_shape)) in
                        shapes.iter().zip(&rank_shapes)
                    {
                        assert_eq!(tensor, rank_tensor);
                        let split = plan.split(tensor, shape, rank);
                        let want = match &split {
                            Some(s) => sliced_shape(shape, s),
                            None => shape.clone(),
                        };
                        assert_eq!(&want, rank_shape, "{name}/{n}/{rank}: {tensor}");
                        // A rank that knows only its own config finds the same split.
                        let shard = plan.rank_config(rank).shard;
                        let own = shard.and_then(|s| s.split(tensor, rank_shape));
                        assert_eq!(own, split, "{name}/{n}/{rank}: {tensor}");
                    }
                }
                for (tensor, shape) in &shapes {
                    let splits: Vec<_> = (0..n)
                        .filter_map(|r| plan.split(tensor, shape, r))
                        .collect();
                    if splits.is_empty() {
                        continue;
                    }
                    assert_eq!(splits.len(), n, "{tensor}");
                    if is_kv(tensor) && n > full.num_kv_heads {
                        // Each KV head on n / kv_heads ranks in turn.
                        let per = n / full.num_kv_heads;
                        for (r, s) in splits.iter().enumerate() {
                            assert_eq!(s.start, (r / per) * s.len, "{name}/{n}: {tensor} rank {r}");
                        }
                        continue;
                    }
                    let mut next = 0;
                    for s in &splits {
                        assert_eq!(s.start, next, "{name}/{n}: {tensor} is contiguous");
                        next += s.len;
                    }
                    assert!(next >= shape[splits[0].dim], "{name}/{n}: {tensor} covered");
                    assert!(
                        next - shape[splits[0].dim] < n,
                        "{tensor}: padding under a row per rank"
                    );
                }
            }
        }
    }

    #[test]
    fn heads_and_columns_split_where_megatron_splits_them() {
        let full = config("llama-3.1-8b");
        let plan = ShardPlan::new(&full, 4).unwrap_or_else(|e| panic!("{e}"));
        let q = plan.split("model.layers.3.self_attn.q_proj.weight", &[4096, 4096], 2);
        assert_eq!(
            q,
            Some(Split {
                dim: 0,
                start: 2048,
                len: 1024,
                full: 4096
            })
        );
        let k = plan.split("model.layers.3.self_attn.k_proj.weight", &[1024, 4096], 1);
        assert_eq!(
            k,
            Some(Split {
                dim: 0,
                start: 256,
                len: 256,
                full: 1024
            })
        );
        let o = plan.split("model.layers.0.self_attn.o_proj.weight", &[4096, 4096], 3);
        assert_eq!(
            o,
            Some(Split {
                dim: 1,
                start: 3072,
                len: 1024,
                full: 4096
            })
        );
        let down = plan.split("model.layers.31.mlp.down_proj.weight", &[4096, 14336], 1);
        assert_eq!(
            down,
            Some(Split {
                dim: 1,
                start: 3584,
                len: 3584,
                full: 14336
            })
        );
        let head = plan.split(LM_HEAD, &[128256, 4096], 3);
        assert_eq!(
            head,
            Some(Split {
                dim: 0,
                start: 96192,
                len: 32064,
                full: 128256
            })
        );
        for replicated in [
            "model.embed_tokens.weight",
            "model.norm.weight",
            "model.layers.0.input_layernorm.weight",
            "model.layers.0.post_attention_layernorm.weight",
        ] {
            assert_eq!(plan.split(replicated, &[4096], 0), None, "{replicated}");
        }
        let r = plan.rank_config(1);
        assert_eq!(
            (r.num_heads, r.num_kv_heads, r.intermediate_size),
            (8, 2, 3584)
        );
        assert_eq!(r.shard.map(|s| s.vocab_range()), Some(32064..64128));
        // More ranks than KV heads: each KV head on two ranks, next to the
        // query heads that read it.
        let wide = ShardPlan::new(&full, 16).unwrap_or_else(|e| panic!("{e}"));
        let k = wide.split("model.layers.0.self_attn.k_proj.weight", &[1024, 4096], 5);
        assert_eq!(
            k,
            Some(Split {
                dim: 0,
                start: 256,
                len: 128,
                full: 1024
            })
        );
        let q = wide.split("model.layers.0.self_attn.q_proj.weight", &[4096, 4096], 5);
        assert_eq!(
            q,
            Some(Split {
                dim: 0,
                start: 1280,
                len: 256,
                full: 4096
            })
        );
        assert_eq!(wide.rank_config(5).num_kv_heads, 1);
        let moe = ShardPlan::new(&config("qwen3-30b-a3b"), 2).unwrap_or_else(|e| panic!("{e}"));
        let experts = |s: &str| format!("model.layers.5.{s}");
        let down = moe.split(&experts(crate::llama::EXPERTS_DOWN), &[128, 2048, 768], 1);
        assert_eq!(
            down,
            Some(Split {
                dim: 2,
                start: 384,
                len: 384,
                full: 768
            })
        );
        let router = moe.split(&experts(crate::llama::ROUTER), &[128, 2048], 1);
        assert_eq!(router, None);
    }

    #[test]
    fn sizes_that_do_not_divide_are_refused_by_name() {
        let full = config("llama-3.1-8b");
        let e = ShardPlan::new(&full, 3)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("does not divide attention heads (32)"), "{e}");
        let e = ShardPlan::new(&config("qwen3-30b-a3b"), 64)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("does not divide attention heads (32)"), "{e}");
        let mut odd = full.clone();
        odd.num_kv_heads = 6;
        odd.num_heads = 48;
        let e = ShardPlan::new(&odd, 4)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("nor is a multiple of the KV heads (6)"), "{e}");
        assert!(ShardPlan::new(&full, 0).is_err());
    }

    #[test]
    fn slices_copy_the_rank_range_and_pad_with_zeros() {
        // [2, 3, 2]: slice dim 1 rows 1..3.
        let data: Vec<u8> = (0..12).collect();
        let s = Split {
            dim: 1,
            start: 1,
            len: 2,
            full: 3,
        };
        assert_eq!(slice(&data, &[2, 3, 2], &s, 1), [2, 3, 4, 5, 8, 9, 10, 11]);
        // Rows 2..4 of 3: the last is padding.
        let s = Split {
            dim: 0,
            start: 2,
            len: 2,
            full: 3,
        };
        assert_eq!(slice(&data, &[3, 4], &s, 1), [8, 9, 10, 11, 0, 0, 0, 0]);
    }
}
