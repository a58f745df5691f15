//! The async world's door to the engine: a cloneable [`EngineHandle`] that
//! submits requests and returns a [`RequestStream`] of [`TokenEvent`]s.
//! Nothing here blocks on the model; the engine runs on its own OS thread.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingot_core::{FinishReason, Priority, SamplingParams, StopCriteria, TokenId};
use ingot_models::ModelConfig;
use ingot_structured::{Grammar, GrammarCompiler, GrammarError};
use ingot_tokenizer::Tokenizer;
use tokio::sync::mpsc;

use crate::sampler::TokenLogprob;

/// Identifies a request for its whole life.
pub type RequestId = u64;

/// A validated request, in token ids.
#[derive(Debug, Clone)]
pub struct EngineRequest {
    /// Prompt token ids (non-empty).
    pub prompt: Vec<TokenId>,
    /// How to sample.
    pub sampling: SamplingParams,
    /// When to stop.
    pub stop: StopCriteria,
    /// Scheduling tier.
    pub priority: Priority,
    /// The grammar the output must follow (structured output), at its
    /// start; compiled by the caller, off the engine thread.
    pub grammar: Option<Grammar>,
    /// May be decoded speculatively when the engine speculates (it never
    /// changes a greedy answer; a seeded sampled request is never
    /// speculated, so its output does not depend on the batch).
    pub speculative: bool,
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedToken {
    /// The token id.
    pub token: TokenId,
    /// Text that became final with this token (may be empty; never a
    /// partial UTF-8 character, never part of a stop string).
    pub text: String,
    /// Log-probability of the token under the model.
    pub logprob: f32,
    /// Most likely alternatives, when requested.
    pub top_logprobs: Vec<TokenLogprob>,
}

/// A prompt token's logprob given the tokens before it
/// (`SamplingParams::prompt_logprobs`).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprob {
    /// The prompt token.
    pub token: TokenId,
    /// Its log-probability; `None` for the first token (nothing precedes it).
    pub logprob: Option<f32>,
    /// Most likely tokens at its position (empty for the first).
    pub top_logprobs: Vec<TokenLogprob>,
}

/// How a request ended, with its usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// Why it ended.
    pub reason: FinishReason,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (including a final stop token).
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// From arrival to the first step that scheduled it.
    pub queue_time: Duration,
}

/// What a request's stream carries.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenEvent {
    /// Every prompt token's logprob, when asked for; before any token.
    Prompt(Vec<PromptLogprob>),
    /// A token was generated.
    Token(GeneratedToken),
    /// The request ended; the last event.
    Finished(Completion),
    /// The engine failed while serving the request; the last event.
    Error(String),
}

impl TokenEvent {
    /// True for the last event of a request (finished or failed).
    pub fn is_terminal(&self) -> bool {
        matches!(self, TokenEvent::Finished(_) | TokenEvent::Error(_))
    }
}

/// Why a request was not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The waiting queue is full for this priority.
    #[error("the server is overloaded ({waiting} requests waiting); retry later")]
    Overloaded {
        /// Requests waiting.
        waiting: usize,
        /// Suggested wait before retrying.
        retry_after: Duration,
    },
    /// Prompt plus max_tokens exceed what the model or the KV cache holds.
    #[error("this model's maximum context length is {max_context} tokens; the request has {prompt_tokens} prompt tokens and max_tokens {max_tokens} ({} in total)", prompt_tokens + max_tokens)]
    TooLong {
        /// Prompt length.
        prompt_tokens: usize,
        /// Requested output length.
        max_tokens: usize,
        /// The limit.
        max_context: usize,
    },
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary (size {vocab_size})")]
    TokenOutOfRange {
        /// The id.
        id: TokenId,
        /// Vocabulary size.
        vocab_size: usize,
    },
    /// A sampling parameter is invalid.
    #[error(transparent)]
    Sampling(#[from] ingot_core::SamplingError),
    /// The engine is shutting down or has stopped.
    #[error("the engine is not running")]
    Stopped,
}

pub(crate) enum Command {
    Add {
        id: RequestId,
        /// Boxed: a grammar's state makes the request large.
        request: Box<EngineRequest>,
        events: mpsc::Sender<TokenEvent>,
        arrival: Instant,
    },
    Abort(RequestId),
    /// Moves a request to another tier.
    SetPriority(RequestId, Priority),
    /// Drops every request, forgets the prefix cache and puts the runner
    /// to sleep; answers with the host bytes it holds asleep.
    Sleep(std_mpsc::Sender<Result<u64, String>>),
    /// Wakes the runner.
    Wake(std_mpsc::Sender<Result<(), String>>),
    /// The last handle is gone: stop and release the runner.
    Shutdown,
}

