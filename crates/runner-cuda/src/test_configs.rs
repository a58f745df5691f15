//! Model shapes and weight formats shared by the unit tests.

use ingot_models::{
    Architecture, BlockOptions, ModelConfig, MoeConfig, RopeConfig, RopeScaling, SlidingWindow,
};

use crate::weights::WeightFormat;

pub(crate) const FP8: WeightFormat = WeightFormat::Fp8 {
    lm_head: false,
    from_file: false,
};
pub(crate) const FP8_HEAD: WeightFormat = WeightFormat::Fp8 {
    lm_head: true,
    from_file: false,
};

/// Llama-3.1-8B's shape (the GPU benchmarks' dummy model).
pub(crate) fn llama8b() -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        hidden_size: 4096,
        intermediate_size: 14336,
        num_layers: 32,
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 128,
        vocab_size: 128256,
        max_context: 4096,
        rms_norm_eps: 1e-5,
        rope: RopeConfig {
            theta: 500000.0,
            scaling: RopeScaling::None,
        },
        qkv_bias: false,
        qk_norm: false,
        tie_word_embeddings: false,
        shard: None,
        block: Default::default(),
    }
}

/// Qwen3-30B-A3B's shape: 48 layers of 128 experts, top 8, of width 768;
/// `dense_layers` keep a dense MLP.
pub(crate) fn qwen3_moe(dense_layers: Vec<usize>) -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Qwen3,
        hidden_size: 2048,
        intermediate_size: 6144,
        num_layers: 48,
        num_heads: 32,
        num_kv_heads: 4,
        head_dim: 128,
        vocab_size: 151_936,
        qk_norm: true,
        block: BlockOptions {
            moe: Some(MoeConfig {
                num_experts: 128,
                experts_per_token: 8,
                expert_intermediate_size: 768,
                normalize_top_k: true,
                dense_layers,
            }),
            ..Default::default()
        },
        ..llama8b()
    }
}

/// Gemma 3 270M's shape.
pub(crate) fn gemma3() -> ModelConfig {
    let rope = |theta| RopeConfig {
        theta,
        scaling: RopeScaling::None,
    };
    ModelConfig {
        architecture: Architecture::Gemma3,
        hidden_size: 640,
        intermediate_size: 2048,
        num_layers: 18,
        num_heads: 4,
        num_kv_heads: 1,
        head_dim: 256,
        vocab_size: 262_144,
        max_context: 2048,
        rms_norm_eps: 1e-6,
        rope: rope(1e6),
        qkv_bias: false,
        qk_norm: true,
        tie_word_embeddings: true,
        shard: None,
        block: BlockOptions {
            sliding_window: Some(SlidingWindow {
                size: 512,
                global_every: 6,
                local_rope: rope(1e4),
            }),
            post_norms: true,
            attention_scale: None,
            final_logit_softcap: None,
            moe: None,
        },
    }
}

/// A GGUF's metadata only: each tensor's storage type by name (what
/// [`crate::NativeBlocks::plan`] reads); it has no data.
pub(crate) struct TypedFile(pub fn(&str) -> ingot_models::gguf::GgmlType);

impl ingot_models::TensorSource for TypedFile {
    fn load(&self, name: &str) -> Result<ingot_models::HostTensor, ingot_models::ModelError> {
        Err(ingot_models::ModelError::MissingTensor { name: name.into() })
    }
    fn stored_type(&self, name: &str) -> Option<ingot_models::gguf::GgmlType> {
        Some((self.0)(name))
    }
    fn contains(&self, _: &str) -> bool {
        true
    }
    fn dtype_summary(&self) -> Vec<(String, usize)> {
        Vec::new()
    }
}

/// An FP8 checkpoint's metadata only: whether each tensor is e4m3 with
/// per-tensor or per-channel scales (what [`crate::config::fp8_checkpoint`]
/// reads); it has no data.
pub(crate) struct E4m3File(pub fn(&str) -> bool);

impl ingot_models::TensorSource for E4m3File {
    fn load(&self, name: &str) -> Result<ingot_models::HostTensor, ingot_models::ModelError> {
        Err(ingot_models::ModelError::MissingTensor { name: name.into() })
    }
    fn stored_e4m3(&self, name: &str) -> bool {
        (self.0)(name)
    }
    fn contains(&self, _: &str) -> bool {
        true
    }
    fn dtype_summary(&self) -> Vec<(String, usize)> {
        Vec::new()
    }
}
