//! GGUF as a model: metadata → [`ModelConfig`], GGUF tensor names → Hugging
//! Face names.
//!
//! llama.cpp's converter permutes the rows of llama q/k projections so that
//! its rope can rotate adjacent pairs (`x[2i], x[2i+1]`). We un-permute them
//! at load, so every model rotates in the Hugging Face "rotate half" layout
//! and one rope implementation (CPU and GPU) serves all formats.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use half::{bf16, f16};
use rayon::prelude::*;

use crate::gguf::{GgmlType, GgufFile, TensorInfo};
use crate::{
    Architecture, Bf16Tensor, BlockData, BlockOptions, HostTensor, ModelConfig, ModelError,
    MoeConfig, QuantTensor, RopeConfig, RopeScaling, SlidingWindow, TensorSource,
};

/// Resolves the decoder configuration from GGUF metadata.
pub fn config_from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
    let arch_name = file
        .architecture()
        .ok_or_else(|| ModelError::InvalidConfig("GGUF has no general.architecture".to_string()))?;
    let key = |k: &str| format!("{arch_name}.{k}");
    let experts = file.get_u64(&key("expert_count")).unwrap_or(0) as usize;
    // llama.cpp writes Mixtral as `llama` with experts.
    let architecture = match Architecture::from_name(arch_name)? {
        Architecture::Llama | Architecture::Mistral if experts > 0 => Architecture::Mixtral,
        Architecture::Qwen3 | Architecture::Qwen3Moe if experts > 0 => Architecture::Qwen3Moe,
        Architecture::Qwen3Moe => {
            return Err(ModelError::InvalidConfig(format!(
                "GGUF metadata lacks {}",
                key("expert_count")
            )))
        }
        other => other,
    };
    let need = |k: &str| -> Result<usize, ModelError> {
        file.get_u64(&key(k))
            .map(|v| v as usize)
            .ok_or_else(|| ModelError::InvalidConfig(format!("GGUF metadata lacks {}", key(k))))
    };
    let hidden_size = need("embedding_length")?;
    let num_heads = need("attention.head_count")?;
    let num_kv_heads = file
        .get_u64(&key("attention.head_count_kv"))
        .map_or(num_heads, |v| v as usize);
    let head_dim = match file.get_u64(&key("attention.key_length")) {
        Some(v) => v as usize,
        None => hidden_size.checked_div(num_heads).unwrap_or(0),
    };
    let embed = file
        .tensor("token_embd.weight")
        .ok_or_else(|| ModelError::MissingTensor {
            name: "token_embd.weight".to_string(),
        })?;
    let vocab_size = embed.dims.get(1).copied().unwrap_or(0) as usize;
    let scaling = if file.tensor("rope_freqs.weight").is_some() {
        RopeScaling::FreqFactors(file.dequantize("rope_freqs.weight")?)
    } else {
        match file.get_str(&key("rope.scaling.type")) {
            Some("linear") => RopeScaling::Linear {
                factor: file.get_f64(&key("rope.scaling.factor")).unwrap_or(1.0) as f32,
            },
            None | Some("none") => RopeScaling::None,
            Some(other) => {
                return Err(ModelError::InvalidConfig(format!(
                    "unsupported rope scaling type '{other}'"
                )))
            }
        }
    };
    let moe = match experts {
        0 => None,
        num_experts => Some(moe_from_gguf(file, arch_name, num_experts)?),
    };
    let config = ModelConfig {
        architecture,
        hidden_size,
        intermediate_size: need("feed_forward_length")?,
        num_layers: need("block_count")?,
        num_heads,
        num_kv_heads,
        head_dim,
        vocab_size,
        max_context: need("context_length")?,
        rms_norm_eps: file
            .get_f64(&key("attention.layer_norm_rms_epsilon"))
            .unwrap_or(1e-6) as f32,
        rope: RopeConfig {
            theta: file.get_f64(&key("rope.freq_base")).unwrap_or(10000.0) as f32,
            scaling,
        },
        qkv_bias: file.tensor("blk.0.attn_q.bias").is_some(),
        qk_norm: file.tensor("blk.0.attn_q_norm.weight").is_some(),
        tie_word_embeddings: file.tensor("output.weight").is_none(),
        shard: None,
        block: BlockOptions {
            moe,
            ..Default::default()
        },
    };
    let config = match architecture {
        Architecture::Gemma3 => with_gemma3_block(config, file)?,
        _ => config,
    };
    config.validate()?;
    Ok(config)
}

