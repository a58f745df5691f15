//! The scheduler state and its step.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ingot_core::{Priority, TokenId};
use ingot_kv_cache::{BlockId, BlockPool, BlockTable};

/// Identifies a sequence inside the engine.
pub type SeqId = u64;

/// Limits and policy knobs.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens (decode + prefill) per step.
    pub max_num_batched_tokens: usize,
    /// Most tokens of a step in which no sequence decodes (every one it
    /// runs is still in its prompt): no running request's inter-token
    /// latency waits on such a step, so it may take more than
    /// `max_num_batched_tokens`. At or below that (0: off) it changes
    /// nothing.
    pub max_prefill_only_tokens: usize,
    /// Waiting-queue bound; tiers below high are shed earlier (see [`admit`]).
    pub max_waiting: usize,
    /// First-token deadline per tier, most urgent first.
    pub tier_deadlines: [Duration; 5],
    /// Waiting this long promotes a request by one tier.
    pub aging: Duration,
}

impl SchedulerConfig {
    /// The most tokens any step may hold (what the runner's activations
    /// must be sized for).
    pub fn largest_step(&self) -> usize {
        self.max_num_batched_tokens
            .max(self.max_prefill_only_tokens)
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            max_prefill_only_tokens: 0,
            max_waiting: 256,
            tier_deadlines: [
                Duration::from_millis(250),
                Duration::from_millis(1000),
                Duration::from_secs(5),
                Duration::from_secs(30),
                Duration::from_secs(120),
            ],
            aging: Duration::from_secs(10),
        }
    }
}

/// The waiting queue is full for this tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the server is overloaded: {waiting} requests waiting (limit {limit} for this priority)")]
pub struct AdmissionError {
    /// Requests waiting now.
    pub waiting: usize,
    /// The bound that applied to this tier.
    pub limit: usize,
}

/// Whether a request of `priority` may join a queue of `waiting` requests
/// bounded by `max_waiting`. Less urgent tiers are shed first: background
/// at half the bound, low at three quarters, normal at the bound, high and
/// critical at 1.25× (a reserve so urgent traffic still gets in).
pub fn admit(priority: Priority, waiting: usize, max_waiting: usize) -> Result<(), AdmissionError> {
    let max = max_waiting;
    let limit = match priority {
        Priority::Critical | Priority::High => max + max / 4,
        Priority::Normal => max,
        Priority::Low => max * 3 / 4,
        Priority::Background => max / 2,
    };
    if waiting >= limit {
        Err(AdmissionError { waiting, limit })
    } else {
        Ok(())
    }
}

/// One sequence's work in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledChunk {
    /// The sequence.
    pub id: SeqId,
    /// Position of the chunk's first token.
    pub start: usize,
    /// Tokens in the chunk.
    pub len: usize,
    /// The chunk ends at the sequence's last token: sample from its logits.
    pub sample: bool,
    /// Proposed tokens (speculative decoding) ending the chunk, after its
    /// one real token: the step verifies them, then
    /// [`Scheduler::accept_draft`] keeps those accepted.
    pub draft: usize,
}

/// What one step runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    /// Chunks to run, one per sequence.
    pub chunks: Vec<ScheduledChunk>,
    /// Sequences preempted this step (blocks freed, back to waiting).
    pub preempted: Vec<SeqId>,
    /// Sequences that left the waiting queue this step, with the number of
    /// prompt tokens found in the prefix cache.
    pub started: Vec<(SeqId, usize)>,
}

/// Read access to a sequence for building the forward batch.
#[derive(Debug, Clone, Copy)]
pub struct SeqView<'a> {
    /// All tokens (prompt then output).
    pub tokens: &'a [TokenId],
    /// KV blocks of the first layer group, in position order (the only
    /// group of a model without sliding windows).
    pub blocks: &'a [BlockId],
    /// Every layer group's table (the first is `blocks`).
    pub tables: &'a [BlockTable],
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum State {
    Waiting,
    Running,
}

#[derive(Debug)]
struct Seq {
    priority: Priority,
    arrival: Instant,
    tokens: Vec<TokenId>,
    max_tokens: usize,
    prompt_len: usize,
    num_computed: usize,
    /// One block table per layer group of the pool's layout.
    tables: Vec<BlockTable>,
    state: State,
    paused: bool,
    /// Computes every position itself (it needs their logits, e.g. for
    /// prompt logprobs): never starts from cached prefix blocks.
    compute_all: bool,
    /// The last `draft` tokens are proposals (speculative decoding), not
    /// yet the sequence's: never counted computed or named as cache blocks.
    draft: usize,
    /// The next `ahead` tokens appended were computed already (kept
    /// proposals: the step that verified them wrote their KV).
    ahead: usize,
}

impl Seq {
    /// Real tokens not yet in the cache.
    fn pending(&self) -> usize {
        self.tokens.len() - self.draft - self.num_computed
    }

    /// Drops the proposals after the first `keep`.
    fn cut_draft(&mut self, keep: usize) {
        let keep = keep.min(self.draft);
        self.tokens
            .truncate(self.tokens.len() - (self.draft - keep));
        self.draft = keep;
    }
}

/// Continuous-batching scheduler over a KV block pool.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    pool: BlockPool,
    seqs: HashMap<SeqId, Seq>,
    waiting: Vec<SeqId>,
    running: Vec<SeqId>,
    num_preemptions: u64,
    /// Bit `rank` set: sequences of that tier are held (SLO remediation):
    /// not admitted, not stepped, not counted against `max_num_seqs`.
    held: u8,
}

impl Scheduler {
    /// A scheduler allocating from `pool`.
    pub fn new(config: SchedulerConfig, pool: BlockPool) -> Self {
        Self {
            config,
            pool,
            seqs: HashMap::new(),
            waiting: Vec::new(),
            running: Vec::new(),
            num_preemptions: 0,
            held: 0,
        }
    }