/// Counters the engine thread publishes for the handle (and `/metrics`).
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Requests waiting for admission, including ones not yet seen by the
    /// engine thread (admission control counts those beyond the free
    /// running slots).
    pub waiting: AtomicUsize,
    /// Requests running (raised before `waiting` is lowered when requests
    /// start, so admission never sees a started request in neither).
    pub running: AtomicUsize,
    /// KV blocks in use.
    pub kv_blocks_used: AtomicUsize,
    /// KV blocks in total.
    pub kv_blocks_total: AtomicUsize,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: AtomicU64,
    /// Prompt tokens found.
    pub prefix_cache_hits: AtomicU64,
    /// Preemptions since start.
    pub preemptions: AtomicU64,
    /// Engine steps run.
    pub steps: AtomicU64,
    /// Requests leaving the waiting queue per second, recently (f64 bits).
    pub drain_per_sec: AtomicU64,
    /// Tokens generated since start, counted as they are sampled (the
    /// dashboard's output rate; the metrics count finished requests').
    pub generated_tokens: AtomicU64,
    /// Tokens proposed by speculative decoding since start.
    pub spec_proposed: AtomicU64,
    /// Proposed tokens kept.
    pub spec_kept: AtomicU64,
    /// Requests running, by priority tier (`Priority::rank`).
    pub running_by_tier: [AtomicUsize; Priority::ALL.len()],
    /// Requests the engine thread holds waiting, by priority tier.
    pub waiting_by_tier: [AtomicUsize; Priority::ALL.len()],
}

impl EngineStats {
    /// Fraction of KV blocks in use, in [0, 1].
    pub fn kv_usage(&self) -> f64 {
        let total = self.kv_blocks_total.load(Ordering::Relaxed);
        if total == 0 {
            return 0.0;
        }
        self.kv_blocks_used.load(Ordering::Relaxed) as f64 / total as f64
    }
}

/// Weak references to an engine's counters and latency windows: an
/// unloaded engine's read as gone.
#[derive(Debug, Clone, Default)]
pub struct EngineWatch {
    stats: std::sync::Weak<EngineStats>,
    controls: std::sync::Weak<crate::controls::EngineControls>,
    tiers: Option<std::sync::Weak<ingot_kv_tiers::KvTiers>>,
}

impl EngineWatch {
    /// The engine's counters and windows, while it exists.
    pub fn get(&self) -> Option<(Arc<EngineStats>, Arc<crate::controls::EngineControls>)> {
        Some((self.stats.upgrade()?, self.controls.upgrade()?))
    }

    /// What the engine's KV tiers hold and did, while it exists and has them.
    pub fn kv_tiers(&self) -> Option<ingot_kv_tiers::TierUse> {
        Some(self.tiers.as_ref()?.upgrade()?.usage())
    }
}

pub(crate) struct Shared {
    pub commands: std_mpsc::Sender<Command>,
    pub stats: Arc<EngineStats>,
    pub next_id: AtomicU64,
    pub config: ModelConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub limits: Limits,
    pub device: String,
    /// The model's name in metrics.
    pub model_name: String,
    /// Closed by the engine thread once it has released the runner.
    pub stopped: std::sync::Mutex<Option<std_mpsc::Receiver<()>>>,
    /// The model's grammar compiler, indexed on first use.
    pub grammars: std::sync::OnceLock<Result<Arc<GrammarCompiler>, GrammarError>>,
    /// Latency windows and runtime-adjustable limits (SLO remediation).
    pub controls: Arc<crate::controls::EngineControls>,
    /// The KV tiers the engine uses, when on.
    pub kv_tiers: Option<Arc<ingot_kv_tiers::KvTiers>>,
    /// The shared KV store, when on.
    pub kv_share: Option<Arc<ingot_kv_tiers::SharedKv>>,
}

impl Drop for Shared {
    /// Stops the engine thread and waits (boundedly) until it has dropped
    /// the runner, so a GPU backend is torn down before the process exits.
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(stopped) = self.stopped.get_mut().ok().and_then(Option::take) {
            let _ = stopped.recv_timeout(std::time::Duration::from_secs(10));
        }
    }
}

/// Bounds checked at submission, before the engine thread sees a request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_context: usize,
    pub kv_capacity_tokens: usize,
    pub max_waiting: usize,
    pub stream_buffer: usize,
}

