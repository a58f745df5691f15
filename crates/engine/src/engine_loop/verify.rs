//! Speculative steps: proposals before the schedule, then a step whose
//! decode chunks end in them, verified row by row on the host.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ingot_core::TokenId;
use ingot_runner::{scoring, ForwardBatch, Logprobs, ScoredChunk, SequenceChunk};
use ingot_scheduler::ScheduledChunk;

use super::step::{build_batch, RowOutcome};
use super::{Active, EngineLoop};
use crate::cpu_share::CpuArbiter;
use crate::handle::RequestId;
use crate::speculative::{verify_ids, verify_rows, Observed, ProposeRequest, Verified};

/// What a speculative step's rows gave, taken from the logits before they
/// are released.
struct VerifiedStep {
    /// Per sampled chunk with a request: its verification and proposals.
    rows: Vec<(RequestId, Verified, usize)>,
    /// Prompt logprobs of the step's scored prompt chunks.
    scores: Vec<Vec<Logprobs>>,
    /// Requests that generate nothing (max_tokens 0).
    empty: Vec<RequestId>,
}

impl EngineLoop {
    /// Proposes what follows each decoding sequence that may speculate,
    /// as many tokens as the batch allows and its output has left.
    pub(super) fn propose_drafts(&mut self) {
        let Some(spec) = self.speculation.as_mut() else {
            return;
        };
        let running = self.scheduler.num_running();
        // Proposals that run as decode rows take the runner's rows, sized
        // for `max_num_seqs` sequences; a waiting request the step admits
        // takes one too (its prompt's last row), so the room leaves them theirs.
        let mut room = if self.runner.verifies_as_decode_rows() {
            let seqs = running + self.scheduler.num_waiting();
            self.config.scheduler.max_num_seqs.saturating_sub(seqs)
        } else {
            usize::MAX
        };
        let active = &self.active;
        spec.proposer.retain(&|id| active.contains_key(&id));
        // How many each sequence may propose (the room taken as if every
        // proposal were whole), then one call for all of them.
        let mut wanted = Vec::new();
        for (&id, a) in self.active.iter_mut() {
            a.proposing = false;
            if !a.speculative || a.done || a.first_token.is_none() || room == 0 {
                continue;
            }
            // The step yields up to one token more than it proposes.
            let k = spec
                .tokens_for(&mut a.acceptance, running)
                .min(a.decoding.tokens_left().saturating_sub(1))
                .min(room);
            if k > 0 {
                wanted.push((id, k));
                room -= k;
            }
        }
        if spec.launched_ahead {
            // The runner has this step in flight as plain decode rows: no
            // proposals (each sequence's quiet steps counted above, so
            // its probes still come).
            return;
        }
        let requests: Vec<ProposeRequest<'_>> = wanted
            .iter()
            .filter_map(|&(seq, max)| {
                let view = self.scheduler.view(seq)?;
                Some(ProposeRequest {
                    seq,
                    tokens: view.tokens,
                    max,
                })
            })
            .collect();
        if requests.is_empty() {
            return;
        }
        let started = Instant::now();
        let drafts = spec.proposer.propose(&requests);
        tracing::debug!(
            seqs = requests.len(),
            tokens = drafts.iter().map(|d| d.tokens.len()).sum::<usize>(),
            propose_ms = started.elapsed().as_secs_f64() * 1e3,
            "proposals"
        );
        let seqs: Vec<RequestId> = requests.iter().map(|r| r.seq).collect();
        drop(requests);
        for (id, draft) in seqs.into_iter().zip(drafts) {
            // Each guess cut to what pays, by how often guesses backed alike were kept.
            let keep = spec.keep_of(&draft, running);
            if let Some(a) = self.active.get_mut(&id) {
                a.proposing = keep > 0;
                a.draft_matched = draft.matched;
            }
            if keep > 0 {
                self.scheduler.set_draft(id, &draft.tokens[..keep]);
            }
        }
    }

