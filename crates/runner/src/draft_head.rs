//! Draft heads (EAGLE-3): a small network that reads the target model's
//! hidden states and drafts the tokens that follow. The target's runner
//! hands out the hidden states of chosen layers
//! ([`crate::ModelRunner::capture_hidden`]) and builds the head on its
//! own device ([`crate::ModelRunner::draft_head`]), sharing the target's
//! embedding.

use ingot_core::TokenId;
use ingot_kv_cache::KvLayout;
use ingot_models::eagle::EagleHeadConfig;

use crate::{ForwardBatch, KvCacheShape, RunnerError, SequenceChunk};

/// What feeds each row of a head's forward pass.
#[derive(Debug, Clone, Copy)]
pub enum HeadInput<'a> {
    /// The target's hidden states at the row's position (one row of
    /// [`DraftHead::feature_width`] values per token, in batch order).
    Target(&'a [f32]),
    /// The head's own output row of the position before (one row of
    /// [`DraftHead::hidden_size`] values per token): drafting past what
    /// the target has verified.
    Own(&'a [f32]),
}

/// One forward pass of a head: each chunk's tokens are the tokens that
/// *follow* its positions (position `i` reads the hidden state of `i` and
/// the embedding of token `i + 1`), its block tables the head's own.
#[derive(Debug, Clone)]
pub struct HeadBatch<'a> {
    /// Sequence chunks (tokens, start positions, the head's tables).
    pub chunks: Vec<SequenceChunk<'a>>,
    /// The rows' hidden inputs.
    pub input: HeadInput<'a>,
}

impl HeadBatch<'_> {
    /// Tokens in the batch.
    pub fn num_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.tokens.len()).sum()
    }
}

/// A draft head on a device, with its own one-layer KV pool.
pub trait DraftHead: Send {
    /// The head's shape.
    fn config(&self) -> &EagleHeadConfig;

    /// Values per token of [`HeadInput::Target`].
    fn feature_width(&self) -> usize {
        self.config().feature_width()
    }

    /// Values per token of [`HeadInput::Own`] and [`HeadStep::hidden`].
    fn hidden_size(&self) -> usize {
        self.config().layer.hidden_size
    }

    /// The head's KV pool.
    fn kv_cache_shape(&self) -> KvCacheShape;

    /// Its one layer's table layout.
    fn kv_layout(&self) -> KvLayout {
        KvLayout::single(1)
    }

    /// Runs the batch (writing each token's K/V in the head's pool) and
    /// returns each chunk's last output row (`hidden_size` values each):
    /// what [`DraftHead::pick`] drafts from, and the [`HeadInput::Own`] row
    /// of the chunk's next position.
    fn forward(&mut self, batch: &HeadBatch<'_>) -> Result<Vec<f32>, RunnerError>;

    /// The greedy draft (a target token id) of each output row: the final
    /// norm, the head's LM head and its map to the target's vocabulary.
    /// Apart from `forward` so that rows nobody drafts from cost no LM head.
    fn pick(&mut self, rows: &[f32]) -> Result<Vec<TokenId>, RunnerError>;
}

/// Checks `batch` for a head of `config` with a KV pool of `kv`: the
/// chunks against the head's context and pool, and the input rows'
/// count and width against the batch's tokens.
pub fn check_head_batch(
    config: &EagleHeadConfig,
    kv: KvCacheShape,
    batch: &HeadBatch<'_>,
) -> Result<(), RunnerError> {
    let plain = ForwardBatch {
        chunks: batch.chunks.clone(),
        ..ForwardBatch::default()
    };
    crate::validate_batch(&config.layer, kv, &plain)?;
    let t = batch.num_tokens();
    let (rows, width) = match batch.input {
        HeadInput::Target(r) => (r, config.feature_width()),
        HeadInput::Own(r) => (r, config.layer.hidden_size),
    };
    if rows.len() != t * width {
        return Err(RunnerError::InvalidBatch(format!(
            "{} hidden values for {t} tokens of {width}",
            rows.len()
        )));
    }
    Ok(())
}

/// The number of `hidden`-wide rows in `rows` ([`DraftHead::pick`]'s
/// input), or an error when they are not whole rows.
pub fn head_rows(rows: &[f32], hidden: usize) -> Result<usize, RunnerError> {
    if !rows.len().is_multiple_of(hidden) {
        return Err(RunnerError::InvalidBatch(format!(
            "{} values are not rows of {hidden}",
            rows.len()
        )));
    }
    Ok(rows.len() / hidden)
}
