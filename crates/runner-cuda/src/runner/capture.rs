//! Hidden states for EAGLE heads: each step copies the residual rows
//! entering the chosen layers into device rows (inside the decode graphs
//! too) and, right behind the step on the stream, into pinned host memory
//! that `ModelRunner::captured_hidden` hands out once the step is read.
//! While capturing no step is launched ahead: a launched step would
//! overwrite the rows of the one the engine has not read yet.

use ingot_runner::RunnerError;

use super::CudaRunner;
use crate::device::{Arena, DevPtr, Pinned};
use crate::eagle::HeadParts;
use crate::{ops, CudaError};

/// The layers whose input rows each step keeps, and where.
pub(super) struct HiddenCapture {
    layers: Vec<usize>,
    /// `[max_tokens, layers.len() * hidden]` f32.
    rows: DevPtr,
    host: Pinned<f32>,
    /// Values of the last step's rows in `host`.
    len: usize,
    _arena: Arena,
}

impl HiddenCapture {
    /// Where the step's copies go.
    pub(super) fn target(&self) -> ops::Capture<'_> {
        ops::Capture {
            layers: &self.layers,
            rows: self.rows,
        }
    }

    /// The last step's rows.
    pub(super) fn rows(&self) -> &[f32] {
        &self.host.as_slice()[..self.len]
    }
}

impl CudaRunner {
    /// Keeps the input rows of `layers` from the next step on (none: stops);
    /// the decode graphs are captured again with the copies in them.
    pub(super) fn set_capture(&mut self, layers: &[usize]) -> Result<(), RunnerError> {
        if self.comm.is_some() {
            return Err(RunnerError::Backend(
                "EAGLE heads do not run under tensor parallelism yet".into(),
            ));
        }
        if let Some(&l) = layers.iter().find(|&&l| l >= self.config.num_layers) {
            return Err(RunnerError::Backend(format!(
                "cannot capture the input of layer {l}: the model has {}",
                self.config.num_layers
            )));
        }
        self.make_capture(layers)
            .map_err(|e| RunnerError::Backend(e.to_string()))
    }

    fn make_capture(&mut self, layers: &[usize]) -> Result<(), CudaError> {
        self.gpu.ctx.bind_to_thread()?;
        self.pending = None;
        self.gpu.sync()?;
        self.capture = None;
        if !layers.is_empty() {
            let values = self.buffers.max_tokens * layers.len() * self.config.hidden_size;
            let mut arena = Arena::new(&self.gpu, "hidden capture", Arena::size_of([values * 4]))?;
            self.memory.workspace += arena.size() + values * 4;
            self.capture = Some(HiddenCapture {
                layers: layers.to_vec(),
                rows: arena.take(values * 4)?,
                host: Pinned::new(&self.gpu, values)?,
                len: 0,
                _arena: arena,
            });
        }
        if !self.graphs.is_empty() {
            self.graphs.clear();
            self.capture_graphs()?;
        }
        Ok(())
    }

    /// Enqueues the copy of a step's `tokens` captured rows to the host
    /// (read once the step's ids or logits are).
    pub(super) fn download_captured(&mut self, tokens: usize) -> Result<(), CudaError> {
        let Some(c) = self.capture.as_mut() else {
            return Ok(());
        };
        c.len = tokens * c.layers.len() * self.config.hidden_size;
        self.gpu
            .download(&mut c.host.as_mut_slice()[..c.len], c.rows)
    }

    /// What an EAGLE head on this runner's device shares with it.
    pub(super) fn head_parts(&self) -> HeadParts {
        HeadParts {
            gpu: self.gpu.clone(),
            embed: (self.weights.embed, self.weights.embed_blocks),
            block_size: self.opts.block_size,
            max_seqs: self.opts.max_num_seqs,
        }
    }

    /// Whether steps keep hidden rows (and so none launches ahead).
    pub(super) fn captures(&self) -> bool {
        self.capture.is_some()
    }
}
