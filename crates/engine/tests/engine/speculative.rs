//! Speculative decoding through the engine loop (n-gram proposals on a
//! small random-weight model, whose greedy outputs fall into loops the
//! proposer can copy): answers equal plain decoding's token for token,
//! alone and batched, with stop rules, logprobs, penalties and grammars.

use std::sync::atomic::Ordering;

use super::common::*;
use ingot_core::GrammarSpec;
use ingot_engine::{EngineHandle, EngineRequest, SpeculativeConfig, SpeculativeMethod, TokenEvent};
use ingot_runner::{ModelRunner, RunnerError};
use ingot_runner_cpu::CpuRunner;

fn speculating(k: usize) -> EngineHandle {
    speculating_on(k, |r| Box::new(r))
}

fn speculating_on(k: usize, wrap: impl FnOnce(CpuRunner) -> Box<dyn ModelRunner>) -> EngineHandle {
    engine_on(256, wrap, |c| {
        c.speculative = SpeculativeConfig {
            method: Some(SpeculativeMethod::Ngram),
            num_speculative_tokens: k,
            ngram_min: 1,
            ngram_max: 3,
            disable_by_batch_size: 8,
            // Always propose: these tests check that speculation keeps the
            // answers exact, which needs proposals to happen; the cost model
            // times real steps, and beside a loaded machine's other work it
            // may judge none worth making (its choices are unit-tested in
            // `speculative::policy`).
            adaptive: false,
        }
    })
}

/// The CPU runner, asking for proposals as single-token decode rows (as
/// the CUDA runner does, for its graphs), and holding at most this many
/// rows (as the CUDA runner's buffers hold `max_num_seqs`).
struct DecodeRows(CpuRunner, usize);

impl ModelRunner for DecodeRows {
    fn config(&self) -> &ingot_models::ModelConfig {
        self.0.config()
    }

    fn kv_cache_shape(&self) -> ingot_runner::KvCacheShape {
        self.0.kv_cache_shape()
    }

    fn forward(&mut self, batch: &ingot_runner::ForwardBatch<'_>) -> Result<&[f32], RunnerError> {
        if batch.chunks.len() > self.1 {
            return Err(RunnerError::InvalidBatch(format!(
                "{} rows for {}",
                batch.chunks.len(),
                self.1
            )));
        }
        self.0.forward(batch)
    }

    fn device_name(&self) -> String {
        self.0.device_name()
    }

    fn verifies_as_decode_rows(&self) -> bool {
        true
    }
}

/// A prompt that repeats a phrase, so proposals come from the prompt too.
fn repeating(seed: u32, max_tokens: usize) -> EngineRequest {
    let mut req = request(seed, 12, max_tokens);
    let phrase = req.prompt.clone();
    req.prompt.extend_from_slice(&phrase);
    req.prompt.extend_from_slice(&phrase[..5]);
    req
}

/// A prompt in which the first token of `plain`'s answer to it is followed
/// by other tokens: proposals copied from there are wrong.
fn misleading(plain: &EngineHandle, seed: u32, max_tokens: usize) -> EngineRequest {
    let mut req = request(seed, 12, max_tokens);
    let first = outputs(plain, std::slice::from_ref(&req))[0][0].0;
    let base = std::mem::take(&mut req.prompt);
    for i in 0..10 {
        req.prompt.extend([first, 20_000 + i]);
    }
    req.prompt.extend(base);
    req
}

/// Each request's tokens and their logprobs (bits), run one at a time.
fn outputs(e: &EngineHandle, reqs: &[EngineRequest]) -> Vec<Vec<(u32, u32)>> {
    reqs.iter()
        .map(|r| {
            let mut s = e.submit(r.clone()).unwrap();
            let mut out = Vec::new();
            while let Some(ev) = s.next_blocking() {
                match ev {
                    TokenEvent::Token(t) => out.push((t.token, t.logprob.to_bits())),
                    TokenEvent::Error(e) => panic!("{e}"),
                    _ => {}
                }
            }
            out
        })
        .collect()
}

fn kept(e: &EngineHandle) -> (u64, u64) {
    let s = e.stats();
    (
        s.spec_proposed.load(Ordering::Relaxed),
        s.spec_kept.load(Ordering::Relaxed),
    )
}

#[test]
fn greedy_answers_equal_plain_decoding() {
    greedy_answers_equal_plain_decoding_on(|r| Box::new(r));
}

#[test]
fn greedy_answers_equal_plain_decoding_verified_as_decode_rows() {
    greedy_answers_equal_plain_decoding_on(|r| Box::new(DecodeRows(r, 64)));
}

