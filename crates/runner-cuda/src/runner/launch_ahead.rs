//! Launch-ahead decode steps.
//!
//! When the engine expects the same decode next (`ForwardBatch::expect_next`),
//! the runner launches that next step before returning this one's ids: its
//! inputs are this step's, one position further in the same tables, and the
//! ids this step picks are copied into them on the device, so the device
//! runs step N+1 while the host reads step N's ids and the engine schedules.
//! The next forward uses it when its batch is the launched one (a hit) or
//! the launched one less some finished rows (a partial hit: the rows still
//! running keep their results); any other batch discards it (a miss: the
//! stream runs it first, nothing else to undo). The step computes exactly
//! what the engine would have asked for: this is not speculative decoding.

use std::time::{Duration, Instant};

use cudarc::driver::CudaEvent;
use ingot_core::TokenId;
use ingot_runner::{ForwardBatch, MaskSource, RowSampling, RunnerError, SequenceChunk};

use super::CudaRunner;
use crate::CudaError;

/// A decode step launched before the engine asked for it (the engine's
/// `expect_next` hint): used if the next batch is the expected one, or
/// that one less some rows.
pub(super) struct LaunchAhead {
    /// Per row: the position and block the next chunk must have.
    rows: Vec<(usize, u32)>,
    /// The size of the graph it replayed.
    graph: usize,
    /// Which pinned id buffer its ids land in, and when they have.
    buffer: usize,
    /// Which launched buffer its captured hidden rows land in (EAGLE).
    capture: Option<usize>,
    done: CudaEvent,
}

/// What became of the launch-ahead steps (logged when the runner drops).
#[derive(Debug, Default)]
pub(super) struct LaunchAheadCounts {
    /// Used for every row.
    pub(super) hits: usize,
    /// Used for the rows still running after some of the launched rows
    /// finished (see [`launched_rows`]).
    pub(super) partial_hits: usize,
    /// Discarded.
    pub(super) misses: usize,
}

