//! The embedding engine: an OS thread that batches embedding requests with
//! each other and runs them through an [`Embedder`].
//!
//! Requests queue on a channel; the thread takes every request waiting and
//! runs their sequences in batches of at most `max_batch_tokens` tokens
//! (a longer single sequence runs alone), so concurrent requests share
//! forward passes and one large request cannot hold the model for long.
//!
//! Decode must never wait for embeddings. On the CPU the two take turns
//! through the process's [`CpuArbiter`]: the forward pass stops at a
//! checkpoint before every matmul and attention, and while a CPU decode
//! engine is stepping it runs only between decode steps, for at most
//! `decode_share` of their time; batches are then sized so one piece of
//! work fits one such slice. With no decode running it takes the CPU in
//! full-size batches. The passes run on the engine's own thread pool, not
//! the global one the CPU decoders share, so a decode step's tasks never
//! queue behind an encoder batch.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ingot_arch::Embedder;
use ingot_tokenizer::EncoderTokenizer;
use tokio::sync::oneshot;

use crate::cpu_share::{CpuArbiter, EmbeddingSide};

/// How an embedding engine batches and where it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingConfig {
    /// The model's id: the `model` label of its series.
    pub model_name: String,
    /// Most tokens in one forward pass.
    pub max_batch_tokens: usize,
    /// Threads of the engine's pool.
    pub threads: usize,
    /// Run the pool at `SCHED_IDLE` (Linux), below every other thread.
    pub idle_priority: bool,
    /// Take turns with CPU decode steps through [`CpuArbiter::process`],
    /// using at most this share of their time while they run (`None`:
    /// no turns, for a model that does not share the decoders' cores).
    pub decode_share: Option<f64>,
}

/// Why an embedding request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmbeddingError {
    /// The input does not fit the model (the client's fault).
    #[error("{0}")]
    Input(String),
    /// The engine has stopped.
    #[error("the embedding engine has stopped")]
    Stopped,
    /// The forward pass failed.
    #[error("embedding failed: {0}")]
    Failed(String),
}

/// A request's vectors, or why it failed.
type Answer = Result<Vec<Vec<f32>>, EmbeddingError>;
type Reply = oneshot::Sender<Answer>;

struct Job {
    sequences: Vec<Vec<u32>>,
    reply: Reply,
}

struct Shared {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    tokenizer: EncoderTokenizer,
    dimensions: usize,
    max_tokens: usize,
    vocab_size: usize,
    device: String,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Closing the channel ends the thread once the queue is drained.
        lock(&self.jobs).take();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The async-facing handle of an embedding engine. Cheap to clone; the
/// engine stops when the last clone drops.
#[derive(Clone)]
pub struct EmbeddingHandle {
    shared: Arc<Shared>,
}

impl EmbeddingHandle {
    /// Starts the engine's thread over `model`.
    pub fn start(
        model: Box<dyn Embedder>,
        tokenizer: EncoderTokenizer,
        config: EmbeddingConfig,
    ) -> Result<Self, EmbeddingError> {
        let pool = thread_pool(&config)?;
        describe();
        let (tx, rx) = mpsc::channel::<Job>();
        let (dimensions, max_tokens) = (model.dimensions(), model.max_tokens());
        let (vocab_size, device) = (model.vocab_size(), model.device_name().to_string());
        let budget = config.max_batch_tokens.max(1);
        let side = config
            .decode_share
            .map(|share| CpuArbiter::process().embedding_side(share));
        let thread = std::thread::Builder::new()
            .name("ingot-embed".into())
            .spawn(move || {
                let mut worker = Worker::new(&*model, budget, side, config.model_name);
                while let Ok(first) = rx.recv() {
                    let mut jobs = vec![first];
                    jobs.extend(rx.try_iter());
                    let results = pool.install(|| worker.embed_jobs(&jobs));
                    for (job, result) in jobs.into_iter().zip(results) {
                        let _ = job.reply.send(result);
                    }
                }
            })
            .map_err(|e| EmbeddingError::Failed(format!("cannot start the thread: {e}")))?;
        Ok(Self {
            shared: Arc::new(Shared {
                jobs: Mutex::new(Some(tx)),
                thread: Mutex::new(Some(thread)),
                tokenizer,
                dimensions,
                max_tokens,
                vocab_size,
                device,
            }),
        })
    }

