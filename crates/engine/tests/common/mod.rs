//! What the engine tests share: a small random-weight Llama with the real
//! SmolLM2 tokenizer on the CPU runner, requests, and running them.
#![allow(clippy::unwrap_used, dead_code)] // each test file uses a part

use std::sync::Arc;

use ingot_core::{FinishReason, Priority, SamplingParams, StopCriteria};
use ingot_engine::{
    start_engine, EngineConfig, EngineHandle, EngineRequest, RequestStream, TokenEvent,
};
use ingot_models::dummy::DummySource;
use ingot_models::{LlamaShape, LlamaWeights, ModelConfig};
use ingot_runner::ModelRunner;
use ingot_runner_cpu::{CpuRunner, CpuRunnerConfig};
use ingot_scheduler::SchedulerConfig;
use ingot_tokenizer::Tokenizer;

pub fn tokenizer() -> Arc<Tokenizer> {
    let gguf = ingot_models::gguf::GgufFile::open(&ingot_testkit::smollm2_gguf()).unwrap();
    Arc::new(Tokenizer::from_gguf(&gguf).unwrap())
}

pub fn tiny_config() -> ModelConfig {
    ModelConfig::llama(LlamaShape {
        hidden: 64,
        intermediate: 128,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        vocab: 49152,
    })
}

pub fn engine(num_blocks: usize, f: impl FnOnce(&mut EngineConfig)) -> EngineHandle {
    engine_on(num_blocks, |r| Box::new(r), f)
}

/// [`engine`] over the runner `wrap` makes of the tiny CPU runner.
pub fn engine_on(
    num_blocks: usize,
    wrap: impl FnOnce(CpuRunner) -> Box<dyn ModelRunner>,
    f: impl FnOnce(&mut EngineConfig),
) -> EngineHandle {
    let config = tiny_config();
    let weights = LlamaWeights::load(&config, &DummySource::new(&config, 1), &|_, _| {}).unwrap();
    let runner = CpuRunner::new(
        config,
        weights,
        CpuRunnerConfig {
            num_blocks,
            block_size: 16,
            weight_dtype: Default::default(),
        },
    )
    .unwrap();
    let mut c = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_batched_tokens: 64,
            ..SchedulerConfig::default()
        },
        ..EngineConfig::default()
    };
    f(&mut c);
    start_engine(wrap(runner), tokenizer(), c).unwrap()
}

pub fn request(seed: u32, len: usize, max_tokens: usize) -> EngineRequest {
    EngineRequest {
        prompt: (0..len as u32)
            .map(|i| (i * 7919 + seed * 104_729) % 49_000 + 10)
            .collect(),
        sampling: SamplingParams::greedy(),
        stop: StopCriteria {
            max_tokens,
            ignore_eos: true,
            ..Default::default()
        },
        priority: Priority::Normal,
        grammar: None,
        speculative: true,
    }
}

/// Runs a request to its end; returns its tokens and finish reason.
pub fn run(handle: &EngineHandle, req: EngineRequest) -> (Vec<u32>, FinishReason) {
    drain(handle.submit(req).unwrap())
}

/// Reads a request's stream to its end: its tokens and finish reason.
pub fn drain(mut s: RequestStream) -> (Vec<u32>, FinishReason) {
    let mut tokens = Vec::new();
    while let Some(e) = s.next_blocking() {
        match e {
            TokenEvent::Token(t) => tokens.push(t.token),
            TokenEvent::Finished(c) => return (tokens, c.reason),
            TokenEvent::Error(e) => panic!("engine error: {e}"),
            TokenEvent::Prompt(_) => {}
        }
    }
    panic!("stream ended without Finished");
}

pub fn run_concurrently(handle: &EngineHandle, reqs: Vec<EngineRequest>) -> Vec<Vec<u32>> {
    // Every request is queued before any is read, so they run together
    // however loaded the machine (a thread each would submit late at times,
    // after the first ones had finished).
    let streams: Vec<RequestStream> = reqs
        .into_iter()
        .map(|r| handle.submit(r).unwrap())
        .collect();
    std::thread::scope(|s| {
        let hs: Vec<_> = streams
            .into_iter()
            .map(|stream| s.spawn(move || drain(stream).0))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

pub fn constrained(
    e: &EngineHandle,
    mut req: EngineRequest,
    spec: ingot_core::GrammarSpec,
) -> EngineRequest {
    req.grammar = Some(e.grammar_compiler().unwrap().compile(&spec).unwrap());
    req.stop.ignore_eos = false;
    req
}
