//! One engine step: build the forward batch of the scheduled chunks, pick
//! how its tokens are chosen (plain argmax or the rows' samplers), run the
//! forward pass, then apply the results (grammar advance, prompt
//! logprobs, accepted tokens or failures) and send them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ingot_core::FinishReason;
use ingot_runner::{
    ForwardBatch, Logprobs, ModelRunner, Pick, RowSampling, RunnerError, ScoredChunk, SequenceChunk,
};
use ingot_scheduler::{ScheduledChunk, Scheduler};
use ingot_structured::Limit;

use super::{Active, Delivery, EngineLoop};
use crate::cpu_share::CpuArbiter;
use crate::decoding::TokenOutput;
use crate::handle::{PromptLogprob, RequestId, TokenEvent};
use crate::masks::PendingMasks;

/// A sampled row's token as its request accepted it, or why the row failed.
pub(super) type RowOutcome = Result<TokenOutput, String>;

impl EngineLoop {
    /// Steady decode: nothing waiting, every row a decode that continues
    /// (none at a length limit), no row likely to propose next step. The
    /// backend may then launch the next step before this one returns.
    fn expects_next(&self, chunks: &[ScheduledChunk]) -> bool {
        let may_speculate = self.speculation.as_ref().is_some_and(|s| {
            chunks.iter().any(|c| {
                self.active.get(&c.id).is_some_and(|a| {
                    let tokens = || self.scheduler.view(c.id).map_or(&[][..], |v| v.tokens);
                    a.speculative
                        && s.holds_back_launch(&a.acceptance, a.proposing, chunks.len(), tokens)
                })
            })
        });
        !may_speculate
            && self.scheduler.num_waiting() == 0
            && chunks.iter().all(|c| {
                c.len == 1
                    && c.sample
                    && self
                        .active
                        .get(&c.id)
                        .is_some_and(|a| !a.decoding.next_hits_limit())
            })
    }

    /// One forward pass over the scheduled chunks, then sampling.
    pub(super) fn step(&mut self, chunks: &[ScheduledChunk]) {
        if chunks.iter().any(|c| c.draft > 0) {
            return self.step_verify(chunks);
        }
        let started = Instant::now();
        let expect_next = self.expects_next(chunks);
        if let Some(s) = self.speculation.as_mut() {
            s.launched_ahead = expect_next && self.runner.launches_ahead();
        }
        if expect_next && self.runner.launches_ahead() {
            // Where a row's next position starts a new block, the step
            // launched ahead needs that block now: with many sequences at
            // mixed positions some row crosses a block at nearly every step.
            for c in chunks {
                self.scheduler.reserve_next_position(c.id);
            }
        }
        if !self.move_pages(chunks) {
            return;
        }
        let keep_hidden = self.observes_hidden();
        let (mut batch, scored) = build_batch(&self.scheduler, &self.active, chunks);
        batch.keep_hidden = keep_hidden;
        let num_tokens = batch.num_tokens();
        let mut masks = self.submit_masks(chunks);
        let greedy = batch.score.is_empty() && self.all_plain_greedy(chunks);
        batch.expect_next = expect_next;
        let turn = self.cpu.as_deref().map(CpuArbiter::decode_step);
        let forward_started = Instant::now();
        let result = forward(
            self.runner.as_mut(),
            &mut self.active,
            (&batch, chunks),
            greedy,
            &mut masks,
        );
        let forward = forward_started.elapsed();
        drop(turn);
        drop(batch);
        let (picked, scores) = match result {
            Ok(r) => r,
            Err(e) => return self.fail_step(chunks, &e),
        };
        self.publish_pages();
        // A row whose grammar failed was sampled without its mask: its
        // pick is void and the request fails.
        let failed = masks.failed().to_vec();
        let advanced = self.advance_grammars(chunks, &picked, &failed);
        let prompts = self.record_prompt_scores(scored, scores);
        let (outputs, empty) = self.accept_picks(chunks, picked, &failed, &advanced);
        tracing::debug!(
            tokens = num_tokens,
            seqs = chunks.len(),
            greedy,
            expect_next,
            step_ms = started.elapsed().as_secs_f64() * 1e3,
            "step"
        );
        self.account_step(chunks, num_tokens, forward, started);
        self.deliver_step(prompts, empty, outputs);
        self.observe_hidden(chunks);
    }

    /// A step's accounting, for plain and speculative steps alike: prefill
    /// time per request, the step-cost fit, the iteration metrics.
    pub(super) fn account_step(
        &mut self,
        chunks: &[ScheduledChunk],
        num_tokens: usize,
        forward: Duration,
        started: Instant,
    ) {
        self.count_prefill(chunks, forward);
        self.note_step_cost(chunks, forward);
        self.metrics.iteration(num_tokens, started.elapsed());
    }

