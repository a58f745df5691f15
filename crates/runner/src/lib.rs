//! The seam between the engine and a compute backend: one forward pass over
//! a batch of sequence chunks, reading and writing a paged KV cache.
//!
//! A backend (`runner-cpu`, `runner-cuda`) owns its weights and KV memory;
//! the engine owns the bookkeeping (block tables) and tells the runner which
//! blocks each chunk uses.

pub mod draft_head;
pub mod sampling;
pub mod scoring;

use ingot_core::TokenId;
use ingot_kv_cache::{BlockId, BlockTable, KvLayout, NULL_BLOCK};
use ingot_models::ModelConfig;

pub use draft_head::{check_head_batch, head_rows, DraftHead, HeadBatch, HeadInput};
pub use sampling::{apply_mask, Logprobs, Pick, RowSampling, TokenLogprob};
pub use scoring::ScoredChunk;

/// The allowed-token bitsets of a step's rows (structured output): bit
/// `t % 32` of word `t / 32` allows token `t`; ids past the end are
/// refused. They are computed on another thread while the forward pass
/// runs, so a backend asks for them only once its logits exist.
pub trait MaskSource {
    /// True when no row is constrained (known before the masks are).
    fn is_empty(&self) -> bool;

    /// Blocks until every row's mask is ready: one entry per row (`None`:
    /// unconstrained), or an empty slice when no row is constrained.
    fn masks(&mut self) -> &[Option<Vec<u32>>];
}

/// A step without constrained rows.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoMasks;

impl MaskSource for NoMasks {
    fn is_empty(&self) -> bool {
        true
    }

    fn masks(&mut self) -> &[Option<Vec<u32>>] {
        &[]
    }
}

/// Consecutive tokens of one sequence to run through the model.
#[derive(Debug, Clone, Copy)]
pub struct SequenceChunk<'a> {
    /// Token ids at positions `start_pos..start_pos + tokens.len()`.
    pub tokens: &'a [TokenId],
    /// Position of `tokens[0]`; positions before it are already in the cache.
    pub start_pos: usize,
    /// The sequence's blocks, covering at least `start_pos + tokens.len()`:
    /// the table of the first layer group of the runner's
    /// [`ModelRunner::kv_layout`] (the only one of a model without sliding
    /// windows).
    pub block_table: &'a [BlockId],
    /// The tables of the layout's other groups, in order (empty with one
    /// group). A sliding group's entries before its window are
    /// [`NULL_BLOCK`]: those positions are never read again.
    pub group_tables: &'a [BlockTable],
}

impl<'a> SequenceChunk<'a> {
    /// A chunk reading `tables`, one per layer group (at least one).
    pub fn with_tables(tokens: &'a [TokenId], start_pos: usize, tables: &'a [BlockTable]) -> Self {
        Self {
            tokens,
            start_pos,
            block_table: tables.first().map_or(&[], BlockTable::blocks),
            group_tables: tables.get(1..).unwrap_or_default(),
        }
    }

    /// Positions in the cache after this chunk has run.
    pub fn end_pos(&self) -> usize {
        self.start_pos + self.tokens.len()
    }
}

/// Block tables of every layer group of `runner` for one sequence of `len`
/// positions running alone (tools and tests): pages taken in order from an
/// empty pool of the runner's size.
pub fn solo_tables(runner: &dyn ModelRunner, len: usize) -> Result<Vec<BlockTable>, RunnerError> {
    let shape = runner.kv_cache_shape();
    let mut pool = ingot_kv_cache::BlockPool::with_layout(
        shape.num_blocks,
        shape.block_size,
        runner.kv_layout(),
        false,
    );
    let mut tables = pool.new_tables();
    pool.reserve_groups(&mut tables, 0, len)
        .map_err(|e| RunnerError::InvalidBatch(e.to_string()))?;
    Ok(tables)
}

