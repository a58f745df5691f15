//! The engine loop end to end on a small random-weight model with the real
//! SmolLM2 tokenizer: batch invariance, preemption by recompute, abort,
//! backpressure and admission control.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingot_core::{FinishReason, Priority, SamplingParams, StopCriteria};
use ingot_engine::{
    start_engine, EngineConfig, EngineHandle, EngineRequest, SubmitError, TokenEvent,
};
use ingot_models::dummy::DummySource;
use ingot_models::{LlamaWeights, ModelConfig};
use ingot_runner_cpu::{CpuRunner, CpuRunnerConfig};

mod common;
#[path = "engine/speculative.rs"]
mod speculative;

use common::*;

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn concurrent_requests_match_sequential_bit_for_bit() {
    let e = engine(256, |_| {});
    let reqs: Vec<_> = (0..8)
        .map(|i| request(i, 20 + 9 * i as usize, 12))
        .collect();
    let alone: Vec<_> = reqs.iter().map(|r| run(&e, r.clone()).0).collect();
    let together = run_concurrently(&e, reqs);
    assert_eq!(alone, together);
}

#[test]
fn a_prompt_in_one_prefill_only_step_matches_it_chunked_bit_for_bit() {
    // Budget 64: a 150-token prompt alone takes 3 chunks, or one step with
    // a prefill-only budget of 256.
    let chunked = engine(256, |_| {});
    let whole = engine(256, |c| c.scheduler.max_prefill_only_tokens = 256);
    for i in 0..3 {
        let r = request(i, 150, 12);
        assert_eq!(run(&chunked, r.clone()), run(&whole, r));
    }
}

#[test]
fn preemption_recomputes_to_the_same_tokens() {
    // 12 blocks of 16 = 192 slots; 6 requests of 40 + 24 tokens (4 blocks
    // each at the end) cannot all fit, so some are preempted and recomputed.
    let e = engine(12, |c| c.scheduler.max_num_seqs = 6);
    let reqs: Vec<_> = (0..6).map(|i| request(i, 40, 24)).collect();
    let alone: Vec<_> = reqs.iter().map(|r| run(&e, r.clone()).0).collect();
    let together = run_concurrently(&e, reqs);
    assert_eq!(alone, together);
    assert!(
        e.stats()
            .preemptions
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0,
        "test needs preemption"
    );
    wait_until("blocks freed", || e.stats().kv_usage() == 0.0);
}

#[test]
fn dropping_a_stream_aborts_and_frees_blocks() {
    let e = engine(256, |_| {});
    let mut streams: Vec<_> = (0..4)
        .map(|i| e.submit(request(i, 30, 400)).unwrap())
        .collect();
    for s in &mut streams {
        assert!(matches!(s.next_blocking(), Some(TokenEvent::Token(_))));
    }
    assert!(e.stats().kv_usage() > 0.0);
    drop(streams);
    wait_until("idle after abort", || {
        e.stats().running.load(std::sync::atomic::Ordering::Relaxed) == 0
            && e.stats().kv_usage() == 0.0
    });
}

#[test]
fn a_client_that_stops_reading_is_paused_then_cut_off_without_stalling_others() {
    let e = engine(256, |c| {
        c.stream_buffer = 2;
        c.stall_timeout = Duration::from_millis(300);
    });
    let mut stalled = e.submit(request(1, 10, 200)).unwrap();
    // The others finish while the stalled one sits paused.
    let (tokens, reason) = run(&e, request(2, 10, 30));
    assert_eq!((tokens.len(), reason), (30, FinishReason::Length));
    std::thread::sleep(Duration::from_millis(600));
    wait_until("stalled request freed", || e.stats().kv_usage() == 0.0);
    // It got its buffered events and then the channel closed, without Finished.
    let mut seen = 0;
    while let Some(ev) = stalled.next_blocking() {
        assert!(matches!(ev, TokenEvent::Token(_)));
        seen += 1;
    }
    assert!((2..200).contains(&seen), "saw {seen} events");
}

