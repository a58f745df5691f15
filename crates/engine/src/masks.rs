//! Grammar masks off the critical path: the engine hands a step's
//! constrained rows to the `ingot-grammar` thread before the forward pass
//! and the backend collects the masks once its logits exist, so the mask
//! for a token is computed while the model computes that token's logits.
//! A step's rows are spread over a small pool of their own (not the CPU
//! runner's), so the wait is for the slowest row rather than the sum.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ingot_core::TokenId;
use ingot_runner::MaskSource;
use ingot_structured::{Grammar, Limit};
use metrics::Histogram;
use rayon::prelude::*;
use rayon::ThreadPool;

use crate::decoding::{advance_grammar, lock_grammar};

/// A grammar shared by a sequence (which advances it) and the mask thread
/// (which reads the allowed tokens from it); never locked by both at once
/// since the engine waits for a step's masks before advancing.
pub(crate) type SharedGrammar = Arc<Mutex<Grammar>>;

/// A constrained row of a step: its index, its grammar, and how near its
/// output is to its token limit (the mask may head for the end).
pub(crate) type MaskRow = (usize, SharedGrammar, Limit);

/// One step's constrained rows.
struct Job {
    /// Rows of the batch: `(row, grammar, how near its limit)`.
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
    /// Also advances a step's grammars past their picks (engine thread,
    /// between steps, while no mask job runs).
    pool: Arc<ThreadPool>,
}

impl MaskWorker {
    /// Starts the thread and its pool of [`pool_size`] workers; `timing`
    /// receives each mask's compute time.
    pub(crate) fn start(timing: Histogram) -> std::io::Result<Self> {
        Self::with_pool(timing, pool_size())
    }

    /// [`Self::start`] with `workers` pool threads (at least 1).
    fn with_pool(timing: Histogram, workers: usize) -> std::io::Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(workers.max(1))
            .thread_name(|i| format!("ingot-grammar-{i}"))
            .build()
            .map_err(std::io::Error::other)?;
        let pool = Arc::new(pool);
        let for_thread = pool.clone();
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("ingot-grammar".into())
            .spawn(move || {
                for job in rx {
                    let computed = compute(&for_thread, &job.rows, job.total, &timing);
                    // The engine may have given up on the step; nothing to do then.
                    let _ = job.reply.send(computed);
                }
            })?;
        Ok(Self { jobs, pool })
    }

    /// Advances each `(row, grammar, token)` on the pool (`consume_token`
    /// takes microseconds a row, serial it is a millisecond at batch 64);
    /// per row, whether its output is complete, or why the grammar failed.
    pub(crate) fn advance(
        &self,
        rows: Vec<(usize, SharedGrammar, TokenId)>,
    ) -> Vec<(usize, Result<bool, String>)> {
        if rows.len() < 2 {
            return rows.iter().map(advance_row).collect();
        }
        par_rows(&self.pool, &rows, advance_row)
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

/// Mask workers: one core stays with the engine thread (and the CPU
/// runner's own pool shares the rest); more than 8 buys nothing, a mask
/// taking tens of microseconds.
fn pool_size() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get().saturating_sub(1))
        .clamp(1, 8)
}

fn compute(pool: &ThreadPool, rows: &[MaskRow], total: usize, timing: &Histogram) -> Computed {
    let results = par_rows(pool, rows, |(row, grammar, limit)| {
        let started = Instant::now();
        let mask = row_mask(grammar, *limit);
        timing.record(started.elapsed().as_secs_f64());
        (*row, mask)
    });
    let mut masks = vec![None; total];
    let mut failed = Vec::new();
    for (row, mask) in results {
        match mask {
            Ok(m) => masks[row] = Some(m),
            Err(e) => failed.push((row, e)),
        }
    }
    Computed { masks, failed }
}

/// `f` of every item of `items` on `pool`, in order.
fn par_rows<T: Sync, R: Send>(
    pool: &ThreadPool,
    items: &[T],
    f: impl Fn(&T) -> R + Sync + Send,
) -> Vec<R> {
    // One item per task: a step has at most a few hundred rows and each
    // mask is worth far more than rayon's split.
    pool.install(|| items.par_iter().with_max_len(1).map(f).collect())
}

fn advance_row(
    (row, grammar, token): &(usize, SharedGrammar, TokenId),
) -> (usize, Result<bool, String>) {
    (
        *row,
        advance_grammar(grammar, *token).map_err(|e| e.to_string()),
    )
}

