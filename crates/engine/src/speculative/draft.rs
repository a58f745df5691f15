//! Draft-model proposals: a smaller model of the target's tokenizer runs
//! greedily ahead of each speculating sequence, in its own KV cache, and
//! its picks are the proposals. Per sequence the draft keeps the tokens its
//! cache holds; a step first runs what the target's sequence gained since
//! (the whole prompt the first time, later the kept proposals and the
//! target's own token: refused proposals are dropped by rewinding to the
//! common prefix, their slots written over), then one token at a time, all
//! speculating sequences in one batch per position.

use std::collections::HashMap;
use std::time::Instant;

use ingot_core::TokenId;
use ingot_kv_cache::{BlockPool, BlockTable};
use ingot_runner::{ForwardBatch, ModelRunner, RunnerError, SequenceChunk};

use super::{reserve_evicting, Draft, HeldPages, ProposeRequest, Proposer, SpeculationError};
use crate::handle::RequestId;

/// Most prompt tokens of one sequence a catch-up forward takes.
const CATCH_UP_CHUNK: usize = 512;
/// Weight of the newest measure in the seconds-per-token average.
const COST_SMOOTHING: f64 = 0.2;

/// Proposes what a draft model picks greedily after each sequence.
pub struct DraftModelProposer {
    runner: Box<dyn ModelRunner>,
    pool: BlockPool,
    seqs: HashMap<RequestId, DraftSeq>,
    limits: DraftLimits,
    /// The target's vocabulary: a pick past it is no proposal.
    target_vocab: usize,
    /// Recent seconds a proposed position cost (see [`Proposer::seconds_per_token`]).
    seconds_per_token: f64,
    /// Calls so far: the least recently used sequence's state goes first
    /// when the draft's cache is full.
    clock: u64,
}

/// How much one draft forward may take (the draft runner's buffers).
#[derive(Debug, Clone, Copy)]
pub struct DraftLimits {
    /// Sequences (rows) in one forward.
    pub max_rows: usize,
    /// Tokens in one forward.
    pub max_tokens: usize,
}

/// One sequence's state in the draft's cache.
struct DraftSeq {
    /// Tokens whose KV the draft's cache holds, from position 0.
    cached: Vec<TokenId>,
    tables: Vec<BlockTable>,
    last_used: u64,
}

impl HeldPages for DraftSeq {
    fn tables(&mut self) -> &mut Vec<BlockTable> {
        &mut self.tables
    }
    fn last_used(&self) -> u64 {
        self.last_used
    }
}

impl DraftModelProposer {
    /// Proposes with `runner` (the draft model, its KV pool empty) for a
    /// target of `target_vocab` tokens.
    pub fn new(
        runner: Box<dyn ModelRunner>,
        target_vocab: usize,
        limits: DraftLimits,
    ) -> Result<Self, SpeculationError> {
        let draft_vocab = runner.config().vocab_size;
        // Sizes may differ by padding rows (no token maps there); more
        // than that means another tokenizer.
        if draft_vocab.abs_diff(target_vocab) > target_vocab / 100 {
            return Err(SpeculationError::Incompatible(format!(
                "the draft model's vocabulary ({draft_vocab} tokens) is not the target's \
                 ({target_vocab}): a draft model must share the target's tokenizer"
            )));
        }
        let shape = runner.kv_cache_shape();
        let pool = BlockPool::with_layout(
            shape.num_blocks,
            shape.block_size,
            runner.kv_layout(),
            false,
        );
        Ok(Self {
            runner,
            pool,
            seqs: HashMap::new(),
            limits: DraftLimits {
                max_rows: limits.max_rows.max(1),
                max_tokens: limits.max_tokens.max(1),
            },
            target_vocab,
            seconds_per_token: 0.0,
            clock: 0,
        })
    }

