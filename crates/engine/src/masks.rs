//! Grammar masks off the critical path: the engine hands a step's
//! constrained rows to the `ingot-grammar` thread before the forward pass
//! and the backend collects the masks once its logits exist, so the mask
//! for a token is computed while the model computes that token's logits.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ingot_runner::MaskSource;
use ingot_structured::Grammar;
use metrics::Histogram;

/// A grammar shared by a sequence (which advances it) and the mask thread
/// (which reads the allowed tokens from it); never locked by both at once
/// since the engine waits for a step's masks before advancing.
pub(crate) type SharedGrammar = Arc<Mutex<Grammar>>;

/// A constrained row of a step: its index, its grammar, and whether its
/// output is near its token limit (the mask then heads for the end).
pub(crate) type MaskRow = (usize, SharedGrammar, bool);

/// One step's constrained rows.
struct Job {
    /// Rows of the batch: `(row, grammar, heading for the end)`.
    rows: Vec<MaskRow>,
    /// Rows in the batch.
    total: usize,
    reply: mpsc::SyncSender<Computed>,
}

/// What the thread sends back.
struct Computed {
    masks: Vec<Option<Vec<u32>>>,
    /// Rows whose grammar failed, with why.
    failed: Vec<(usize, String)>,
}

/// The mask thread; exits when dropped.
pub(crate) struct MaskWorker {
    jobs: mpsc::Sender<Job>,
}

impl MaskWorker {
    /// Starts the thread; `timing` receives each mask's compute time.
    pub(crate) fn start(timing: Histogram) -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("ingot-grammar".into())
            .spawn(move || {
                for job in rx {
                    // The engine may have given up on the step; nothing to do then.
                    let _ = job.reply.send(compute(&job.rows, job.total, &timing));
                }
            })?;
        Ok(Self { jobs })
    }

    /// Starts computing `rows`' masks; the step's [`PendingMasks`].
    pub(crate) fn submit(&self, rows: Vec<MaskRow>, total: usize) -> PendingMasks {
        if rows.is_empty() {
            return PendingMasks::none();
        }
        let submitted: Vec<usize> = rows.iter().map(|r| r.0).collect();
        let (reply, rx) = mpsc::sync_channel(1);
        let rx = self
            .jobs
            .send(Job { rows, total, reply })
            .is_ok()
            .then_some(rx);
        PendingMasks {
            computed: gone(&submitted),
            rx,
            submitted,
        }
    }
}

/// Every submitted row failed: the thread is gone (it panicked).
fn gone(rows: &[usize]) -> Computed {
    Computed {
        masks: Vec::new(),
        failed: rows
            .iter()
            .map(|&r| (r, "the grammar thread is gone".to_string()))
            .collect(),
    }
}

fn compute(rows: &[MaskRow], total: usize, timing: &Histogram) -> Computed {
    let mut masks = vec![None; total];
    let mut failed = Vec::new();
    for (row, grammar, closing) in rows {
        let started = Instant::now();
        let mask = match grammar.lock() {
            Ok(mut g) if *closing => g.closing_mask().map_err(|e| e.to_string()),
            Ok(mut g) => g.mask().map_err(|e| e.to_string()),
            Err(_) => Err("the grammar state was poisoned".to_string()),
        };
        timing.record(started.elapsed().as_secs_f64());
        match mask {
            Ok(m) => masks[*row] = Some(m),
            Err(e) => failed.push((*row, e)),
        }
    }
    Computed { masks, failed }
}

/// A step's masks, possibly still being computed.
pub(crate) struct PendingMasks {
    /// Set until the masks have been received.
    rx: Option<mpsc::Receiver<Computed>>,
    /// The masks once received (until then: every row failed).
    computed: Computed,
    submitted: Vec<usize>,
}

impl PendingMasks {
    /// A step without constrained rows.
    pub(crate) fn none() -> Self {
        Self {
            rx: None,
            computed: Computed {
                masks: Vec::new(),
                failed: Vec::new(),
            },
            submitted: Vec::new(),
        }
    }

    fn wait(&mut self) -> &Computed {
        if let Some(rx) = self.rx.take() {
            self.computed = rx.recv().unwrap_or_else(|_| gone(&self.submitted));
        }
        &self.computed
    }

    /// Rows whose mask failed (their pick is void): waits if needed.
    pub(crate) fn failed(&mut self) -> &[(usize, String)] {
        &self.wait().failed
    }
}

impl MaskSource for PendingMasks {
    fn is_empty(&self) -> bool {
        self.submitted.is_empty()
    }

    fn masks(&mut self) -> &[Option<Vec<u32>>] {
        &self.wait().masks
    }
}
