//! The seam between the engine and a compute backend: one forward pass over
//! a batch of sequence chunks, reading and writing a paged KV cache.
//!
//! A backend (`runner-cpu`, `runner-cuda`) owns its weights and KV memory;
//! the engine owns the bookkeeping (block tables) and tells the runner which
//! blocks each chunk uses.

use ingot_core::TokenId;
use ingot_kv_cache::BlockId;
use ingot_models::ModelConfig;

/// Consecutive tokens of one sequence to run through the model.
#[derive(Debug, Clone, Copy)]
pub struct SequenceChunk<'a> {
    /// Token ids at positions `start_pos..start_pos + tokens.len()`.
    pub tokens: &'a [TokenId],
    /// Position of `tokens[0]`; positions before it are already in the cache.
    pub start_pos: usize,
    /// The sequence's blocks, covering at least `start_pos + tokens.len()`.
    pub block_table: &'a [BlockId],
}

impl SequenceChunk<'_> {
    /// Positions in the cache after this chunk has run.
    pub fn end_pos(&self) -> usize {
        self.start_pos + self.tokens.len()
    }
}

/// A step's work: prefill chunks and decode tokens mixed freely.
#[derive(Debug, Clone, Default)]
pub struct ForwardBatch<'a> {
    /// One entry per sequence; each yields one row of logits (its last token).
    pub chunks: Vec<SequenceChunk<'a>>,
}

impl ForwardBatch<'_> {
    /// Tokens in the batch.
    pub fn num_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.tokens.len()).sum()
    }
}

/// Sizes of the runner's KV pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheShape {
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size: usize,
}

/// A failure inside a backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunnerError {
    /// The batch refers to positions or blocks the runner cannot hold.
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size}")]
    TokenOutOfRange {
        /// The id.
        id: TokenId,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// The device failed.
    #[error("backend error: {0}")]
    Backend(String),
}

/// A model on a device. Synchronous: called from the engine's own thread.
pub trait ModelRunner: Send {
    /// The model being run.
    fn config(&self) -> &ModelConfig;

    /// The KV pool this runner allocated.
    fn kv_cache_shape(&self) -> KvCacheShape;

    /// Runs the batch, writing K/V for every token into its block, and
    /// returns logits for the last token of each chunk: `chunks.len()` rows
    /// of `vocab_size` values, valid until the next call.
    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<&[f32], RunnerError>;

    /// Short name of the device ("cpu (2 threads)", "cuda:0 H100").
    fn device_name(&self) -> String;
}