/// A cloneable handle to a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    pub(crate) shared: Arc<Shared>,
}

impl EngineHandle {
    /// The model's resolved configuration.
    pub fn model_config(&self) -> &ModelConfig {
        &self.shared.config
    }

    /// The device the model runs on ("cpu (16 threads)", "cuda:0 NVIDIA H100 ...").
    pub fn device_name(&self) -> &str {
        &self.shared.device
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.shared.tokenizer
    }

    /// Compiles grammars for this model's vocabulary (structured output).
    /// The first call indexes the vocabulary (tens of milliseconds): call
    /// it off the async runtime.
    pub fn grammar_compiler(&self) -> Result<Arc<GrammarCompiler>, GrammarError> {
        self.shared
            .grammars
            .get_or_init(|| GrammarCompiler::new(self.shared.tokenizer.clone()).map(Arc::new))
            .clone()
    }

    /// The KV tiers below the pool, when on (their use, for `/admin`).
    pub fn kv_tiers(&self) -> Option<&Arc<ingot_kv_tiers::KvTiers>> {
        self.shared.kv_tiers.as_ref()
    }

    /// Brings the blocks of `prompt` that another instance published into
    /// the host tier, when a shared KV store is on and fetching beats
    /// recomputing; returns at once otherwise. Call before
    /// [`EngineHandle::submit`].
    pub async fn prefetch_kv(&self, prompt: &[TokenId]) {
        if let Some(share) = &self.shared.kv_share {
            let got = share.prefetch(prompt).await;
            if got.fetched_blocks > 0 {
                tracing::debug!(?got, "prefix fetched from the shared KV store");
            }
        }
    }

    /// Live counters.
    pub fn stats(&self) -> &EngineStats {
        &self.shared.stats
    }

    /// What a dashboard reads of this engine without keeping it alive.
    pub fn watch(&self) -> EngineWatch {
        EngineWatch {
            stats: Arc::downgrade(&self.shared.stats),
            controls: Arc::downgrade(&self.shared.controls),
            tiers: self.shared.kv_tiers.as_ref().map(Arc::downgrade),
        }
    }

    /// Latency windows per tier, and the step limits and held tiers the
    /// next step uses.
    pub fn controls(&self) -> &Arc<crate::controls::EngineControls> {
        &self.shared.controls
    }

    /// Longest prompt + max_tokens a request may have.
    pub fn max_context(&self) -> usize {
        self.shared
            .limits
            .max_context
            .min(self.shared.limits.kv_capacity_tokens)
    }

    /// What a request must fit: the context and the vocabulary.
    pub fn limits(&self) -> RequestLimits {
        RequestLimits {
            max_context: self.max_context(),
            vocab_size: self.shared.config.vocab_size,
        }
    }

    /// Puts the model to sleep (see `ModelRunner::sleep`): its device
    /// memory goes back, the engine thread waits for [`EngineHandle::wake`].
    /// Requests still queued or running are dropped. Returns the host bytes
    /// it holds asleep. Blocks until the engine thread has done it.
    pub fn sleep(&self) -> Result<u64, String> {
        self.ask(Command::Sleep)
    }

    /// Wakes a sleeping model. Blocks until it can serve again.
    pub fn wake(&self) -> Result<(), String> {
        self.ask(Command::Wake)
    }

    /// Sends a command carrying a reply channel and waits for the reply.
    fn ask<T>(
        &self,
        command: impl FnOnce(std_mpsc::Sender<Result<T, String>>) -> Command,
    ) -> Result<T, String> {
        let (tx, rx) = std_mpsc::channel();
        self.shared
            .commands
            .send(command(tx))
            .map_err(|_| "the engine is not running".to_string())?;
        rx.recv()
            .map_err(|_| "the engine stopped before answering".to_string())?
    }