/// The experts of a GGUF's every layer (llama.cpp has no dense layers in
/// its MoE architectures). The expert width is `expert_feed_forward_length`
/// (qwen3moe) or, where absent, `feed_forward_length` (llama-as-Mixtral);
/// the top-k weights are renormalised unless `expert_weights_norm` says
/// otherwise (llama.cpp's qwen3moe and llama graphs always renormalise).
fn moe_from_gguf(
    file: &GgufFile,
    arch_name: &str,
    num_experts: usize,
) -> Result<MoeConfig, ModelError> {
    let key = |k: &str| format!("{arch_name}.{k}");
    let width = file
        .get_u64(&key("expert_feed_forward_length"))
        .or_else(|| file.get_u64(&key("feed_forward_length")))
        .unwrap_or(0) as usize;
    let used = file.get_u64(&key("expert_used_count")).ok_or_else(|| {
        ModelError::InvalidConfig(format!("GGUF metadata lacks {}", key("expert_used_count")))
    })? as usize;
    if file.tensor("blk.0.ffn_gate_exps.weight").is_none()
        && file.tensor("blk.0.ffn_gate.0.weight").is_some()
    {
        return Err(ModelError::InvalidConfig(
            "this GGUF stores one tensor per expert (llama.cpp's layout before 2024-04); \
             convert it again with a current convert_hf_to_gguf.py, which stacks them"
                .into(),
        ));
    }
    Ok(MoeConfig {
        num_experts,
        experts_per_token: used,
        expert_intermediate_size: width,
        normalize_top_k: file.get_bool(&key("expert_weights_norm")).unwrap_or(true),
        dense_layers: Vec::new(),
    })
}

/// Gemma 3's rope base on its sliding layers (transformers'
/// `rope_local_base_freq`); llama.cpp's GGUFs do not store it and its gemma3
/// graph hard-codes the same value.
const GEMMA3_LOCAL_ROPE_BASE: f32 = 10000.0;
/// Every sixth Gemma 3 layer is global (transformers'
/// `sliding_window_pattern`; llama.cpp's `set_swa_pattern(6)`).
const GEMMA3_GLOBAL_EVERY: usize = 6;

/// Gemma 3's departures from the Llama block, from its GGUF metadata.
/// Attention scale: `query_pre_attn_scalar^-0.5` in transformers, which
/// llama.cpp's converter does not store; it equals `head_dim` (so the
/// default `head_dim^-0.5`) for every Gemma 3 size but 27B, whose
/// `hidden / heads` llama.cpp keys on the 62-layer count.
fn with_gemma3_block(mut config: ModelConfig, file: &GgufFile) -> Result<ModelConfig, ModelError> {
    let key = |k: &str| format!("gemma3.{k}");
    let size = file
        .get_u64(&key("attention.sliding_window"))
        .ok_or_else(|| {
            ModelError::InvalidConfig("GGUF metadata lacks gemma3.attention.sliding_window".into())
        })? as usize;
    let attention_scale = (config.num_layers == 62)
        .then(|| 1.0 / ((config.hidden_size / config.num_heads.max(1)) as f32).sqrt());
    config.block = BlockOptions {
        sliding_window: Some(SlidingWindow {
            size,
            global_every: GEMMA3_GLOBAL_EVERY,
            local_rope: RopeConfig {
                theta: GEMMA3_LOCAL_ROPE_BASE,
                scaling: RopeScaling::None,
            },
        }),
        post_norms: true,
        attention_scale,
        final_logit_softcap: file
            .get_f64(&key("final_logit_softcapping"))
            .map(|c| c as f32),
        moe: None,
    };
    Ok(config)
}

/// Maps a canonical (Hugging Face) tensor name of `arch` to its GGUF name.
/// Gemma 3 names its four block norms differently from Llama (whose
/// `post_attention_layernorm` is the pre-MLP norm).
pub fn gguf_name_for(arch: Architecture, hf: &str) -> Option<String> {
    let layer_module = hf
        .strip_prefix("model.layers.")
        .and_then(|rest| rest.split_once('.'));
    if let (Architecture::Gemma3, Some((layer, module))) = (arch, layer_module) {
        let short = match module {
            "post_attention_layernorm.weight" => Some("post_attention_norm"),
            "pre_feedforward_layernorm.weight" => Some("ffn_norm"),
            "post_feedforward_layernorm.weight" => Some("post_ffw_norm"),
            _ => None,
        };
        if let Some(short) = short {
            return Some(format!("blk.{layer}.{short}.weight"));
        }
    }
    gguf_name(hf)
}