    /// A failed forward pass fails every request in the step.
    pub(super) fn fail_step(&mut self, chunks: &[ScheduledChunk], e: &RunnerError) {
        tracing::error!(error = %e, "forward pass failed");
        // Pages this step was to compute hold nothing to copy out.
        drop(self.scheduler.take_named());
        for c in chunks {
            self.fail(c.id, &e.to_string());
        }
    }

    /// Sends a step's results: completed prompt logprobs, then the end of
    /// requests that generate nothing, then each sampled token (or the
    /// row's failure).
    pub(super) fn deliver_step(
        &mut self,
        prompts: Vec<(RequestId, Vec<PromptLogprob>)>,
        empty: Vec<RequestId>,
        outputs: Vec<(RequestId, RowOutcome)>,
    ) {
        let now = Instant::now();
        for (id, list) in prompts {
            if let Some(a) = self.active.get_mut(&id) {
                let delivery = a.deliver(TokenEvent::Prompt(list));
                self.settle(id, delivery, None, now);
            }
        }
        for id in empty {
            self.settle(id, Delivery::Sent, Some(FinishReason::Length), now);
        }
        for (id, out) in outputs {
            match out {
                Ok(out) => self.emit(id, out, now),
                Err(e) => self.fail(id, &e),
            }
        }
    }

    /// Hands the step's constrained rows to the grammar thread, which
    /// computes their masks while the forward pass runs; the backend waits
    /// for them only to sample.
    fn submit_masks(&self, chunks: &[ScheduledChunk]) -> PendingMasks {
        let close = self.config.close_structured_near_limit;
        let constrained = chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.sample)
            .filter_map(|(i, c)| {
                let d = &self.active.get(&c.id)?.decoding;
                let limit = if close { d.limit() } else { Limit::Far };
                Some((i, d.grammar()?.clone(), limit))
            })
            .collect();
        self.masks.submit(constrained, chunks.len())
    }

    /// Whether every sampled row is greedy without penalties or logprobs:
    /// the step's tokens are then a plain argmax. They are picked on the
    /// backend's device either way (only ids and asked-for logprobs come
    /// back).
    pub(super) fn all_plain_greedy(&self, chunks: &[ScheduledChunk]) -> bool {
        chunks.iter().filter(|c| c.sample).all(|c| {
            self.active
                .get(&c.id)
                .is_none_or(|a| a.decoding.is_plain_greedy())
        })
    }

    /// Hands each scored prompt chunk's logprobs to its request; returns
    /// the requests whose prompt logprobs are now complete, with them.
    pub(super) fn record_prompt_scores(
        &mut self,
        scored: Vec<(RequestId, usize)>,
        scores: Vec<Vec<Logprobs>>,
    ) -> Vec<(RequestId, Vec<PromptLogprob>)> {
        let mut prompts = Vec::new();
        for ((id, start), s) in scored.into_iter().zip(scores) {
            let Some(a) = self.active.get_mut(&id) else {
                continue;
            };
            let view = self.scheduler.view(id);
            if let (Some(p), Some(v)) = (a.prompt_scores.as_mut(), view) {
                p.record(start, s);
                if let Some(list) = p.take_finished(&v.tokens[..a.prompt_tokens]) {
                    prompts.push((id, list));
                }
            }
        }
        prompts
    }

    /// Each sampling row's pick accepted by its request (or why it failed:
    /// its grammar's mask or advance failed, or the pick was refused), and
    /// the requests that generate nothing (max_tokens 0).
    fn accept_picks(
        &mut self,
        chunks: &[ScheduledChunk],
        picked: Vec<Pick>,
        failed: &[(usize, String)],
        advanced: &[(usize, Result<bool, String>)],
    ) -> (Vec<(RequestId, RowOutcome)>, Vec<RequestId>) {
        let mut outputs = Vec::new();
        let mut empty = Vec::new();
        for (i, (c, pick)) in chunks.iter().zip(picked).enumerate() {
            let Some(a) = self.active.get_mut(&c.id) else {
                continue;
            };
            if !c.sample {
                continue;
            }
            if a.decoding.generates_nothing() {
                // max_tokens 0: the prompt (and its logprobs) was the point.
                empty.push(c.id);
                continue;
            }
            let out = match failed.iter().find(|f| f.0 == i) {
                Some((_, why)) => Err(why.clone()),
                None => match advanced.iter().find(|r| r.0 == i) {
                    Some((_, Ok(done))) => a
                        .decoding
                        .accept_picked_advanced(pick, *done)
                        .map_err(|e| e.to_string()),
                    Some((_, Err(why))) => Err(why.clone()),
                    None => a.decoding.accept_picked(pick).map_err(|e| e.to_string()),
                },
            };
            outputs.push((c.id, out));
        }
        (outputs, empty)
    }

    /// Advances the grammars of a step's constrained rows past their picks
    /// on the mask pool, all at once rather than row by row; rows left out
    /// (unconstrained, failed, stop tokens) advance in `accept_picked`.
    fn advance_grammars(
        &self,
        chunks: &[ScheduledChunk],
        picked: &[Pick],
        failed: &[(usize, String)],
    ) -> Vec<(usize, Result<bool, String>)> {
        let rows = chunks
            .iter()
            .zip(picked)
            .enumerate()
            .filter(|(i, (c, _))| c.sample && !failed.iter().any(|f| f.0 == *i))
            .filter_map(|(i, (c, p))| {
                let d = &self.active.get(&c.id)?.decoding;
                if d.generates_nothing() {
                    return None;
                }
                Some((i, d.grammar_to_advance(p.token)?.clone(), p.token))
            })
            .collect::<Vec<_>>();
        self.masks.advance(rows)
    }

    /// Adds a step's forward time to every request whose prompt it
    /// computed (chunks before the end of the prompt, or the prompt's last
    /// chunk, which also samples the first token).
    fn count_prefill(&mut self, chunks: &[ScheduledChunk], forward: Duration) {
        if let Some(tiers) = &self.tiers {
            // What a prompt token costs to compute: the tiers weigh it
            // against fetching a shared prefix.
            if chunks.iter().all(|c| c.len > 1) {
                tiers.note_prefill(chunks.iter().map(|c| c.len).sum(), forward);
            }
        }
        for c in chunks {
            if let Some(a) = self.active.get_mut(&c.id) {
                if a.first_token.is_none() && c.start < a.prompt_tokens {
                    a.prefill_forward += forward;
                    a.prefill_steps += 1;
                }
            }
        }
    }
}