    /// Changes the step token budget and the running-sequence cap (both at
    /// least 1); the next step uses them.
    pub fn set_step_limits(&mut self, max_num_batched_tokens: usize, max_num_seqs: usize) {
        self.config.max_num_batched_tokens = max_num_batched_tokens.max(1);
        self.config.max_num_seqs = max_num_seqs.max(1);
    }

    /// Holds the tiers whose bit (`1 << rank`) is set: their waiting
    /// sequences are not admitted and their running ones keep their blocks
    /// but are not stepped, until released.
    pub fn set_held(&mut self, tiers: u8) {
        self.held = tiers;
    }

    fn is_held(&self, seq: &Seq) -> bool {
        self.held & (1 << seq.priority.rank()) != 0
    }

    /// Running sequences that take a slot (held ones do not).
    fn num_stepping(&self) -> usize {
        self.running
            .iter()
            .filter(|id| !self.is_held(&self.seqs[id]))
            .count()
    }

    /// The block pool (usage, prefix-cache counters).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The copies between the runner's pool and the tiers below it to make
    /// before the step's forward pass, in order.
    pub fn take_transfers(&mut self) -> Vec<ingot_kv_cache::PageTransfer> {
        self.pool.take_transfers()
    }

    /// Pages named since the last call, to copy after the step (KV tiers
    /// with write-through).
    pub fn take_named(&mut self) -> Vec<(BlockId, ingot_kv_cache::PageKey)> {
        self.pool.take_named()
    }

    /// Up to `max` evictable pages not held below, the next evicted first
    /// (an idle engine copies them down ahead of their eviction).
    pub fn cold_pages(
        &self,
        max: usize,
        below: impl Fn(&ingot_kv_cache::PageKey) -> bool,
    ) -> Vec<(BlockId, ingot_kv_cache::PageKey)> {
        self.pool.cold_pages(max, below)
    }

    /// Forgets the prefix cache (the runner's KV contents were lost).
    pub fn forget_cached_kv(&mut self) {
        self.pool.forget_cached();
    }

    /// Sequences waiting for admission.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences holding KV blocks and being stepped.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Preemptions since start.
    pub fn num_preemptions(&self) -> u64 {
        self.num_preemptions
    }

