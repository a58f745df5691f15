//! Model shapes shared by the unit tests.

use ingot_models::{Architecture, ModelConfig, RopeConfig, RopeScaling};

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
        block: Default::default(),
    }
}
