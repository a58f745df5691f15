//! EAGLE-3 proposals: a draft head reads the target's hidden states.
//!
//! After every target step the engine hands over the hidden states of the
//! positions whose next token is now known ([`Proposer::observe`]); the
//! head runs them at once (position `i` reads the target's row of `i` and
//! the embedding of token `i + 1`), so its KV cache follows the verified
//! tokens and its output after the last one is the first proposal. A
//! proposal step then drafts the rest one position at a time, each reading
//! the head's own output row of the position before. Positions the head
//! drafted past the verified ones are written again by the next
//! observation, so refused proposals need no rollback.
//!
//! A sequence whose prompt began in the prefix cache has no hidden states
//! for that prefix: the head starts at the first position it sees (its
//! positions counted from there; rotary attention depends only on
//! distances), with less context to draft from. A gap in what it sees
//! (a step that captured nothing) starts it over the same way.

use std::collections::HashMap;
use std::time::Instant;

use ingot_core::TokenId;
use ingot_kv_cache::{BlockPool, BlockTable};
use ingot_runner::{DraftHead, HeadBatch, HeadInput, RunnerError, SequenceChunk};

use super::{reserve_evicting, Draft, HeldPages, Observed, ProposeRequest, Proposer};
use crate::handle::RequestId;

/// Weight of the newest measure in the seconds-per-token average.
const COST_SMOOTHING: f64 = 0.2;

/// Proposes with an EAGLE-3 head.
pub struct EagleProposer {
    head: Box<dyn DraftHead>,
    pool: BlockPool,
    seqs: HashMap<RequestId, HeadSeq>,
    /// Recent seconds a drafted position cost.
    seconds_per_token: f64,
    /// Calls so far: the least recently used sequence goes first when the
    /// head's pool is full.
    clock: u64,
}

/// One sequence in the head's cache.
struct HeadSeq {
    /// The target position the head counts as its 0.
    base: usize,
    /// Target positions `base..next` are in the head's cache, from the
    /// target's hidden states.
    next: usize,
    /// The head's output row of position `next - 1` (its first draft).
    pending: Option<Vec<f32>>,
    tables: Vec<BlockTable>,
    last_used: u64,
}

impl HeldPages for HeadSeq {
    fn tables(&mut self) -> &mut Vec<BlockTable> {
        &mut self.tables
    }
    fn last_used(&self) -> u64 {
        self.last_used
    }
}

impl EagleProposer {
    /// Proposes with `head` (its KV pool empty).
    pub fn new(head: Box<dyn DraftHead>) -> Self {
        let shape = head.kv_cache_shape();
        let pool =
            BlockPool::with_layout(shape.num_blocks, shape.block_size, head.kv_layout(), false);
        Self {
            head,
            pool,
            seqs: HashMap::new(),
            seconds_per_token: 0.0,
            clock: 0,
        }
    }

    /// Holds pages for `id`'s positions below `end` (the head's own
    /// count), evicting the least recently used other sequences when the
    /// pool is full. False when it cannot.
    fn hold(&mut self, id: RequestId, end: usize) -> bool {
        let Some(start) = self.seqs.get(&id).map(|s| s.next - s.base) else {
            return false;
        };
        reserve_evicting(&mut self.pool, &mut self.seqs, id, (start, end), self.clock)
    }

    fn forget(&mut self, id: RequestId) {
        if let Some(mut seq) = self.seqs.remove(&id) {
            self.pool.release_groups(&mut seq.tables);
        }
    }

    /// Readies `id` for rows of target positions `start..end`: the
    /// position the head continues from, or `None` when it has them all.
    fn resume_at(&mut self, id: RequestId, start: usize, end: usize) -> Option<usize> {
        if let Some(seq) = self.seqs.get(&id) {
            if start > seq.next || start < seq.base {
                // A gap (or an earlier start than it has): begin again here.
                self.forget(id);
            }
        }
        let fresh = || HeadSeq {
            base: start,
            next: start,
            pending: None,
            tables: self.pool.new_tables(),
            last_used: 0,
        };
        let seq = self.seqs.entry(id).or_insert_with(fresh);
        seq.last_used = self.clock;
        (seq.next < end).then_some(seq.next)
    }