/// A step's work: prefill chunks and decode tokens mixed freely.
#[derive(Debug, Clone, Default)]
pub struct ForwardBatch<'a> {
    /// One entry per sequence; each yields one row of logits (its last token).
    pub chunks: Vec<SequenceChunk<'a>>,
    /// A hint from the engine: it expects the next step to be these same
    /// decode chunks one token further (nothing waiting, no sequence at its
    /// length limit). A backend may start that step before this one's
    /// results are read; it must check the next batch and discard on a miss.
    pub expect_next: bool,
    /// The caller reads this step's hidden rows (an EAGLE head, see
    /// [`ModelRunner::capture_hidden`]); false: the runner may keep none
    /// (a GPU then copies none to the host).
    pub keep_hidden: bool,
    /// Chunks whose positions are scored too (prompt logprobs): their rows
    /// follow the chunks' last-token rows in [`ModelRunner::forward`]'s
    /// output. Read by `forward` and [`ModelRunner::forward_scored`] only.
    pub score: Vec<ScoredChunk<'a>>,
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
    /// of `vocab_size` values, then one row per scored position of each
    /// entry of `batch.score` (its chunk's first `next.len()` positions),
    /// valid until the next call.
    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<&[f32], RunnerError>;

    /// How the layers share KV pages and block tables. The default is one
    /// group of every layer: one table per sequence, every layer reading
    /// it, whatever windows the model has. A backend that reads a table
    /// per group returns [`kv_layout_of`] its model.
    fn kv_layout(&self) -> KvLayout {
        KvLayout::single(self.config().num_layers)
    }

    /// Short name of the device ("cpu (2 threads)", "cuda:0 H100").
    fn device_name(&self) -> String;

    /// The forward pass computes on the host's cores (it then takes turns
    /// with CPU embedding work).
    fn computes_on_host(&self) -> bool {
        false
    }

    /// The runner may launch the next decode step before this one returns
    /// (see [`ForwardBatch::expect_next`]): the engine then gives each row
    /// the block of its next position a step early, where that starts a
    /// new block, so the launched step has every row's KV slot.
    fn launches_ahead(&self) -> bool {
        false
    }

    /// Whether a speculative step runs a sequence's last token and its
    /// proposals as single-token decode rows (which this backend runs
    /// fastest: replayed graphs) rather than as one chunk.
    fn verifies_as_decode_rows(&self) -> bool {
        false
    }

    /// Gives back the memory of the KV pool (its contents are lost) and,
    /// where weights live on a device, moves them to host memory, keeping
    /// what it takes to [`ModelRunner::wake`] fast. Returns the host bytes
    /// the sleeping runner holds. No forward pass runs while asleep.
    fn sleep(&mut self) -> Result<u64, RunnerError> {
        Err(RunnerError::Backend(format!(
            "{} cannot sleep",
            self.device_name()
        )))
    }

    /// Undoes [`ModelRunner::sleep`]: the runner serves again, with an
    /// empty KV pool.
    fn wake(&mut self) -> Result<(), RunnerError> {
        Err(RunnerError::Backend(format!(
            "{} cannot wake",
            self.device_name()
        )))
    }

    /// Bytes of one KV page as [`ModelRunner::read_kv_pages`] copies it
    /// out (every layer of the page, K and V). 0: this backend cannot copy
    /// pages, so KV tiers stay off for it.
    fn kv_page_bytes(&self) -> usize {
        0
    }

    /// What a page's bytes depend on besides the model and its layout:
    /// the backend, element type and byte layout ("cpu-f32"). Pages are
    /// only restored into a runner of the same format.
    fn kv_page_format(&self) -> String {
        String::new()
    }

    /// Copies page `pages[i]` of the KV pool into `out[i]`
    /// (`kv_page_bytes()` each).
    fn read_kv_pages(
        &mut self,
        pages: &[BlockId],
        out: &mut [&mut [u8]],
    ) -> Result<(), RunnerError> {
        let _ = (pages, out);
        Err(RunnerError::Backend(format!(
            "{} cannot copy KV pages",
            self.device_name()
        )))
    }

    /// Writes `data[i]` (`kv_page_bytes()` each) into page `pages[i]`.
    fn write_kv_pages(&mut self, pages: &[BlockId], data: &[&[u8]]) -> Result<(), RunnerError> {
        let _ = (pages, data);
        Err(RunnerError::Backend(format!(
            "{} cannot copy KV pages",
            self.device_name()
        )))
    }

    /// From the next forward pass on, keep the hidden state entering each
    /// of `layers` (the residual stream before the layer runs) for every
    /// token of a batch that asks for them ([`ForwardBatch::keep_hidden`]):
    /// [`ModelRunner::captured_hidden`]. Empty: none.
    fn capture_hidden(&mut self, layers: &[usize]) -> Result<(), RunnerError> {
        let _ = layers;
        Err(RunnerError::Backend(format!(
            "{} does not hand out hidden states yet (EAGLE heads need them)",
            self.device_name()
        )))
    }

    /// The last forward pass's captured hidden states: per token of the
    /// batch, in order, the rows of each captured layer side by side
    /// (`layers.len() * hidden_size` values).
    fn captured_hidden(&self) -> &[f32] {
        &[]
    }

    /// An EAGLE-3 head on this runner's device, reading this model's
    /// hidden states (its embedding shared unless the head has its own),
    /// with a KV pool of `kv_tokens` positions.
    fn draft_head(
        &self,
        config: ingot_models::eagle::EagleHeadConfig,
        weights: ingot_models::eagle::EagleHeadWeights,
        kv_tokens: usize,
    ) -> Result<Box<dyn DraftHead>, RunnerError> {
        let _ = (config, weights, kv_tokens);
        Err(RunnerError::Backend(format!(
            "{} does not run EAGLE heads yet",
            self.device_name()
        )))
    }

    /// Runs the batch and returns the greedy choice (argmax, lowest id on
    /// ties) for the last token of each chunk. Backends that can pick on the
    /// device override this so that only ids, not logits, leave it.
    fn forward_greedy(&mut self, batch: &ForwardBatch<'_>) -> Result<Vec<TokenId>, RunnerError> {
        let (vocab, n) = (self.config().vocab_size, batch.chunks.len());
        let logits = self.forward(batch)?;
        Ok(logits.chunks_exact(vocab).take(n).map(argmax).collect())
    }

    /// Runs the batch and picks each chunk's next token as `rows` (one per
    /// chunk) say: the row's token mask from `masks` (tokens it refuses
    /// get -inf, so logprobs are those of the constrained distribution),
    /// penalties, temperature, truncation and a draw, plus the logprobs a
    /// row asks for. Backends that can sample on the device override this
    /// so that only ids (and logprobs) leave it; the default samples the
    /// downloaded logits on the host. `masks` is waited for only after the
    /// forward pass, which it overlaps.
    fn forward_sample(
        &mut self,
        batch: &ForwardBatch<'_>,
        rows: &[RowSampling<'_>],
        masks: &mut dyn MaskSource,
    ) -> Result<Vec<Pick>, RunnerError> {
        check_rows(batch, rows)?;
        let vocab = self.config().vocab_size;
        let logits = self.forward(batch)?;
        Ok(pick_rows(logits, vocab, rows, masks.masks()))
    }

    /// Runs the batch, picks each chunk's next token as `rows` say, and
    /// scores the positions `batch.score` names, all from one forward
    /// pass: `scores[i][j]` is position `j` of `batch.score[i]`'s chunk
    /// against `next[j]`. Picks and scores are made on the host from the
    /// downloaded rows.
    fn forward_scored(
        &mut self,
        batch: &ForwardBatch<'_>,
        rows: &[RowSampling<'_>],
        masks: &mut dyn MaskSource,
    ) -> Result<ScoredStep, RunnerError> {
        check_rows(batch, rows)?;
        let vocab = self.config().vocab_size;
        let n = batch.chunks.len();
        let positions: usize = batch.score.iter().map(|s| s.next.len()).sum();
        let logits = self.forward(batch)?;
        if logits.len() != (n + positions) * vocab {
            return Err(RunnerError::Backend(format!(
                "{} logits rows for {n} chunks and {positions} scored positions",
                logits.len() / vocab
            )));
        }
        let (last, scored) = logits.split_at(n * vocab);
        Ok(ScoredStep {
            picks: pick_rows(last, vocab, rows, masks.masks()),
            scores: scoring::score_rows(scored, vocab, &batch.score),
        })
    }
}

/// What [`ModelRunner::forward_scored`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredStep {
    /// One per chunk.
    pub picks: Vec<Pick>,
    /// One list per entry of `batch.score`, one entry per scored position.
    pub scores: Vec<Vec<Logprobs>>,
}

