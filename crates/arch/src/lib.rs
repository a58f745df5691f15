//! Model architectures written once, over the block-level operations that
//! every backend implements ([`ops`]). [`forward`] picks the architecture
//! file from the model's config; the CPU and CUDA runners call it with
//! their own [`DecoderOps`].

pub mod gemma3;
pub mod llama;
pub mod ops;

use ingot_models::{Architecture, ModelConfig};
pub use ops::{
    Activation, AttentionSpec, DecoderOps, EmbedSpec, HeadSpec, MlpSpec, NextNorm, RopeTable,
};

/// One forward step of `config`'s architecture over `ops`: the embedding of
/// the step's tokens, every layer, and the logits of the rows the backend
/// returns.
pub fn forward<O: DecoderOps>(config: &ModelConfig, ops: &mut O) -> Result<(), O::Error> {
    match config.architecture {
        Architecture::Llama | Architecture::Mistral | Architecture::Qwen2 | Architecture::Qwen3 => {
            llama::forward(config, ops)
        }
        Architecture::Gemma3 => gemma3::forward(config, ops),
    }
}

/// The LM head of `config`'s architecture (a backend that projects extra
/// rows after the step, such as scored prompt positions, uses it).
pub fn head_spec(config: &ModelConfig) -> HeadSpec {
    match config.architecture {
        Architecture::Llama | Architecture::Mistral | Architecture::Qwen2 | Architecture::Qwen3 => {
            llama::HEAD
        }
        Architecture::Gemma3 => gemma3::head_spec(config),
    }
}