    /// The ids of `text` ([CLS] … [SEP] included).
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, EmbeddingError> {
        self.shared
            .tokenizer
            .encode(text)
            .map_err(|e| EmbeddingError::Failed(e.to_string()))
    }

    /// Width of every vector.
    pub fn dimensions(&self) -> usize {
        self.shared.dimensions
    }

    /// Longest input in tokens.
    pub fn max_tokens(&self) -> usize {
        self.shared.max_tokens
    }

    /// Where the model runs.
    pub fn device_name(&self) -> &str {
        &self.shared.device
    }

    /// One vector per sequence, batched with whatever else is queued.
    pub async fn embed(&self, sequences: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, EmbeddingError> {
        self.check(&sequences)?;
        let (reply, answer) = oneshot::channel();
        {
            let jobs = lock(&self.shared.jobs);
            let tx = jobs.as_ref().ok_or(EmbeddingError::Stopped)?;
            tx.send(Job { sequences, reply })
                .map_err(|_| EmbeddingError::Stopped)?;
        }
        answer.await.map_err(|_| EmbeddingError::Stopped)?
    }

    /// Refuses what the model cannot take before it queues.
    fn check(&self, sequences: &[Vec<u32>]) -> Result<(), EmbeddingError> {
        let (max, vocab) = (self.shared.max_tokens, self.shared.vocab_size);
        for (i, s) in sequences.iter().enumerate() {
            if s.is_empty() {
                return Err(EmbeddingError::Input(format!("input {i} has no tokens")));
            }
            if s.len() > max {
                return Err(EmbeddingError::Input(format!(
                    "input {i} has {} tokens; this model's maximum context length is {max} tokens",
                    s.len()
                )));
            }
            if let Some(t) = s.iter().find(|&&t| t as usize >= vocab) {
                return Err(EmbeddingError::Input(format!(
                    "input {i} holds token id {t}, outside the vocabulary (size {vocab})"
                )));
            }
        }
        Ok(())
    }
}

/// The embedding series.
const BATCH_SECONDS: &str = "ingot_embedding_batch_seconds";
const TOKENS: &str = "ingot_embedding_tokens_total";

/// HELP text of the embedding series (the recorder keeps one per name).
fn describe() {
    metrics::describe_histogram!(
        BATCH_SECONDS,
        metrics::Unit::Seconds,
        "Time an embedding model computed per forward pass (batch), pauses for decode's turns excluded."
    );
    metrics::describe_counter!(
        TOKENS,
        metrics::Unit::Count,
        "Input tokens embedded (special tokens included)."
    );
}

fn thread_pool(config: &EmbeddingConfig) -> Result<rayon::ThreadPool, EmbeddingError> {
    let idle = config.idle_priority;
    rayon::ThreadPoolBuilder::new()
        .num_threads(config.threads.max(1))
        .thread_name(|i| format!("ingot-embed-{i}"))
        .start_handler(move |_| {
            if idle {
                lower_to_idle_priority();
            }
        })
        .build()
        .map_err(|e| EmbeddingError::Failed(format!("cannot build the thread pool: {e}")))
}

/// Moves the calling thread to `SCHED_IDLE`.
fn lower_to_idle_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; `param` outlives the call.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        if rc != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "cannot set SCHED_IDLE");
        }
    }
}

/// A sequence's place: which job, which input of it.
type Slot = (usize, usize);

/// Weight of the newest batch in the smoothed cost per token and piece.
const COST_SMOOTHING: f64 = 0.3;

/// Runs batches on the engine thread, taking turns with decode.
struct Worker<'a> {
    model: &'a dyn Embedder,
    /// The `model` label of the series.
    model_name: String,
    /// Most tokens per batch when decode is idle.
    budget: usize,
    side: Option<EmbeddingSide>,
    /// Smoothed seconds of work per token per piece (between two
    /// checkpoints); sizes batches while decode runs.
    piece_cost: f64,
}

impl<'a> Worker<'a> {
    fn new(
        model: &'a dyn Embedder,
        budget: usize,
        side: Option<EmbeddingSide>,
        model_name: String,
    ) -> Self {
        Self {
            model,
            model_name,
            budget,
            side,
            piece_cost: 0.0,
        }
    }