    /// Feeds the step-cost fit with a decode step (every chunk a
    /// sequence's last token, with or without proposals).
    pub(super) fn note_step_cost(&mut self, chunks: &[ScheduledChunk], forward: Duration) {
        let Some(spec) = self.speculation.as_mut() else {
            return;
        };
        if chunks.iter().all(|c| c.sample && c.len == 1 + c.draft) {
            let tokens = chunks.iter().map(|c| c.len).sum();
            spec.cost.record(tokens, forward.as_secs_f64());
        }
    }

    /// Whether the step being built keeps its hidden rows for the
    /// proposer: one reads them, and no more sequences run or wait than
    /// speculate (a head starts a sequence over where it next sees it, so
    /// the steps of a large batch cost it nothing; counting the waiting
    /// ones keeps a burst's first prompt chunks, admitted while the rest
    /// queue, from being observed for proposals that never come).
    /// Recorded for [`Self::observe_hidden`].
    pub(super) fn observes_hidden(&mut self) -> bool {
        let sequences = self.scheduler.num_running() + self.scheduler.num_waiting();
        let Some(spec) = self.speculation.as_mut() else {
            return false;
        };
        spec.observing =
            !spec.hidden_layers.is_empty() && sequences <= spec.config.disable_by_batch_size;
        spec.observing
    }

    /// After a step (its tokens taken): hands a proposer that reads
    /// hidden states the rows whose next token is now known, of the
    /// sequences that may speculate, when the step kept them
    /// ([`Self::observes_hidden`]).
    pub(super) fn observe_hidden(&mut self, chunks: &[ScheduledChunk]) {
        let Some(spec) = self.speculation.as_mut() else {
            return;
        };
        if !spec.observing {
            return;
        }
        let mut rows = Vec::with_capacity(chunks.len());
        let mut first_row = 0;
        for c in chunks {
            let first = first_row;
            first_row += c.len;
            // Only sequences that may speculate (not opted out, not seeded).
            if !self.active.get(&c.id).is_some_and(|a| a.speculative) {
                continue;
            }
            let Some(v) = self.scheduler.view(c.id) else {
                continue;
            };
            // Rows past the last taken token's position were refused
            // proposals; the last token's own row waits for its successor.
            let end = (c.start + c.len).min(v.tokens.len().saturating_sub(1));
            if end > c.start {
                rows.push(Observed {
                    seq: c.id,
                    start: c.start,
                    next: &v.tokens[c.start + 1..end + 1],
                    first_row: first,
                });
            }
        }
        let started = Instant::now();
        spec.proposer.observe(&rows, self.runner.captured_hidden());
        tracing::debug!(
            seqs = rows.len(),
            observe_ms = started.elapsed().as_secs_f64() * 1e3,
            "hidden states observed"
        );
    }