    /// Forgets every sequence (after a failed forward: the cache's state
    /// is unknown).
    fn reset(&mut self) {
        let ids: Vec<RequestId> = self.seqs.keys().copied().collect();
        for id in ids {
            self.forget(id);
        }
    }

    /// No proposals for `n` requests after the head failed; its cache
    /// starts over.
    fn failed(&mut self, e: &RunnerError, n: usize) -> Vec<Draft> {
        tracing::warn!(error = %e, "the EAGLE head failed; no proposals this step");
        self.reset();
        vec![Draft::default(); n]
    }

    /// Drafts past each started proposal (`out[i]` holds its first token,
    /// `rows` the head's output row after the last verified position)
    /// until each has its request's `max`; returns the forwards run.
    fn draft(
        &mut self,
        requests: &[ProposeRequest<'_>],
        out: &mut [Vec<TokenId>],
        mut rows: Vec<(usize, Vec<f32>)>,
    ) -> Result<usize, RunnerError> {
        let h = self.head.hidden_size();
        let mut forwards = 0;
        rows.retain(|(i, _)| out[*i].len() < requests[*i].max);
        while !rows.is_empty() {
            let picks: Vec<TokenId> = rows
                .iter()
                .map(|(i, _)| out[*i][out[*i].len() - 1])
                .collect();
            let mut hidden = Vec::with_capacity(rows.len() * h);
            let mut chunks = Vec::with_capacity(rows.len());
            for ((i, row), pick) in rows.iter().zip(&picks) {
                let r = &requests[*i];
                let seq = &self.seqs[&r.seq];
                // The row of the last pick sits after the verified tokens and
                // the picks before it.
                let pos = r.tokens.len() + out[*i].len() - 2;
                hidden.extend_from_slice(row);
                chunks.push(SequenceChunk::with_tables(
                    std::slice::from_ref(pick),
                    pos - seq.base,
                    &seq.tables,
                ));
            }
            let next_rows = self.head.forward(&HeadBatch {
                chunks,
                input: HeadInput::Own(&hidden),
            })?;
            let drafted = self.head.pick(&next_rows)?;
            forwards += 1;
            for (k, (i, row)) in rows.iter_mut().enumerate() {
                out[*i].push(drafted[k]);
                row.copy_from_slice(&next_rows[k * h..(k + 1) * h]);
            }
            rows.retain(|(i, _)| out[*i].len() < requests[*i].max);
        }
        Ok(forwards)
    }
}

impl Proposer for EagleProposer {
    fn propose(&mut self, requests: &[ProposeRequest<'_>]) -> Vec<Draft> {
        let started = Instant::now();
        self.clock += 1;
        let mut out = vec![Vec::new(); requests.len()];
        let mut rows = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            let Some(last) = r.tokens.len().checked_sub(1).filter(|_| r.max > 0) else {
                continue;
            };
            let Some(seq) = self.seqs.get_mut(&r.seq) else {
                continue;
            };
            // The head must have run every verified position but the last
            // token's (whose hidden state the next target step makes).
            let Some(row) = seq.pending.clone().filter(|_| seq.next == last) else {
                continue;
            };
            seq.last_used = self.clock;
            let end = last + r.max - 1 - seq.base;
            if r.max == 1 || self.hold(r.seq, end) {
                rows.push((i, row));
            }
        }
        if rows.is_empty() {
            return vec![Draft::default(); requests.len()];
        }
        let first = rows
            .iter()
            .flat_map(|(_, row)| row.iter().copied())
            .collect::<Vec<_>>();
        let drafted = match self.head.pick(&first) {
            Ok(d) => d,
            Err(e) => return self.failed(&e, requests.len()),
        };
        for ((i, _), token) in rows.iter().zip(drafted) {
            out[*i].push(token);
        }
        match self.draft(requests, &mut out, rows) {
            Ok(forwards) if forwards > 0 => {
                let per_token = started.elapsed().as_secs_f64() / forwards as f64;
                self.seconds_per_token += COST_SMOOTHING * (per_token - self.seconds_per_token);
            }
            Ok(_) => {}
            Err(e) => return self.failed(&e, requests.len()),
        }
        out.into_iter()
            .map(|tokens| Draft { tokens, matched: 0 })
            .collect()
    }

