//! EAGLE-3 draft heads (Li et al., "EAGLE-3: Scaling up Inference
//! Acceleration of Large Language Models via Training-Time Test", 2025) in
//! their published layout: a directory of `config.json` (a Llama config
//! named `LlamaForCausalLMEagle3`) and `model.safetensors` holding
//!
//! - `fc.weight` `[hidden, 3 hidden]`: the target's hidden states at three
//!   layers (low, middle, high; concatenated) to one row;
//! - `midlayer.*`: one Llama decoder layer whose q/k/v read twice the
//!   hidden width (the normed token embedding, then the normed fused row:
//!   `input_layernorm` and `hidden_norm`), its residual the fused row;
//! - `norm.weight`, `lm_head.weight` `[draft_vocab, hidden]` and `d2t`
//!   (draft id `i` is target id `i + d2t[i]`);
//! - `embed_tokens.weight` where the head has its own (else the target's).
//!
//! The row a head produces at position `i` is fed back for position `i + 1`
//! while it drafts; the target's rows replace the head's once verified.

use std::path::Path;

use serde::Deserialize;

use crate::hf::SafetensorsSource;
use crate::{HostTensor, ModelConfig, ModelError, TensorSource};

/// `architectures` names of EAGLE-3 heads (the EAGLE authors' and vLLM's).
pub const EAGLE3_ARCHITECTURES: &[&str] = &["LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"];

/// An EAGLE-3 head's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct EagleHeadConfig {
    /// The head's decoder layer as a one-layer Llama (its q/k/v read
    /// `2 * hidden_size` columns).
    pub layer: ModelConfig,
    /// Rows of the head's LM head.
    pub draft_vocab_size: usize,
    /// The target layers whose input (the residual stream entering them)
    /// the head reads, in `fc`'s column order.
    pub aux_layers: Vec<usize>,
}

impl EagleHeadConfig {
    /// Width of the target's row per token: every aux layer's hidden state.
    pub fn feature_width(&self) -> usize {
        self.aux_layers.len() * self.layer.hidden_size
    }

    /// Parameters of the head's own tensors (not counting an embedding it
    /// shares with the target).
    pub fn num_params(&self) -> usize {
        let c = &self.layer;
        let (h, ff) = (c.hidden_size, c.intermediate_size);
        let attention = (c.q_dim() + 2 * c.kv_dim()) * 2 * h + h * c.q_dim();
        h * self.feature_width() + attention + 3 * h * ff + self.draft_vocab_size * h + 4 * h
    }
}

/// An EAGLE-3 head's weights, f32, in the layout above.
pub struct EagleHeadWeights {
    /// `[hidden, 3 hidden]`.
    pub fc: HostTensor,
    /// RMSNorm of the token embedding.
    pub input_norm: HostTensor,
    /// RMSNorm of the fused row.
    pub hidden_norm: HostTensor,
    /// `[q_dim, 2 hidden]`, `[kv_dim, 2 hidden]` twice.
    pub q_proj: HostTensor,
    pub k_proj: HostTensor,
    pub v_proj: HostTensor,
    /// `[hidden, q_dim]`.
    pub o_proj: HostTensor,
    pub post_attention_norm: HostTensor,
    pub gate_proj: HostTensor,
    pub up_proj: HostTensor,
    pub down_proj: HostTensor,
    /// The final norm.
    pub norm: HostTensor,
    /// `[draft_vocab, hidden]`.
    pub lm_head: HostTensor,
    /// The head's own embedding, `[vocab, hidden]`; `None`: the target's.
    pub embed: Option<HostTensor>,
    /// The target id of each draft id.
    pub draft_to_target: Vec<u32>,
}

/// The head's own fields of `config.json`.
#[derive(Deserialize)]
struct RawHead {
    draft_vocab_size: Option<usize>,
    target_hidden_size: Option<usize>,
    eagle_config: Option<RawEagle>,
}

#[derive(Deserialize)]
struct RawEagle {
    eagle_aux_hidden_state_layer_ids: Option<Vec<usize>>,
}

/// The aux layers when the config names none: vLLM's and the EAGLE-3
/// training code's choice (the inputs of layers 2, L/2 and L-3).
pub fn default_aux_layers(target_layers: usize) -> Vec<usize> {
    vec![
        2.min(target_layers.saturating_sub(1)),
        target_layers / 2,
        target_layers.saturating_sub(3),
    ]
}

