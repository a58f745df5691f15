//! CUDA graphs of decode steps: one per batch-size bucket (at GEMV sizes
//! one per attention split count too), captured at start-up on scratch
//! inputs and replayed by steps whose rows fit a bucket.

use std::time::Instant;

use cudarc::driver::{sys, CudaGraph};
use ingot_runner::{ForwardBatch, RunnerError};

use super::CudaRunner;
use crate::buffers::{self, StepPlan};
use crate::ops;
use crate::CudaError;

/// The captured decode steps for batches of up to `size` sequences, one
/// per attention split count (`splits`, ascending).
pub(super) struct DecodeGraph {
    size: usize,
    splits: Vec<usize>,
    graphs: Vec<CudaGraph>,
}

impl DecodeGraph {
    /// The split count and graph for a step whose longest context is
    /// `max_ctx` (see [`buffers::pick_splits`]).
    fn for_context(&self, max_ctx: usize) -> Result<(usize, &CudaGraph), CudaError> {
        let i = buffers::pick_splits(&self.splits, max_ctx);
        match (self.splits.get(i), self.graphs.get(i)) {
            (Some(&splits), Some(graph)) => Ok((splits, graph)),
            _ => Err(CudaError::Unsupported(format!(
                "no decode graph of size {}",
                self.size
            ))),
        }
    }
}

/// A graph to replay: its bucket's size, its split count, the graph.
pub(super) type Replay<'g> = (usize, usize, &'g CudaGraph);

/// The graph for a decode step of `rows` rows whose longest context is
/// `max_ctx`, from the smallest bucket that holds them; `None` past the
/// largest bucket.
pub(super) fn for_rows(
    graphs: &[DecodeGraph],
    rows: usize,
    max_ctx: usize,
) -> Result<Option<Replay<'_>>, CudaError> {
    match graphs.iter().find(|g| g.size >= rows) {
        Some(g) => {
            let (splits, graph) = g.for_context(max_ctx)?;
            Ok(Some((g.size, splits, graph)))
        }
        None => Ok(None),
    }
}

impl CudaRunner {
    /// Batch sizes that get a captured decode graph.
    fn graph_sizes(&self) -> Vec<usize> {
        let max = self.opts.max_num_seqs.min(self.buffers.max_tokens);
        // Every size to 8: a speculative verify step runs 2-8 rows, and on
        // a small model a row costs a step a fifth more (SmolLM2 on an
        // H200: 0.53 ms at 1 row, 0.93 at 4, 1.32 at 8), so 5 rows should
        // not replay the 8-row graph.
        let mut sizes = vec![1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32];
        let mut s = 48;
        while s <= 512 {
            sizes.push(s);
            s += 16;
        }
        sizes.retain(|&s| s < max);
        sizes.push(max);
        sizes.dedup();
        sizes
    }

    /// Captures the graphs of every batch-size bucket (one per split count
    /// at GEMV sizes); logs the time it took and the device memory the
    /// graphs took.
    pub(super) fn capture_graphs(&mut self) -> Result<(), CudaError> {
        let started = Instant::now();
        let mut graph_bytes = 0;
        for size in self.graph_sizes() {
            let counts = self
                .buffers
                .graph_split_counts(size, self.kernels.num_sms, &self.config);
            let mut graphs = Vec::with_capacity(counts.len());
            // Most splits first: the warm-up and the first capture are the
            // ones a size had with a single graph (fewest first left the
            // 32-split graph ~2 % slower on SmolLM2, measured).
            for (i, &splits) in counts.iter().rev().enumerate() {
                let empty = ForwardBatch::default();
                let scratch = self.scratch_block();
                let plan = self
                    .buffers
                    .prepare_graph_decode(&empty, (size, splits), scratch)?;
                self.buffers.upload(&self.gpu, &plan)?;
                if i == 0 {
                    // Run once eagerly: creates cuBLASLt plans (one set per
                    // size) outside the capture.
                    ops::encode(&self.model(), &plan, None)?;
                }
                self.gpu.sync()?;
                let (free_before, _) = self.gpu.memory()?;
                graphs.push(self.capture(&plan)?);
                let (free_after, _) = self.gpu.memory()?;
                graph_bytes += free_before.saturating_sub(free_after);
            }
            graphs.reverse();
            self.graphs.push(DecodeGraph {
                size,
                splits: counts,
                graphs,
            });
        }
        self.gpu.sync()?;
        tracing::info!(
            sizes = self.graphs.len(),
            graphs = self.graphs.iter().map(|g| g.graphs.len()).sum::<usize>(),
            largest = self.graphs.last().map_or(0, |g| g.size),
            graph_mib = graph_bytes as f64 / (1 << 20) as f64,
            warmup_ms = started.elapsed().as_secs_f64() * 1e3,
            "CUDA graphs captured"
        );
        Ok(())
    }

    /// Captures the decode step `plan` lays out and uploads its graph.
    fn capture(&self, plan: &StepPlan) -> Result<CudaGraph, CudaError> {
        self.gpu
            .stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let encoded = ops::encode(&self.model(), plan, None);
        let graph = self
            .gpu
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))?;
        encoded?;
        let graph = graph.ok_or_else(|| CudaError::Unsupported("empty decode graph".into()))?;
        graph.upload()?;
        Ok(graph)
    }

    /// The split count and graph of `size` rows for a longest context of
    /// `max_ctx`.
    pub(super) fn graph_for(
        &self,
        size: usize,
        max_ctx: usize,
    ) -> Result<(usize, &CudaGraph), RunnerError> {
        let g = self
            .graphs
            .iter()
            .find(|g| g.size == size)
            .ok_or_else(|| RunnerError::Backend(format!("no graph of size {size}")))?;
        Ok(g.for_context(max_ctx)?)
    }
}