    /// True when nothing is waiting or running.
    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }

    /// The longest sequence the whole pool can run (a sliding layer group
    /// holds only its window, so this can exceed the pool's positions):
    /// longer sequences can never run.
    pub fn capacity_tokens(&self) -> usize {
        self.pool.layout().capacity_tokens(
            self.pool.num_blocks(),
            self.pool.block_size(),
            self.config.largest_step(),
        )
    }

    /// Queues a sequence. `max_tokens` only feeds the shortest-job estimate.
    pub fn add(
        &mut self,
        id: SeqId,
        prompt: Vec<TokenId>,
        priority: Priority,
        max_tokens: usize,
        now: Instant,
    ) {
        let prompt_len = prompt.len();
        self.seqs.insert(
            id,
            Seq {
                priority,
                arrival: now,
                tokens: prompt,
                max_tokens,
                prompt_len,
                num_computed: 0,
                tables: self.pool.new_tables(),
                state: State::Waiting,
                paused: false,
                compute_all: false,
                draft: 0,
                ahead: 0,
            },
        );
        self.waiting.push(id);
    }

    /// Makes a waiting sequence compute every position itself, skipping
    /// the prefix cache (its blocks are still published for others): a
    /// cache hit would skip positions whose logits it needs.
    pub fn compute_all_positions(&mut self, id: SeqId) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.compute_all = true;
        }
    }

    /// Removes a sequence (finished or aborted) and frees its blocks.
    /// Returns false when the id is unknown.
    pub fn remove(&mut self, id: SeqId) -> bool {
        let Some(mut seq) = self.seqs.remove(&id) else {
            return false;
        };
        self.pool.release_groups(&mut seq.tables);
        match seq.state {
            State::Waiting => self.waiting.retain(|&w| w != id),
            State::Running => self.running.retain(|&r| r != id),
        }
        true
    }

    /// Appends a sampled token to a sequence.
    pub fn append_token(&mut self, id: SeqId, token: TokenId) {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        seq.cut_draft(0);
        seq.tokens.push(token);
        if seq.ahead > 0 {
            seq.ahead -= 1;
            seq.num_computed += 1;
            self.pool
                .publish_groups(&mut seq.tables, &seq.tokens, seq.num_computed);
        }
    }

    /// Proposes `draft` to follow a decoding sequence's last token
    /// (speculative decoding): the next step runs them with it, as far as
    /// its token budget allows, and its logits verify them. Replaces an
    /// earlier proposal. False (nothing proposed) unless the sequence is
    /// running with exactly its last token to compute.
    pub fn set_draft(&mut self, id: SeqId, draft: &[TokenId]) -> bool {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return false;
        };
        seq.cut_draft(0);
        if seq.state != State::Running || seq.num_computed == 0 || seq.pending() != 1 {
            return false;
        }
        seq.tokens.extend_from_slice(draft);
        seq.draft = draft.len();
        true
    }

    /// After a step that ran a proposal: the proposals are dropped, and the
    /// next `kept` tokens appended (the engine appends every token it
    /// takes, kept proposals first) count as computed: the step wrote their
    /// KV. Slots of refused proposals are written again later.
    pub fn accept_draft(&mut self, id: SeqId, kept: usize) {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        seq.ahead = kept.min(seq.draft);
        seq.cut_draft(0);
    }

    /// Changes a sequence's tier (a coalesced request joined by a more
    /// urgent subscriber runs at the most urgent tier among them).
    pub fn set_priority(&mut self, id: SeqId, priority: Priority) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.priority = priority;
        }
    }

    /// A paused sequence keeps its blocks but is not stepped (its client is
    /// not reading).
    pub fn set_paused(&mut self, id: SeqId, paused: bool) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.paused = paused;
        }
    }

    /// Tokens and blocks of a sequence.
    pub fn view(&self, id: SeqId) -> Option<SeqView<'_>> {
        self.seqs.get(&id).map(|s| SeqView {
            tokens: &s.tokens,
            blocks: s.tables.first().map_or(&[], |t| t.blocks()),
            tables: &s.tables,
        })
    }

    /// Generated tokens of a sequence so far.
    pub fn num_output_tokens(&self, id: SeqId) -> usize {
        self.seqs
            .get(&id)
            .map_or(0, |s| s.tokens.len() - s.prompt_len)
    }

    /// Tier after aging: one level more urgent per `aging` waited.
    fn effective_rank(&self, seq: &Seq, now: Instant) -> usize {
        let waited = now.saturating_duration_since(seq.arrival);
        let steps = if self.config.aging.is_zero() {
            0
        } else {
            (waited.as_secs_f64() / self.config.aging.as_secs_f64()) as usize
        };
        seq.priority.rank().saturating_sub(steps)
    }

    fn waiting_key(&self, id: SeqId, now: Instant) -> (usize, bool, usize, Instant, SeqId) {
        let seq = &self.seqs[&id];
        let waited = now.saturating_duration_since(seq.arrival);
        let overdue = waited >= self.config.tier_deadlines[seq.priority.rank()];
        let job = seq.pending() + seq.max_tokens;
        (
            self.effective_rank(seq, now),
            !overdue,
            job,
            seq.arrival,
            id,
        )
    }

    /// Running sequences, least urgent (then latest) first: preemption order.
    fn victims(&self) -> Vec<SeqId> {
        let mut v = self.running.clone();
        v.sort_by_key(|id| {
            let s = &self.seqs[id];
            (
                std::cmp::Reverse(s.priority),
                std::cmp::Reverse(s.arrival),
                std::cmp::Reverse(*id),
            )
        });
        v
    }

    fn preempt(&mut self, id: SeqId, out: &mut SchedulerOutput) {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        self.pool.release_groups(&mut seq.tables);
        seq.cut_draft(0);
        seq.ahead = 0;
        seq.num_computed = 0;
        seq.state = State::Waiting;
        self.running.retain(|&r| r != id);
        self.waiting.push(id);
        self.num_preemptions += 1;
        out.preempted.push(id);
        out.chunks.retain(|c| c.id != id);
    }

    /// Decides this step's work.
    pub fn schedule(&mut self, now: Instant) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        self.preempt_for_urgent_waiting(now, &mut out);
        let urgent_preemptions = out.preempted.len();
        let mut budget = self.step_budget();
        // 1. Running sequences, most urgent first.
        let mut order = self.running.clone();
        order.sort_by_key(|id| (self.seqs[id].priority, self.seqs[id].arrival, *id));
        for id in order {
            if budget == 0 {
                break;
            }
            let Some(seq) = self.seqs.get(&id) else {
                continue;
            };
            if seq.state != State::Running || seq.paused || seq.pending() == 0 || self.is_held(seq)
            {
                continue;
            }
            // A proposal is cut to the budget left.
            let n = (seq.pending() + seq.draft).min(budget);
            if let Some(seq) = self.seqs.get_mut(&id) {
                seq.cut_draft(n - 1);
            }
            if self.reserve_or_preempt(id, n, &mut out) {
                self.push_chunk(id, n, &mut out);
                budget -= n;
            }
        }
        // 2. Waiting sequences, unless running ones were short of memory.
        if out.preempted.len() == urgent_preemptions {
            self.admit_waiting(now, &mut budget, &mut out);
        }
        self.commit(&out);
        out
    }

    /// Drops the proposals of sequences this step does not run.
    fn drop_unscheduled_drafts(&mut self, out: &SchedulerOutput) {
        for (id, seq) in self.seqs.iter_mut() {
            if seq.draft > 0 && !out.chunks.iter().any(|c| c.id == *id) {
                seq.cut_draft(0);
            }
        }
    }

    /// This step's token budget: the larger prefill-only budget when no
    /// sequence that will be stepped has finished its prompt.
    fn step_budget(&self) -> usize {
        let decoding = self.running.iter().any(|id| {
            let s = &self.seqs[id];
            s.state == State::Running
                && !s.paused
                && !self.is_held(s)
                && s.num_computed >= s.prompt_len
        });
        if decoding {
            self.config.max_num_batched_tokens
        } else {
            self.config.largest_step()
        }
    }

    /// Grows `id`'s table for `n` more tokens, preempting less urgent running
    /// sequences (or `id` itself, as a last resort). True when it can run.
    fn reserve_or_preempt(&mut self, id: SeqId, n: usize, out: &mut SchedulerOutput) -> bool {
        loop {
            let seq = self
                .seqs
                .get_mut(&id)
                .expect("scheduled ids exist. This is a bug.");
            let (start, target) = (seq.num_computed, seq.num_computed + n);
            if self
                .pool
                .reserve_groups(&mut seq.tables, start, target)
                .is_ok()
            {
                return true;
            }
            let victim = self.victims().into_iter().find(|v| *v != id);
            let me_first = victim.is_none_or(|v| self.seqs[&v].priority < self.seqs[&id].priority);
            if me_first {
                self.preempt(id, out);
                return false;
            }
            if let Some(v) = victim {
                self.preempt(v, out);
            }
        }
    }

    /// Gives a decoding sequence the block of its next position one step
    /// early, so a backend that launches the next decode step before this
    /// one returns has that position's KV slot even where it starts a new
    /// block. Best effort: it never preempts, and it leaves a block free for
    /// every running sequence, so it cannot take a block another sequence
    /// needs this step or the next. The engine calls it (after `schedule`)
    /// only for rows it expects to decode again; the block is released with
    /// the sequence like any other. True when the next position has a slot.
    pub fn reserve_next_position(&mut self, id: SeqId) -> bool {
        let spare = self.running.len();
        let Some(seq) = self.seqs.get_mut(&id) else {
            return false;
        };
        if seq.state != State::Running || seq.pending() != 0 || seq.num_computed == 0 {
            return false;
        }
        // This step computes position `num_computed - 1` (it is scheduled:
        // `commit` counted it); the next computes `num_computed`. Starting
        // from this step's position gives back no block this step still reads.
        let (start, end) = (seq.num_computed - 1, seq.num_computed + 1);
        let blocks = end.div_ceil(self.pool.block_size());
        if seq.tables.iter().all(|t| t.num_blocks() >= blocks) {
            return true;
        }
        let needed = self.pool.pages_for(start, end) - self.pool.pages_for(start, end - 1);
        if self.pool.num_available() < needed + spare {
            return false;
        }
        self.pool
            .reserve_groups(&mut seq.tables, start, end)
            .is_ok()
    }

    fn push_chunk(&mut self, id: SeqId, n: usize, out: &mut SchedulerOutput) {
        let seq = &self.seqs[&id];
        out.chunks.push(ScheduledChunk {
            id,
            start: seq.num_computed,
            len: n,
            sample: seq.num_computed + n == seq.tokens.len(),
            draft: seq.draft,
        });
    }

    /// Makes room for the most urgent waiting sequence when it outranks
    /// running ones and there is no slot or no memory for its first chunk.
    fn preempt_for_urgent_waiting(&mut self, now: Instant, out: &mut SchedulerOutput) {
        let Some(&best) = self.sorted_waiting(now).first() else {
            return;
        };
        let budget = self.step_budget();
        let (rank, need) = {
            let s = &self.seqs[&best];
            let chunk = s.pending().min(budget);
            let end = s.num_computed + chunk;
            (s.priority, self.pool.pages_for(s.num_computed, end))
        };
        loop {
            let short_of_slots = self.num_stepping() >= self.config.max_num_seqs;
            let short_of_blocks = need > self.pool.num_available();
            if !short_of_slots && !short_of_blocks {
                return;
            }
            // Held sequences take no slot: preempting one frees only memory.
            let victim = self
                .victims()
                .into_iter()
                .find(|v| short_of_blocks || !self.is_held(&self.seqs[v]));
            match victim {
                Some(v) if self.seqs[&v].priority > rank => self.preempt(v, out),
                _ => return,
            }
        }
    }

    /// Waiting sequences that may start, most urgent first.
    fn sorted_waiting(&self, now: Instant) -> Vec<SeqId> {
        let mut w = self.waiting.clone();
        w.retain(|id| !self.is_held(&self.seqs[id]));
        w.sort_by_cached_key(|&id| self.waiting_key(id, now));
        w
    }

    fn admit_waiting(&mut self, now: Instant, budget: &mut usize, out: &mut SchedulerOutput) {
        for id in self.sorted_waiting(now) {
            if *budget == 0 || self.num_stepping() >= self.config.max_num_seqs {
                return;
            }
            if out.preempted.contains(&id) {
                continue;
            }
            let seq = self
                .seqs
                .get_mut(&id)
                .expect("waiting ids exist. This is a bug.");
            let cached = if seq.compute_all {
                0
            } else {
                self.pool.reuse_prefix_groups(&mut seq.tables, &seq.tokens)
            };
            seq.num_computed = cached;
            let n = seq.pending().min(*budget);
            let (start, end) = (seq.num_computed, seq.num_computed + n);
            if self
                .pool
                .reserve_groups(&mut seq.tables, start, end)
                .is_err()
            {
                // Not enough memory: give the prefix back and stop admitting,
                // so a large request is not overtaken forever by small ones.
                self.pool.release_groups(&mut seq.tables);
                seq.num_computed = 0;
                return;
            }
            seq.state = State::Running;
            self.waiting.retain(|&w| w != id);
            self.running.push(id);
            out.started.push((id, cached));
            self.push_chunk(id, n, out);
            *budget -= n;
        }
    }

    /// Marks scheduled tokens computed and publishes newly full blocks to
    /// the prefix cache (their contents are written by this step's forward).
    fn commit(&mut self, out: &SchedulerOutput) {
        self.drop_unscheduled_drafts(out);
        for c in &out.chunks {
            let seq = self
                .seqs
                .get_mut(&c.id)
                .expect("scheduled ids exist. This is a bug.");
            seq.num_computed = c.start + c.len - c.draft;
            self.pool
                .publish_groups(&mut seq.tables, &seq.tokens, seq.num_computed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: usize = 4;

    fn sched(blocks: usize, f: impl FnOnce(&mut SchedulerConfig)) -> Scheduler {
        let mut c = SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 16,
            max_waiting: 8,
            aging: Duration::from_secs(10),
            ..SchedulerConfig::default()
        };
        f(&mut c);
        Scheduler::new(c, BlockPool::new(blocks, BS, true))
    }

    fn prompt(n: usize, base: u32) -> Vec<TokenId> {
        (0..n as u32).map(|i| base + i).collect()
    }

    /// Plays the engine: every sampled chunk appends one token.
    fn step(s: &mut Scheduler, now: Instant) -> SchedulerOutput {
        let out = s.schedule(now);
        for c in &out.chunks {
            if c.sample {
                s.append_token(c.id, 7);
            }
        }
        out
    }

    fn ids(out: &SchedulerOutput) -> Vec<SeqId> {
        out.chunks.iter().map(|c| c.id).collect()
    }

    #[test]
    fn drafts_run_after_the_last_token_and_only_accepted_ones_stay() {
        let t0 = Instant::now();
        let mut s = sched(64, |_| {});
        s.add(1, prompt(6, 0), Priority::Normal, 10, t0);
        step(&mut s, t0);
        assert!(s.set_draft(1, &[20, 21, 22]));
        let out = s.schedule(t0);
        let chunk = ScheduledChunk {
            id: 1,
            start: 6,
            len: 4,
            sample: true,
            draft: 3,
        };
        assert_eq!(out.chunks, vec![chunk]);
        assert_eq!(s.view(1).unwrap().tokens[6..], [7, 20, 21, 22]);
        // The first proposal holds; the verifier's own token follows it.
        s.accept_draft(1, 1);
        s.append_token(1, 20);
        s.append_token(1, 30);
        assert_eq!(s.view(1).unwrap().tokens[6..], [7, 20, 30]);
        let out = s.schedule(t0);
        assert_eq!((out.chunks[0].start, out.chunks[0].len), (8, 1));
        // Cached blocks hold accepted tokens only: [4, 5, 7, 20] is the
        // second block, no block holds 21.
        s.add(2, vec![0, 1, 2, 3, 4, 5, 7, 20, 9], Priority::Normal, 1, t0);
        s.add(3, vec![0, 1, 2, 3, 4, 5, 7, 21, 9], Priority::Normal, 1, t0);
        let mut started = s.schedule(t0).started;
        started.sort();
        assert_eq!(started, vec![(2, 8), (3, 4)]);
    }

    #[test]
    fn drafts_are_cut_to_the_budget_and_dropped_when_not_run() {
        let t0 = Instant::now();
        let mut s = sched(64, |_| {});
        s.add(1, prompt(6, 0), Priority::Normal, 10, t0);
        step(&mut s, t0);
        s.set_step_limits(3, 8);
        assert!(s.set_draft(1, &[20, 21, 22, 23]));
        let out = s.schedule(t0);
        assert_eq!((out.chunks[0].len, out.chunks[0].draft), (3, 2));
        s.accept_draft(1, 0);
        s.append_token(1, 30);
        assert_eq!(s.view(1).unwrap().tokens[6..], [7, 30]);
        // A paused sequence is not run: its proposal goes.
        assert!(s.set_draft(1, &[40]));
        s.set_paused(1, true);
        assert!(s.schedule(t0).chunks.is_empty());
        assert_eq!(s.view(1).unwrap().tokens[6..], [7, 30]);
        // Nothing is proposed for a sequence with more than its last token
        // to compute.
        s.add(2, prompt(8, 100), Priority::Normal, 10, t0);
        assert!(!s.set_draft(2, &[1]));
    }

    #[test]
    fn held_tiers_wait_and_release() {
        let t0 = Instant::now();
        let mut s = sched(64, |_| {});
        s.add(1, prompt(4, 0), Priority::Low, 10, t0);
        s.add(2, prompt(4, 100), Priority::High, 10, t0);
        step(&mut s, t0);
        // Hold low: the running low sequence is no longer stepped.
        s.set_held(1 << Priority::Low.rank());
        s.add(3, prompt(4, 200), Priority::Low, 10, t0);
        for _ in 0..3 {
            assert_eq!(ids(&step(&mut s, t0)), vec![2]);
        }
        assert_eq!(s.num_waiting(), 1, "the new low request waits");
        s.set_held(0);
        let out = step(&mut s, t0);
        let mut got = ids(&out);
        got.sort();
        assert_eq!(got, vec![1, 2, 3]);
    }

    #[test]
    fn held_sequences_take_no_slot() {
        let t0 = Instant::now();
        let mut s = sched(64, |c| c.max_num_seqs = 1);
        s.add(1, prompt(4, 0), Priority::Background, 10, t0);
        step(&mut s, t0);
        s.set_held(1 << Priority::Background.rank());
        s.add(2, prompt(4, 100), Priority::Normal, 10, t0);
        let out = step(&mut s, t0);
        assert_eq!(ids(&out), vec![2]);
        assert!(out.preempted.is_empty(), "the held one keeps its blocks");
    }

    #[test]
    fn step_limits_change_at_runtime() {
        let t0 = Instant::now();
        let mut s = sched(64, |_| {});
        s.set_step_limits(8, 8);
        s.add(1, prompt(20, 0), Priority::Normal, 10, t0);
        let out = step(&mut s, t0);
        assert_eq!(out.chunks[0].len, 8);
        s.set_step_limits(16, 8);
        let out = step(&mut s, t0);
        assert_eq!(out.chunks[0].len, 12);
    }

    #[test]
    fn long_prompt_is_chunked_and_decodes_keep_running() {
        let t0 = Instant::now();
        let mut s = sched(64, |_| {});
        s.add(1, prompt(3, 0), Priority::Normal, 10, t0);
        let out = step(&mut s, t0);
        assert_eq!(
            out.chunks,
            vec![ScheduledChunk {
                id: 1,
                start: 0,
                len: 3,
                sample: true,
                draft: 0,
            }]
        );
        s.add(2, prompt(40, 100), Priority::Normal, 10, t0);
        // Budget 16: seq 1 decodes 1 token, seq 2 prefills 15, then 15, then 10.
        let mut prefilled = 0;
        for _ in 0..3 {
            let out = step(&mut s, t0);
            let c1 = out.chunks[0];
            assert_eq!(
                (c1.id, c1.len, c1.sample),
                (1, 1, true),
                "decode keeps going"
            );
            let c2 = out.chunks[1];
            assert_eq!((c2.id, c2.start), (2, prefilled));
            assert!(out.chunks.iter().map(|c| c.len).sum::<usize>() <= 16);
            prefilled += c2.len;
            assert_eq!(c2.sample, prefilled == 40);
        }
        assert_eq!(prefilled, 40);
    }

    #[test]
    fn a_prompt_with_no_decode_beside_it_takes_the_prefill_only_budget() {
        let t0 = Instant::now();
        let mut s = sched(64, |c| c.max_prefill_only_tokens = 48);
        s.add(1, prompt(40, 0), Priority::Normal, 10, t0);
        let out = step(&mut s, t0);
        assert_eq!(
            out.chunks,
            vec![ScheduledChunk {
                id: 1,
                start: 0,
                len: 40,
                sample: true,
                draft: 0,
            }],
            "one step for the whole prompt"
        );
        // Seq 1 now decodes: a new prompt is chunked under the normal budget.
        s.add(2, prompt(40, 100), Priority::Normal, 10, t0);
        let out = step(&mut s, t0);
        assert_eq!(ids(&out), vec![1, 2]);
        assert_eq!(out.chunks.iter().map(|c| c.len).sum::<usize>(), 16);
    }

    #[test]
    fn prompts_waiting_together_share_the_prefill_only_budget() {
        let t0 = Instant::now();
        let mut s = sched(64, |c| c.max_prefill_only_tokens = 48);
        s.add(1, prompt(30, 0), Priority::Normal, 10, t0);
        s.add(2, prompt(30, 100), Priority::Normal, 10, t0);
        let out = step(&mut s, t0);
        let lens: Vec<_> = out.chunks.iter().map(|c| (c.id, c.len)).collect();
        assert_eq!(lens, vec![(1, 30), (2, 18)]);
        // Seq 1 decodes from now on: seq 2's rest goes under the normal budget.
        let out = step(&mut s, t0);
        let lens: Vec<_> = out.chunks.iter().map(|c| (c.id, c.len)).collect();
        assert_eq!(lens, vec![(1, 1), (2, 12)]);
    }

    #[test]
    fn a_prefill_only_budget_below_the_step_budget_changes_nothing() {
        let t0 = Instant::now();
        let mut s = sched(64, |c| c.max_prefill_only_tokens = 8);
        s.add(1, prompt(40, 0), Priority::Normal, 10, t0);
        assert_eq!(step(&mut s, t0).chunks[0].len, 16);
    }

    #[test]
    fn max_num_seqs_bounds_the_batch() {
        let t0 = Instant::now();
        let mut s = sched(64, |c| c.max_num_seqs = 2);
        for id in 0..4 {
            s.add(id, prompt(2, id as u32 * 10), Priority::Normal, 4, t0);
        }
        let out = step(&mut s, t0);
        assert_eq!(out.chunks.len(), 2);
        assert_eq!(s.num_running(), 2);
        assert_eq!(s.num_waiting(), 2);
        s.remove(0);
        let out = step(&mut s, t0);
        assert_eq!(out.chunks.len(), 2);
        assert_eq!(out.started.len(), 1);
    }

    #[test]
    fn shared_prefix_starts_from_the_cache() {
        let t0 = Instant::now();
        let mut s = sched(64, |c| c.max_num_batched_tokens = 64);
        s.add(1, prompt(20, 0), Priority::Normal, 4, t0);
        step(&mut s, t0);
        s.remove(1);
        let mut p = prompt(16, 0);
        p.extend([500, 501, 502]);
        s.add(2, p, Priority::Normal, 4, t0);
        let out = step(&mut s, t0);
        assert_eq!(out.started, vec![(2, 16)]);
        assert_eq!(
            out.chunks,
            vec![ScheduledChunk {
                id: 2,
                start: 16,
                len: 3,
                sample: true,
                draft: 0,
            }]
        );
        assert_eq!(s.pool().prefix_cache_stats().hits, 16);
    }

    #[test]
    fn a_sequence_that_computes_all_positions_skips_the_cache() {
        let t0 = Instant::now();
        let mut s = sched(64, |c| c.max_num_batched_tokens = 64);
        s.add(1, prompt(20, 0), Priority::Normal, 4, t0);
        step(&mut s, t0);
        s.remove(1);
        s.add(2, prompt(20, 0), Priority::Normal, 4, t0);
        s.compute_all_positions(2);
        let out = step(&mut s, t0);
        assert_eq!(out.started, vec![(2, 0)]);
        assert_eq!((out.chunks[0].start, out.chunks[0].len), (0, 20));
        // Its blocks are still published for the next request.
        s.add(3, prompt(20, 0), Priority::Normal, 4, t0);
        assert_eq!(step(&mut s, t0).started, vec![(3, 16)]);
    }

    #[test]
    fn out_of_blocks_preempts_the_least_urgent_latest_and_recovers() {
        let t0 = Instant::now();
        // 6 blocks of 4 = 24 slots. Three sequences of 7 tokens need 2 blocks
        // each, then grow.
        let mut s = sched(6, |c| c.max_num_batched_tokens = 64);
        s.add(1, prompt(7, 0), Priority::High, 100, t0);
        s.add(2, prompt(7, 100), Priority::Normal, 100, t0);
        s.add(
            3,
            prompt(7, 200),
            Priority::Normal,
            100,
            t0 + Duration::from_millis(1),
        );
        step(&mut s, t0);
        assert_eq!(s.num_running(), 3);
        // Decode until someone must be preempted.
        let mut preempted = Vec::new();
        for _ in 0..8 {
            let out = step(&mut s, t0 + Duration::from_millis(2));
            preempted.extend(out.preempted);
            if !preempted.is_empty() {
                break;
            }
        }
        assert_eq!(preempted.first(), Some(&3), "latest normal goes first");
        assert!(s.pool().num_in_use() <= 6);
        // Finishing the others lets the preempted one come back and finish.
        s.remove(1);
        s.remove(2);
        let out = step(&mut s, t0 + Duration::from_millis(3));
        assert!(ids(&out).contains(&3));
        assert_eq!(s.num_preemptions(), preempted.len() as u64);
    }

    #[test]
    fn a_sequence_alone_without_memory_preempts_itself_instead_of_hanging() {
        let t0 = Instant::now();
        let mut s = sched(2, |c| c.max_num_batched_tokens = 64);
        s.add(1, prompt(8, 0), Priority::Normal, 100, t0);
        step(&mut s, t0); // 2 blocks used
        let out = step(&mut s, t0); // needs a third block
        assert_eq!(out.preempted, vec![1]);
        assert!(out.chunks.is_empty());
        assert_eq!(s.pool().num_in_use(), 0);
    }

    #[test]
    fn urgent_tiers_first_then_shortest_job() {
        let t0 = Instant::now();
        let mut s = sched(64, |c| c.max_num_seqs = 1);
        s.add(1, prompt(8, 0), Priority::Normal, 100, t0);
        s.add(2, prompt(8, 10), Priority::Normal, 2, t0);
        s.add(
            3,
            prompt(8, 20),
            Priority::Critical,
            100,
            t0 + Duration::from_millis(5),
        );
        s.add(4, prompt(8, 30), Priority::Background, 1, t0);
        let now = t0 + Duration::from_millis(6);
        let mut order = Vec::new();
        for _ in 0..4 {
            let out = step(&mut s, now);
            let id = out.chunks[0].id;
            order.push(id);
            s.remove(id);
        }
        assert_eq!(order, vec![3, 2, 1, 4]);
    }

    #[test]
    fn aging_lets_background_overtake_newer_normal() {
        let t0 = Instant::now();
        let mut s = sched(64, |c| c.max_num_seqs = 1);
        s.add(1, prompt(4, 0), Priority::Background, 4, t0);
        // 25 s later: background has aged two tiers (rank 4 -> 2 = normal) and
        // arrived earlier; a fresh normal request waits behind it.
        let later = t0 + Duration::from_secs(25);
        s.add(2, prompt(4, 10), Priority::Normal, 4, later);
        let out = step(&mut s, later);
        assert_eq!(ids(&out), vec![1]);
    }

    #[test]
    fn overdue_requests_go_first_within_a_tier() {
        let t0 = Instant::now();
        let mut s = sched(64, |c| c.max_num_seqs = 1);
        s.add(1, prompt(4, 0), Priority::Normal, 1000, t0);
        let later = t0 + Duration::from_secs(6); // past normal's 5 s deadline
        s.add(2, prompt(4, 10), Priority::Normal, 1, later);
        assert_eq!(
            ids(&step(&mut s, later)),
            vec![1],
            "overdue beats a shorter job"
        );
    }

    #[test]
    fn critical_preempts_background_for_a_slot() {
        let t0 = Instant::now();
        let mut s = sched(64, |c| c.max_num_seqs = 1);
        s.add(1, prompt(4, 0), Priority::Background, 100, t0);
        step(&mut s, t0);
        s.add(2, prompt(4, 10), Priority::Critical, 100, t0);
        let out = step(&mut s, t0);
        assert_eq!(out.preempted, vec![1]);
        assert_eq!(ids(&out), vec![2]);
        // A normal request does not preempt a running normal one.
        let mut s = sched(64, |c| c.max_num_seqs = 1);
        s.add(1, prompt(4, 0), Priority::Normal, 100, t0);
        step(&mut s, t0);
        s.add(2, prompt(4, 10), Priority::Normal, 100, t0);
        let out = step(&mut s, t0);
        assert!(out.preempted.is_empty());
        assert_eq!(ids(&out), vec![1]);
    }

    #[test]
    fn admission_sheds_background_and_low_first() {
        assert!(admit(Priority::Background, 3, 8).is_ok());
        assert!(admit(Priority::Background, 4, 8).is_err());
        assert!(admit(Priority::Low, 5, 8).is_ok());
        assert!(admit(Priority::Low, 6, 8).is_err());
        assert!(admit(Priority::Normal, 7, 8).is_ok());
        assert!(admit(Priority::Normal, 8, 8).is_err());
        assert!(admit(Priority::Critical, 9, 8).is_ok());
        assert!(admit(Priority::Critical, 10, 8).is_err());
    }

    #[test]
    fn paused_sequences_hold_blocks_but_are_not_stepped() {
        let t0 = Instant::now();
        let mut s = sched(64, |_| {});
        s.add(1, prompt(4, 0), Priority::Normal, 10, t0);
        s.add(2, prompt(4, 10), Priority::Normal, 10, t0);
        step(&mut s, t0);
        s.set_paused(1, true);
        assert_eq!(ids(&step(&mut s, t0)), vec![2]);
        s.set_paused(1, false);
        assert_eq!(ids(&step(&mut s, t0)).len(), 2);
    }

    #[test]
    fn the_next_positions_block_is_taken_early_and_freed_with_the_sequence() {
        let t0 = Instant::now();
        let mut s = sched(16, |_| {});
        // A 7-token prompt: positions 0..7 in 2 blocks of 4.
        s.add(1, prompt(7, 0), Priority::Normal, 10, t0);
        step(&mut s, t0);
        // Its first decode step computes position 7, the end of block 1:
        // the next step's position 8 needs a third block, taken now.
        let out = s.schedule(t0);
        assert_eq!(out.chunks[0].start, 7);
        assert_eq!(s.pool().num_in_use(), 2);
        assert!(s.reserve_next_position(1));
        assert_eq!(s.pool().num_in_use(), 3);
        assert_eq!(s.view(1).map(|v| v.blocks.len()), Some(3));
        // Mid-block (position 8, next 9): nothing more is taken.
        s.append_token(1, 7);
        let out = s.schedule(t0);
        assert_eq!(out.chunks[0].start, 8);
        assert!(s.reserve_next_position(1));
        assert_eq!(s.pool().num_in_use(), 3);
        assert!(s.remove(1));
        assert_eq!(s.pool().num_in_use(), 0);
        // Unknown and waiting sequences get nothing.
        assert!(!s.reserve_next_position(1));
        s.add(2, prompt(4, 0), Priority::Normal, 10, t0);
        assert!(!s.reserve_next_position(2));
        assert_eq!(s.pool().num_in_use(), 0);
    }

    #[test]
    fn the_next_positions_block_leaves_a_block_per_running_sequence() {
        let t0 = Instant::now();
        for (blocks, early) in [(4, false), (6, true)] {
            // Two 3-token prompts (a block each), then each decodes position
            // 3, the end of its block: position 4 would take a new block.
            let mut s = sched(blocks, |_| {});
            s.add(1, prompt(3, 0), Priority::Normal, 10, t0);
            s.add(2, prompt(3, 10), Priority::Normal, 10, t0);
            step(&mut s, t0);
            let out = s.schedule(t0);
            assert_eq!(out.chunks.len(), 2);
            let free = s.pool().num_available();
            // 4 blocks: 2 free for 2 running sequences, none to spare.
            assert_eq!(s.reserve_next_position(1), early, "{blocks} blocks");
            assert_eq!(s.reserve_next_position(2), early, "{blocks} blocks");
            let taken = if early { 2 } else { 0 };
            assert_eq!(s.pool().num_available(), free - taken);
        }
    }

    #[test]
    fn remove_frees_blocks_immediately() {
        let t0 = Instant::now();
        let mut s = sched(16, |_| {});
        s.add(1, prompt(10, 0), Priority::Normal, 10, t0);
        step(&mut s, t0);
        assert_eq!(s.pool().num_in_use(), 3);
        assert!(s.remove(1));
        assert_eq!(s.pool().num_in_use(), 0);
        assert!(s.is_idle());
        assert!(!s.remove(1));
    }

    /// Gemma 3 270M's groups (18 layers, every sixth global, window 512)
    /// over `pages` pages of 16 positions.
    fn gemma_sched(pages: usize, budget: usize) -> Scheduler {
        let windows: Vec<_> = (0..18).map(|l| ((l + 1) % 6 != 0).then_some(512)).collect();
        let layout = ingot_kv_cache::KvLayout::from_windows(&windows);
        let config = SchedulerConfig {
            max_num_batched_tokens: budget,
            ..SchedulerConfig::default()
        };
        Scheduler::new(config, BlockPool::with_layout(pages, 16, layout, true))
    }

    /// Runs sequence `id` until it holds `len` tokens; returns the most
    /// pages in use at once.
    fn run_to(s: &mut Scheduler, id: SeqId, len: usize, t0: Instant) -> usize {
        let mut peak = 0;
        while s.view(id).is_some_and(|v| v.tokens.len() < len) {
            let out = step(s, t0);
            assert!(out.preempted.is_empty(), "no preemption expected");
            peak = peak.max(s.pool().num_in_use());
        }
        peak
    }

    #[test]
    fn a_long_gemma_sequence_holds_a_window_of_sliding_blocks() {
        let t0 = Instant::now();
        // 700 pages: a 4k sequence in one shared table would need 256
        // blocks of 6 pages (1536).
        let mut s = gemma_sched(700, 512);
        assert!(s.capacity_tokens() >= 4096 + 64);
        s.add(1, prompt(4000, 0), Priority::Normal, 200, t0);
        let peak = run_to(&mut s, 1, 4096, t0);
        let v = s.view(1).unwrap();
        let (global, sliding) = (v.tables[0].num_live_pages(), v.tables[1].num_live_pages());
        assert_eq!(global, 4096usize.div_ceil(16));
        // The last step computed position 4094, which sees 3583..=4094:
        // blocks 223..=255, 5 pages each; one table would hold 256.
        assert_eq!(sliding, 33 * 5);
        assert_eq!(s.pool().num_in_use(), global + sliding);
        // While prefilling, a 512-token chunk adds its own blocks.
        assert!(peak <= 256 + (512 + 512) / 16 * 5 + 5, "peak {peak}");
        s.remove(1);
        assert_eq!(s.pool().num_in_use(), 0);
    }

    #[test]
    fn gemma_admission_counts_pages_per_group() {
        let t0 = Instant::now();
        let mut s = gemma_sched(700, 512);
        s.add(1, prompt(100, 0), Priority::Normal, 10, t0);
        step(&mut s, t0);
        // 100 positions: 7 blocks in both groups, 1 + 5 pages each.
        assert_eq!(s.pool().num_in_use(), 7 * 6);
        // A pool too small for even one chunk's window never admits.
        let mut tiny = gemma_sched(40, 512);
        tiny.add(1, prompt(100, 0), Priority::Normal, 10, t0);
        assert!(tiny.schedule(t0).chunks.is_empty());
        assert_eq!(tiny.num_waiting(), 1);
    }

    #[test]
    fn gemma_prefix_reuse_resumes_both_groups() {
        let t0 = Instant::now();
        let mut s = gemma_sched(2000, 512);
        s.add(1, prompt(2000, 0), Priority::Normal, 4, t0);
        run_to(&mut s, 1, 2001, t0);
        s.remove(1);
        let mut p = prompt(1800, 0);
        p.extend([9000, 9001]);
        s.add(2, p, Priority::Normal, 4, t0);
        let out = step(&mut s, t0);
        assert_eq!(out.started, vec![(2, 1792)]);
        let v = s.view(2).unwrap();
        // The sliding group holds only the window before position 1792.
        let first_live = (1792 + 1 - 512) / 16;
        assert_eq!(v.tables[1].num_live_pages(), (113 - first_live) * 5);
        assert_eq!(v.tables[0].num_live_pages(), 113);
    }
}