#[test]
fn a_full_queue_refuses_background_first() {
    let e = engine(256, |c| {
        c.scheduler.max_waiting = 4;
        c.scheduler.max_num_seqs = 1;
    });
    // Occupy the engine and fill the queue.
    let _running = e.submit(request(0, 10, 300)).unwrap();
    wait_until("first request running", || {
        e.stats().running.load(std::sync::atomic::Ordering::Relaxed) == 1
    });
    let _queued: Vec<_> = (1..3)
        .map(|i| e.submit(request(i, 10, 10)).unwrap())
        .collect();
    let mut bg = request(9, 10, 10);
    bg.priority = Priority::Background;
    assert!(
        matches!(e.submit(bg), Err(SubmitError::Overloaded { .. })),
        "background shed at half"
    );
    let _more: Vec<_> = (3..5)
        .map(|i| e.submit(request(i, 10, 10)).unwrap())
        .collect();
    assert!(matches!(
        e.submit(request(5, 10, 10)),
        Err(SubmitError::Overloaded { .. })
    ));
    let mut critical = request(6, 10, 10);
    critical.priority = Priority::Critical;
    assert!(e.submit(critical).is_ok(), "critical has a reserve");
}

#[test]
fn a_burst_on_an_idle_engine_is_admitted_up_to_max_num_seqs_plus_max_waiting() {
    let e = engine(256, |c| {
        c.scheduler.max_waiting = 8;
        c.scheduler.max_num_seqs = 4;
    });
    // Long answers: the first four hold their slots for the whole test.
    let burst: Vec<_> = (0..12)
        .map(|i| {
            e.submit(request(i, 10, 300))
                .unwrap_or_else(|err| panic!("request {i} of the burst refused: {err}"))
        })
        .collect();
    let stats = e.stats();
    wait_until("four running and eight waiting", || {
        stats.running.load(std::sync::atomic::Ordering::SeqCst) == 4
            && stats.waiting.load(std::sync::atomic::Ordering::SeqCst) == 8
    });
    assert!(matches!(
        e.submit(request(12, 10, 10)),
        Err(SubmitError::Overloaded { .. })
    ));
    drop(burst);
}

#[test]
fn too_long_and_bad_tokens_are_refused_up_front() {
    let e = engine(256, |_| {});
    assert!(matches!(
        e.submit(request(0, 500, 100)),
        Err(SubmitError::TooLong { .. })
    ));
    let mut bad = request(0, 5, 5);
    bad.prompt[2] = 10_000_000;
    assert!(matches!(
        e.submit(bad),
        Err(SubmitError::TokenOutOfRange { .. })
    ));
    let mut empty = request(0, 5, 5);
    empty.prompt.clear();
    assert!(matches!(e.submit(empty), Err(SubmitError::EmptyPrompt)));
}