fn row_mask(grammar: &SharedGrammar, limit: Limit) -> Result<Vec<u32>, String> {
    lock_grammar(grammar)
        .and_then(|mut g| g.limit_mask(limit))
        .map_err(|e| e.to_string())
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use ingot_core::GrammarSpec;
    use ingot_structured::GrammarCompiler;
    use ingot_tokenizer::Tokenizer;

    use super::*;

    fn grammar(spec: GrammarSpec) -> SharedGrammar {
        let gguf = ingot_models::gguf::GgufFile::open(&ingot_testkit::smollm2_gguf()).unwrap();
        let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf).unwrap());
        let compiler = GrammarCompiler::new(tokenizer).unwrap();
        Arc::new(Mutex::new(compiler.compile(&spec).unwrap()))
    }

    #[test]
    fn pool_rows_run_at_once_and_keep_their_order() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let started = Instant::now();
        let out = par_rows(&pool, &[0u64, 1, 2, 3], |&i| {
            std::thread::sleep(Duration::from_millis(200));
            i * 10
        });
        assert_eq!(out, vec![0, 10, 20, 30]);
        // Serially this is 800 ms; four workers take about 200.
        assert!(
            started.elapsed() < Duration::from_millis(600),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn pooled_masks_match_serial_ones_and_failures_stay_per_row() {
        let schema = r#"{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}"#;
        let json = grammar(GrammarSpec::JsonSchema(schema.into()));
        // A grammar of its own: closing, once begun, stays on.
        let closing = grammar(GrammarSpec::JsonSchema(schema.into()));
        let regex = grammar(GrammarSpec::Regex("(yes|no)".into()));
        let want_json = json.lock().unwrap().clone().mask().unwrap();
        let want_closing = json.lock().unwrap().clone().closing_mask().unwrap();
        let want_regex = regex.lock().unwrap().clone().mask().unwrap();
        let poisoned = grammar(GrammarSpec::Regex("a+".into()));
        let p = poisoned.clone();
        let _ = std::thread::spawn(move || {
            let _guard = p.lock().unwrap();
            panic!("poison the grammar");
        })
        .join();
        let worker = MaskWorker::with_pool(Histogram::noop(), 3).unwrap();
        let rows: Vec<MaskRow> = vec![
            (0, json, Limit::Far),
            (2, regex, Limit::Far),
            (3, poisoned, Limit::Far),
            (5, closing, Limit::Closing),
        ];
        let mut pending = worker.submit(rows, 6);
        let masks = pending.masks().to_vec();
        assert_eq!(masks.len(), 6);
        assert_eq!(masks[0].as_ref(), Some(&want_json));
        assert_eq!(masks[2].as_ref(), Some(&want_regex));
        assert_eq!(masks[5].as_ref(), Some(&want_closing));
        assert!(masks[1].is_none() && masks[3].is_none() && masks[4].is_none());
        let failed = pending.failed();
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].0, 3);
        assert!(failed[0].1.contains("poisoned"), "{}", failed[0].1);
    }

    #[test]
    fn advance_moves_each_grammar_on_the_pool_and_reports_per_row() {
        let yes = grammar(GrammarSpec::Regex("(yes|no)".into()));
        let mask = yes.lock().unwrap().clone().mask().unwrap();
        let allowed = |t: u32| mask[t as usize / 32] & (1 << (t % 32)) != 0;
        let first = (0..mask.len() as u32 * 32).find(|&t| allowed(t)).unwrap();
        let refused = (0..mask.len() as u32 * 32).find(|&t| !allowed(t)).unwrap();
        let other = grammar(GrammarSpec::Regex("(yes|no)".into()));
        let worker = MaskWorker::with_pool(Histogram::noop(), 2).unwrap();
        let out = worker.advance(vec![(1, yes.clone(), first), (4, other, refused)]);
        assert_eq!(out[0].0, 1);
        assert!(out[0].1.is_ok(), "{:?}", out[0].1);
        assert_eq!(out[1].0, 4);
        assert!(out[1].1.is_err());
        // The grammar moved: the first token is no longer what it allows.
        assert_ne!(yes.lock().unwrap().clone().mask().unwrap(), mask);
    }

    #[test]
    fn pool_size_leaves_a_core_and_stays_small() {
        let n = pool_size();
        assert!((1..=8).contains(&n), "{n}");
    }
}