    /// Tokens the next batch may hold: the full budget when decode is idle,
    /// otherwise what keeps one piece inside one slice (at least one
    /// sequence always runs).
    fn next_budget(&self) -> usize {
        let slice = self
            .side
            .as_ref()
            .and_then(|s| s.slice_tokens(self.piece_cost));
        slice.map_or(self.budget, |t| t.clamp(1, self.budget))
    }

    /// Every job's vectors, running their sequences in token-budgeted
    /// batches; gives the CPU back when done.
    fn embed_jobs(&mut self, jobs: &[Job]) -> Vec<Answer> {
        let mut out: Vec<Answer> = jobs
            .iter()
            .map(|j| Ok(vec![Vec::new(); j.sequences.len()]))
            .collect();
        let slots: Vec<Slot> = jobs
            .iter()
            .enumerate()
            .flat_map(|(j, job)| (0..job.sequences.len()).map(move |i| (j, i)))
            .collect();
        let mut rest = &slots[..];
        while !rest.is_empty() {
            let size = |&(j, i): &Slot| jobs[j].sequences[i].len();
            let batch = next_batch(rest, size, self.next_budget());
            rest = &rest[batch.len()..];
            let sequences: Vec<Vec<u32>> = batch
                .iter()
                .map(|&(j, i)| jobs[j].sequences[i].clone())
                .collect();
            match self.run_batch(&sequences) {
                Ok(vectors) => {
                    for (&(j, i), v) in batch.iter().zip(vectors) {
                        if let Ok(rows) = &mut out[j] {
                            rows[i] = v;
                        }
                    }
                }
                Err(e) => {
                    for &(j, _) in batch {
                        out[j] = Err(EmbeddingError::Failed(e.to_string()));
                    }
                }
            }
        }
        if let Some(side) = &mut self.side {
            side.release();
        }
        out
    }

    /// One forward pass, pausing at every checkpoint for decode's turn;
    /// learns the cost of a piece from the time it worked.
    fn run_batch(
        &mut self,
        sequences: &[Vec<u32>],
    ) -> Result<Vec<Vec<f32>>, ingot_arch::ArchError> {
        let started = Instant::now();
        let (mut pieces, mut waited) = (0usize, Duration::ZERO);
        let side = &mut self.side;
        let result = self.model.embed_paced(sequences, &mut || {
            pieces += 1;
            if let Some(side) = side.as_mut() {
                let t = Instant::now();
                side.checkpoint();
                waited += t.elapsed();
            }
        });
        let worked = started.elapsed().saturating_sub(waited);
        let tokens: usize = sequences.iter().map(Vec::len).sum();
        if result.is_ok() && pieces > 0 && tokens > 0 {
            let cost = worked.as_secs_f64() / (tokens * pieces) as f64;
            self.piece_cost = if self.piece_cost == 0.0 {
                cost
            } else {
                self.piece_cost * (1.0 - COST_SMOOTHING) + cost * COST_SMOOTHING
            };
        }
        // Labelled with this model: the recorder's global `model` label is
        // the server's default model, which may be another one.
        let model = self.model_name.clone();
        metrics::histogram!(BATCH_SECONDS, "model" => model.clone()).record(worked);
        metrics::counter!(TOKENS, "model" => model).increment(tokens as u64);
        result
    }
}

