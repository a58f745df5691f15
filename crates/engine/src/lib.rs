//! The engine: an OS thread that owns the scheduler, the KV bookkeeping and
//! the model runner, and streams tokens to requests through an
//! [`EngineHandle`].
//!
//! - [`engine_loop`]: the step loop (schedule → forward → sample → send).
//! - [`handle`]: the async-facing handle, requests and events.
//! - [`decoding`]: per-request output processing (sampling, stop rules,
//!   detokenization).
//! - [`embedding`]: the embedding engine (encoder models, batched).
//! - [`cpu_share`]: turns between CPU decode steps and embedding work.
//! - [`sampler`], [`stop`]: the pieces `decoding` is built from.
//! - `masks`: grammar masks computed on their own thread during the
//!   forward pass (structured output).

pub mod controls;
pub mod cpu_share;
pub mod decoding;
pub mod drain;
pub mod embedding;
pub mod engine_loop;
pub mod handle;
mod masks;
mod metrics;
pub mod prompt_scores;
pub mod sampler;
pub mod speculative;
pub mod stop;

pub use controls::{EngineControls, Measure};
pub use cpu_share::CpuArbiter;
pub use decoding::{DecodeError, Decoding, TokenOutput};
pub use embedding::{EmbeddingConfig, EmbeddingError, EmbeddingHandle};
pub use engine_loop::{start_engine, start_engine_with_draft, EngineConfig};
pub use handle::{
    Completion, EngineHandle, EngineRequest, EngineStats, EngineWatch, GeneratedToken,
    PriorityHandle, PromptLogprob, RequestId, RequestLimits, RequestStream, SubmitError,
    TokenEvent,
};
pub use ingot_kv_tiers::TierUse;
pub use ingot_structured::{Grammar, GrammarCompiler, GrammarError};
pub use metrics::{MetricsConfig, TOKEN_COUNT_BUCKETS, TOKEN_COUNT_HISTOGRAMS};
pub use sampler::TokenLogprob;
pub use speculative::{Drafter, SpeculativeConfig, SpeculativeMethod};