impl CudaRunner {
    /// Runs the batch (or takes the launch-ahead step that already ran it),
    /// picks ids on the device (argmax, or `rows`' sampling), and, when the
    /// engine expects the same decode next, launches that step before
    /// returning.
    pub(super) fn forward_ids(
        &mut self,
        batch: &ForwardBatch<'_>,
        rows: Option<(&[RowSampling<'_>], &mut dyn MaskSource)>,
    ) -> Result<Vec<TokenId>, RunnerError> {
        self.check_batch(batch)?;
        let n = batch.chunks.len();
        let (launched, partial) = self.take_launched(batch);
        let partial = partial.as_deref();
        let graph = self.step_graph(batch, launched.as_ref(), partial)?;
        // A launched step's captured rows: its buffer and row count (none
        // when it kept no rows).
        let captured = launched
            .as_ref()
            .map(|s| s.capture.map(|b| (b, s.rows.len())));
        // Ids sampled here are in this batch's order; a greedy hit's were
        // picked by the launched step, in its rows' order.
        let id_rows = partial.filter(|_| rows.is_none());
        let (buffer, done) = match (rows, launched) {
            (Some((rows, masks)), _) => {
                if let Some(kept) = partial {
                    self.compact_logits(kept)?;
                }
                self.sample_ids(rows, masks, n)?
            }
            (None, Some(step)) => (step.buffer, step.done),
            (None, None) => self.download_ids(n)?,
        };
        self.chain_next(batch, graph)?;
        if self.pending.is_some() {
            // The next step is queued: the CPU's other work goes on meanwhile.
            done.synchronize().map_err(CudaError::from)?;
        } else {
            // The device idles until the host answers: a blocking wait's
            // wake-up (tens of µs) would be on that path.
            wait_spinning(&done)?;
        }
        if let Some(captured) = captured {
            self.take_launched_rows(captured, partial);
        }
        let ids = self.ids_host[buffer].as_slice();
        self.last_ids = match id_rows {
            Some(kept) => kept.iter().map(|&j| ids[j] as TokenId).collect(),
            None => ids[..n].iter().map(|&i| i as TokenId).collect(),
        };
        Ok(self.last_ids.clone())
    }

    /// A tensor-parallel follower's part of [`Self::forward_ids`]: the same
    /// choice of launched step, graph and next launch, from the same batch
    /// and (set by the caller) rank 0's last ids; nothing is read back.
    pub(super) fn follow_ids(&mut self, batch: &ForwardBatch<'_>) -> Result<(), RunnerError> {
        let (launched, partial) = self.take_launched(batch);
        let graph = self.step_graph(batch, launched.as_ref(), partial.as_deref())?;
        self.chain_next(batch, graph)
    }

    /// Runs `batch` unless the step launched ahead already did; the graph
    /// size the next step can chain on (none after a partial hit: the
    /// device's inputs are laid out for the launched rows).
    fn step_graph(
        &mut self,
        batch: &ForwardBatch<'_>,
        launched: Option<&LaunchAhead>,
        partial: Option<&[usize]>,
    ) -> Result<Option<usize>, RunnerError> {
        Ok(match (launched, partial) {
            (Some(_), Some(_)) => None,
            (Some(step), None) => Some(step.graph),
            (None, _) => self.run(batch, true)?.graph_size,
        })
    }

    /// Launches the step after `batch` on the graph of `graph` rows when
    /// the engine expects it.
    fn chain_next(
        &mut self,
        batch: &ForwardBatch<'_>,
        graph: Option<usize>,
    ) -> Result<(), RunnerError> {
        match graph.filter(|_| batch.expect_next && self.profiler.is_none()) {
            Some(size) => self.launch_next(batch, size),
            None => Ok(()),
        }
    }

    /// The launch-ahead step `batch` can use, and on a partial hit which
    /// launched row each of its rows is (a subsequence, in order); counts
    /// the hit or miss. A missed step is dropped: the stream runs it first
    /// and nothing else needs undoing.
    fn take_launched(
        &mut self,
        batch: &ForwardBatch<'_>,
    ) -> (Option<LaunchAhead>, Option<Vec<usize>>) {
        let Some(step) = self.pending.take() else {
            return (None, None);
        };
        match self.launched_rows(&step, batch) {
            Some(kept) if kept.len() == step.rows.len() => {
                self.launch_ahead.hits += 1;
                (Some(step), None)
            }
            Some(kept) => {
                self.launch_ahead.partial_hits += 1;
                (Some(step), Some(kept))
            }
            None => {
                self.launch_ahead.misses += 1;
                (None, None)
            }
        }
    }

    /// Launches the decode step after `batch` on the graph of `size` rows,
    /// when every row's next position is already in its tables, and keeps
    /// it as the pending step.
    fn launch_next(&mut self, batch: &ForwardBatch<'_>, size: usize) -> Result<(), RunnerError> {
        let Some(next) = self.next_rows(batch) else {
            return Ok(());
        };
        // Its rows are one position further: their context is one longer.
        let max_ctx = next.iter().map(|&(pos, _)| pos + 1).max().unwrap_or(1);
        let (splits, _) = self.graph_for(size, max_ctx)?;
        self.stage_next_step(batch, (size, splits))?;
        let (_, graph) = self.graph_for(size, max_ctx)?;
        graph.launch().map_err(CudaError::from)?;
        let keep = self.keeps_rows(batch);
        let capture = self.download_launched(batch.chunks.len(), keep)?;
        let (buffer, done) = self.download_ids(batch.chunks.len())?;
        self.pending = Some(LaunchAhead {
            rows: next,
            graph: size,
            buffer,
            capture,
            done,
        });
        Ok(())
    }
}

/// How long [`wait_spinning`] polls before it blocks: longer than a decode
/// or verify step, shorter than a long prefill (a core busy for it).
const SPIN_LIMIT: Duration = Duration::from_millis(20);

/// Waits for `done` polling it, for at most [`SPIN_LIMIT`], then blocking.
fn wait_spinning(done: &CudaEvent) -> Result<(), CudaError> {
    let start = Instant::now();
    while start.elapsed() < SPIN_LIMIT {
        if done.try_is_complete()? {
            return Ok(());
        }
        std::hint::spin_loop();
    }
    Ok(done.synchronize()?)
}

impl CudaRunner {
    /// Where each row goes next, when every row's tables already hold its
    /// next position (inside its block, or a block the engine took a step
    /// early: `Scheduler::reserve_next_position`): its position and its
    /// first-group page there (only its sequence writes it, so the page
    /// names the sequence and, with it, the pages of its other groups).
    fn next_rows(&self, batch: &ForwardBatch<'_>) -> Option<Vec<(usize, u32)>> {
        next_rows(batch, self.first_group_shape(), self.config.max_context)
    }

    /// Stages and uploads the inputs of the decode step after `batch` (one
    /// position further, the same tables) for the graph of `size` rows and
    /// `splits` attention splits, and
    /// copies the ids this step picks into them on the device: the next
    /// step can then be launched before the host has seen those ids.
    fn stage_next_step(
        &mut self,
        batch: &ForwardBatch<'_>,
        (size, splits): (usize, usize),
    ) -> Result<(), CudaError> {
        // The ids are the device's: a placeholder stands in on the host.
        const PICKED: [TokenId; 1] = [0];
        let next = ForwardBatch {
            chunks: batch
                .chunks
                .iter()
                .map(|c| SequenceChunk {
                    tokens: &PICKED,
                    start_pos: c.start_pos + 1,
                    ..*c
                })
                .collect(),
            ..Default::default()
        };
        let scratch = self.scratch_block();
        let plan = self
            .buffers
            .prepare_graph_decode(&next, (size, splits), scratch)?;
        self.buffers.upload(&self.gpu, &plan)?;
        let rows = next.chunks.len();
        self.gpu.copy_within(
            self.buffers.input(self.buffers.layout.ids),
            self.buffers.sampled,
            rows * std::mem::size_of::<i32>(),
        )
    }

    /// Which launched row each row of `batch` is (see [`launched_rows`]).
    fn launched_rows(&self, step: &LaunchAhead, batch: &ForwardBatch<'_>) -> Option<Vec<usize>> {
        launched_rows(&step.rows, &self.last_ids, self.first_group_shape(), batch)
    }

    /// The block size and the first KV group's pages per block.
    fn first_group_shape(&self) -> (usize, usize) {
        (
            self.kv_shape.block_size,
            self.buffers.views.layout().pages_per_block(0),
        )
    }

    /// Moves the logits rows of a partial hit together, so row `i` holds
    /// launched row `kept[i]` (which is never before `i`).
    fn compact_logits(&self, kept: &[usize]) -> Result<(), RunnerError> {
        let row = self.config.vocab_size * std::mem::size_of::<f32>();
        for (i, &j) in kept.iter().enumerate().filter(|(i, j)| i != *j) {
            let at = |r: usize| self.buffers.logits + (r * row) as u64;
            self.gpu.copy_within(at(i), at(j), row)?;
        }
        Ok(())
    }
}

/// [`CudaRunner::next_rows`] for `(block_size, pages_per_block)` of the
/// first group and `max_context` positions.
fn next_rows(
    batch: &ForwardBatch<'_>,
    (block_size, pages_per_block): (usize, usize),
    max_context: usize,
) -> Option<Vec<(usize, u32)>> {
    batch
        .chunks
        .iter()
        .map(|c| {
            let next = c.start_pos + 1;
            let block = next / block_size;
            let held = next < max_context && c.group_tables.iter().all(|t| t.num_blocks() > block);
            let page = c.block_table.get(block * pages_per_block).copied();
            page.filter(|_| held).map(|page| (next, page))
        })
        .collect()
}

/// Which launched row each row of `batch` is, when the batch is the
/// launched one or the launched one less some rows (finished ones):
/// every row carries the id it was given last step (`last_ids`, one per
/// launched row), one position further in the same block (`launched`: the
/// position and first-group page each launched row must have; `shape`:
/// block size and the first group's pages per block), in the launched
/// order. `None` when a row was not launched.
fn launched_rows(
    launched: &[(usize, u32)],
    last_ids: &[TokenId],
    (block_size, pages_per_block): (usize, usize),
    batch: &ForwardBatch<'_>,
) -> Option<Vec<usize>> {
    if launched.len() != last_ids.len() || batch.chunks.is_empty() {
        return None;
    }
    let mut next = 0;
    batch
        .chunks
        .iter()
        .map(|c| {
            let found = (next..launched.len()).find(|&j| {
                let (pos, block) = launched[j];
                c.tokens == [last_ids[j]]
                    && c.start_pos == pos
                    && c.block_table.get(pos / block_size * pages_per_block) == Some(&block)
            })?;
            next = found + 1;
            Some(found)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_runner::SequenceChunk;

    /// Three launched rows: ids 7, 8, 9 at positions 5, 6, 7 of blocks
    /// 10, 11, 12 (block size 16).
    const LAUNCHED: [(usize, u32); 3] = [(5, 10), (6, 11), (7, 12)];
    const IDS: [TokenId; 3] = [7, 8, 9];
    const TABLES: [[u32; 1]; 3] = [[10], [11], [12]];

    fn batch(rows: &[usize]) -> ForwardBatch<'static> {
        ForwardBatch {
            chunks: rows
                .iter()
                .map(|&r| SequenceChunk {
                    tokens: std::slice::from_ref(&IDS[r]),
                    start_pos: LAUNCHED[r].0,
                    block_table: &TABLES[r],
                    group_tables: &[],
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn rows_go_on_into_a_block_taken_early_and_not_past_their_tables() {
        let ids = [1u32];
        let chunk = |start_pos, block_table| SequenceChunk {
            tokens: &ids,
            start_pos,
            block_table,
            group_tables: &[],
        };
        let batch = |chunks| ForwardBatch {
            chunks,
            ..Default::default()
        };
        // Position 14 goes on in its block; 15 crosses into the block the
        // engine took early (page 8).
        let both = batch(vec![chunk(14, &[3]), chunk(15, &[4, 8])]);
        assert_eq!(
            next_rows(&both, (16, 1), 4096),
            Some(vec![(15, 3), (16, 8)])
        );
        // A row crossing without its next block: no launch-ahead step.
        let short = batch(vec![chunk(14, &[3]), chunk(15, &[4])]);
        assert_eq!(next_rows(&short, (16, 1), 4096), None);
        // Nor at the end of the context.
        assert_eq!(next_rows(&batch(vec![chunk(14, &[3])]), (16, 1), 15), None);
        // Two pages a block: the next block's first page names the row.
        let paged = batch(vec![chunk(15, &[4, 5, 8, 9])]);
        assert_eq!(next_rows(&paged, (16, 2), 4096), Some(vec![(16, 8)]));
    }

    #[test]
    fn the_same_rows_are_a_full_hit() {
        assert_eq!(
            launched_rows(&LAUNCHED, &IDS, (16, 1), &batch(&[0, 1, 2])),
            Some(vec![0, 1, 2])
        );
    }

    #[test]
    fn finished_rows_leave_a_partial_hit_in_order() {
        assert_eq!(
            launched_rows(&LAUNCHED, &IDS, (16, 1), &batch(&[0, 2])),
            Some(vec![0, 2])
        );
        assert_eq!(
            launched_rows(&LAUNCHED, &IDS, (16, 1), &batch(&[1])),
            Some(vec![1])
        );
    }

    #[test]
    fn a_first_group_of_two_pages_per_block_is_matched_on_the_written_blocks_page() {
        // Position 21 is in block 1: its pages are entries 2 and 3.
        let table = [4, 5, 6, 7];
        let b = ForwardBatch {
            chunks: vec![SequenceChunk {
                tokens: &IDS[..1],
                start_pos: 21,
                block_table: &table,
                group_tables: &[],
            }],
            ..Default::default()
        };
        assert_eq!(
            launched_rows(&[(21, 6)], &IDS[..1], (16, 2), &b),
            Some(vec![0])
        );
        // Entry 1 (block 0's second page) is a shared prefix's page.
        assert_eq!(launched_rows(&[(21, 5)], &IDS[..1], (16, 2), &b), None);
    }

    #[test]
    fn reordered_new_or_changed_rows_are_a_miss() {
        assert_eq!(
            launched_rows(&LAUNCHED, &IDS, (16, 1), &batch(&[2, 0])),
            None
        );
        assert_eq!(launched_rows(&LAUNCHED, &IDS, (16, 1), &batch(&[])), None);
        let mut b = batch(&[0, 1]);
        b.chunks[1].start_pos = 9;
        assert_eq!(launched_rows(&LAUNCHED, &IDS, (16, 1), &b), None);
        let other = [8];
        let mut b = batch(&[0, 1]);
        b.chunks[0].tokens = &other;
        assert_eq!(launched_rows(&LAUNCHED, &IDS, (16, 1), &b), None);
    }
}
