//! Gemma 3 270M on the exact CPU path (weights dequantized to f32) against
//! the independent numpy reference (tests/reference/gemma3_reference.py):
//! the top first-step logits within 1e-3 and 16 greedy tokens identical on
//! every fixture prompt (all decoded in one batch), one of them (965
//! tokens) longer than the 512-token sliding window, whose sliding table
//! holds no more than a window once past it. Chunked prefill across window
//! edges and blocks going back to the pool as they leave the window are
//! checked through the server by tests/e2e/test_gemma3.py: a prompt several
//! windows long
//! (1,670 tokens, prefilled in chunks, decoded across further window edges,
//! then resumed from the prefix cache) equals the reference while the KV
//! gauge shows about a window of sliding blocks held.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use ingot_kv_cache::{BlockPool, BlockTable, NULL_BLOCK};
use ingot_models::{LlamaWeights, LoadFormat};
use ingot_runner::{ForwardBatch, ModelRunner, SequenceChunk};
use ingot_runner_cpu::{CpuRunner, CpuRunnerConfig};
use serde_json::Value;

use ingot_testkit::argmax;

const BLOCK_SIZE: usize = 16;
const NUM_BLOCKS: usize = 200;

fn runner() -> CpuRunner {
    let path = ingot_testkit::fetched("fetch-gemma3-gguf");
    let files = ingot_models::open(&path, LoadFormat::Auto).unwrap();
    let config = files.config.clone();
    let weights = LlamaWeights::load(&config, files.tensors.as_ref(), &|_, _| {}).unwrap();
    let opts = CpuRunnerConfig {
        num_blocks: NUM_BLOCKS,
        block_size: BLOCK_SIZE,
        weight_dtype: Default::default(),
    };
    CpuRunner::new(config, weights, opts).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The runner's pool, with its layer groups (no prefix caching).
fn pool_of(runner: &CpuRunner) -> BlockPool {
    let shape = runner.kv_cache_shape();
    BlockPool::with_layout(
        shape.num_blocks,
        shape.block_size,
        runner.kv_layout(),
        false,
    )
}

/// One prompt being decoded: its tables, tokens and how far it got.
struct Run {
    tables: Vec<BlockTable>,
    tokens: Vec<u32>,
    prompt_len: usize,
    pos: usize,
    got: Vec<u32>,
    first: Vec<f32>,
}

/// Greedy decoding of `n` tokens of every prompt in one batch (the CPU
/// backend is batch-invariant: a row's logits do not depend on the others;
/// one pass over the f32 weights per step instead of one per prompt): each
/// prompt whole, then one token a step, the tables readied before each step
/// as the scheduler does (sliding blocks that left the window go back).
/// Returns each prompt's tokens and its logits after the prompt.
fn greedy(
    runner: &mut CpuRunner,
    pool: &mut BlockPool,
    prompts: &[Vec<u32>],
    n: usize,
) -> Vec<(Vec<u32>, Vec<f32>)> {
    let window = runner.config().block.sliding_window.clone().unwrap().size;
    let vocab = runner.config().vocab_size;
    let mut runs: Vec<Run> = prompts
        .iter()
        .map(|p| Run {
            tables: pool.new_tables(),
            tokens: p.clone(),
            prompt_len: p.len(),
            pos: 0,
            got: Vec::new(),
            first: Vec::new(),
        })
        .collect();
    while runs.iter().any(|r| r.got.len() < n) {
        for r in &mut runs {
            let end = r.tokens.len();
            pool.reserve_groups(&mut r.tables, r.pos, end).unwrap();
            // The sliding group holds no more than its window and the chunk.
            let sliding = &r.tables[1];
            let live_blocks = sliding.num_live_pages() / sliding.pages_per_block();
            assert!(live_blocks <= (window + end - r.pos).div_ceil(BLOCK_SIZE) + 1);
            if r.pos > window + BLOCK_SIZE {
                assert_eq!(sliding.blocks()[0], NULL_BLOCK, "left the window");
            }
        }
        let batch = ForwardBatch {
            chunks: runs
                .iter()
                .map(|r| SequenceChunk::with_tables(&r.tokens[r.pos..], r.pos, &r.tables))
                .collect(),
            expect_next: false,
            keep_hidden: false,
            score: Vec::new(),
        };
        let logits = runner.forward(&batch).unwrap().to_vec();
        for (row, r) in runs.iter_mut().enumerate() {
            let logits = &logits[row * vocab..(row + 1) * vocab];
            let end = r.tokens.len();
            pool.publish_groups(&mut r.tables, &r.tokens, end);
            if r.pos < r.prompt_len {
                r.first = logits.to_vec();
            }
            r.pos = end;
            let next = argmax(logits);
            r.got.push(next);
            r.tokens.push(next);
        }
    }
    runs.into_iter()
        .map(|mut r| {
            pool.release_groups(&mut r.tables);
            (r.got, r.first)
        })
        .collect()
}

#[test]
fn gemma3_matches_f32_reference() {
    let mut runner = runner();
    let mut pool = pool_of(&runner);
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(ingot_testkit::fixture("gemma3/expected.json")).unwrap(),
    )
    .unwrap();
    let cases = expected.as_array().unwrap();
    assert!(cases.len() >= 5, "need at least 5 fixture prompts");
    let window = runner.config().block.sliding_window.clone().unwrap().size;
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| ids(&c["prompt_ids"])).collect();
    let n = ids(&cases[0]["greedy_ids"]).len();
    let results = greedy(&mut runner, &mut pool, &prompts, n);
    let mut failures = Vec::new();
    for ((case, prompt), (got, logits)) in cases.iter().zip(&prompts).zip(results) {
        let name = case["name"].as_str().unwrap();
        let want = ids(&case["greedy_ids"]);
        assert_eq!(want.len(), n, "{name}: every fixture has {n} greedy tokens");
        assert!(prompt.len() >= 64, "{name}: prompts are at least 64 tokens");
        let mut max_err = 0f32;
        for pair in case["first_logits_top"].as_array().unwrap() {
            let (id, value) = (
                pair[0].as_u64().unwrap() as usize,
                pair[1].as_f64().unwrap(),
            );
            max_err = max_err.max((logits[id] - value as f32).abs());
        }
        eprintln!(
            "{name}: {} prompt tokens, top-16 first-step logits max abs error {max_err:.2e}",
            prompt.len()
        );
        assert!(
            max_err < 1e-3,
            "{name}: first-step logits max abs error {max_err}"
        );
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b);
            failures.push(format!(
                "{name}: diverged at step {at:?}: got {got:?}, want {want:?}"
            ));
        }
    }
    assert!(
        prompts.iter().any(|p| p.len() > window),
        "one prompt must be longer than the {window}-token window"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
