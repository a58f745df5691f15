//! The embedding engine: an OS thread that batches embedding requests with
//! each other and runs them through an [`Embedder`].
//!
//! Requests queue on a channel; the thread takes every request waiting and
//! runs their sequences in batches of at most `max_batch_tokens` tokens
//! (a longer single sequence runs alone), so concurrent requests share
//! forward passes and one large request cannot hold the model for long.
//!
//! Decode must never wait for embeddings. The forward passes run on the
//! engine's own thread pool, not the global one the CPU decoders share (a
//! decode step's tasks would otherwise queue behind an encoder batch), and
//! with `idle_priority` its threads are `SCHED_IDLE`: the kernel runs them
//! only on cores no normal thread wants, and preempts them as soon as a
//! decode thread wakes.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use ingot_arch::Embedder;
use ingot_tokenizer::EncoderTokenizer;
use tokio::sync::oneshot;

/// How an embedding engine batches and where it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddingConfig {
    /// Most tokens in one forward pass.
    pub max_batch_tokens: usize,
    /// Threads of the engine's pool.
    pub threads: usize,
    /// Run the pool at `SCHED_IDLE` (Linux), below every decode thread.
    pub idle_priority: bool,
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
        let pool = thread_pool(config)?;
        let (tx, rx) = mpsc::channel::<Job>();
        let (dimensions, max_tokens) = (model.dimensions(), model.max_tokens());
        let (vocab_size, device) = (model.vocab_size(), model.device_name().to_string());
        let budget = config.max_batch_tokens.max(1);
        let thread = std::thread::Builder::new()
            .name("ingot-embed".into())
            .spawn(move || run(&*model, &pool, &rx, budget))
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

fn thread_pool(config: EmbeddingConfig) -> Result<rayon::ThreadPool, EmbeddingError> {
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

/// The engine thread: waits for work, takes everything queued, runs it.
fn run(model: &dyn Embedder, pool: &rayon::ThreadPool, rx: &mpsc::Receiver<Job>, budget: usize) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        jobs.extend(rx.try_iter());
        let results = pool.install(|| embed_jobs(model, &jobs, budget));
        for (job, result) in jobs.into_iter().zip(results) {
            let _ = job.reply.send(result);
        }
    }
}

/// Every job's vectors, running their sequences in token-budgeted batches.
fn embed_jobs(model: &dyn Embedder, jobs: &[Job], budget: usize) -> Vec<Answer> {
    let mut out: Vec<Answer> = jobs
        .iter()
        .map(|j| Ok(vec![Vec::new(); j.sequences.len()]))
        .collect();
    let slots: Vec<Slot> = jobs
        .iter()
        .enumerate()
        .flat_map(|(j, job)| (0..job.sequences.len()).map(move |i| (j, i)))
        .collect();
    for batch in batches(&slots, |&(j, i)| jobs[j].sequences[i].len(), budget) {
        let sequences: Vec<Vec<u32>> = batch
            .iter()
            .map(|&(j, i)| jobs[j].sequences[i].clone())
            .collect();
        let started = Instant::now();
        match model.embed(&sequences) {
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
        metrics::histogram!("ingot_embedding_batch_seconds").record(started.elapsed());
        metrics::counter!("ingot_embedding_tokens_total")
            .increment(sequences.iter().map(Vec::len).sum::<usize>() as u64);
    }
    out
}

/// Consecutive runs of `items` whose sizes sum to at most `budget`; an item
/// larger than the budget runs alone.
fn batches<T>(items: &[T], size: impl Fn(&T) -> usize, budget: usize) -> Vec<&[T]> {
    let mut out = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, item) in items.iter().enumerate() {
        let n = size(item);
        if i > start && used + n > budget {
            out.push(&items[start..i]);
            (start, used) = (i, 0);
        }
        used += n;
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
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
        let out = embed_jobs(&model, &[a, b], 6);
        // a's two and b's first share one pass; b's second runs next.
        assert_eq!(*lock(&model.0), [vec![3, 1, 2], vec![4]]);
        let out: Vec<_> = out.into_iter().map(Result::unwrap).collect();
        assert_eq!(out[0], [vec![1.0, 3.0], vec![2.0, 1.0]]);
        assert_eq!(out[1], [vec![3.0, 2.0], vec![4.0, 4.0]]);
    }

    #[test]
    fn batches_respect_the_token_budget() {
        let sizes = [3, 4, 2, 9, 1, 1];
        let got: Vec<Vec<usize>> = batches(&sizes, |&n| n, 8)
            .into_iter()
            .map(<[usize]>::to_vec)
            .collect();
        assert_eq!(got, [vec![3, 4], vec![2], vec![9], vec![1, 1]]);
        assert!(batches(&[] as &[usize], |&n| n, 8).is_empty());
    }
}