/// Per step: the entry point used ("greedy", "sample" or "logits"), tokens, hint.
type StepLog = Arc<std::sync::Mutex<Vec<(&'static str, usize, bool)>>>;

/// Wraps the CPU runner and records, per step, which entry point the engine
/// used and its `expect_next` hint.
struct Recording {
    inner: CpuRunner,
    steps: StepLog,
    /// What `launches_ahead` answers.
    ahead: bool,
    /// `expect_next` steps in which some row's tables end at its next
    /// position (a runner launching ahead would have no slot for it).
    short_tables: Arc<AtomicUsize>,
}

impl ingot_runner::ModelRunner for Recording {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }

    fn kv_cache_shape(&self) -> ingot_runner::KvCacheShape {
        self.inner.kv_cache_shape()
    }

    fn forward(
        &mut self,
        batch: &ingot_runner::ForwardBatch<'_>,
    ) -> Result<&[f32], ingot_runner::RunnerError> {
        let n = batch.num_tokens();
        self.steps
            .lock()
            .unwrap()
            .push(("logits", n, batch.expect_next));
        self.inner.forward(batch)
    }

    fn forward_greedy(
        &mut self,
        batch: &ingot_runner::ForwardBatch<'_>,
    ) -> Result<Vec<u32>, ingot_runner::RunnerError> {
        let n = batch.num_tokens();
        self.steps
            .lock()
            .unwrap()
            .push(("greedy", n, batch.expect_next));
        let bs = self.inner.kv_cache_shape().block_size;
        let short = batch
            .chunks
            .iter()
            .any(|c| c.block_table.len() * bs <= c.start_pos + 1);
        if batch.expect_next && short {
            self.short_tables.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.forward_greedy(batch)
    }

    fn forward_sample(
        &mut self,
        batch: &ingot_runner::ForwardBatch<'_>,
        rows: &[ingot_runner::RowSampling<'_>],
        masks: &mut dyn ingot_runner::MaskSource,
    ) -> Result<Vec<ingot_runner::Pick>, ingot_runner::RunnerError> {
        let n = batch.num_tokens();
        self.steps
            .lock()
            .unwrap()
            .push(("sample", n, batch.expect_next));
        self.inner.forward_sample(batch, rows, masks)
    }

    fn device_name(&self) -> String {
        "recording".into()
    }

    fn launches_ahead(&self) -> bool {
        self.ahead
    }
}

fn recording_engine() -> (EngineHandle, StepLog) {
    let (handle, steps, _) = recording_engine_ahead(false);
    (handle, steps)
}

/// A recording engine whose runner says it launches ahead (`ahead`); also
/// the count of steady-decode steps with a row's tables ending at its next
/// position.
fn recording_engine_ahead(ahead: bool) -> (EngineHandle, StepLog, Arc<AtomicUsize>) {
    let config = tiny_config();
    let weights = LlamaWeights::load(&config, &DummySource::new(&config, 1), &|_, _| {}).unwrap();
    let inner = CpuRunner::new(
        config,
        weights,
        CpuRunnerConfig {
            num_blocks: 64,
            block_size: 16,
            weight_dtype: Default::default(),
        },
    )
    .unwrap();
    let steps = Arc::new(std::sync::Mutex::new(Vec::new()));
    let short_tables = Arc::new(AtomicUsize::new(0));
    let runner = Recording {
        inner,
        steps: steps.clone(),
        ahead,
        short_tables: short_tables.clone(),
    };
    let handle = start_engine(Box::new(runner), tokenizer(), EngineConfig::default()).unwrap();
    (handle, steps, short_tables)
}

#[test]
fn a_runner_launching_ahead_gets_every_rows_next_block_a_step_early() {
    for ahead in [false, true] {
        let (handle, steps, short) = recording_engine_ahead(ahead);
        // Prompts of different lengths: rows cross block boundaries (16)
        // at different steps, so most steps have one that does.
        let reqs = (0..4).map(|i| request(i, 5 + 7 * i as usize, 40)).collect();
        let out = run_concurrently(&handle, reqs);
        assert!(out.iter().all(|t| t.len() == 40));
        let steady = steps.lock().unwrap().iter().filter(|s| s.2).count();
        assert!(steady > 20, "{steady} steady-decode steps");
        let short = short.load(Ordering::SeqCst);
        if ahead {
            assert_eq!(short, 0, "a row's next position had no block");
        } else {
            assert!(
                short > 0,
                "no row ever crossed a block: the test shows nothing"
            );
        }
    }
}

#[test]
fn greedy_steps_ask_for_ids_and_mark_steady_decode() {
    let (handle, steps) = recording_engine();
    let (tokens, reason) = run(&handle, request(3, 20, 4));
    assert_eq!((tokens.len(), reason), (4, FinishReason::Length));
    let steps = steps.lock().unwrap().clone();
    // Prefill (20 tokens) cannot be continued on the device; the decode
    // steps can, except the one that produces the last allowed token.
    assert_eq!(
        steps,
        vec![
            ("greedy", 20, false),
            ("greedy", 1, true),
            ("greedy", 1, true),
            ("greedy", 1, false)
        ]
    );
}

#[test]
fn sampled_or_logprob_requests_are_sampled_by_the_backend() {
    // Neither needs the logits on the engine's side: the backend picks
    // (and reports logprobs), and steady decode is still marked so the
    // backend may run the next step ahead.
    let (handle, steps) = recording_engine();
    let mut req = request(4, 8, 3);
    req.sampling.temperature = 0.7;
    req.sampling.seed = Some(1);
    run(&handle, req);
    let mut req = request(5, 8, 3);
    req.sampling.logprobs = Some(2);
    let (tokens, _) = run(&handle, req);
    assert_eq!(tokens.len(), 3);
    let steps = steps.lock().unwrap().clone();
    let sampled: Vec<_> = steps.iter().filter(|s| s.0 == "sample").collect();
    assert_eq!(
        sampled,
        [
            &("sample", 8, false),
            &("sample", 1, true),
            &("sample", 1, false),
            &("sample", 8, false),
            &("sample", 1, true),
            &("sample", 1, false)
        ],
        "{steps:?}"
    );
}

#[test]
fn logprobs_come_back_with_the_tokens() {
    let (handle, _) = recording_engine();
    let mut req = request(7, 9, 4);
    req.sampling.logprobs = Some(3);
    let mut stream = handle.submit(req).unwrap();
    let mut events = Vec::new();
    while let Some(e) = stream.next_blocking() {
        match e {
            TokenEvent::Token(t) => events.push(t),
            TokenEvent::Finished(_) => break,
            TokenEvent::Error(e) => panic!("engine error: {e}"),
            TokenEvent::Prompt(_) => panic!("no prompt logprobs were asked for"),
        }
    }
    assert_eq!(events.len(), 4);
    for t in &events {
        assert_eq!(t.top_logprobs.len(), 3);
        assert!(t
            .top_logprobs
            .windows(2)
            .all(|w| w[0].logprob >= w[1].logprob));
        // Greedy: the pick is the most likely token.
        assert_eq!(t.token, t.top_logprobs[0].token);
        assert!((t.logprob - t.top_logprobs[0].logprob).abs() < 1e-6);
        assert!(t.logprob < 0.0);
    }
}

#[test]
fn logprobs_do_not_change_sampled_tokens() {
    // A seeded, penalised, truncated request with and without logprobs:
    // the same seed draws the same stream, so the tokens agree.
    let (handle, _) = recording_engine();
    let sampled = |logprobs| {
        let mut req = request(3, 10, 8);
        req.sampling = SamplingParams {
            temperature: 0.8,
            top_k: 20,
            top_p: 0.9,
            min_p: 0.01,
            repetition_penalty: 1.2,
            frequency_penalty: 0.3,
            presence_penalty: 0.2,
            seed: Some(11),
            logprobs,
            prompt_logprobs: None,
            logit_bias: Vec::new(),
        };
        run(&handle, req).0
    };
    let on_backend = sampled(None);
    assert_eq!(on_backend, sampled(Some(1)));
    assert_eq!(on_backend, sampled(None));
}

#[test]
fn logprobs_do_not_change_greedy_tokens() {
    // The same prompt greedily through forward_greedy and (with logprobs
    // requested) through forward_sample gives the same tokens.
    let (handle, _) = recording_engine();
    let (plain, _) = run(&handle, request(6, 12, 6));
    let mut req = request(6, 12, 6);
    req.sampling.logprobs = Some(1);
    let (with_logprobs, _) = run(&handle, req);
    assert_eq!(plain, with_logprobs);
}

fn text(tokens: &[u32]) -> String {
    tokenizer().decode(tokens, true).unwrap()
}

#[test]
fn grammar_constrained_output_follows_the_grammar_and_ends_with_it() {
    let e = engine(256, |_| {});
    let schema = r#"{"type":"object","properties":{"ok":{"type":"boolean"},"colour":{"enum":["red","green"]}},"required":["ok","colour"],"additionalProperties":false}"#;
    for seed in 0..3 {
        let mut req = request(seed, 10, 60);
        if seed > 0 {
            req.sampling = SamplingParams {
                temperature: 1.0,
                seed: Some(seed as u64),
                ..SamplingParams::default()
            };
        }
        let req = constrained(&e, req, ingot_core::GrammarSpec::JsonSchema(schema.into()));
        let (tokens, reason) = run(&e, req);
        assert_eq!(reason, FinishReason::Stop);
        let out = text(&tokens);
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out:?}: {e}"));
        assert!(v["ok"].is_boolean(), "{out}");
        assert!(v["colour"] == "red" || v["colour"] == "green", "{out}");
    }
    let choice = ingot_core::GrammarSpec::Lark(r#"start: "yes" | "no""#.into());
    let (tokens, reason) = run(&e, constrained(&e, request(9, 10, 60), choice));
    assert_eq!(reason, FinishReason::Stop);
    assert!(["yes", "no"].contains(&text(&tokens).as_str()));
}

#[test]
fn constrained_and_free_requests_batch_together_and_survive_preemption() {
    // As preemption_recomputes_to_the_same_tokens, every other request
    // under a grammar: outputs equal those run alone, grammars hold.
    // 10 blocks: the constrained requests end early, so fewer blocks keep
    // the batch short of KV.
    let e = engine(10, |c| c.scheduler.max_num_seqs = 6);
    let letters = ingot_core::GrammarSpec::Regex("[a-z]{30}".into());
    let reqs: Vec<_> = (0..6)
        .map(|i| {
            let r = request(i, 40, 24);
            if i % 2 == 0 {
                constrained(&e, request(i, 40, 40), letters.clone())
            } else {
                r
            }
        })
        .collect();
    let alone: Vec<_> = reqs.iter().map(|r| run(&e, r.clone()).0).collect();
    let before = e
        .stats()
        .preemptions
        .load(std::sync::atomic::Ordering::Relaxed);
    let together = run_concurrently(&e, reqs);
    assert_eq!(alone, together);
    assert!(
        e.stats()
            .preemptions
            .load(std::sync::atomic::Ordering::Relaxed)
            > before,
        "test needs preemption"
    );
    for tokens in together.iter().step_by(2) {
        let out = text(tokens);
        assert!(
            out.len() == 30 && out.bytes().all(|b| b.is_ascii_lowercase()),
            "{out:?}"
        );
    }
}

/// Each position's logprob of the next prompt token, one decode step at a
/// time straight on a runner: the reference for the batched prompt scores.
fn stepwise_logprobs(prompt: &[u32]) -> Vec<(f32, u32)> {
    use ingot_runner::{ForwardBatch, ModelRunner, SequenceChunk};
    let config = tiny_config();
    let weights = LlamaWeights::load(&config, &DummySource::new(&config, 1), &|_, _| {}).unwrap();
    let mut runner = CpuRunner::new(
        config,
        weights,
        CpuRunnerConfig {
            num_blocks: 32,
            block_size: 16,
            weight_dtype: Default::default(),
        },
    )
    .unwrap();
    let table: Vec<u32> = (0..32).collect();
    (0..prompt.len() - 1)
        .map(|p| {
            let batch = ForwardBatch {
                chunks: vec![SequenceChunk {
                    tokens: &prompt[p..p + 1],
                    start_pos: p,
                    block_table: &table,
                    group_tables: &[],
                }],
                ..ForwardBatch::default()
            };
            let row = runner.forward(&batch).unwrap();
            let z = ingot_runner::sampling::log_sum_exp(row);
            (row[prompt[p + 1] as usize] - z, ingot_runner::argmax(row))
        })
        .collect()
}

#[test]
fn prompt_logprobs_match_stepwise_logits_through_chunks_and_the_prefix_cache() {
    let e = engine(256, |_| {});
    // The same prompt first, so its blocks sit in the prefix cache.
    let warm = request(3, 150, 1);
    let _ = run(&e, warm.clone());
    let mut scored = warm.clone();
    scored.sampling.prompt_logprobs = Some(2);
    scored.stop.max_tokens = 0;
    let mut stream = e.submit(scored).unwrap();
    let mut prompt = None;
    let mut finished = None;
    while let Some(ev) = stream.next_blocking() {
        match ev {
            TokenEvent::Prompt(list) => prompt = Some(list),
            TokenEvent::Finished(c) => finished = Some(c),
            other => panic!("unexpected {other:?}"),
        }
    }
    let (prompt, finished) = (prompt.unwrap(), finished.unwrap());
    assert_eq!(
        (finished.reason, finished.completion_tokens),
        (FinishReason::Length, 0)
    );
    assert_eq!(
        finished.cached_tokens, 0,
        "scored prompts skip the prefix cache"
    );
    assert_eq!(prompt.len(), 150);
    assert_eq!(prompt[0].logprob, None);
    let reference = stepwise_logprobs(&warm.prompt);
    for (i, (p, (want, best))) in prompt[1..].iter().zip(reference).enumerate() {
        assert_eq!(p.token, warm.prompt[i + 1]);
        let got = p.logprob.unwrap();
        assert!((got - want).abs() < 1e-4, "position {i}: {got} vs {want}");
        assert_eq!(p.top_logprobs.len(), 2);
        assert_eq!(p.top_logprobs[0].token, best, "position {i}");
    }
}

#[test]
fn prompt_logprobs_come_before_the_generated_tokens() {
    let e = engine(256, |_| {});
    let mut req = request(5, 20, 3);
    req.sampling.prompt_logprobs = Some(0);
    let mut stream = e.submit(req).unwrap();
    let mut kinds = Vec::new();
    while let Some(ev) = stream.next_blocking() {
        kinds.push(match ev {
            TokenEvent::Prompt(list) => {
                assert_eq!(list.len(), 20);
                "prompt"
            }
            TokenEvent::Token(_) => "token",
            TokenEvent::Finished(_) => "finished",
            TokenEvent::Error(e) => panic!("{e}"),
        });
    }
    assert_eq!(kinds, ["prompt", "token", "token", "token", "finished"]);
}

/// The real SmolLM2 on the CPU backend.
fn smollm2_engine() -> EngineHandle {
    let files = ingot_models::open(
        &ingot_testkit::smollm2_gguf(),
        ingot_models::LoadFormat::Auto,
    )
    .unwrap();
    let config = files.config.clone();
    let weights = LlamaWeights::load(&config, files.tensors.as_ref(), &|_, _| {}).unwrap();
    let runner = CpuRunner::new(
        config,
        weights,
        CpuRunnerConfig {
            num_blocks: 256,
            block_size: 16,
            weight_dtype: Default::default(),
        },
    )
    .unwrap();
    start_engine(Box::new(runner), tokenizer(), EngineConfig::default()).unwrap()
}

#[test]
fn logit_bias_bans_and_forces_tokens_in_100_sampled_answers() {
    let e = smollm2_engine();
    let prompt = tokenizer()
        .encode("The capital of France is", true)
        .unwrap();
    let answers = |count: u64, bias: Vec<(u32, f32)>| {
        let reqs = (0..count)
            .map(|seed| EngineRequest {
                prompt: prompt.clone(),
                sampling: SamplingParams {
                    seed: Some(seed),
                    logit_bias: bias.clone(),
                    ..SamplingParams::default()
                },
                stop: StopCriteria {
                    max_tokens: 2,
                    ignore_eos: true,
                    ..Default::default()
                },
                priority: Priority::Normal,
                grammar: None,
                speculative: true,
            })
            .collect();
        run_concurrently(&e, reqs)
    };
    // The most likely first token, and how often temperature 1 draws it.
    let (greedy, _) = run(&e, {
        let mut r = request(0, 1, 1);
        r.prompt = prompt.clone();
        r
    });
    let top = greedy[0];
    let free = answers(20, Vec::new());
    let drawn = free.iter().filter(|a| a.contains(&top)).count();
    assert!(
        drawn >= 2,
        "the top token was drawn in {drawn} answers of 20"
    );
    let banned = answers(100, vec![(top, -100.0)]);
    assert!(banned.iter().all(|a| !a.contains(&top)), "{banned:?}");
    // An unlikely token, forced at every position.
    let rare = 12_345;
    let forced = answers(20, vec![(rare, 100.0)]);
    assert!(forced.iter().all(|a| a == &[rare, rare]), "{forced:?}");
    // Out of the vocabulary: refused at submission, naming the field.
    let mut bad = request(0, 5, 5);
    bad.sampling.logit_bias = vec![(10_000_000, 1.0)];
    match e.submit(bad) {
        Err(SubmitError::Sampling(s)) => assert_eq!(s.field, "logit_bias"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// A request's tokens, their logprobs (bits) and its cached prompt tokens.
fn run_scored(handle: &EngineHandle, mut req: EngineRequest) -> (Vec<(u32, u32)>, usize) {
    req.sampling.logprobs = Some(2);
    let mut s = handle.submit(req).unwrap();
    let mut out = Vec::new();
    while let Some(e) = s.next_blocking() {
        match e {
            TokenEvent::Token(t) => out.push((t.token, t.logprob.to_bits())),
            TokenEvent::Finished(c) => return (out, c.cached_tokens),
            TokenEvent::Error(e) => panic!("engine error: {e}"),
            TokenEvent::Prompt(_) => {}
        }
    }
    panic!("stream ended without Finished");
}

fn tiers(host_bytes: u64, disk: Option<&std::path::Path>) -> Arc<ingot_kv_tiers::KvTiers> {
    let settings = ingot_kv_tiers::TierSettings {
        host_bytes,
        disk_path: disk.map(std::path::Path::to_path_buf),
        disk_bytes: 64 << 20,
    };
    let ns = ingot_kv_tiers::Namespace::of(&[("model", b"tiny-1")]);
    Arc::new(ingot_kv_tiers::KvTiers::open(&settings, ns, "tiny").unwrap())
}

/// A 97-token prompt (6 full blocks), then two others that take every
/// page of a 12-block pool, then the first again.
fn return_after_eviction(handle: &EngineHandle) -> [(Vec<(u32, u32)>, usize); 2] {
    let first = run_scored(handle, request(40, 97, 6));
    run(handle, request(41, 180, 2));
    run(handle, request(42, 180, 2));
    let again = run_scored(handle, request(40, 97, 6));
    [first, again]
}

#[test]
fn evicted_prefixes_come_back_from_host_memory_and_disk_bit_for_bit() {
    // Without tiers the returning prompt is recomputed.
    let plain = engine(12, |_| {});
    let [first, again] = return_after_eviction(&plain);
    assert_eq!((first.1, again.1), (0, 0));
    assert_eq!(first.0, again.0);
    // Host memory: the six blocks come back, same tokens and logprobs.
    let host = tiers(64 << 20, None);
    let handle = engine(12, |c| c.kv_tiers = Some(host.clone()));
    let [first, again] = return_after_eviction(&handle);
    assert_eq!((first.1, again.1), (0, 96));
    assert_eq!(again.0, first.0, "restored KV changed the answer");
    assert!(host.usage().hits[0] >= 6, "{:?}", host.usage());
    // Disk only, and again after a restart: the first request of the new
    // engine resumes its prefix from the files the old one wrote.
    let dir = std::env::temp_dir().join(format!("ingot-engine-kv-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    {
        let disk = tiers(0, Some(&dir));
        let handle = engine(12, |c| c.kv_tiers = Some(disk.clone()));
        let [_, from_disk] = return_after_eviction(&handle);
        assert_eq!((from_disk.0.clone(), from_disk.1), (first.0.clone(), 96));
        assert!(disk.usage().hits[1] >= 6);
        run(&handle, request(43, 180, 2));
        run(&handle, request(44, 180, 2));
        disk.disk().unwrap().flush();
    }
    let disk = tiers(0, Some(&dir));
    let restarted = engine(12, |c| c.kv_tiers = Some(disk.clone()));
    let after_restart = run_scored(&restarted, request(40, 97, 6));
    assert_eq!(after_restart, (first.0, 96));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_idle_engine_copies_the_next_evicted_pages_down_ahead_of_eviction() {
    let host = tiers(64 << 20, None);
    let handle = engine(12, |c| c.kv_tiers = Some(host.clone()));
    let first = run_scored(&handle, request(50, 97, 6));
    // Nothing else to do: the six finished blocks go to host memory
    // before anything evicts them.
    wait_until("idle copies", || host.usage().host_pages >= 6);
    let copied = host.usage().host_pages;
    run(&handle, request(51, 180, 2));
    run(&handle, request(52, 180, 2));
    let again = run_scored(&handle, request(50, 97, 6));
    assert_eq!(again, (first.0, 96));
    assert!(host.usage().hits[0] >= 6);
    assert!(copied <= 12, "never more than the pool holds: {copied}");
}