/// Picks from the first `rows.len()` rows of `logits` on the host, each
/// row under its token mask when `masks` has one for it.
fn pick_rows(
    logits: &[f32],
    vocab: usize,
    rows: &[RowSampling<'_>],
    masks: &[Option<Vec<u32>>],
) -> Vec<Pick> {
    let (mut row, mut order) = (Vec::with_capacity(vocab), Vec::new());
    logits
        .chunks_exact(vocab)
        .zip(rows)
        .enumerate()
        .map(|(i, (l, r))| {
            row.clear();
            row.extend_from_slice(l);
            if let Some(Some(mask)) = masks.get(i) {
                apply_mask(&mut row, mask);
            }
            sampling::pick_row(&mut row, r, &mut order)
        })
        .collect()
}

/// Checks a copy of KV `pages` (see [`ModelRunner::read_kv_pages`]): one
/// buffer of `page_bytes` per page (`lens`), every page in a pool of
/// `num_pages`.
pub fn check_kv_copy(
    pages: &[BlockId],
    lens: impl ExactSizeIterator<Item = usize>,
    page_bytes: usize,
    num_pages: usize,
) -> Result<(), RunnerError> {
    let count = lens.len();
    if count != pages.len() {
        return Err(RunnerError::InvalidBatch(format!(
            "{count} buffers for {} KV pages",
            pages.len()
        )));
    }
    if let Some(len) = lens.into_iter().find(|&l| l != page_bytes) {
        return Err(RunnerError::InvalidBatch(format!(
            "a {len}-byte buffer for a KV page of {page_bytes} bytes"
        )));
    }
    match pages.iter().find(|&&p| p as usize >= num_pages) {
        Some(p) => Err(RunnerError::InvalidBatch(format!("no KV page {p}"))),
        None => Ok(()),
    }
}

/// One sampling row per chunk.
pub fn check_rows(batch: &ForwardBatch<'_>, rows: &[RowSampling<'_>]) -> Result<(), RunnerError> {
    if rows.len() != batch.chunks.len() {
        return Err(RunnerError::InvalidBatch(format!(
            "{} sampling rows for {} chunks",
            rows.len(),
            batch.chunks.len()
        )));
    }
    Ok(())
}

