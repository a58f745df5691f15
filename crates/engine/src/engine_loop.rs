//! The step loop, on its own OS thread: take commands, schedule, run one
//! forward pass, sample, and send each request its events. Never awaits;
//! blocks only when there is nothing to do.
//!
//! Backpressure: every request has a bounded event channel. When a client
//! stops reading, its events queue in a backlog and its sequence is paused
//! (it keeps its KV blocks but is not stepped), so the batch never waits for
//! it; after `stall_timeout` it is cut off and its blocks freed.

mod step;
mod tiers;
mod verify;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingot_core::{FinishReason, Priority};
use ingot_kv_cache::BlockPool;
use ingot_runner::ModelRunner;
use ingot_scheduler::{Scheduler, SchedulerConfig, SchedulerOutput};
use ingot_tokenizer::Tokenizer;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::Sender;

use crate::controls::{EngineControls, Measure};
use crate::cpu_share::CpuArbiter;
use crate::decoding::{Decoding, TokenOutput};
use crate::handle::{
    Command, Completion, EngineHandle, EngineStats, GeneratedToken, Limits, RequestId, Shared,
    TokenEvent,
};
use crate::masks::MaskWorker;
use crate::metrics::{Metrics, MetricsConfig};
use crate::prompt_scores::PromptScores;

/// Engine settings (the scheduler's plus the engine's own).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Batching limits and priority policy.
    pub scheduler: SchedulerConfig,
    /// Reuse KV blocks across requests with a common prefix.
    pub prefix_caching: bool,
    /// Events buffered per request before its sequence is paused.
    pub stream_buffer: usize,
    /// A client that reads nothing for this long is cut off.
    pub stall_timeout: Duration,
    /// The model label and the vLLM-named series.
    pub metrics: MetricsConfig,
    /// Constrained outputs near their token limit head for the end of the
    /// document (`structured.close_near_limit`).
    pub close_structured_near_limit: bool,
    /// Storage below the KV pool for evicted prefix blocks (`[kv_tiers]`);
    /// used when prefix caching is on and the runner can copy pages.
    pub kv_tiers: Option<Arc<ingot_kv_tiers::KvTiers>>,
    /// The store shared with other instances (`[redis] share_kv`), over
    /// `kv_tiers`.
    pub kv_share: Option<Arc<ingot_kv_tiers::SharedKv>>,
    /// Speculative decoding (`[speculative]`; off by default).
    pub speculative: crate::speculative::SpeculativeConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            scheduler: SchedulerConfig::default(),
            prefix_caching: true,
            stream_buffer: 64,
            stall_timeout: Duration::from_secs(30),
            metrics: MetricsConfig::default(),
            close_structured_near_limit: true,
            kv_tiers: None,
            kv_share: None,
            speculative: Default::default(),
        }
    }
}

/// Starts the engine thread over `runner` and returns a handle to it. The
/// thread exits when every handle and request stream is dropped.
pub fn start_engine(
    runner: Box<dyn ModelRunner>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
) -> std::io::Result<EngineHandle> {
    start_engine_with_draft(runner, None, tokenizer, config)
}