/// The longest prefix of `items` whose sizes sum to at most `budget` (at
/// least one item, however large).
fn next_batch<T>(items: &[T], size: impl Fn(&T) -> usize, budget: usize) -> &[T] {
    let mut used = 0;
    for (i, item) in items.iter().enumerate() {
        used += size(item);
        if i > 0 && used > budget {
            return &items[..i];
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_arch::ArchError;

    /// Each vector is `[first token, length]`; records every batch's sizes.
    struct Recorder(Mutex<Vec<Vec<usize>>>);

    impl Embedder for Recorder {
        fn embed(&self, sequences: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ArchError> {
            lock(&self.0).push(sequences.iter().map(Vec::len).collect());
            Ok(sequences
                .iter()
                .map(|s| vec![s[0] as f32, s.len() as f32])
                .collect())
        }
        fn dimensions(&self) -> usize {
            2
        }
        fn max_tokens(&self) -> usize {
            512
        }
        fn vocab_size(&self) -> usize {
            100
        }
        fn device_name(&self) -> &str {
            "test"
        }
    }

    fn job(sequences: Vec<Vec<u32>>) -> (Job, oneshot::Receiver<Answer>) {
        let (reply, rx) = oneshot::channel();
        (Job { sequences, reply }, rx)
    }

    #[test]
    fn requests_share_batches_and_get_their_own_vectors_back() {
        let model = Recorder(Mutex::new(Vec::new()));
        let (a, _ra) = job(vec![vec![1, 1, 1], vec![2]]);
        let (b, _rb) = job(vec![vec![3, 3], vec![4, 4, 4, 4]]);
        let out = Worker::new(&model, 6, None, "m".into()).embed_jobs(&[a, b]);
        // a's two and b's first share one pass; b's second runs next.
        assert_eq!(*lock(&model.0), [vec![3, 1, 2], vec![4]]);
        let out: Vec<_> = out.into_iter().map(Result::unwrap).collect();
        assert_eq!(out[0], [vec![1.0, 3.0], vec![2.0, 1.0]]);
        assert_eq!(out[1], [vec![3.0, 2.0], vec![4.0, 4.0]]);
    }

    #[test]
    fn batches_respect_the_token_budget() {
        let sizes = [3, 4, 2, 9, 1, 1];
        let mut rest = &sizes[..];
        let mut got = Vec::new();
        while !rest.is_empty() {
            let b = next_batch(rest, |&n| n, 8);
            got.push(b.to_vec());
            rest = &rest[b.len()..];
        }
        assert_eq!(got, [vec![3, 4], vec![2], vec![9], vec![1, 1]]);
    }

    /// Like `Recorder`, but each pass takes `piece` per checkpoint.
    struct Slow {
        batches: Mutex<Vec<usize>>,
        piece: Duration,
    }

    impl Embedder for Slow {
        fn embed(&self, sequences: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ArchError> {
            self.embed_paced(sequences, &mut || {})
        }
        fn embed_paced(
            &self,
            sequences: &[Vec<u32>],
            between: &mut dyn FnMut(),
        ) -> Result<Vec<Vec<f32>>, ArchError> {
            lock(&self.batches).push(sequences.iter().map(Vec::len).sum());
            let tokens: usize = sequences.iter().map(Vec::len).sum();
            for _ in 0..4 {
                between();
                std::thread::sleep(self.piece * tokens as u32);
            }
            Ok(sequences.iter().map(|_| vec![0.0, 0.0]).collect())
        }
        fn dimensions(&self) -> usize {
            2
        }
        fn max_tokens(&self) -> usize {
            512
        }
        fn vocab_size(&self) -> usize {
            100
        }
        fn device_name(&self) -> &str {
            "test"
        }
    }

    #[test]
    fn batches_shrink_to_a_slice_while_decode_runs() {
        let arbiter = Arc::new(CpuArbiter::default());
        let model = Slow {
            batches: Mutex::new(Vec::new()),
            piece: Duration::from_micros(100),
        };
        let mut worker = Worker::new(&model, 64, Some(arbiter.embedding_side(0.1)), "m".into());
        let jobs = |n| -> Vec<Job> { (0..n).map(|_| job(vec![vec![1; 4]; 4]).0).collect() };
        // Decode idle: one full batch learns the cost (0.1 ms per token-piece).
        worker.embed_jobs(&jobs(4));
        assert_eq!(*lock(&model.batches), [64]);
        // Decode stepping in 20 ms steps: slices of 2 ms hold ~20 tokens.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let decode = {
            let (arbiter, stop) = (arbiter.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let turn = arbiter.decode_step();
                    std::thread::sleep(Duration::from_millis(20));
                    drop(turn);
                }
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        let out = worker.embed_jobs(&jobs(2));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        decode.join().unwrap();
        assert!(out.iter().all(Result::is_ok));
        let during = lock(&model.batches)[1..].to_vec();
        assert!(during.len() >= 2, "{during:?}");
        assert!(during.iter().all(|&t| t <= 32), "{during:?}");
    }
}