/// A head shaped like one of `target`'s layers, reading the default aux
/// layers and drafting over the whole vocabulary (random heads for tests
/// and benchmarks: [`crate::dummy::DummySource::with_shapes`] of
/// [`expected_shapes`]).
pub fn head_like(target: &ModelConfig) -> EagleHeadConfig {
    let mut layer = target.clone();
    layer.num_layers = 1;
    layer.architecture = crate::Architecture::Llama;
    layer.qkv_bias = false;
    layer.qk_norm = false;
    layer.block = Default::default();
    layer.shard = None;
    EagleHeadConfig {
        draft_vocab_size: target.vocab_size,
        aux_layers: default_aux_layers(target.num_layers),
        layer,
    }
}

/// The names (as published) and shapes of a head's tensors, without `d2t`
/// and an embedding of its own.
pub fn expected_shapes(config: &EagleHeadConfig) -> Vec<(String, Vec<usize>)> {
    let c = &config.layer;
    let (h, qd, kvd, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let mid = |n: &str, s: Vec<usize>| (format!("midlayer.{n}"), s);
    vec![
        ("fc.weight".into(), vec![h, config.feature_width()]),
        mid("input_layernorm.weight", vec![h]),
        mid("hidden_norm.weight", vec![h]),
        mid("self_attn.q_proj.weight", vec![qd, 2 * h]),
        mid("self_attn.k_proj.weight", vec![kvd, 2 * h]),
        mid("self_attn.v_proj.weight", vec![kvd, 2 * h]),
        mid("self_attn.o_proj.weight", vec![h, qd]),
        mid("post_attention_layernorm.weight", vec![h]),
        mid("mlp.gate_proj.weight", vec![ff, h]),
        mid("mlp.up_proj.weight", vec![ff, h]),
        mid("mlp.down_proj.weight", vec![h, ff]),
        ("norm.weight".into(), vec![h]),
        ("lm_head.weight".into(), vec![config.draft_vocab_size, h]),
    ]
}

/// Reads the head in `dir` for `target` and checks that it fits it.
pub fn load(
    dir: &Path,
    target: &ModelConfig,
) -> Result<(EagleHeadConfig, EagleHeadWeights), ModelError> {
    let config = load_config(dir, target)?;
    if !dir.join("model.safetensors").is_file()
        && !dir.join("model.safetensors.index.json").is_file()
    {
        return Err(ModelError::InvalidConfig(format!(
            "{} has no model.safetensors: EAGLE-3 heads load from safetensors (a \
             pytorch_model.bin converts with `safetensors.torch.save_file`)",
            dir.display()
        )));
    }
    let source = SafetensorsSource::open(dir)?;
    let weights = load_weights(&source, &config)?;
    Ok((config, weights))
}

/// The head's config, checked against `target`.
pub fn load_config(dir: &Path, target: &ModelConfig) -> Result<EagleHeadConfig, ModelError> {
    let path = dir.join("config.json");
    let mut layer = crate::hf::load_eagle3_layer_config(&path)?;
    let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
        path: path.clone(),
        source,
    })?;
    let raw: RawHead = serde_json::from_str(&text).map_err(|e| ModelError::ConfigFile {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let invalid = |m: String| Err(ModelError::InvalidConfig(format!("EAGLE-3 head: {m}")));
    let hidden = layer.hidden_size;
    if hidden != target.hidden_size || raw.target_hidden_size.is_some_and(|h| h != hidden) {
        return invalid(format!(
            "hidden size {hidden} is not the target's {}",
            target.hidden_size
        ));
    }
    if layer.vocab_size != target.vocab_size {
        return invalid(format!(
            "vocabulary of {} tokens is not the target's {}: the head drafts for another model",
            layer.vocab_size, target.vocab_size
        ));
    }
    if layer.num_layers != 1 {
        return invalid(format!(
            "{} decoder layers; EAGLE-3 heads have one",
            layer.num_layers
        ));
    }
    let aux_layers = raw
        .eagle_config
        .and_then(|e| e.eagle_aux_hidden_state_layer_ids)
        .unwrap_or_else(|| default_aux_layers(target.num_layers));
    if aux_layers.len() != 3 || aux_layers.iter().any(|&l| l >= target.num_layers) {
        return invalid(format!(
            "aux layers {aux_layers:?}: three target layers below {} expected",
            target.num_layers
        ));
    }
    // The head attends over the target's context (with its own rope).
    layer.max_context = target.max_context;
    Ok(EagleHeadConfig {
        draft_vocab_size: raw.draft_vocab_size.unwrap_or(layer.vocab_size),
        layer,
        aux_layers,
    })
}

/// The head's tensors from `source`, shape-checked.
pub fn load_weights(
    source: &dyn TensorSource,
    config: &EagleHeadConfig,
) -> Result<EagleHeadWeights, ModelError> {
    let c = &config.layer;
    let (h, qd, kvd, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let load = |names: &[&str], shape: &[usize]| -> Result<HostTensor, ModelError> {
        let name = names
            .iter()
            .find(|n| source.contains(n))
            .copied()
            .unwrap_or(names[0]);
        let t = source.load(name)?;
        if t.shape != shape {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                got: t.shape,
            });
        }
        Ok(t)
    };
    let top = |name: &str, shape: &[usize]| load(&[name, &format!("model.{name}")], shape);
    let mid = |name: &str, shape: &[usize]| {
        let names = [
            "midlayer.",
            "model.midlayer.",
            "layers.0.",
            "model.layers.0.",
        ]
        .map(|p| format!("{p}{name}"));
        load(&names.each_ref().map(String::as_str), shape)
    };
    let embed = if ["embed_tokens.weight", "model.embed_tokens.weight"]
        .iter()
        .any(|n| source.contains(n))
    {
        Some(top("embed_tokens.weight", &[c.vocab_size, h])?)
    } else {
        None
    };
    let dv = config.draft_vocab_size;
    let draft_to_target = if ["d2t", "model.d2t"].iter().any(|n| source.contains(n)) {
        let d2t = top("d2t", &[dv])?;
        let mut map = Vec::with_capacity(dv);
        for (i, &offset) in d2t.data.iter().enumerate() {
            let id = i as f64 + offset as f64;
            if !(0.0..c.vocab_size as f64).contains(&id) {
                return Err(ModelError::InvalidConfig(format!(
                    "EAGLE-3 head: d2t maps draft id {i} to {id}, outside the target's \
                     vocabulary"
                )));
            }
            map.push(id as u32);
        }
        map
    } else if dv == c.vocab_size {
        (0..dv as u32).collect()
    } else {
        return Err(ModelError::MissingTensor { name: "d2t".into() });
    };
    Ok(EagleHeadWeights {
        fc: top("fc.weight", &[h, config.feature_width()])?,
        input_norm: mid("input_layernorm.weight", &[h])?,
        hidden_norm: mid("hidden_norm.weight", &[h])?,
        q_proj: mid("self_attn.q_proj.weight", &[qd, 2 * h])?,
        k_proj: mid("self_attn.k_proj.weight", &[kvd, 2 * h])?,
        v_proj: mid("self_attn.v_proj.weight", &[kvd, 2 * h])?,
        o_proj: mid("self_attn.o_proj.weight", &[h, qd])?,
        post_attention_norm: mid("post_attention_layernorm.weight", &[h])?,
        gate_proj: mid("mlp.gate_proj.weight", &[ff, h])?,
        up_proj: mid("mlp.up_proj.weight", &[ff, h])?,
        down_proj: mid("mlp.down_proj.weight", &[h, ff])?,
        norm: top("norm.weight", &[h])?,
        lm_head: top("lm_head.weight", &[dv, h])?,
        embed,
        draft_to_target,
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use safetensors::{tensor::TensorView, Dtype};

    use super::*;
    use crate::{Architecture, LlamaShape};

    fn target() -> ModelConfig {
        let llama = ModelConfig::llama(LlamaShape {
            hidden: 16,
            intermediate: 24,
            layers: 8,
            heads: 4,
            kv_heads: 2,
            head_dim: 4,
            vocab: 40,
        });
        ModelConfig {
            architecture: Architecture::Qwen3,
            max_context: 256,
            qk_norm: true,
            tie_word_embeddings: false,
            ..llama
        }
    }

    /// A head directory for `target()` in the published layout (bf16
    /// weights, int64 `d2t` over 10 draft ids), `config` patched by `edit`
    /// and the tensors named `prefix` + the published names.
    fn head_dir(tag: &str, prefix: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ingot-eagle3-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut config = serde_json::json!({
            "architectures": ["LlamaForCausalLMEagle3"],
            "hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 40,
            "draft_vocab_size": 10, "rope_theta": 500000.0, "max_position_embeddings": 64,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 4, 6]}
        });
        edit(&mut config);
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let head = EagleHeadConfig {
            layer: ModelConfig {
                vocab_size: 40,
                ..head_like(&target()).layer
            },
            draft_vocab_size: 10,
            aux_layers: vec![1, 4, 6],
        };
        let mut blobs: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = expected_shapes(&head)
            .into_iter()
            .map(|(name, shape)| {
                let n: usize = shape.iter().product();
                let bytes = (0..n)
                    .flat_map(|i| half::bf16::from_f32(i as f32 / n as f32).to_le_bytes())
                    .collect();
                (format!("{prefix}{name}"), Dtype::BF16, shape, bytes)
            })
            .collect();
        // Draft id i is target id 3 i + 1.
        let d2t: Vec<u8> = (0..10i64).flat_map(|i| (2 * i + 1).to_le_bytes()).collect();
        blobs.push((format!("{prefix}d2t"), Dtype::I64, vec![10], d2t));
        let views: Vec<(String, TensorView<'_>)> = blobs
            .iter()
            .map(|(n, dt, shape, b)| (n.clone(), TensorView::new(*dt, shape.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
        dir
    }

    #[test]
    fn a_published_head_loads_with_its_draft_vocabulary_and_aux_layers() {
        for prefix in ["", "model."] {
            let dir = head_dir(&format!("ok{}", prefix.len()), prefix, |_| {});
            let (config, w) = load(&dir, &target()).unwrap();
            assert_eq!(config.aux_layers, vec![1, 4, 6]);
            assert_eq!(config.feature_width(), 48);
            // The head's own rope and a plain Llama layer; the target's context.
            assert_eq!(config.layer.rope.theta, 500000.0);
            assert!(!config.layer.qk_norm);
            assert_eq!(config.layer.max_context, 256);
            assert_eq!(w.fc.shape, vec![16, 48]);
            assert_eq!(w.q_proj.shape, vec![16, 32]);
            assert_eq!(w.lm_head.shape, vec![10, 16]);
            assert!(w.embed.is_none());
            let map: Vec<u32> = (0..10).map(|i| 3 * i + 1).collect();
            assert_eq!(w.draft_to_target, map);
            std::fs::remove_dir_all(dir).ok();
        }
    }

    #[test]
    fn heads_that_do_not_fit_the_target_are_refused_by_name() {
        type Edit = fn(&mut serde_json::Value);
        let cases: [(&str, Edit, &str); 4] = [
            (
                "arch",
                |c| c["architectures"] = serde_json::json!(["LlamaForCausalLM"]),
                "not an EAGLE-3 head",
            ),
            (
                "vocab",
                |c| c["vocab_size"] = 41.into(),
                "vocabulary of 41 tokens",
            ),
            (
                "aux",
                |c| {
                    c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] =
                        serde_json::json!([1, 8, 2])
                },
                "aux layers",
            ),
            (
                "layers",
                |c| c["num_hidden_layers"] = 2.into(),
                "2 decoder layers",
            ),
        ];
        for (tag, edit, says) in cases {
            let dir = head_dir(tag, "", edit);
            let err = load(&dir, &target())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(says), "{tag}: {err}");
            std::fs::remove_dir_all(dir).ok();
        }
        let dir = head_dir("bin", "", |_| {});
        std::fs::remove_file(dir.join("model.safetensors")).unwrap();
        let err = load(&dir, &target())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("pytorch_model.bin converts"), "{err}");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn default_aux_layers_are_low_middle_and_high() {
        assert_eq!(default_aux_layers(32), vec![2, 16, 29]);
        assert_eq!(default_aux_layers(30), vec![2, 15, 27]);
    }
}