    /// A step in which some decode chunks end in proposals: one forward
    /// pass with a logits row for every position of those chunks (see
    /// [`lay_out`]), then each sampled chunk's tokens taken in order (the
    /// proposals given), kept proposals handed to the scheduler, and the
    /// tokens sent. Where the rows are decode rows and every sampled row is
    /// plain greedy the backend picks each row's argmax on its device;
    /// otherwise rows are picked on the host from the downloaded logits.
    pub(super) fn step_verify(&mut self, chunks: &[ScheduledChunk]) {
        let started = Instant::now();
        if !self.move_pages(chunks) {
            return;
        }
        let keep_hidden = self.observes_hidden();
        let (batch, scored) = build_batch(&self.scheduler, &self.active, chunks);
        let as_rows = self.runner.verifies_as_decode_rows();
        let (mut batch, layout) = lay_out(batch, chunks, as_rows);
        batch.keep_hidden = keep_hidden;
        let num_tokens = batch.num_tokens();
        let greedy = as_rows && batch.score.is_empty() && self.all_plain_greedy(chunks);
        let close = self.config.close_structured_near_limit;
        let vocab = self.runner.config().vocab_size;
        let turn = self.cpu.as_deref().map(CpuArbiter::decode_step);
        let forward_started = Instant::now();
        let result = if greedy {
            self.runner
                .forward_greedy(&batch)
                .map(|ids| verify_greedy(&mut self.active, chunks, &ids, &layout))
        } else {
            self.runner.forward(&batch).map(|logits| {
                let step = StepRows {
                    logits,
                    vocab,
                    batch: &batch,
                    layout: &layout,
                    prompt_scored: scored.len(),
                };
                step.verify(&mut self.active, chunks, close)
            })
        };
        let forward = forward_started.elapsed();
        drop(turn);
        drop(batch);
        let step = match result {
            Ok(s) => s,
            Err(e) => return self.fail_step(chunks, &e),
        };
        self.publish_pages();
        let prompts = self.record_prompt_scores(scored, step.scores);
        let mut outputs: Vec<(RequestId, RowOutcome)> = Vec::new();
        for (id, verified, proposed) in step.rows {
            self.scheduler.accept_draft(id, verified.kept);
            if let Some(a) = self.active.get_mut(&id) {
                a.acceptance.record(proposed, verified.kept);
                if let Some(spec) = self.speculation.as_mut() {
                    spec.record_match(a.draft_matched, proposed, verified.kept);
                }
            }
            self.metrics.speculation(proposed, verified.kept);
            let s = &self.stats;
            s.spec_proposed
                .fetch_add(proposed as u64, Ordering::Relaxed);
            s.spec_kept
                .fetch_add(verified.kept as u64, Ordering::Relaxed);
            outputs.extend(verified.outputs.into_iter().map(|o| (id, o)));
        }
        tracing::debug!(
            tokens = num_tokens,
            seqs = chunks.len(),
            greedy,
            forward_ms = forward.as_secs_f64() * 1e3,
            step_ms = started.elapsed().as_secs_f64() * 1e3,
            "speculative step"
        );
        self.account_step(chunks, num_tokens, forward, started);
        self.deliver_step(prompts, step.empty, outputs);
        self.observe_hidden(chunks);
    }
}

/// Where a speculative step's logits rows are, per scheduled chunk.
struct StepLayout {
    /// The rows of chunk `i`'s positions, in order (one for a chunk
    /// without proposals: its last token's).
    rows: Vec<Vec<usize>>,
    /// Chunk `i`'s proposals.
    drafts: Vec<Vec<TokenId>>,
}

/// Lays out a speculative step. `as_rows`: each chunk that ends in
/// proposals runs as one single-token row per position (its last token,
/// then each proposal), every row reading the sequence's block tables: a
/// decode batch, which a backend runs as any decode step (CUDA graphs
/// included; each row's KV is written before any row attends, so a row
/// sees the positions before it). Otherwise the chunk stays whole and a
/// `score` entry after the prompt ones asks for its other positions' rows.
fn lay_out<'a>(
    batch: ForwardBatch<'a>,
    chunks: &[ScheduledChunk],
    as_rows: bool,
) -> (ForwardBatch<'a>, StepLayout) {
    let drafts: Vec<Vec<TokenId>> = batch
        .chunks
        .iter()
        .zip(chunks)
        .map(|(chunk, c)| chunk.tokens[chunk.tokens.len() - c.draft..].to_vec())
        .collect();
    if !as_rows {
        return whole_chunks(batch, chunks, drafts);
    }
    let mut flat = ForwardBatch {
        chunks: Vec::with_capacity(batch.num_tokens()),
        ..ForwardBatch::default()
    };
    let mut rows = Vec::with_capacity(chunks.len());
    for (chunk, c) in batch.chunks.iter().zip(chunks) {
        let first = flat.chunks.len();
        if c.draft == 0 {
            flat.chunks.push(*chunk);
        } else {
            flat.chunks
                .extend((0..chunk.tokens.len()).map(|j| SequenceChunk {
                    tokens: &chunk.tokens[j..j + 1],
                    start_pos: chunk.start_pos + j,
                    ..*chunk
                }));
        }
        rows.push((first..flat.chunks.len()).collect::<Vec<_>>());
    }
    flat.score = batch
        .score
        .into_iter()
        .map(|s| ScoredChunk {
            chunk: rows[s.chunk][0],
            ..s
        })
        .collect();
    (flat, StepLayout { rows, drafts })
}