    /// Readies `id`'s state for `tokens` and `max` proposals: rewinds it
    /// to what it shares with `tokens` (the last token always runs again:
    /// its logits give the first proposal) and holds pages up to the last
    /// proposal's position, evicting the least recently used other states
    /// when the pool is full. False when the draft cannot take it.
    fn ready(&mut self, id: RequestId, tokens: &[TokenId], max: usize) -> bool {
        let draft = self.runner.config();
        let end = tokens.len() + max - 1;
        if end > draft.max_context {
            return false;
        }
        let seq = self.seqs.entry(id).or_insert_with(|| DraftSeq {
            cached: Vec::new(),
            tables: self.pool.new_tables(),
            last_used: 0,
        });
        seq.last_used = self.clock;
        let common = seq
            .cached
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len() - 1);
        seq.cached.truncate(common);
        if tokens[common..]
            .iter()
            .any(|&t| t as usize >= draft.vocab_size)
        {
            return false;
        }
        reserve_evicting(
            &mut self.pool,
            &mut self.seqs,
            id,
            (common, end),
            self.clock,
        )
    }

    /// Runs what each of `live`'s sequences gained since the draft last
    /// saw it; the pick after a sequence's last token starts its proposal.
    fn catch_up(
        &mut self,
        requests: &[ProposeRequest<'_>],
        live: &[usize],
        out: &mut [Vec<TokenId>],
    ) -> Result<(), RunnerError> {
        loop {
            let mut chunks = Vec::new();
            let mut ran = Vec::new();
            let mut budget = self.limits.max_tokens;
            for &i in live {
                let r = &requests[i];
                let seq = &self.seqs[&r.seq];
                let from = seq.cached.len();
                let n = (r.tokens.len() - from).min(CATCH_UP_CHUNK).min(budget);
                if n == 0 || chunks.len() == self.limits.max_rows {
                    continue;
                }
                chunks.push(SequenceChunk::with_tables(
                    &r.tokens[from..from + n],
                    from,
                    &seq.tables,
                ));
                ran.push((i, from + n));
                budget -= n;
            }
            if chunks.is_empty() {
                return Ok(());
            }
            let ids = greedy(self.runner.as_mut(), chunks)?;
            for ((i, upto), id) in ran.into_iter().zip(ids) {
                let r = &requests[i];
                if let Some(seq) = self.seqs.get_mut(&r.seq) {
                    let from = seq.cached.len();
                    seq.cached.extend_from_slice(&r.tokens[from..upto]);
                }
                if upto == r.tokens.len() {
                    out[i].push(id);
                }
            }
        }
    }

    /// Extends each of `live`'s proposals one pick at a time until each
    /// has its `max`; returns the forwards run.
    fn draft(
        &mut self,
        requests: &[ProposeRequest<'_>],
        live: &[usize],
        out: &mut [Vec<TokenId>],
    ) -> Result<usize, RunnerError> {
        let mut forwards = 0;
        loop {
            // (request, its last pick, that pick's position)
            let rows: Vec<(usize, TokenId, usize)> = live
                .iter()
                .filter_map(|&i| {
                    let (r, o) = (&requests[i], &out[i]);
                    let last = *o.last()?;
                    let open = o.len() < r.max && (last as usize) < self.target_vocab;
                    open.then(|| (i, last, r.tokens.len() + o.len() - 1))
                })
                .take(self.limits.max_rows)
                .collect();
            if rows.is_empty() {
                return Ok(forwards);
            }
            let picks: Vec<TokenId> = rows.iter().map(|r| r.1).collect();
            let chunks = rows
                .iter()
                .zip(&picks)
                .map(|(&(i, _, pos), pick)| {
                    let seq = &self.seqs[&requests[i].seq];
                    SequenceChunk::with_tables(std::slice::from_ref(pick), pos, &seq.tables)
                })
                .collect();
            let ids = greedy(self.runner.as_mut(), chunks)?;
            forwards += 1;
            for ((i, pick, _), id) in rows.into_iter().zip(ids) {
                if let Some(seq) = self.seqs.get_mut(&requests[i].seq) {
                    seq.cached.push(pick);
                }
                out[i].push(id);
            }
        }
    }

    /// Forgets every sequence (after a failed forward: the cache's state
    /// is unknown).
    fn reset(&mut self) {
        for (_, mut seq) in self.seqs.drain() {
            self.pool.release_groups(&mut seq.tables);
        }
    }
}

/// The draft's greedy pick after each chunk.
fn greedy(
    runner: &mut dyn ModelRunner,
    chunks: Vec<SequenceChunk<'_>>,
) -> Result<Vec<TokenId>, RunnerError> {
    runner.forward_greedy(&ForwardBatch {
        chunks,
        ..ForwardBatch::default()
    })
}

impl Proposer for DraftModelProposer {
    fn propose(&mut self, requests: &[ProposeRequest<'_>]) -> Vec<Draft> {
        self.propose_tokens(requests)
            .into_iter()
            .map(|tokens| Draft { tokens, matched: 0 })
            .collect()
    }

    fn retain(&mut self, live: &dyn Fn(RequestId) -> bool) {
        let ended: Vec<RequestId> = self.seqs.keys().copied().filter(|&id| !live(id)).collect();
        for id in ended {
            if let Some(mut seq) = self.seqs.remove(&id) {
                self.pool.release_groups(&mut seq.tables);
            }
        }
    }

    fn seconds_per_token(&self) -> f64 {
        self.seconds_per_token
    }
}

impl DraftModelProposer {
    /// Each request's greedy continuation by the draft model.
    fn propose_tokens(&mut self, requests: &[ProposeRequest<'_>]) -> Vec<Vec<TokenId>> {
        let started = Instant::now();
        self.clock += 1;
        let mut out = vec![Vec::new(); requests.len()];
        let live: Vec<usize> = (0..requests.len())
            .filter(|&i| {
                let r = &requests[i];
                r.max > 0 && !r.tokens.is_empty() && self.ready(r.seq, r.tokens, r.max)
            })
            .collect();
        if live.is_empty() {
            return out;
        }
        let drafted = self
            .catch_up(requests, &live, &mut out)
            .and_then(|()| self.draft(requests, &live, &mut out));
        match drafted {
            Ok(forwards) => {
                let per_token = started.elapsed().as_secs_f64() / (forwards + 1) as f64;
                self.seconds_per_token += COST_SMOOTHING * (per_token - self.seconds_per_token);
            }
            Err(e) => {
                tracing::warn!(error = %e, "the draft model failed; no proposals this step");
                self.reset();
                return vec![Vec::new(); requests.len()];
            }
        }
        // A pick outside the target's vocabulary ends the proposal.
        for o in &mut out {
            if let Some(bad) = o.iter().position(|&t| t as usize >= self.target_vocab) {
                o.truncate(bad);
            }
        }
        out
    }
}
