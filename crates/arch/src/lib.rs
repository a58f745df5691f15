//! Model architectures written once, over the block-level operations that
//! every backend implements ([`ops`]). [`forward`] picks the architecture
//! file from the model's config; the CPU and CUDA runners call it with
//! their own [`DecoderOps`].
//!
//! - [`llama`] (dense and mixture-of-experts), [`gemma3`]: decoders over
//!   [`DecoderOps`];
//! - [`bert`]: the BERT-family encoder (sentence embeddings) over
//!   [`bert::EncoderOps`].

pub mod bert;
pub mod gemma3;
pub mod llama;
pub mod ops;

pub use bert::{Bert, EncoderBatch, EncoderOps};
use ingot_models::{Architecture, ModelConfig};
pub use ops::{
    Activation, AttentionSpec, DecoderOps, EmbedSpec, HeadSpec, MlpSpec, MoeSpec, NextNorm,
    RopeTable, Routing,
};

/// One forward step of `config`'s architecture over `ops`: the embedding of
/// the step's tokens, every layer, and the logits of the rows the backend
/// returns.
pub fn forward<O: DecoderOps>(config: &ModelConfig, ops: &mut O) -> Result<(), O::Error> {
    match config.architecture {
        Architecture::Llama
        | Architecture::Mistral
        | Architecture::Qwen2
        | Architecture::Qwen3
        | Architecture::Qwen3Moe
        | Architecture::Mixtral => llama::forward(config, ops),
        Architecture::Gemma3 => gemma3::forward(config, ops),
    }
}

/// The LM head of `config`'s architecture (a backend that projects extra
/// rows after the step, such as scored prompt positions, uses it).
pub fn head_spec(config: &ModelConfig) -> HeadSpec {
    match config.architecture {
        Architecture::Llama
        | Architecture::Mistral
        | Architecture::Qwen2
        | Architecture::Qwen3
        | Architecture::Qwen3Moe
        | Architecture::Mixtral => llama::HEAD,
        Architecture::Gemma3 => gemma3::head_spec(config),
    }
}

/// Failures of a forward pass, phrased for the user.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArchError {
    /// The weights could not be read or have the wrong shape.
    #[error(transparent)]
    Model(#[from] ingot_models::ModelError),
    /// The input does not fit the model.
    #[error("{0}")]
    Input(String),
    /// The backend failed.
    #[error("backend error: {0}")]
    Backend(String),
}

/// A loaded embedding model, whatever its architecture and backend.
pub trait Embedder: Send + Sync {
    /// One vector per sequence of token ids (each non-empty and at most
    /// [`Embedder::max_tokens`] long). A sequence's vector does not depend
    /// on the others in the call.
    fn embed(&self, sequences: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ArchError>;
    /// [`Embedder::embed`], calling `between` between pieces of the pass
    /// (each block-level op) so the caller can pause it for other work.
    fn embed_paced(
        &self,
        sequences: &[Vec<u32>],
        between: &mut dyn FnMut(),
    ) -> Result<Vec<Vec<f32>>, ArchError> {
        between();
        self.embed(sequences)
    }
    /// Width of every vector.
    fn dimensions(&self) -> usize;
    /// Longest sequence in tokens.
    fn max_tokens(&self) -> usize;
    /// Token ids are below this.
    fn vocab_size(&self) -> usize;
    /// Where it runs ("cpu", the GPU's name).
    fn device_name(&self) -> &str;
}