/// [`start_engine`] with `draft`: the runner of the draft model that
/// `speculative.method = draft` proposes with (its own KV pool; it must
/// share `runner`'s tokenizer, and take forwards of the scheduler's
/// `max_num_seqs` rows and `max_num_batched_tokens` tokens), or the EAGLE-3
/// head of `method = eagle3` (built by `runner`, which then hands it its
/// hidden states).
pub fn start_engine_with_draft(
    mut runner: Box<dyn ModelRunner>,
    draft: Option<crate::Drafter>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
) -> std::io::Result<EngineHandle> {
    let (commands, rx) = std_mpsc::channel();
    let shape = runner.kv_cache_shape();
    // One block table per layer group the runner reads (a sliding-window
    // group gives its blocks back as they leave the window).
    let layout = runner.kv_layout();
    let kv_capacity_tokens = layout.capacity_tokens(
        shape.num_blocks,
        shape.block_size,
        config.scheduler.largest_step(),
    );
    let mut pool = BlockPool::with_layout(
        shape.num_blocks,
        shape.block_size,
        layout,
        config.prefix_caching,
    );
    let tiers = config
        .kv_tiers
        .clone()
        .filter(|_| config.prefix_caching && runner.kv_page_bytes() > 0);
    if let Some(t) = &tiers {
        pool.set_lower_tiers(t.clone(), t.writes_through());
    } else if config.kv_tiers.is_some() {
        tracing::warn!(
            "KV tiers are off: they need prefix caching and a backend that copies KV pages"
        );
    }
    let model = runner.config().clone();
    let device = runner.device_name();
    let stats = Arc::new(EngineStats::default());
    stats
        .kv_blocks_total
        .store(shape.num_blocks, Ordering::Relaxed);
    let limits = Limits {
        max_context: model.max_context,
        kv_capacity_tokens,
        max_waiting: config.scheduler.max_waiting,
        stream_buffer: config.stream_buffer.max(1),
    };
    let metrics = Metrics::new(&config.metrics);
    let masks = MaskWorker::start(metrics.mask_seconds())?;
    let model_name = config.metrics.model_name.clone();
    let controls = Arc::new(EngineControls::new(
        config.scheduler.max_num_batched_tokens,
        config.scheduler.max_num_seqs,
    ));
    let cpu = runner.computes_on_host().then(CpuArbiter::process);
    // The shared store sits over the tiers: without them it is off too.
    let (kv_tiers, kv_share) = (tiers.clone(), tiers.as_ref().and(config.kv_share.clone()));
    let draft_limits = crate::speculative::DraftLimits {
        max_rows: config.scheduler.max_num_seqs,
        max_tokens: config.scheduler.max_num_batched_tokens,
    };
    let speculation = crate::speculative::Speculation::new(
        &config.speculative,
        draft,
        model.vocab_size,
        draft_limits,
    )
    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    if let Some(s) = speculation.as_ref().filter(|s| !s.hidden_layers.is_empty()) {
        runner
            .capture_hidden(&s.hidden_layers)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    }
    let state = EngineLoop {
        speculation,
        cpu,
        controls: controls.clone(),
        scheduler: Scheduler::new(config.scheduler.clone(), pool),
        runner,
        tokenizer: tokenizer.clone(),
        active: HashMap::new(),
        stats: stats.clone(),
        config,
        idle_wait: false,
        stopping: false,
        last_prefix: Default::default(),
        last_preemptions: 0,
        admitted: 0,
        drain: Default::default(),
        metrics,
        masks,
        tiers,
    };
    let (stopped_tx, stopped) = std_mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("ingot-engine".into())
        .spawn(move || {
            state.run(rx);
            drop(stopped_tx);
        })?;
    Ok(EngineHandle {
        shared: Arc::new(Shared {
            commands,
            stats,
            next_id: Default::default(),
            config: model,
            tokenizer,
            limits,
            device,
            model_name,
            stopped: std::sync::Mutex::new(Some(stopped)),
            grammars: Default::default(),
            controls,
            kv_tiers,
            kv_share,
        }),
    })
}

/// One request the engine is serving.
struct Active {
    decoding: Decoding,
    events: Sender<TokenEvent>,
    /// Events the client has not taken yet; non-empty means paused.
    backlog: VecDeque<TokenEvent>,
    stalled_since: Option<Instant>,
    priority: Priority,
    arrival: Instant,
    prompt_tokens: usize,
    cached_tokens: usize,
    /// Still counted in `EngineStats::waiting`.
    queued: bool,
    /// When a step first scheduled it.
    scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// Forward-pass time of the steps that computed its prompt, until its
    /// first token: the engine's own prefill time.
    prefill_forward: Duration,
    /// How many steps those were.
    prefill_steps: u32,
    /// The sequence ended; only the backlog remains to deliver.
    done: bool,
    /// Prompt logprobs being collected, when asked for.
    prompt_scores: Option<PromptScores>,
    /// Its steps may carry proposals (speculative decoding).
    speculative: bool,
    /// How often its proposals were kept.
    acceptance: crate::speculative::Acceptance,
    /// It proposed in the last step.
    proposing: bool,
    /// The context that backed its last guess (`Draft::matched`).
    draft_matched: usize,
}

enum Delivery {
    Sent,
    Backlogged,
    ClientGone,
}

impl Active {
    fn deliver(&mut self, event: TokenEvent) -> Delivery {
        if !self.backlog.is_empty() {
            self.backlog.push_back(event);
            return Delivery::Backlogged;
        }
        match self.events.try_send(event) {
            Ok(()) => Delivery::Sent,
            Err(TrySendError::Full(event)) => {
                self.backlog.push_back(event);
                Delivery::Backlogged
            }
            Err(TrySendError::Closed(_)) => Delivery::ClientGone,
        }
    }

