//! GGUF as a model: metadata → [`ModelConfig`], GGUF tensor names → Hugging
//! Face names.
//!
//! llama.cpp's converter permutes the rows of llama q/k projections so that
//! its rope can rotate adjacent pairs (`x[2i], x[2i+1]`). We un-permute them
//! at load, so every model rotates in the Hugging Face "rotate half" layout
//! and one rope implementation (CPU and GPU) serves all formats.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::gguf::GgmlType;
use crate::gguf::GgufFile;
use crate::{
    Architecture, BlockData, HostTensor, ModelConfig, ModelError, QuantTensor, RopeConfig,
    RopeScaling, TensorSource,
};

/// Resolves the decoder configuration from GGUF metadata.
pub fn config_from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
    let arch_name = file
        .architecture()
        .ok_or_else(|| ModelError::InvalidConfig("GGUF has no general.architecture".to_string()))?;
    let architecture = Architecture::from_name(arch_name)?;
    let key = |k: &str| format!("{arch_name}.{k}");
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
    };
    config.validate()?;
    Ok(config)
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
}

impl GgufSource {
    /// Wraps an opened file whose config has been resolved.
    pub fn new(file: Arc<GgufFile>, config: &ModelConfig) -> Self {
        let unpermute = matches!(
            config.architecture,
            Architecture::Llama | Architecture::Mistral
        )
        .then_some((config.num_heads, config.num_kv_heads));
        Self { file, unpermute }
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
}

impl TensorSource for GgufSource {
    fn load(&self, name: &str) -> Result<HostTensor, ModelError> {
        let missing = || ModelError::MissingTensor {
            name: name.to_string(),
        };
        let gname = gguf_name(name).ok_or_else(missing)?;
        let info = self.file.tensor(&gname).ok_or_else(missing)?;
        // ggml lists the fastest-varying dimension first.
        let shape: Vec<usize> = info.dims.iter().rev().map(|&d| d as usize).collect();
        let mut data = self.file.dequantize(&gname)?;
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
        let gname = gguf_name(name).ok_or_else(missing)?;
        let index = self.file.tensor_index(&gname).ok_or_else(missing)?;
        let info = &self.file.tensors()[index];
        if matches!(
            info.ggml_type,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::F64
        ) {
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

    fn contains(&self, name: &str) -> bool {
        gguf_name(name).is_some_and(|g| self.file.tensor(&g).is_some())
    }

    fn dtype_summary(&self) -> Vec<(String, usize)> {
        let mut counts = BTreeMap::new();
        for t in self.file.tensors() {
            *counts.entry(t.ggml_type.name().to_string()).or_insert(0) += 1;
        }
        counts.into_iter().collect()
    }
}

/// Undoes llama.cpp's q/k row permutation: GGUF row `h*hd + 2i + j` holds
/// Hugging Face row `h*hd + j*hd/2 + i`.
fn unpermute_rows<T: Copy + Default>(data: &[T], heads: usize, cols: usize) -> Vec<T> {
    let rows = data.len() / cols;
    let head_dim = rows / heads;
    let half = head_dim / 2;
    let mut out = vec![T::default(); data.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let src = h * head_dim + 2 * i + j;
                let dst = h * head_dim + j * half + i;
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
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
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // One head, head_dim 4, one column: HF rows [a0 a1 b0 b1] (halves a, b)
        // are stored by llama.cpp as [a0 b0 a1 b1].
        let gguf = [0.0, 2.0, 1.0, 3.0];
        assert_eq!(unpermute_rows(&gguf, 1, 1), vec![0.0, 1.0, 2.0, 3.0]);
    }
}
