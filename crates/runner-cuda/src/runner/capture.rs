//! Hidden states for EAGLE heads: each step copies the residual rows
//! entering the chosen layers into device rows (inside the decode graphs
//! too) and, right behind the step on the stream, into pinned host memory
//! that `ModelRunner::captured_hidden` hands out once the step is read. A
//! step launched ahead copies its rows into one of two buffers of its own,
//! so the rows of the step the engine reads are never those of the step
//! running behind it.

use ingot_runner::{ForwardBatch, RunnerError};

use super::CudaRunner;
use crate::device::{Arena, DevPtr, Pinned};
use crate::{ops, CudaError};

/// The layers whose input rows each step keeps, and where.
pub(super) struct HiddenCapture {
    layers: Vec<usize>,
    /// `[max_tokens, layers.len() * hidden]` f32.
    rows: DevPtr,
    /// A step run when asked: up to the workspace's tokens.
    host: Pinned<f32>,
    /// Steps launched ahead (decode rows of at most `max_seqs` sequences),
    /// used in turn.
    launched: [Pinned<f32>; 2],
    next_launched: usize,
    /// Values of a row (every layer's).
    width: usize,
    /// What [`HiddenCapture::rows`] hands out.
    current: Current,
    _arena: Arena,
}

/// Where the last step's rows are.
enum Current {
    None,
    /// The first `n` values of `host`.
    Step(usize),
    /// The first `n` values of launched buffer `b`.
    Launched {
        b: usize,
        n: usize,
    },
    /// The rows still running of a launched step some of whose rows
    /// finished.
    Kept(Vec<f32>),
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
        match &self.current {
            Current::None => &[],
            Current::Step(n) => &self.host.as_slice()[..*n],
            Current::Launched { b, n } => &self.launched[*b].as_slice()[..*n],
            Current::Kept(rows) => rows,
        }
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
        self.make_capture(layers).map_err(RunnerError::from)
    }

    fn make_capture(&mut self, layers: &[usize]) -> Result<(), CudaError> {
        self.gpu.ctx.bind_to_thread()?;
        self.pending = None;
        self.gpu.sync()?;
        self.capture = None;
        if !layers.is_empty() {
            let width = layers.len() * self.config.hidden_size;
            let values = self.buffers.max_tokens * width;
            let mut arena = Arena::new(&self.gpu, "hidden capture", Arena::size_of([values * 4]))?;
            self.memory.workspace += arena.size();
            let seqs = self.buffers.max_seqs * width;
            self.capture = Some(HiddenCapture {
                layers: layers.to_vec(),
                rows: arena.take(values * 4)?,
                host: Pinned::new(&self.gpu, values)?,
                launched: [Pinned::new(&self.gpu, seqs)?, Pinned::new(&self.gpu, seqs)?],
                next_launched: 0,
                width,
                current: Current::None,
                _arena: arena,
            });
        }
        if !self.graphs.is_empty() {
            self.graphs.clear();
            self.capture_graphs()?;
        }
        Ok(())
    }

    /// Whether `batch`'s step keeps its rows (the caller reads them).
    pub(super) fn keeps_rows(&self, batch: &ForwardBatch<'_>) -> bool {
        self.capture.is_some() && batch.keep_hidden
    }

    /// Enqueues the copy of a step's `tokens` captured rows to the host
    /// (read once the step's ids or logits are); with `keep` false the
    /// step has none.
    pub(super) fn download_captured(&mut self, tokens: usize, keep: bool) -> Result<(), CudaError> {
        let Some(c) = self.capture.as_mut() else {
            return Ok(());
        };
        if !keep {
            c.current = Current::None;
            return Ok(());
        }
        let n = tokens * c.width;
        c.current = Current::Step(n);
        self.gpu.download(&mut c.host.as_mut_slice()[..n], c.rows)
    }

    /// Enqueues the copy of a launched step's `rows` captured rows into the
    /// next launched buffer when `keep`; returns it.
    pub(super) fn download_launched(
        &mut self,
        rows: usize,
        keep: bool,
    ) -> Result<Option<usize>, CudaError> {
        let Some(c) = self.capture.as_mut().filter(|_| keep) else {
            return Ok(None);
        };
        let b = c.next_launched;
        c.next_launched ^= 1;
        let host = &mut c.launched[b].as_mut_slice()[..rows * c.width];
        self.gpu.download(host, c.rows)?;
        Ok(Some(b))
    }

    /// After the wait for a launched step whose `rows` rows landed in
    /// buffer `b` (`captured`; none for a step that kept none): its rows
    /// become the last step's (only `kept`, in order, after a partial hit).
    pub(super) fn take_launched_rows(
        &mut self,
        captured: Option<(usize, usize)>,
        kept: Option<&[usize]>,
    ) {
        let Some(c) = self.capture.as_mut() else {
            return;
        };
        let w = c.width;
        c.current = match (captured, kept) {
            (None, _) => Current::None,
            (Some((b, rows)), None) => Current::Launched { b, n: rows * w },
            (Some((b, _)), Some(kept)) => {
                let all = c.launched[b].as_slice();
                Current::Kept(
                    kept.iter()
                        .flat_map(|&j| &all[j * w..(j + 1) * w])
                        .copied()
                        .collect(),
                )
            }
        };
    }
}