    /// Sends as much backlog as the channel takes. `Err` when the client is gone.
    fn flush(&mut self) -> Result<(), ()> {
        while let Some(event) = self.backlog.pop_front() {
            match self.events.try_send(event) {
                Ok(()) => {}
                Err(TrySendError::Full(event)) => {
                    self.backlog.push_front(event);
                    return Ok(());
                }
                Err(TrySendError::Closed(_)) => return Err(()),
            }
        }
        Ok(())
    }
}

struct EngineLoop {
    scheduler: Scheduler,
    runner: Box<dyn ModelRunner>,
    tokenizer: Arc<Tokenizer>,
    active: HashMap<RequestId, Active>,
    stats: Arc<EngineStats>,
    config: EngineConfig,
    /// The last step scheduled nothing although work exists (all paused).
    idle_wait: bool,
    /// Set by `Command::Shutdown`: leave the loop and drop the runner.
    stopping: bool,
    last_prefix: ingot_kv_cache::PrefixCacheStats,
    last_preemptions: u64,
    /// Requests moved from waiting to running since start.
    admitted: u64,
    /// Their rate over the last seconds (published for Retry-After).
    drain: crate::drain::DrainMeter,
    /// The engine's metric handles.
    metrics: Metrics,
    /// Computes grammar masks during the forward pass.
    masks: MaskWorker,
    /// Latency windows out, step limits and held tiers in (SLO remediation).
    controls: Arc<EngineControls>,
    /// Turns with embedding work on the same cores (CPU runners only).
    cpu: Option<Arc<CpuArbiter>>,
    /// Storage below the KV pool, when on.
    tiers: Option<Arc<ingot_kv_tiers::KvTiers>>,
    /// Speculative decoding, when on.
    speculation: Option<crate::speculative::Speculation>,
}

impl EngineLoop {
    fn run(mut self, commands: std_mpsc::Receiver<Command>) {
        while self.receive(&commands) {
            let now = Instant::now();
            self.flush_backlogs(now);
            self.apply_controls();
            self.propose_drafts();
            let out = self.scheduler.schedule(now);
            self.note_started(&out, now);
            self.idle_wait = out.chunks.is_empty();
            if !out.chunks.is_empty() {
                self.step(&out.chunks);
            }
            self.publish_stats();
        }
        if let Some(tiers) = &self.tiers {
            tiers.flush();
        }
        tracing::debug!("engine thread exiting");
    }