    fn hidden_layers(&self) -> Vec<usize> {
        self.head.config().aux_layers.clone()
    }

    fn observe(&mut self, rows: &[Observed<'_>], hidden: &[f32]) {
        let fw = self.head.feature_width();
        self.clock += 1;
        // (sequence, first target position to run, its next tokens, first row)
        let mut work = Vec::with_capacity(rows.len());
        for r in rows {
            let end = r.start + r.next.len();
            if hidden.len() < (r.first_row + r.next.len()) * fw {
                continue;
            }
            let Some(from) = self.resume_at(r.seq, r.start, end) else {
                continue;
            };
            let base = self.seqs[&r.seq].base;
            if !self.hold(r.seq, end - base) {
                self.forget(r.seq);
                continue;
            }
            let skip = from - r.start;
            work.push((r.seq, from, &r.next[skip..], r.first_row + skip));
        }
        if work.is_empty() {
            return;
        }
        let mut features = Vec::with_capacity(work.iter().map(|w| w.2.len()).sum::<usize>() * fw);
        for &(_, _, next, first) in &work {
            features.extend_from_slice(&hidden[first * fw..(first + next.len()) * fw]);
        }
        let chunks = work
            .iter()
            .map(|&(id, from, next, _)| {
                let seq = &self.seqs[&id];
                SequenceChunk::with_tables(next, from - seq.base, &seq.tables)
            })
            .collect();
        let last_rows = self.head.forward(&HeadBatch {
            chunks,
            input: HeadInput::Target(&features),
        });
        let last_rows = match last_rows {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "the EAGLE head failed; its cache starts over");
                return self.reset();
            }
        };
        let h = self.head.hidden_size();
        for (k, &(id, from, next, _)) in work.iter().enumerate() {
            if let Some(seq) = self.seqs.get_mut(&id) {
                seq.next = from + next.len();
                seq.pending = Some(last_rows[k * h..(k + 1) * h].to_vec());
            }
        }
    }

    fn retain(&mut self, live: &dyn Fn(RequestId) -> bool) {
        let ended: Vec<RequestId> = self.seqs.keys().copied().filter(|&id| !live(id)).collect();
        for id in ended {
            self.forget(id);
        }
    }

    fn seconds_per_token(&self) -> f64 {
        self.seconds_per_token
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use ingot_models::eagle::{head_like, EagleHeadConfig};
    use ingot_models::{LlamaShape, ModelConfig};
    use ingot_runner::KvCacheShape;

    use super::*;

    /// What a head call saw: own rows or the target's, the first position,
    /// the tokens and the first value of each row's input.
    type Call = (bool, usize, Vec<TokenId>, Vec<f32>);

    /// Drafts the token after each chunk's last one; its output row holds
    /// that row's position.
    struct FakeHead {
        config: EagleHeadConfig,
        calls: Arc<Mutex<Vec<Call>>>,
    }

    impl DraftHead for FakeHead {
        fn config(&self) -> &EagleHeadConfig {
            &self.config
        }
        fn kv_cache_shape(&self) -> KvCacheShape {
            KvCacheShape {
                num_blocks: 8,
                block_size: 4,
            }
        }
        fn forward(&mut self, batch: &HeadBatch<'_>) -> Result<Vec<f32>, RunnerError> {
            let (own, rows, width) = match batch.input {
                HeadInput::Own(r) => (true, r, self.hidden_size()),
                HeadInput::Target(r) => (false, r, self.feature_width()),
            };
            let mut firsts = rows.chunks_exact(width).map(|r| r[0]);
            let mut out = Vec::new();
            for c in &batch.chunks {
                let seen = firsts.by_ref().take(c.tokens.len()).collect();
                let call = (own, c.start_pos, c.tokens.to_vec(), seen);
                self.calls.lock().unwrap().push(call);
                // The row holds its position (read back as the next row's
                // input) and its token (drafted from by `pick`).
                let mut row = vec![0.0; self.hidden_size()];
                row[0] = (c.end_pos() - 1) as f32;
                row[1] = c.tokens[c.tokens.len() - 1] as f32;
                out.extend(row);
            }
            Ok(out)
        }
        fn pick(&mut self, rows: &[f32]) -> Result<Vec<TokenId>, RunnerError> {
            let h = self.hidden_size();
            Ok(rows.chunks_exact(h).map(|r| r[1] as TokenId + 1).collect())
        }
    }

    fn target() -> ModelConfig {
        ModelConfig::llama(LlamaShape {
            hidden: 4,
            intermediate: 8,
            layers: 6,
            heads: 2,
            kv_heads: 1,
            head_dim: 2,
            vocab: 100,
        })
    }

    /// Target rows `start..start + n` whose first value is their position.
    fn rows(start: usize, n: usize, width: usize) -> Vec<f32> {
        (start..start + n)
            .flat_map(|p| std::iter::repeat_n(p as f32, width))
            .collect()
    }

    fn proposer() -> (EagleProposer, Arc<Mutex<Vec<Call>>>, usize) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let head = FakeHead {
            config: head_like(&target()),
            calls: calls.clone(),
        };
        let fw = head.feature_width();
        (EagleProposer::new(Box::new(head)), calls, fw)
    }