/// The forward batch of `chunks` (their tokens and block tables), and
/// which request and start position each of its `score` entries scores
/// (chunks of requests that asked for prompt logprobs).
pub(super) fn build_batch<'a>(
    scheduler: &'a Scheduler,
    active: &HashMap<RequestId, Active>,
    chunks: &[ScheduledChunk],
) -> (ForwardBatch<'a>, Vec<(RequestId, usize)>) {
    let mut batch = ForwardBatch::default();
    let mut scored = Vec::new();
    for c in chunks {
        let Some(v) = scheduler.view(c.id) else {
            continue;
        };
        let next = active
            .get(&c.id)
            .and_then(|a| a.prompt_scores.as_ref())
            .and_then(|p| Some((p.next_tokens(v.tokens, c.start, c.len)?, p.top())));
        if let Some((next, top)) = next {
            batch.score.push(ScoredChunk {
                chunk: batch.chunks.len(),
                next,
                top,
            });
            scored.push((c.id, c.start));
        }
        batch.chunks.push(SequenceChunk::with_tables(
            &v.tokens[c.start..c.start + c.len],
            c.start,
            v.tables,
        ));
    }
    (batch, scored)
}

/// Runs the forward pass and picks the step's tokens: a plain argmax when
/// `greedy`, else each sampling row's own sampler (with the prompt scores
/// of a batch that scores positions).
fn forward(
    runner: &mut dyn ModelRunner,
    active: &mut HashMap<RequestId, Active>,
    (batch, chunks): (&ForwardBatch<'_>, &[ScheduledChunk]),
    greedy: bool,
    masks: &mut PendingMasks,
) -> Result<(Vec<Pick>, Vec<Vec<Logprobs>>), RunnerError> {
    if greedy {
        let ids = runner.forward_greedy(batch)?;
        return Ok((ids.into_iter().map(Pick::from).collect(), Vec::new()));
    }
    // Draw first (mutably), then lend the samplers' state to the rows.
    let randoms: Vec<u64> = chunks
        .iter()
        .map(|c| match active.get_mut(&c.id) {
            Some(a) if c.sample => a.decoding.sampler_mut().draw_random(),
            _ => 0,
        })
        .collect();
    let rows: Vec<RowSampling<'_>> = chunks
        .iter()
        .zip(randoms)
        .map(|(c, random)| match active.get(&c.id) {
            Some(a) if c.sample => a.decoding.sampler().row(random),
            _ => RowSampling::GREEDY,
        })
        .collect();
    if batch.score.is_empty() {
        Ok((runner.forward_sample(batch, &rows, masks)?, Vec::new()))
    } else {
        let step = runner.forward_scored(batch, &rows, masks)?;
        Ok((step.picks, step.scores))
    }
}