    /// Applies pending commands. Blocks when idle; false when every handle
    /// is gone and no work remains.
    fn receive(&mut self, commands: &std_mpsc::Receiver<Command>) -> bool {
        if self.active.is_empty() {
            // Idle: pages the pool will evict next go down to the tiers
            // first, a batch at a time, while no command waits.
            loop {
                match commands.try_recv() {
                    Ok(c) => {
                        self.apply(c);
                        break;
                    }
                    Err(std_mpsc::TryRecvError::Disconnected) => return false,
                    Err(std_mpsc::TryRecvError::Empty) if self.copy_cold_pages() => {}
                    Err(std_mpsc::TryRecvError::Empty) => match commands.recv() {
                        Ok(c) => {
                            self.apply(c);
                            break;
                        }
                        Err(_) => return false,
                    },
                }
            }
        } else if self.idle_wait {
            if let Ok(c) = commands.recv_timeout(Duration::from_millis(2)) {
                self.apply(c);
            }
        }
        while let Ok(c) = commands.try_recv() {
            self.apply(c);
        }
        !self.stopping
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Shutdown => self.stopping = true,
            Command::Add {
                id,
                request,
                events,
                arrival,
            } => {
                let request = *request;
                let scored = request.sampling.prompt_logprobs;
                // A seeded draw must not depend on the batch (which decides
                // how much is proposed).
                let speculative = request.speculative
                    && (request.sampling.is_greedy() || request.sampling.seed.is_none());
                let decoding = Decoding::new(
                    &request.prompt,
                    request.sampling,
                    request.stop.clone(),
                    self.tokenizer.clone(),
                    self.runner.config().max_context,
                    request.grammar,
                );
                self.active.insert(
                    id,
                    Active {
                        decoding,
                        events,
                        backlog: VecDeque::new(),
                        stalled_since: None,
                        priority: request.priority,
                        arrival,
                        prompt_tokens: request.prompt.len(),
                        cached_tokens: 0,
                        queued: true,
                        scheduled: None,
                        first_token: None,
                        last_token: None,
                        prefill_forward: Duration::ZERO,
                        prefill_steps: 0,
                        done: false,
                        prompt_scores: scored
                            .map(|top| PromptScores::new(request.prompt.len(), top)),
                        speculative,
                        acceptance: Default::default(),
                        proposing: false,
                        draft_matched: 0,
                    },
                );
                self.scheduler.add(
                    id,
                    request.prompt,
                    request.priority,
                    request.stop.max_tokens,
                    arrival,
                );
                if scored.is_some() {
                    self.scheduler.compute_all_positions(id);
                }
            }
            Command::Abort(id) => self.drop_request(id, Some(FinishReason::Abort)),
            Command::Sleep(reply) => {
                let ids: Vec<RequestId> = self.active.keys().copied().collect();
                for id in ids {
                    self.drop_request(id, Some(FinishReason::Abort));
                }
                self.scheduler.forget_cached_kv();
                let _ = reply.send(self.runner.sleep().map_err(|e| e.to_string()));
            }
            Command::Wake(reply) => {
                let _ = reply.send(self.runner.wake().map_err(|e| e.to_string()));
            }
            Command::SetPriority(id, priority) => {
                if let Some(a) = self.active.get_mut(&id) {
                    a.priority = priority;
                    self.scheduler.set_priority(id, priority);
                }
            }
        }
    }

    /// Forgets a request and frees its blocks. `reason` is counted in
    /// metrics when the request had not finished.
    fn drop_request(&mut self, id: RequestId, reason: Option<FinishReason>) {
        self.scheduler.remove(id);
        if let Some(a) = self.active.remove(&id) {
            if a.queued {
                self.stats.waiting.fetch_sub(1, Ordering::SeqCst);
            }
            if let (false, Some(reason)) = (a.done, reason) {
                self.metrics.request_finished(reason, a.priority);
            }
        }
    }

    /// Takes the step limits and held tiers the SLO policy engine set.
    fn apply_controls(&mut self) {
        let c = &self.controls;
        self.scheduler
            .set_step_limits(c.token_budget(), c.max_num_seqs());
        self.scheduler.set_held(c.held_bits());
    }

    fn note_started(&mut self, out: &SchedulerOutput, now: Instant) {
        if !out.started.is_empty() {
            self.stats
                .running
                .store(self.scheduler.num_running(), Ordering::SeqCst);
        }
        for &(id, cached) in &out.started {
            if let Some(a) = self.active.get_mut(&id) {
                if a.queued {
                    a.queued = false;
                    self.admitted += 1;
                    a.scheduled = Some(now);
                    a.cached_tokens = cached;
                    self.stats.waiting.fetch_sub(1, Ordering::SeqCst);
                    self.metrics
                        .queue_time(now.saturating_duration_since(a.arrival), a.priority);
                }
            }
        }
    }

    /// Delivers backlogs of paused requests; resumes the ones that drained
    /// and cuts off the ones stalled too long or gone.
    fn flush_backlogs(&mut self, now: Instant) {
        let mut resume = Vec::new();
        let mut cut = Vec::new();
        for (&id, a) in self
            .active
            .iter_mut()
            .filter(|(_, a)| !a.backlog.is_empty())
        {
            if a.flush().is_err() {
                cut.push(id);
            } else if a.backlog.is_empty() {
                a.stalled_since = None;
                resume.push((id, a.done));
            } else if a
                .stalled_since
                .is_some_and(|t| now.saturating_duration_since(t) > self.config.stall_timeout)
            {
                tracing::warn!(id, "client stalled; request cut off");
                cut.push(id);
            }
        }
        for (id, done) in resume {
            if done {
                self.active.remove(&id);
            } else {
                self.scheduler.set_paused(id, false);
            }
        }
        for id in cut {
            self.drop_request(id, Some(FinishReason::Abort));
        }
    }

    fn emit(&mut self, id: RequestId, out: TokenOutput, now: Instant) {
        self.scheduler.append_token(id, out.sampled.token);
        let Some(a) = self.active.get_mut(&id) else {
            return;
        };
        match a.last_token {
            None => {
                let d = now.saturating_duration_since(a.arrival);
                self.metrics.time_to_first_token(d, a.priority);
                self.metrics.prefill(a.prefill_forward, a.prefill_steps);
                self.controls
                    .record(a.priority, Measure::Ttft, d.as_secs_f64(), now);
            }
            Some(prev) => {
                let d = now.saturating_duration_since(prev);
                self.metrics.inter_token_latency(d);
                self.controls
                    .record(a.priority, Measure::Itl, d.as_secs_f64(), now);
            }
        }
        a.first_token.get_or_insert(now);
        a.last_token = Some(now);
        self.stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
        let token = TokenEvent::Token(GeneratedToken {
            token: out.sampled.token,
            text: out.text,
            logprob: out.sampled.logprob,
            top_logprobs: out.sampled.top_logprobs,
        });
        let delivery = a.deliver(token);
        self.settle(id, delivery, out.finish, now);
    }

    /// After an event went out as `delivery`: ends the request when
    /// `finish` says so (sending `Finished`), pauses it when its client is
    /// behind, drops it when the client is gone.
    fn settle(
        &mut self,
        id: RequestId,
        mut delivery: Delivery,
        finish: Option<FinishReason>,
        now: Instant,
    ) {
        let Some(a) = self.active.get_mut(&id) else {
            return;
        };
        if a.done {
            return;
        }
        if let Some(reason) = finish {
            let completion = Completion {
                reason,
                prompt_tokens: a.prompt_tokens,
                completion_tokens: a.decoding.num_output(),
                cached_tokens: a.cached_tokens,
                queue_time: a
                    .scheduled
                    .map_or(Duration::ZERO, |t| t.saturating_duration_since(a.arrival)),
            };
            let e2e = now.saturating_duration_since(a.arrival);
            let phases = crate::metrics::RequestPhases {
                max_tokens: a.decoding.max_tokens(),
                prefill: a
                    .scheduled
                    .zip(a.first_token)
                    .map(|(s, f)| f.saturating_duration_since(s)),
                decode: a.first_token.map(|f| now.saturating_duration_since(f)),
            };
            self.metrics
                .request_done(&completion, phases, e2e, a.priority);
            self.controls
                .record(a.priority, Measure::E2e, e2e.as_secs_f64(), now);
            self.controls.record(a.priority, Measure::Outcome, 0.0, now);
            a.done = true;
            if !matches!(delivery, Delivery::ClientGone) {
                delivery = a.deliver(TokenEvent::Finished(completion));
            }
            self.scheduler.remove(id);
        }
        match delivery {
            Delivery::Sent if finish.is_some() => {
                self.active.remove(&id);
            }
            Delivery::Sent => {}
            Delivery::Backlogged => {
                a.stalled_since.get_or_insert(now);
                self.scheduler.set_paused(id, true);
            }
            Delivery::ClientGone => self.drop_request(id, Some(FinishReason::Abort)),
        }
    }

    fn fail(&mut self, id: RequestId, message: &str) {
        if let Some(a) = self.active.get_mut(&id) {
            let _ = a.events.try_send(TokenEvent::Error(message.to_string()));
            self.controls
                .record(a.priority, Measure::Outcome, 1.0, Instant::now());
        }
        self.drop_request(id, Some(FinishReason::Abort));
    }

    /// Running and waiting requests by tier (a preempted request counts as
    /// running: it keeps its place and its output so far).
    fn publish_tiers(&self) {
        let mut running = [0usize; Priority::ALL.len()];
        let mut waiting = running;
        for a in self.active.values() {
            let tally = if a.queued { &mut waiting } else { &mut running };
            tally[a.priority.rank()] += 1;
        }
        let s = &self.stats;
        for (rank, (r, w)) in running.iter().zip(&waiting).enumerate() {
            s.running_by_tier[rank].store(*r, Ordering::Relaxed);
            s.waiting_by_tier[rank].store(*w, Ordering::Relaxed);
        }
    }

    fn publish_stats(&mut self) {
        let rate = self.drain.record(Instant::now(), self.admitted);
        let s = &self.stats;
        s.drain_per_sec.store(rate.to_bits(), Ordering::Relaxed);
        let pool = self.scheduler.pool();
        s.running
            .store(self.scheduler.num_running(), Ordering::Relaxed);
        s.kv_blocks_used.store(pool.num_in_use(), Ordering::Relaxed);
        let prefix = pool.prefix_cache_stats();
        s.prefix_cache_queries
            .store(prefix.queries, Ordering::Relaxed);
        s.prefix_cache_hits.store(prefix.hits, Ordering::Relaxed);
        s.preemptions
            .store(self.scheduler.num_preemptions(), Ordering::Relaxed);
        s.steps.fetch_add(1, Ordering::Relaxed);
        self.publish_tiers();
        self.metrics.gauges(
            self.scheduler.num_running(),
            self.scheduler.num_waiting(),
            pool.usage(),
        );
        self.metrics.prefix_cache(
            prefix.queries - self.last_prefix.queries,
            prefix.hits - self.last_prefix.hits,
        );
        self.metrics
            .preemptions(self.scheduler.num_preemptions() - self.last_preemptions);
        self.last_prefix = prefix;
        self.last_preemptions = self.scheduler.num_preemptions();
    }
}
