//! The engine: sequences, sampling, stop rules and the loop that drives a
//! [`ingot_runner::ModelRunner`].

mod generate;
pub mod sampler;
mod sequence;
pub mod stop;

pub use generate::{GenerationStats, Generator};
pub use sequence::{Sequence, TokenOutput};

/// Why a request could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A sampling parameter is out of range.
    #[error(transparent)]
    Sampling(#[from] ingot_core::SamplingError),
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// Prompt plus max_tokens do not fit the model's context.
    #[error("prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds the model's context length of {max_context} tokens")]
    ContextExceeded {
        /// Prompt length.
        prompt_tokens: usize,
        /// Requested generation length.
        max_tokens: usize,
        /// The model's limit.
        max_context: usize,
    },
    /// The KV cache cannot hold the sequence.
    #[error(transparent)]
    OutOfBlocks(#[from] ingot_kv_cache::OutOfBlocks),
    /// Detokenization failed.
    #[error(transparent)]
    Tokenizer(#[from] ingot_tokenizer::TokenizerError),
    /// The backend failed.
    #[error(transparent)]
    Runner(#[from] ingot_runner::RunnerError),
}