    fn take(calls: &Mutex<Vec<Call>>) -> Vec<Call> {
        std::mem::take(&mut *calls.lock().unwrap())
    }

    /// The head runs each verified row once, from the target's hidden
    /// state and the token after it; drafts continue from its own rows;
    /// rows after a refused proposal are run again from the target's.
    #[test]
    fn the_head_follows_the_verified_tokens_and_drafts_from_its_own_rows() {
        let (mut p, calls, fw) = proposer();
        assert_eq!(p.hidden_layers(), vec![2, 3, 3]);
        let observed = |seq, start, next: &'static [TokenId]| Observed {
            seq,
            start,
            next,
            first_row: 0,
        };
        // The prompt 10 11 12 13 and the first token, 14.
        p.observe(&[observed(1, 0, &[11, 12, 13, 14])], &rows(0, 4, fw));
        assert_eq!(
            take(&calls),
            vec![(false, 0, vec![11, 12, 13, 14], vec![0.0, 1.0, 2.0, 3.0])]
        );
        let tokens = [10, 11, 12, 13, 14];
        let request = |tokens, max| ProposeRequest {
            seq: 1,
            tokens,
            max,
        };
        let drafts = p.propose(&[request(&tokens[..], 3)]);
        assert_eq!(drafts[0].tokens, vec![15, 16, 17]);
        // Position 4 reads the head's row of position 3, then 5 of 4.
        assert_eq!(
            take(&calls),
            vec![
                (true, 4, vec![15], vec![3.0]),
                (true, 5, vec![16], vec![4.0])
            ]
        );
        // The step kept 15 and took 20: positions 4 and 5 from the target.
        p.observe(&[observed(1, 4, &[15, 20])], &rows(4, 2, fw));
        assert_eq!(take(&calls), vec![(false, 4, vec![15, 20], vec![4.0, 5.0])]);
        let tokens = [10, 11, 12, 13, 14, 15, 20];
        assert_eq!(
            p.propose(&[request(&tokens[..], 2)])[0].tokens,
            vec![21, 22]
        );
        take(&calls);
        // A sequence the head is behind on proposes nothing.
        let longer = [10, 11, 12, 13, 14, 15, 20, 21, 22];
        assert!(p.propose(&[request(&longer[..], 2)])[0].tokens.is_empty());
        // A gap starts the sequence over from where the rows begin (a
        // prompt from the prefix cache too): the head counts from there.
        p.observe(&[observed(1, 10, &[30, 31])], &rows(10, 2, fw));
        p.observe(&[observed(2, 8, &[40])], &rows(8, 1, fw));
        assert_eq!(
            take(&calls),
            vec![
                (false, 0, vec![30, 31], vec![10.0, 11.0]),
                (false, 0, vec![40], vec![8.0])
            ]
        );
        p.retain(&|id| id == 2);
        assert_eq!(p.seqs.len(), 1);
    }
}