/// Maps a canonical (Hugging Face) tensor name to its GGUF name.
pub fn gguf_name(hf: &str) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let short = match module {
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "mlp.gate" => "ffn_gate_inp",
        "mlp.experts.gate_proj" => "ffn_gate_exps",
        "mlp.experts.up_proj" => "ffn_up_exps",
        "mlp.experts.down_proj" => "ffn_down_exps",
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        _ => return None,
    };
    Some(format!("blk.{layer}.{short}.{suffix}"))
}

/// Tensors of a GGUF file, dequantized to f32 under Hugging Face names.
pub struct GgufSource {
    file: Arc<GgufFile>,
    /// Heads for q and k when rows must be un-permuted (llama layout).
    unpermute: Option<(usize, usize)>,
    /// Decides the tensor names ([`gguf_name_for`]).
    architecture: Architecture,
}

impl GgufSource {
    /// Wraps an opened file whose config has been resolved.
    pub fn new(file: Arc<GgufFile>, config: &ModelConfig) -> Self {
        let unpermute = matches!(
            config.architecture,
            Architecture::Llama | Architecture::Mistral | Architecture::Mixtral
        )
        .then_some((config.num_heads, config.num_kv_heads));
        Self {
            file,
            unpermute,
            architecture: config.architecture,
        }
    }

    fn heads_to_unpermute(&self, hf: &str) -> Option<usize> {
        let (q, kv) = self.unpermute?;
        if hf.contains("self_attn.q_proj.") {
            Some(q)
        } else if hf.contains("self_attn.k_proj.") {
            Some(kv)
        } else {
            None
        }
    }

    /// The GGUF info of canonical tensor `name` and its shape (outermost
    /// first).
    fn info(&self, name: &str) -> Result<(&TensorInfo, Vec<usize>), ModelError> {
        let missing = || ModelError::MissingTensor {
            name: name.to_string(),
        };
        let gname = gguf_name_for(self.architecture, name).ok_or_else(missing)?;
        let info = self.file.tensor(&gname).ok_or_else(missing)?;
        // ggml lists the fastest-varying dimension first.
        let shape = info.dims.iter().rev().map(|&d| d as usize).collect();
        Ok((info, shape))
    }
}

/// Elements converted per rayon task (f16 to bf16).
const CONVERT_CHUNK: usize = 1 << 16;

impl TensorSource for GgufSource {
    /// A quantized tensor's slice from its own blocks: a rank dequantizes
    /// a quarter of a 70B at four ranks, not all of it (2 min 11 s to
    /// serve a 70B Q4_K_M at TP=4 when each rank dequantized every tensor
    /// whole on the host).
    fn load_slice(
        &self,
        name: &str,
        split: &dyn Fn(&[usize]) -> Option<crate::parallel::Split>,
    ) -> Result<Option<HostTensor>, ModelError> {
        let Some(blocks) = self.load_blocks(name)? else {
            return Ok(None);
        };
        match split(&blocks.shape) {
            Some(split) => crate::parallel::dequantize_slice(&blocks, &split),
            None => Ok(None),
        }
    }

    fn load(&self, name: &str) -> Result<HostTensor, ModelError> {
        let (info, shape) = self.info(name)?;
        let mut data = self.file.dequantize(&info.name)?;
        if let Some(heads) = self.heads_to_unpermute(name) {
            let cols = if shape.len() > 1 { shape[1] } else { 1 };
            data = unpermute_rows(&data, heads, cols);
        }
        Ok(HostTensor::new(shape, data))
    }

    fn load_blocks(&self, name: &str) -> Result<Option<QuantTensor>, ModelError> {
        let missing = || ModelError::MissingTensor {
            name: name.to_string(),
        };
        let gname = gguf_name_for(self.architecture, name).ok_or_else(missing)?;
        let index = self.file.tensor_index(&gname).ok_or_else(missing)?;
        let info = &self.file.tensors()[index];
        if block_type(info.ggml_type).is_none() {
            return Ok(None);
        }
        let shape: Vec<usize> = info.dims.iter().rev().map(|&d| d as usize).collect();
        let data = match self.heads_to_unpermute(name) {
            // Rows are whole blocks, so the permutation moves bytes verbatim.
            Some(heads) => {
                let cols = shape.get(1).copied().unwrap_or(1);
                let (bs, ts) = (info.ggml_type.block_size(), info.ggml_type.type_size());
                if bs == 0 || !cols.is_multiple_of(bs) {
                    return Ok(None);
                }
                let row_bytes = cols / bs * ts;
                BlockData::Owned(unpermute_rows(
                    self.file.tensor_bytes(info),
                    heads,
                    row_bytes,
                ))
            }
            None => BlockData::Mapped {
                file: self.file.clone(),
                index,
            },
        };
        Ok(Some(QuantTensor {
            ggml_type: info.ggml_type,
            shape,
            data,
        }))
    }

