//! Speculative decoding through the engine loop (n-gram proposals on a
//! small random-weight model, whose greedy outputs fall into loops the
//! proposer can copy): answers equal plain decoding's token for token,
//! alone and batched, with stop rules, logprobs, penalties and grammars;
//! and draft-model proposals (the target as its own draft, another random
//! model, a draft cache too small for every sequence).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::common::*;
use ingot_core::GrammarSpec;
use ingot_engine::{
    Drafter, EngineHandle, EngineRequest, SpeculativeConfig, SpeculativeMethod, TokenEvent,
};
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
            rate_by_match: false,
            launch_ahead_unmatched: true,
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
                rate_by_match: false,
                launch_ahead_unmatched: true,
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

/// Each step's longest chunk and whether the runner was told a plain step
/// follows it (`ForwardBatch::expect_next`).
type StepRecord = Arc<Mutex<Vec<(usize, bool)>>>;

/// The CPU runner saying it launches the next step ahead (as the CUDA
/// runner does), recording its steps.
struct LaunchingAhead(CpuRunner, StepRecord);

impl LaunchingAhead {
    fn record(&self, batch: &ingot_runner::ForwardBatch<'_>) {
        let longest = batch
            .chunks
            .iter()
            .map(|c| c.tokens.len())
            .max()
            .unwrap_or(0);
        self.1.lock().unwrap().push((longest, batch.expect_next));
    }
}

impl ModelRunner for LaunchingAhead {
    fn config(&self) -> &ingot_models::ModelConfig {
        self.0.config()
    }

    fn kv_cache_shape(&self) -> ingot_runner::KvCacheShape {
        self.0.kv_cache_shape()
    }

    fn forward(&mut self, batch: &ingot_runner::ForwardBatch<'_>) -> Result<&[f32], RunnerError> {
        self.record(batch);
        self.0.forward(batch)
    }

    fn forward_greedy(
        &mut self,
        batch: &ingot_runner::ForwardBatch<'_>,
    ) -> Result<Vec<u32>, RunnerError> {
        self.record(batch);
        self.0.forward_greedy(batch)
    }

    fn device_name(&self) -> String {
        self.0.device_name()
    }

    fn launches_ahead(&self) -> bool {
        true
    }
}

/// Speculating over a runner that launches ahead, with or without
/// `launch_ahead_unmatched`; its steps' record.
fn speculating_ahead(unmatched: bool) -> (EngineHandle, StepRecord) {
    let steps = Arc::new(Mutex::new(Vec::new()));
    let log = steps.clone();
    let e = engine_on(
        256,
        move |r| Box::new(LaunchingAhead(r, log)),
        |c| {
            c.speculative = SpeculativeConfig {
                method: Some(SpeculativeMethod::Ngram),
                num_speculative_tokens: 4,
                ngram_min: 2,
                ngram_max: 3,
                adaptive: false,
                launch_ahead_unmatched: unmatched,
                ..SpeculativeConfig::default()
            };
        },
    );
    (e, steps)
}