/// Index of the largest value; ties go to the lowest index.
pub fn argmax(v: &[f32]) -> TokenId {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as TokenId
}

/// The layer groups of `config`: global layers in one group, sliding-window
/// layers in another (one group for a model without windows).
pub fn kv_layout_of(config: &ModelConfig) -> KvLayout {
    let windows: Vec<Option<usize>> = (0..config.num_layers)
        .map(|l| config.block.window_of(l))
        .collect();
    KvLayout::from_windows(&windows)
}

/// [`validate_grouped`] for a runner with one table per sequence.
pub fn validate_batch(
    config: &ModelConfig,
    kv: KvCacheShape,
    batch: &ForwardBatch<'_>,
) -> Result<(), RunnerError> {
    validate_grouped(config, kv, &KvLayout::single(config.num_layers), batch)
}

/// Checks one group's table of chunk `c`: it covers the chunk, its pages
/// are in the pool, and only blocks no query of the chunk sees are null.
fn validate_table(
    c: &SequenceChunk<'_>,
    (layout, g): (&KvLayout, usize),
    table: &[BlockId],
    kv: KvCacheShape,
) -> Result<(), RunnerError> {
    let (bs, ppb) = (kv.block_size, layout.pages_per_block(g));
    if table.len() / ppb * bs < c.end_pos() {
        return Err(RunnerError::InvalidBatch(format!(
            "block table of {} blocks cannot hold {} positions",
            table.len() / ppb,
            c.end_pos()
        )));
    }
    let first_live = layout.first_live_block(g, c.start_pos, bs) * ppb;
    for (i, &b) in table.iter().enumerate() {
        if b == NULL_BLOCK && i < first_live {
            continue;
        }
        if b as usize >= kv.num_blocks {
            return Err(RunnerError::InvalidBatch(format!(
                "block {b} outside the pool"
            )));
        }
    }
    Ok(())
}