    fn load_bf16(&self, name: &str) -> Result<Option<Bf16Tensor<'_>>, ModelError> {
        let (info, shape) = self.info(name)?;
        if !matches!(info.ggml_type, GgmlType::BF16 | GgmlType::F16) {
            return Ok(None);
        }
        let raw = self.file.tensor_bytes(info);
        let n = info.n_elements();
        if raw.len() != 2 * n {
            return Err(ModelError::InvalidConfig(format!(
                "tensor '{}' holds {} bytes, expected {} for {n} 16-bit elements",
                info.name,
                raw.len(),
                2 * n
            )));
        }
        let mut bytes = if info.ggml_type == GgmlType::BF16 {
            Cow::Borrowed(raw)
        } else {
            Cow::Owned(f16_to_bf16_bytes(raw))
        };
        if let Some(heads) = self.heads_to_unpermute(name) {
            // A row of `cols` elements is `2 * cols` bytes.
            let cols = if shape.len() > 1 { shape[1] } else { 1 };
            bytes = Cow::Owned(unpermute_rows(&bytes[..], heads, 2 * cols));
        }
        Ok(Some(Bf16Tensor { shape, bytes }))
    }

    fn contains(&self, name: &str) -> bool {
        gguf_name_for(self.architecture, name).is_some_and(|g| self.file.tensor(&g).is_some())
    }

    fn stored_type(&self, name: &str) -> Option<GgmlType> {
        block_type(self.info(name).ok()?.0.ggml_type)
    }

    fn dtype_summary(&self) -> Vec<(String, usize)> {
        let mut counts = BTreeMap::new();
        for t in self.file.tensors() {
            *counts.entry(t.ggml_type.name().to_string()).or_insert(0) += 1;
        }
        counts.into_iter().collect()
    }
}

/// `ty` when it is a quantized block type (what `load_blocks` hands out
/// as blocks), `None` for float storage.
fn block_type(ty: GgmlType) -> Option<GgmlType> {
    (!matches!(
        ty,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::F64
    ))
    .then_some(ty)
}

/// Undoes llama.cpp's q/k row permutation: GGUF row `h*hd + 2i + j` holds
/// Hugging Face row `h*hd + j*hd/2 + i`. Rows are `cols` elements of any
/// type (f32 values, or bf16 bytes with `cols` counted in bytes); heads are
/// reordered in parallel, as each one only moves rows within itself.
fn unpermute_rows<T: Copy + Default + Send + Sync>(
    data: &[T],
    heads: usize,
    cols: usize,
) -> Vec<T> {
    let rows = data.len() / cols.max(1);
    let head_dim = rows / heads.max(1);
    let half = head_dim / 2;
    let mut out = vec![T::default(); data.len()];
    let head_len = (head_dim * cols).max(1);
    out.par_chunks_mut(head_len)
        .zip(data.par_chunks(head_len))
        .for_each(|(dst_head, src_head)| {
            // Rows past the last whole head (a malformed file, rejected by
            // the shape check later) stay zero, as they always did.
            if src_head.len() < head_len {
                return;
            }
            for i in 0..half {
                for j in 0..2 {
                    let src = 2 * i + j;
                    let dst = j * half + i;
                    dst_head[dst * cols..(dst + 1) * cols]
                        .copy_from_slice(&src_head[src * cols..(src + 1) * cols]);
                }
            }
        });
    out
}

