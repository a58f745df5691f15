//! Speculative steps: proposals before the schedule, then a step whose
//! decode chunks end in them, verified row by row on the host.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ingot_runner::{scoring, ForwardBatch, Logprobs, ScoredChunk};
use ingot_scheduler::ScheduledChunk;

use super::step::{build_batch, RowOutcome};
use super::{Active, EngineLoop};
use crate::cpu_share::CpuArbiter;
use crate::handle::RequestId;
use crate::speculative::{verify_rows, Verified};

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
        for (&id, a) in self.active.iter_mut() {
            if !a.speculative || a.done || a.first_token.is_none() {
                continue;
            }
            // The step yields up to one token more than it proposes.
            let k = spec
                .tokens_for(&mut a.acceptance, running)
                .min(a.decoding.tokens_left().saturating_sub(1));
            let Some(view) = self.scheduler.view(id).filter(|_| k > 0) else {
                continue;
            };
            let draft = spec.proposer.propose(view.tokens, k);
            if !draft.is_empty() {
                self.scheduler.set_draft(id, &draft);
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

    /// A step in which some decode chunks end in proposals: one forward
    /// pass with rows for every proposal's position, then each sampled
    /// chunk's tokens picked in order on the host (the proposal given),
    /// kept proposals handed to the scheduler, and the tokens sent.
    pub(super) fn step_verify(&mut self, chunks: &[ScheduledChunk]) {
        let started = Instant::now();
        if !self.move_pages(chunks) {
            return;
        }
        let (batch, scored) = build_batch(&self.scheduler, &self.active, chunks);
        let num_tokens = batch.num_tokens();
        let close = self.config.close_structured_near_limit;
        let vocab = self.runner.config().vocab_size;
        let turn = self.cpu.as_deref().map(CpuArbiter::decode_step);
        let forward_started = Instant::now();
        let result = self.runner.forward(&batch).map(|logits| {
            let rows = StepRows {
                logits,
                vocab,
                batch: &batch,
                prompt_scored: scored.len(),
            };
            rows.verify(&mut self.active, chunks, close)
        });
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
            }
            self.metrics.speculation(proposed, verified.kept);
            let s = &self.stats;
            s.spec_proposed
                .fetch_add(proposed as u64, Ordering::Relaxed);
            s.spec_kept
                .fetch_add(verified.kept as u64, Ordering::Relaxed);
            outputs.extend(verified.outputs.into_iter().map(|o| (id, o)));
        }
        self.count_prefill(chunks, forward);
        self.note_step_cost(chunks, forward);
        tracing::debug!(
            tokens = num_tokens,
            seqs = chunks.len(),
            forward_ms = forward.as_secs_f64() * 1e3,
            step_ms = started.elapsed().as_secs_f64() * 1e3,
            "speculative step"
        );
        self.metrics.iteration(num_tokens, started.elapsed());
        self.deliver_step(prompts, step.empty, outputs);
    }
}

/// The logits of a speculative step: each chunk's last row, then one row
/// per position of each `score` entry (prompt entries first, then one per
/// chunk with proposals).
struct StepRows<'a, 'b> {
    logits: &'a [f32],
    vocab: usize,
    batch: &'a ForwardBatch<'b>,
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
        let (prompt, verify) = self.batch.score.split_at(self.prompt_scored);
        let prompt_rows: usize = prompt.iter().map(|s| s.next.len()).sum();
        let scores = scoring::score_rows(
            &self.logits[n * self.vocab..(n + prompt_rows) * self.vocab],
            self.vocab,
            prompt,
        );
        // Where each chunk's proposal rows start.
        let mut first_rows: HashMap<usize, usize> = HashMap::new();
        let mut at = n + prompt_rows;
        for ScoredChunk { chunk, next, .. } in verify {
            first_rows.insert(*chunk, at);
            at += next.len();
        }
        let mut step = VerifiedStep {
            rows: Vec::new(),
            scores,
            empty: Vec::new(),
        };
        let mut order = Vec::new();
        for (i, c) in chunks.iter().enumerate().filter(|(_, c)| c.sample) {
            let Some(a) = active.get_mut(&c.id) else {
                continue;
            };
            if a.decoding.generates_nothing() {
                step.empty.push(c.id);
                continue;
            }
            let tokens = self.batch.chunks[i].tokens;
            let draft = &tokens[tokens.len() - c.draft..];
            let mut rows: Vec<&[f32]> = match first_rows.get(&i) {
                Some(&first) => (first..first + c.draft).map(|r| self.row(r)).collect(),
                None => Vec::new(),
            };
            rows.push(self.row(i));
            let verified = verify_rows(&mut a.decoding, &rows, draft, close, &mut order);
            step.rows.push((c.id, verified, c.draft));
        }
        step
    }
}