#[test]
fn proposals_as_decode_rows_stay_within_the_runners_rows() {
    let plain = engine(256, |_| {});
    let spec = engine_on(
        256,
        |r| Box::new(DecodeRows(r, 4)),
        |c| {
            c.scheduler.max_num_seqs = 4;
            c.speculative = SpeculativeConfig {
                method: Some(SpeculativeMethod::Ngram),
                num_speculative_tokens: 6,
                ngram_min: 1,
                ngram_max: 3,
                disable_by_batch_size: 8,
                // Always six proposals where the n-grams have them (see
                // `speculating_on`): more than the rows left.
                adaptive: false,
            };
        },
    );
    let reqs: Vec<_> = (0..3).map(|i| repeating(i, 90)).collect();
    let alone: Vec<Vec<u32>> = outputs(&plain, &reqs)
        .into_iter()
        .map(|o| o.into_iter().map(|t| t.0).collect())
        .collect();
    assert_eq!(alone, run_concurrently(&spec, reqs));
    assert!(kept(&spec).1 > 0);
}

fn greedy_answers_equal_plain_decoding_on(wrap: impl FnOnce(CpuRunner) -> Box<dyn ModelRunner>) {
    let plain = engine(256, |_| {});
    let spec = speculating_on(4, wrap);
    let reqs: Vec<_> = (0..6)
        .map(|i| match i % 3 {
            0 => repeating(i, 40),
            1 => misleading(&plain, i, 40),
            _ => request(i, 10 + i as usize, 40),
        })
        .collect();
    assert_eq!(outputs(&plain, &reqs), outputs(&spec, &reqs));
    let (proposed, kept) = kept(&spec);
    assert!(kept > 0 && kept < proposed, "{kept} of {proposed} kept");
    // Batched: the same answers, every sequence speculating beside others.
    let together = run_concurrently(&spec, reqs.clone());
    let alone: Vec<Vec<u32>> = outputs(&plain, &reqs)
        .into_iter()
        .map(|o| o.into_iter().map(|t| t.0).collect())
        .collect();
    assert_eq!(alone, together);
}

#[test]
fn stop_rules_logprobs_and_penalties_hold_with_proposals() {
    let plain = engine(256, |_| {});
    let spec = speculating(5);
    let mut reqs = Vec::new();
    for max_tokens in [1, 2, 3, 7, 17] {
        reqs.push(repeating(3, max_tokens));
    }
    let mut lp = repeating(4, 30);
    lp.sampling.logprobs = Some(3);
    reqs.push(lp);
    let mut pen = repeating(5, 30);
    pen.sampling.frequency_penalty = 0.4;
    pen.sampling.repetition_penalty = 1.2;
    reqs.push(pen);
    // A stop token the plain answer reaches mid-way.
    let first = outputs(&plain, &[repeating(6, 30)]).remove(0);
    let mut stop = repeating(6, 30);
    stop.stop.stop_token_ids = vec![first[9].0];
    reqs.push(stop);
    let want = outputs(&plain, &reqs);
    assert_eq!(
        want[..5].iter().map(Vec::len).collect::<Vec<_>>(),
        [1, 2, 3, 7, 17]
    );
    assert!(want[7].len() <= 10);
    assert_eq!(want, outputs(&spec, &reqs));
    assert!(kept(&spec).1 > 0);
}

#[test]
fn constrained_answers_equal_plain_decoding() {
    let plain = engine(256, |_| {});
    let spec = speculating(4);
    let spec_of = || GrammarSpec::Regex("(ab|ba|a){3,40}".into());
    let reqs: Vec<_> = (0..3)
        .map(|i| constrained(&plain, repeating(i, 40), spec_of()))
        .collect();
    let spec_reqs: Vec<_> = (0..3)
        .map(|i| constrained(&spec, repeating(i, 40), spec_of()))
        .collect();
    assert_eq!(outputs(&plain, &reqs), outputs(&spec, &spec_reqs));
    assert!(
        kept(&spec).1 > 0,
        "a looping constrained output copies itself"
    );
}

#[test]
fn a_request_may_opt_out_and_seeded_samples_never_speculate() {
    let spec = speculating(4);
    let mut off = repeating(1, 30);
    off.speculative = false;
    outputs(&spec, &[off]);
    assert_eq!(kept(&spec), (0, 0));
    let mut seeded = repeating(1, 30);
    seeded.sampling.temperature = 0.8;
    seeded.sampling.seed = Some(3);
    outputs(&spec, &[seeded]);
    assert_eq!(kept(&spec), (0, 0));
    outputs(&spec, &[repeating(1, 30)]);
    assert!(kept(&spec).0 > 0);
}