/// Little-endian f16 bytes to bf16 bytes, in parallel. Rounds as
/// `bf16::from_f32(x.to_f32())` does (f16 to f32 is exact), so the result
/// equals the f32 path's.
fn f16_to_bf16_bytes(raw: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; raw.len()];
    out.par_chunks_mut(2 * CONVERT_CHUNK)
        .zip(raw.par_chunks(2 * CONVERT_CHUNK))
        .for_each(|(dst, src)| {
            for (d, s) in dst.chunks_exact_mut(2).zip(src.chunks_exact(2)) {
                let x = f16::from_le_bytes([s[0], s[1]]);
                d.copy_from_slice(&bf16::from_f32(x.to_f32()).to_le_bytes());
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways_we_need() {
        assert_eq!(
            gguf_name("model.layers.12.self_attn.q_proj.weight").as_deref(),
            Some("blk.12.attn_q.weight")
        );
        assert_eq!(
            gguf_name("model.layers.0.self_attn.k_proj.bias").as_deref(),
            Some("blk.0.attn_k.bias")
        );
        assert_eq!(
            gguf_name("model.layers.3.post_attention_layernorm.weight").as_deref(),
            Some("blk.3.ffn_norm.weight")
        );
        assert_eq!(gguf_name("model.layers.3.mystery.weight"), None);
        // Experts: the router and the stacks.
        for (hf, gguf) in [
            ("mlp.gate.weight", "ffn_gate_inp.weight"),
            ("mlp.experts.gate_proj.weight", "ffn_gate_exps.weight"),
            ("mlp.experts.up_proj.weight", "ffn_up_exps.weight"),
            ("mlp.experts.down_proj.weight", "ffn_down_exps.weight"),
        ] {
            let name = gguf_name(&format!("model.layers.7.{hf}"));
            assert_eq!(name, Some(format!("blk.7.{gguf}")));
        }
        // Gemma 3's post-attention norm is not Llama's pre-MLP norm.
        let gemma = |hf: &str| gguf_name_for(Architecture::Gemma3, hf);
        assert_eq!(
            gemma("model.layers.3.post_attention_layernorm.weight").as_deref(),
            Some("blk.3.post_attention_norm.weight")
        );
        assert_eq!(
            gemma("model.layers.3.pre_feedforward_layernorm.weight").as_deref(),
            Some("blk.3.ffn_norm.weight")
        );
        assert_eq!(
            gemma("model.layers.3.post_feedforward_layernorm.weight").as_deref(),
            Some("blk.3.post_ffw_norm.weight")
        );
        assert_eq!(
            gemma("model.embed_tokens.weight").as_deref(),
            Some("token_embd.weight")
        );
        assert_eq!(
            gemma("model.layers.3.self_attn.q_norm.weight").as_deref(),
            Some("blk.3.attn_q_norm.weight")
        );
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // One head, head_dim 4, one column: HF rows [a0 a1 b0 b1] (halves a, b)
        // are stored by llama.cpp as [a0 b0 a1 b1].
        let gguf = [0.0, 2.0, 1.0, 3.0];
        assert_eq!(unpermute_rows(&gguf, 1, 1), vec![0.0, 1.0, 2.0, 3.0]);
        // Rows that do not make a whole head never panic (and stay zero).
        assert_eq!(
            unpermute_rows(&[1u8, 2, 3, 4, 5], 2, 1),
            vec![1, 2, 3, 4, 0]
        );
    }

    /// `values` as little-endian bytes of `ty` (BF16 or F16).
    fn half_bytes(values: &[f32], ty: GgmlType) -> Vec<u8> {
        values
            .iter()
            .flat_map(|&x| match ty {
                GgmlType::BF16 => bf16::from_f32(x).to_le_bytes(),
                _ => f16::from_f32(x).to_le_bytes(),
            })
            .collect()
    }

    #[test]
    fn experts_in_gguf_metadata_resolve_or_are_refused_by_name() {
        use crate::gguf::tests::{f32_bytes, Builder, TempFile};
        use crate::gguf::MetaValue;
        // A GGUF of `arch` with 4 experts (llama.cpp's Mixtral for llama),
        // `used` experts per token, and `expert` as its expert tensor.
        let config = |arch: &str, used: Option<u32>, expert: &str| {
            let k = |key: &str| format!("{arch}.{key}");
            let mut b = Builder::new()
                .kv("general.architecture", MetaValue::String(arch.into()))
                .kv(&k("embedding_length"), MetaValue::U32(8))
                .kv(&k("attention.head_count"), MetaValue::U32(2))
                .kv(&k("feed_forward_length"), MetaValue::U32(16))
                .kv(&k("block_count"), MetaValue::U32(1))
                .kv(&k("context_length"), MetaValue::U32(16))
                .kv(&k("expert_count"), MetaValue::U32(4))
                .tensor(
                    "token_embd.weight",
                    &[8, 4],
                    GgmlType::F32,
                    f32_bytes(&[0.0; 32]),
                )
                .tensor(expert, &[8], GgmlType::F32, f32_bytes(&[0.0; 8]));
            if let Some(n) = used {
                b = b.kv(&k("expert_used_count"), MetaValue::U32(n));
            }
            let tmp = TempFile::new(&b.build());
            config_from_gguf(&GgufFile::open(&tmp.0).expect("open"))
        };
        let c = config("llama", Some(2), "blk.0.ffn_gate_exps.weight").expect("config");
        assert_eq!(c.architecture, Architecture::Mixtral);
        let moe = c.block.moe.expect("experts");
        assert_eq!((moe.num_experts, moe.experts_per_token), (4, 2));
        assert_eq!(moe.expert_intermediate_size, 16);
        assert!(moe.normalize_top_k && moe.dense_layers.is_empty());
        let err = config("llama", None, "blk.0.ffn_gate_exps.weight").unwrap_err();
        assert!(err.to_string().contains("llama.expert_used_count"), "{err}");
        let err = config("llama", Some(2), "blk.0.ffn_gate.0.weight").unwrap_err();
        assert!(err.to_string().contains("one tensor per expert"), "{err}");
        let err = config("llama", Some(5), "blk.0.ffn_gate_exps.weight").unwrap_err();
        assert!(err.to_string().contains("experts per token (5)"), "{err}");
    }

    #[test]
    fn bf16_loads_match_f32_loads_converted() {
        use crate::gguf::tests::{f32_bytes, Builder, TempFile};
        use crate::gguf::MetaValue;
        // hidden 8, 2 q heads and 1 kv head of 4, vocab 4: q and k rows are
        // un-permuted, the embedding is borrowed as is, k is stored in f16.
        let vals = |n: usize, k: f32| -> Vec<f32> {
            (0..n).map(|i| ((i as f32) * k).sin() * 3.0).collect()
        };
        let bytes = Builder::new()
            .kv("general.architecture", MetaValue::String("llama".into()))
            .kv("llama.embedding_length", MetaValue::U32(8))
            .kv("llama.attention.head_count", MetaValue::U32(2))
            .kv("llama.attention.head_count_kv", MetaValue::U32(1))
            .kv("llama.feed_forward_length", MetaValue::U32(16))
            .kv("llama.block_count", MetaValue::U32(1))
            .kv("llama.context_length", MetaValue::U32(16))
            .tensor(
                "token_embd.weight",
                &[8, 4],
                GgmlType::BF16,
                half_bytes(&vals(32, 0.7), GgmlType::BF16),
            )
            .tensor(
                "blk.0.attn_q.weight",
                &[8, 8],
                GgmlType::BF16,
                half_bytes(&vals(64, 1.3), GgmlType::BF16),
            )
            .tensor(
                "blk.0.attn_k.weight",
                &[8, 4],
                GgmlType::F16,
                half_bytes(&vals(32, 0.37), GgmlType::F16),
            )
            .tensor(
                "blk.0.ffn_up.weight",
                &[8, 16],
                GgmlType::F16,
                half_bytes(&vals(128, 2.1), GgmlType::F16),
            )
            .tensor(
                "blk.0.attn_norm.weight",
                &[8],
                GgmlType::F32,
                f32_bytes(&vals(8, 0.5)),
            )
            .build();
        let tmp = TempFile::new(&bytes);
        let file = Arc::new(GgufFile::open(&tmp.0).expect("open"));
        let config = config_from_gguf(&file).expect("config");
        let source = GgufSource::new(file.clone(), &config);
        for name in [
            "model.embed_tokens.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.mlp.up_proj.weight",
        ] {
            let reference = source.load(name).expect("f32 load");
            let fast = source
                .load_bf16(name)
                .expect("bf16 load")
                .expect("16-bit tensors have a bf16 path");
            assert_eq!(fast.shape, reference.shape, "{name}");
            let want: Vec<u8> = reference
                .data
                .iter()
                .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                .collect();
            assert_eq!(fast.bytes.as_ref(), want.as_slice(), "{name}");
            // Only the untouched bf16 tensor is borrowed from the map.
            let borrowed = matches!(fast.bytes, Cow::Borrowed(_));
            assert_eq!(borrowed, name == "model.embed_tokens.weight", "{name}");
        }
        // f32 storage has no bf16 path; a missing tensor is an error.
        assert!(source
            .load_bf16("model.layers.0.input_layernorm.weight")
            .expect("f32 tensor")
            .is_none());
        assert!(matches!(
            source.load_bf16("model.layers.0.self_attn.v_proj.weight"),
            Err(ModelError::MissingTensor { .. })
        ));
    }
}