    /// Validates and queues a request. Fails fast when the queue is full
    /// for its priority (see `Scheduler::admit`).
    pub fn submit(&self, request: EngineRequest) -> Result<RequestStream, SubmitError> {
        self.limits().check(&request)?;
        let stats = &self.shared.stats;
        let waiting = stats.waiting.fetch_add(1, Ordering::SeqCst);
        // Requests the engine will start at its next step (there are free
        // running slots for them) are not waiting for room: only the rest
        // count against `max_waiting`, so a burst on an idle engine is
        // admitted up to max_num_seqs + max_waiting.
        let running = stats.running.load(Ordering::SeqCst);
        let free = self.shared.controls.max_num_seqs().saturating_sub(running);
        let drain = f64::from_bits(stats.drain_per_sec.load(Ordering::Relaxed));
        if let Err(e) = admission(
            request.priority,
            waiting.saturating_sub(free),
            self.shared.limits.max_waiting,
            drain,
        ) {
            stats.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(e);
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(self.shared.limits.stream_buffer);
        let sent = self.shared.commands.send(Command::Add {
            id,
            request: Box::new(request),
            events: tx,
            arrival: Instant::now(),
        });
        if sent.is_err() {
            stats.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::Stopped);
        }
        crate::metrics::request_submitted(&self.shared.model_name);
        Ok(RequestStream {
            id,
            events: rx,
            abort: Some(self.shared.commands.clone()),
        })
    }
}

/// The bounds every request is checked against, before any queue or cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Longest prompt + max_tokens.
    pub max_context: usize,
    /// Token ids must be below this.
    pub vocab_size: usize,
}

impl RequestLimits {
    /// Sampling values, an empty prompt, token ids and length.
    pub fn check(&self, request: &EngineRequest) -> Result<(), SubmitError> {
        request.sampling.validate()?;
        if request.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        let vocab_size = self.vocab_size;
        if let Some(&id) = request.prompt.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(SubmitError::TokenOutOfRange { id, vocab_size });
        }
        let bias = &request.sampling.logit_bias;
        if let Some(&(id, _)) = bias.iter().find(|&&(t, _)| t as usize >= vocab_size) {
            return Err(SubmitError::Sampling(ingot_core::SamplingError {
                field: "logit_bias",
                bound: "token ids below the vocabulary size",
                value: format!("{id} (the vocabulary has {vocab_size} tokens)"),
            }));
        }
        if request.prompt.len() + request.stop.max_tokens > self.max_context {
            return Err(SubmitError::TooLong {
                prompt_tokens: request.prompt.len(),
                max_tokens: request.stop.max_tokens,
                max_context: self.max_context,
            });
        }
        Ok(())
    }
}

/// Admission control; a refusal suggests waiting until enough of the queue
/// has drained, at its recent rate, for this request's tier to fit.
fn admission(
    priority: Priority,
    waiting: usize,
    max_waiting: usize,
    drain_per_sec: f64,
) -> Result<(), SubmitError> {
    ingot_scheduler::admit(priority, waiting, max_waiting).map_err(|e| SubmitError::Overloaded {
        waiting: e.waiting,
        retry_after: crate::drain::retry_after(
            e.waiting + 1 - e.limit.min(e.waiting),
            drain_per_sec,
        ),
    })
}

/// The events of one request. Dropping it aborts the request and frees its
/// KV blocks within one engine step.
pub struct RequestStream {
    id: RequestId,
    events: mpsc::Receiver<TokenEvent>,
    abort: Option<std_mpsc::Sender<Command>>,
}

impl RequestStream {
    /// The request's id.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event; `None` after the last one.
    pub async fn next(&mut self) -> Option<TokenEvent> {
        self.events.recv().await
    }

    /// A handle that can move this request to another tier while it runs.
    pub fn priority_handle(&self) -> PriorityHandle {
        let id = self.id;
        let commands = self.abort.clone();
        PriorityHandle::new(move |priority| {
            if let Some(tx) = &commands {
                let _ = tx.send(Command::SetPriority(id, priority));
            }
        })
    }

    /// The next event, blocking the current (non-async) thread.
    pub fn next_blocking(&mut self) -> Option<TokenEvent> {
        self.events.blocking_recv()
    }
}

/// Changes the tier of a running or waiting request. Layers above the
/// engine (coalescing, a model registry) hold it without knowing the engine.
#[derive(Clone)]
pub struct PriorityHandle(Arc<dyn Fn(Priority) + Send + Sync>);

impl PriorityHandle {
    /// A handle that calls `set` with the new tier.
    pub fn new(set: impl Fn(Priority) + Send + Sync + 'static) -> Self {
        Self(Arc::new(set))
    }

    /// Moves the request to `priority` (ignored once it has finished).
    pub fn set(&self, priority: Priority) {
        (self.0)(priority);
    }
}

impl std::fmt::Debug for PriorityHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PriorityHandle")
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if let Some(tx) = self.abort.take() {
            // Harmless when the request already finished: the engine ignores
            // unknown ids. Fails only when the engine is gone.
            let _ = tx.send(Command::Abort(self.id));
        }
    }
}