/// Checks what every backend relies on: non-empty chunks inside the context,
/// block tables (one per group of `layout`) that cover them and stay in the
/// pool, tokens in the vocabulary.
pub fn validate_grouped(
    config: &ModelConfig,
    kv: KvCacheShape,
    layout: &KvLayout,
    batch: &ForwardBatch<'_>,
) -> Result<(), RunnerError> {
    for c in &batch.chunks {
        if c.tokens.is_empty() {
            return Err(RunnerError::InvalidBatch("empty chunk".into()));
        }
        if c.end_pos() > config.max_context {
            return Err(RunnerError::InvalidBatch(format!(
                "position {} exceeds the context length {}",
                c.end_pos(),
                config.max_context
            )));
        }
        if c.group_tables.len() + 1 != layout.groups().len() {
            return Err(RunnerError::InvalidBatch(format!(
                "{} block tables for {} layer groups",
                c.group_tables.len() + 1,
                layout.groups().len()
            )));
        }
        validate_table(c, (layout, 0), c.block_table, kv)?;
        for (g, t) in c.group_tables.iter().enumerate() {
            validate_table(c, (layout, g + 1), t.blocks(), kv)?;
        }
        if let Some(&id) = c.tokens.iter().find(|&&t| t as usize >= config.vocab_size) {
            return Err(RunnerError::TokenOutOfRange {
                id,
                vocab_size: config.vocab_size,
            });
        }
    }
    for s in &batch.score {
        let Some(c) = batch.chunks.get(s.chunk) else {
            return Err(RunnerError::InvalidBatch(format!(
                "scored chunk {} of {}",
                s.chunk,
                batch.chunks.len()
            )));
        };
        if s.next.len() > c.tokens.len() {
            return Err(RunnerError::InvalidBatch(format!(
                "{} scored positions in a chunk of {} tokens",
                s.next.len(),
                c.tokens.len()
            )));
        }
        if let Some(&id) = s.next.iter().find(|&&t| t as usize >= config.vocab_size) {
            return Err(RunnerError::TokenOutOfRange {
                id,
                vocab_size: config.vocab_size,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kv_copy_needs_one_page_sized_buffer_per_page_of_the_pool() {
        let ok = check_kv_copy(&[0, 3], [8, 8].into_iter(), 8, 4);
        assert!(ok.is_ok());
        let refused = [
            check_kv_copy(&[0, 3], [8].into_iter(), 8, 4),
            check_kv_copy(&[0, 3], [8, 7].into_iter(), 8, 4),
            check_kv_copy(&[0, 4], [8, 8].into_iter(), 8, 4),
        ];
        for r in refused {
            assert!(matches!(r, Err(RunnerError::InvalidBatch(_))), "{r:?}");
        }
    }
}