/// [`lay_out`] with whole chunks: the rows of a chunk's proposal positions
/// follow the chunks' last-token rows and the prompt entries' rows.
fn whole_chunks<'a>(
    mut batch: ForwardBatch<'a>,
    chunks: &[ScheduledChunk],
    drafts: Vec<Vec<TokenId>>,
) -> (ForwardBatch<'a>, StepLayout) {
    let mut at = batch.chunks.len() + batch.score.iter().map(|s| s.next.len()).sum::<usize>();
    let mut rows = Vec::with_capacity(chunks.len());
    for (i, c) in chunks.iter().enumerate() {
        let mut r: Vec<usize> = (at..at + c.draft).collect();
        r.push(i);
        rows.push(r);
        if c.draft > 0 {
            let tokens = batch.chunks[i].tokens;
            batch.score.push(ScoredChunk {
                chunk: i,
                next: &tokens[1..],
                top: 0,
            });
            at += c.draft;
        }
    }
    (batch, StepLayout { rows, drafts })
}

/// A speculative step whose decode rows the backend picked greedily
/// (`ids`, one per row).
fn verify_greedy(
    active: &mut HashMap<RequestId, Active>,
    chunks: &[ScheduledChunk],
    ids: &[TokenId],
    layout: &StepLayout,
) -> VerifiedStep {
    verify_each(active, chunks, Vec::new(), |i, decoding| {
        let picked: Vec<TokenId> = layout.rows[i].iter().map(|&r| ids[r]).collect();
        verify_ids(decoding, &picked, &layout.drafts[i])
    })
}

/// Verifies each sampled chunk `i` of a request with `verify(i, its
/// output)`; requests that generate nothing are listed apart.
fn verify_each(
    active: &mut HashMap<RequestId, Active>,
    chunks: &[ScheduledChunk],
    scores: Vec<Vec<Logprobs>>,
    mut verify: impl FnMut(usize, &mut crate::decoding::Decoding) -> Verified,
) -> VerifiedStep {
    let mut step = VerifiedStep {
        rows: Vec::new(),
        scores,
        empty: Vec::new(),
    };
    for (i, c) in chunks.iter().enumerate() {
        let Some(a) = active.get_mut(&c.id).filter(|_| c.sample) else {
            continue;
        };
        if a.decoding.generates_nothing() {
            step.empty.push(c.id);
            continue;
        }
        let verified = verify(i, &mut a.decoding);
        step.rows.push((c.id, verified, c.draft));
    }
    step
}

/// The logits of a speculative step: each chunk's last-token row, then
/// one row per position of each `score` entry (the prompt ones first).
struct StepRows<'a, 'b> {
    logits: &'a [f32],
    vocab: usize,
    batch: &'a ForwardBatch<'b>,
    layout: &'a StepLayout,
    /// The first `score` entries, which are prompt logprobs.
    prompt_scored: usize,
}

impl StepRows<'_, '_> {
    fn row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.vocab..(i + 1) * self.vocab]
    }

    /// Verifies every sampled chunk and scores the prompt chunks.
    fn verify(
        &self,
        active: &mut HashMap<RequestId, Active>,
        chunks: &[ScheduledChunk],
        close: bool,
    ) -> VerifiedStep {
        let n = self.batch.chunks.len();
        let prompt = &self.batch.score[..self.prompt_scored];
        let scored: usize = prompt.iter().map(|s| s.next.len()).sum();
        let scores = scoring::score_rows(
            &self.logits[n * self.vocab..(n + scored) * self.vocab],
            self.vocab,
            prompt,
        );
        let mut order = Vec::new();
        verify_each(active, chunks, scores, |i, decoding| {
            let rows: Vec<&[f32]> = self.layout.rows[i].iter().map(|&r| self.row(r)).collect();
            verify_rows(decoding, &rows, &self.layout.drafts[i], close, &mut order)
        })
    }
}