#[test]
fn sequences_with_nothing_to_copy_let_the_next_step_launch_ahead() {
    let plain = engine(256, |_| {});
    // Prompts with nothing to copy at first, then outputs that loop.
    let reqs: Vec<_> = (0..4).map(|i| request(i, 10 + i as usize, 60)).collect();
    let want = outputs(&plain, &reqs);
    let (spec, steps) = speculating_ahead(true);
    assert_eq!(want, outputs(&spec, &reqs));
    let steps = steps.lock().unwrap().clone();
    assert!(kept(&spec).1 > 0, "the loops are copied");
    assert!(steps.iter().any(|s| s.1), "some steps launch ahead");
    // The step after one launched ahead is the plain step in flight: it
    // carries no proposals (the runner would have to discard it).
    for w in steps.windows(2) {
        assert!(
            !(w[0].1 && w[1].0 > 1),
            "proposals after a launched step: {steps:?}"
        );
    }
    // Off: no step launches ahead while a sequence may propose.
    let (spec, steps) = speculating_ahead(false);
    assert_eq!(want, outputs(&spec, &reqs));
    assert!(!steps.lock().unwrap().iter().any(|s| s.1));
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

/// The tiny model on the CPU with the weights of `seed` (1: the target's,
/// see `engine_on`) and a pool of `num_blocks` blocks.
fn tiny_runner(seed: u64, num_blocks: usize) -> CpuRunner {
    tiny_runner_of(tiny_config(), seed, num_blocks)
}

/// A model the target disagrees with: its own LM head (the tied random
/// models mostly repeat their last token, whatever the seed).
fn wrong_draft() -> CpuRunner {
    let mut config = tiny_config();
    config.tie_word_embeddings = false;
    tiny_runner_of(config, 2, 256)
}

fn tiny_runner_of(config: ingot_models::ModelConfig, seed: u64, num_blocks: usize) -> CpuRunner {
    let source = ingot_models::dummy::DummySource::new(&config, seed);
    let weights = ingot_models::LlamaWeights::load(&config, &source, &|_, _| {}).unwrap();
    let opts = ingot_runner_cpu::CpuRunnerConfig {
        num_blocks,
        block_size: 16,
        weight_dtype: Default::default(),
    };
    CpuRunner::new(config, weights, opts).unwrap()
}

/// An engine over the tiny target proposing with `draft`, `k` tokens a
/// step (always, as `speculating_on` explains).
fn drafting(
    draft: CpuRunner,
    k: usize,
    target: impl FnOnce(CpuRunner) -> Box<dyn ModelRunner>,
) -> EngineHandle {
    let config = ingot_engine::EngineConfig {
        scheduler: ingot_scheduler::SchedulerConfig {
            max_num_batched_tokens: 64,
            ..Default::default()
        },
        speculative: SpeculativeConfig {
            method: Some(SpeculativeMethod::Draft),
            num_speculative_tokens: k,
            adaptive: false,
            ..Default::default()
        },
        ..Default::default()
    };
    ingot_engine::start_engine_with_draft(
        target(tiny_runner(1, 256)),
        Some(Drafter::Model(Box::new(draft))),
        tokenizer(),
        config,
    )
    .unwrap()
}

fn ids(outputs: Vec<Vec<(u32, u32)>>) -> Vec<Vec<u32>> {
    outputs
        .into_iter()
        .map(|o| o.into_iter().map(|t| t.0).collect())
        .collect()
}

/// The target as its own draft proposes exactly its greedy answer: every
/// proposal is kept, and the answers (logprobs too) are plain decoding's.
#[test]
fn the_target_as_its_own_draft_is_always_right() {
    let plain = engine(256, |_| {});
    let spec = drafting(tiny_runner(1, 256), 4, |r| Box::new(r));
    let reqs: Vec<_> = (0..4)
        .map(|i| request(i, 10 + 9 * i as usize, 30))
        .collect();
    assert_eq!(outputs(&plain, &reqs), outputs(&spec, &reqs));
    let (proposed, kept) = kept(&spec);
    assert!(
        proposed > 0 && kept == proposed,
        "{kept} of {proposed} kept"
    );
}

/// Another model's proposals are mostly refused; the answers stay plain
/// decoding's, alone and batched, as chunks and as decode rows.
#[test]
fn a_wrong_draft_keeps_the_answers() {
    let plain = engine(256, |_| {});
    let reqs: Vec<_> = (0..5)
        .map(|i| {
            if i % 2 == 0 {
                repeating(i, 30)
            } else {
                request(i, 20, 30)
            }
        })
        .collect();
    let alone = outputs(&plain, &reqs);
    for rows in [false, true] {
        let target = move |r: CpuRunner| -> Box<dyn ModelRunner> {
            if rows {
                Box::new(DecodeRows(r, 64))
            } else {
                Box::new(r)
            }
        };
        let spec = drafting(wrong_draft(), 3, target);
        assert_eq!(alone, outputs(&spec, &reqs), "decode rows: {rows}");
        assert_eq!(
            ids(alone.clone()),
            run_concurrently(&spec, reqs.clone()),
            "decode rows: {rows}"
        );
        let (proposed, kept) = kept(&spec);
        assert!(proposed > 0 && kept < proposed, "{kept} of {proposed} kept");
    }
}

/// A draft cache too small for every sequence drafts for those it holds,
/// the least recently drafted giving way, and the answers stay exact.
#[test]
fn a_small_draft_cache_gives_way_and_keeps_the_answers() {
    let plain = engine(256, |_| {});
    // Six blocks of 16: room for two 40-token sequences' drafts at most.
    let spec = drafting(tiny_runner(1, 6), 4, |r| Box::new(r));
    let reqs: Vec<_> = (0..4).map(|i| request(i, 30, 20)).collect();
    assert_eq!(
        ids(outputs(&plain, &reqs)),
        run_concurrently(&spec, reqs.clone())
    );
    let (proposed, before) = kept(&spec);
    assert!(
        proposed > 0 && before == proposed,
        "{before} of {proposed} kept"
    );
    // A prompt longer than the whole draft cache is never drafted.
    let long = request(9, 120, 10);
    assert_eq!(
        outputs(&plain, std::slice::from_ref(&long)),
        outputs(&spec, &[long])
    );
    assert_eq!(kept(&spec).1, before);
}

/// A draft of another vocabulary, a draft without the method and the
/// method without a draft are refused at start, by name.
#[test]
fn mismatched_drafts_are_refused() {
    let mut small = tiny_config();
    small.vocab_size = 1000;
    let weights = ingot_models::LlamaWeights::load(
        &small,
        &ingot_models::dummy::DummySource::new(&small, 1),
        &|_, _| {},
    )
    .unwrap();
    let opts = ingot_runner_cpu::CpuRunnerConfig {
        num_blocks: 16,
        block_size: 16,
        weight_dtype: Default::default(),
    };
    let other = CpuRunner::new(small, weights, opts).unwrap();
    let start = |method, draft: Option<CpuRunner>| {
        let config = ingot_engine::EngineConfig {
            speculative: SpeculativeConfig {
                method,
                ..Default::default()
            },
            ..Default::default()
        };
        let draft = draft.map(|d| Drafter::Model(Box::new(d)));
        match ingot_engine::start_engine_with_draft(
            Box::new(tiny_runner(1, 32)),
            draft,
            tokenizer(),
            config,
        ) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    };
    assert!(start(Some(SpeculativeMethod::Draft), Some(other)).contains("vocabulary (1000 tokens)"));
    assert!(start(Some(SpeculativeMethod::Draft), None).contains("needs speculative.model"));
    assert!(
        start(Some(SpeculativeMethod::Ngram), Some(tiny_runner(1, 16)))
            .contains("was given that speculative.method does not use")
    );
    assert!(start(None, Some(tiny_runner(1, 16)))
        .contains("was given that speculative.method does not use"));
}

/// An engine over the tiny target proposing with a random EAGLE-3 head,
/// `k` tokens a step (always).
fn eagle(k: usize, num_blocks: usize) -> EngineHandle {
    let target = tiny_runner(1, num_blocks);
    let head = ingot_models::eagle::head_like(&tiny_config());
    let shapes = ingot_models::eagle::expected_shapes(&head);
    let source = ingot_models::dummy::DummySource::with_shapes(shapes, 5);
    let weights = ingot_models::eagle::load_weights(&source, &head).unwrap();
    let head = target.draft_head(head, weights, 1024).unwrap();
    let config = ingot_engine::EngineConfig {
        scheduler: ingot_scheduler::SchedulerConfig {
            max_num_batched_tokens: 64,
            ..Default::default()
        },
        speculative: SpeculativeConfig {
            method: Some(SpeculativeMethod::Eagle3),
            num_speculative_tokens: k,
            adaptive: false,
            ..Default::default()
        },
        ..Default::default()
    };
    ingot_engine::start_engine_with_draft(
        Box::new(target),
        Some(Drafter::Head(head)),
        tokenizer(),
        config,
    )
    .unwrap()
}

/// An EAGLE-3 head's proposals (a random head: mostly refused) leave the
/// answers plain decoding's, alone and batched, with prompts split into
/// chunks and sequences that start from the prefix cache.
#[test]
fn an_eagle_head_keeps_the_answers() {
    let plain = engine(256, |_| {});
    let spec = eagle(4, 256);
    let reqs: Vec<_> = (0..5)
        .map(|i| {
            if i % 2 == 0 {
                repeating(i, 30)
            } else {
                request(i, 20 + 30 * i as usize, 30)
            }
        })
        .collect();
    let alone = outputs(&plain, &reqs);
    assert_eq!(alone, outputs(&spec, &reqs));
    assert_eq!(ids(alone), run_concurrently(&spec, reqs.clone()));
    let (proposed, kept) = kept(&spec);
    assert!(proposed > 0, "{kept} of {proposed} kept");
}

/// The method without a head, and a head for another method, are refused
/// at start by name.
#[test]
fn an_eagle_head_is_given_for_eagle3_only() {
    let start = |method, with_head: bool| {
        let target = tiny_runner(1, 32);
        let head = with_head.then(|| {
            let head = ingot_models::eagle::head_like(&tiny_config());
            let shapes = ingot_models::eagle::expected_shapes(&head);
            let source = ingot_models::dummy::DummySource::with_shapes(shapes, 5);
            let weights = ingot_models::eagle::load_weights(&source, &head).unwrap();
            Drafter::Head(target.draft_head(head, weights, 64).unwrap())
        });
        let config = ingot_engine::EngineConfig {
            speculative: SpeculativeConfig {
                method,
                ..Default::default()
            },
            ..Default::default()
        };
        match ingot_engine::start_engine_with_draft(Box::new(target), head, tokenizer(), config) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    };
    assert!(start(Some(SpeculativeMethod::Eagle3), false).contains("\"eagle3\" needs"));
    assert!(start(Some(SpeculativeMethod::Draft), true).contains("was given"));
    assert_eq!(start(Some(SpeculativeMethod::Eagle3), true), "");
}

/// The CPU runner, recording each forward pass's sequences and whether it
/// asked to keep the hidden rows (`ForwardBatch::keep_hidden`). With a
/// gate, its first forward pass waits for a message on it.
struct KeepsHidden {
    runner: CpuRunner,
    steps: Arc<Mutex<Vec<(usize, bool)>>>,
    gate: Option<std::sync::mpsc::Receiver<()>>,
}

impl KeepsHidden {
    fn note(&mut self, batch: &ingot_runner::ForwardBatch<'_>) {
        self.steps
            .lock()
            .unwrap()
            .push((batch.chunks.len(), batch.keep_hidden));
        if let Some(gate) = self.gate.take() {
            gate.recv().unwrap();
        }
    }
}

impl ModelRunner for KeepsHidden {
    fn config(&self) -> &ingot_models::ModelConfig {
        self.runner.config()
    }

    fn kv_cache_shape(&self) -> ingot_runner::KvCacheShape {
        self.runner.kv_cache_shape()
    }

    fn forward(&mut self, batch: &ingot_runner::ForwardBatch<'_>) -> Result<&[f32], RunnerError> {
        self.note(batch);
        self.runner.forward(batch)
    }

    fn device_name(&self) -> String {
        self.runner.device_name()
    }

    fn capture_hidden(&mut self, layers: &[usize]) -> Result<(), RunnerError> {
        self.runner.capture_hidden(layers)
    }

    fn captured_hidden(&self) -> &[f32] {
        self.runner.captured_hidden()
    }
}

/// An engine over the tiny target with a random EAGLE-3 head, proposing 2
/// tokens a step (always) while at most 2 sequences run, over a runner
/// recording its steps in `steps`, its first forward pass held by `gate`.
fn observing(
    steps: &Arc<Mutex<Vec<(usize, bool)>>>,
    gate: Option<std::sync::mpsc::Receiver<()>>,
    max_num_batched_tokens: usize,
) -> EngineHandle {
    let runner = tiny_runner(1, 256);
    let head_config = ingot_models::eagle::head_like(&tiny_config());
    let shapes = ingot_models::eagle::expected_shapes(&head_config);
    let source = ingot_models::dummy::DummySource::with_shapes(shapes, 5);
    let weights = ingot_models::eagle::load_weights(&source, &head_config).unwrap();
    let head = runner.draft_head(head_config, weights, 1024).unwrap();
    let config = ingot_engine::EngineConfig {
        scheduler: ingot_scheduler::SchedulerConfig {
            max_num_batched_tokens,
            ..Default::default()
        },
        speculative: SpeculativeConfig {
            method: Some(SpeculativeMethod::Eagle3),
            num_speculative_tokens: 2,
            disable_by_batch_size: 2,
            adaptive: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let runner = KeepsHidden {
        runner,
        steps: steps.clone(),
        gate,
    };
    ingot_engine::start_engine_with_draft(
        Box::new(runner),
        Some(Drafter::Head(head)),
        tokenizer(),
        config,
    )
    .unwrap()
}

/// A step keeps its hidden rows for the head only while no more
/// sequences run or wait than speculate: a lone request's steps do, the
/// steps of four at once (more than `disable_by_batch_size`) do not, and
/// the answers stay plain decoding's either way.
#[test]
fn hidden_rows_are_kept_only_while_few_sequences_run() {
    let steps = Arc::new(Mutex::new(Vec::new()));
    let spec = observing(&steps, None, 64);
    let plain = engine(256, |_| {});
    let reqs: Vec<_> = (0..4).map(|i| request(i, 24, 12)).collect();
    assert_eq!(outputs(&plain, &reqs[..1]), outputs(&spec, &reqs[..1]));
    let alone = steps.lock().unwrap().clone();
    assert!(
        alone.iter().all(|&(seqs, keep)| seqs == 1 && keep),
        "{alone:?}"
    );
    steps.lock().unwrap().clear();
    let plain_ids = run_concurrently(&plain, reqs.clone());
    assert_eq!(plain_ids, run_concurrently(&spec, reqs));
    let together = steps.lock().unwrap().clone();
    assert!(together.iter().any(|&(seqs, _)| seqs > 2), "{together:?}");
    assert!(
        together
            .iter()
            .filter(|&&(seqs, _)| seqs > 2)
            .all(|&(_, keep)| !keep),
        "{together:?}"
    );
}

/// A burst admitted a prompt at a time: while the first request's prompt
/// runs alone (nothing else has come) its step keeps its rows; once four
/// more wait, the next step runs two sequences (the first's decode row and
/// the second's prompt), within `disable_by_batch_size`, yet keeps none,
/// as the batch is about to grow. Answers equal plain decoding's.
#[test]
fn a_burst_keeps_no_hidden_rows_while_requests_wait() {
    let steps = Arc::new(Mutex::new(Vec::new()));
    let (open, gate) = std::sync::mpsc::channel();
    let spec = observing(&steps, Some(gate), 25);
    let plain = engine(256, |_| {});
    let reqs: Vec<_> = (0..5).map(|i| request(i, 24, 8)).collect();
    let first = spec.submit(reqs[0].clone()).unwrap();
    // Its first step has begun (and waits at the gate) before the rest come.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while steps.lock().unwrap().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no first step");
        std::thread::yield_now();
    }
    let rest: Vec<_> = reqs[1..]
        .iter()
        .map(|r| spec.submit(r.clone()).unwrap())
        .collect();
    open.send(()).unwrap();
    let ids: Vec<_> = std::iter::once(first)
        .chain(rest)
        .map(|s| drain(s).0)
        .collect();
    assert_eq!(ids, run_concurrently(&plain, reqs));
    let burst = steps.lock().unwrap().clone();
    assert_eq!(burst[0], (1, true), "{burst:?}");
    assert_eq!(burst[1], (2, false), "{burst:?}");
}
