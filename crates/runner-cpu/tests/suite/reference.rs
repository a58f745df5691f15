//! Exactness against an independent f32 reference (tests/reference/
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns
//! llama_reference.py, numpy + the `gguf` package): first-step logits within
//! 1e-3 and 32 greedy tokens identical, for every committed fixture prompt
//! (all decoded in one batch).

use ingot_kv_cache::{BlockPool, BlockTable};
use ingot_models::{LlamaWeights, LoadFormat};
use ingot_runner::{ForwardBatch, ModelRunner, SequenceChunk};
use ingot_runner_cpu::{CpuRunner, CpuRunnerConfig};
use serde_json::Value;

use ingot_testkit::{argmax, max_abs_diff};

fn read_f32(path: &std::path::Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn smollm2_matches_f32_reference() {
    let files = ingot_models::open(&ingot_testkit::smollm2_gguf(), LoadFormat::Auto).unwrap();
    let config = files.config.clone();
    let vocab = config.vocab_size;
    let weights = LlamaWeights::load(&config, files.tensors.as_ref(), &|_, _| {}).unwrap();
    let block_size = 16;
    let num_blocks = 160;
    let mut runner = CpuRunner::new(
        config,
        weights,
        CpuRunnerConfig {
            num_blocks,
            block_size,
            weight_dtype: Default::default(),
        },
    )
    .unwrap();
    let mut pool = BlockPool::new(num_blocks, block_size, false);
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(ingot_testkit::fixture("smollm2/expected.json")).unwrap(),
    )
    .unwrap();
    let cases = expected.as_array().unwrap();
    assert!(cases.len() >= 8, "need at least 8 fixture prompts");
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    // Every prompt decodes in one batch, a row each (the CPU backend is
    // batch-invariant: a row's logits do not depend on the others). One
    // pass over the f32 weights per step instead of one per prompt: the
    // decode is bound by reading them.
    struct Case {
        name: String,
        tokens: Vec<u32>,
        want: Vec<u32>,
        got: Vec<u32>,
        table: BlockTable,
        pos: usize,
    }
    let mut runs: Vec<Case> = cases
        .iter()
        .map(|case| {
            let prompt = ids(&case["prompt_ids"]);
            let want = ids(&case["greedy_ids"]);
            let mut table = BlockTable::new();
            pool.reserve(&mut table, prompt.len() + want.len()).unwrap();
            Case {
                name: case["name"].as_str().unwrap().to_string(),
                tokens: prompt,
                want,
                got: Vec::new(),
                table,
                pos: 0,
            }
        })
        .collect();
    let mut first = true;
    while runs.iter().any(|r| r.got.len() < r.want.len()) {
        let live: Vec<usize> = (0..runs.len())
            .filter(|&i| runs[i].got.len() < runs[i].want.len())
            .collect();
        let batch = ForwardBatch {
            chunks: live
                .iter()
                .map(|&i| SequenceChunk {
                    tokens: &runs[i].tokens[runs[i].pos..],
                    start_pos: runs[i].pos,
                    block_table: runs[i].table.blocks(),
                    group_tables: &[],
                })
                .collect(),
            expect_next: false,
            keep_hidden: false,
            score: Vec::new(),
        };
        let logits = runner.forward(&batch).unwrap().to_vec();
        for (row, &i) in live.iter().enumerate() {
            let logits = &logits[row * vocab..(row + 1) * vocab];
            if first {
                let ref_logits = read_f32(&ingot_testkit::fixture(&format!(
                    "smollm2/{}",
                    cases[i]["logits_file"].as_str().unwrap()
                )));
                let max_err = max_abs_diff(logits, &ref_logits);
                assert!(
                    max_err < 1e-3,
                    "{}: first-step logits max abs error {max_err}",
                    runs[i].name
                );
            }
            let r = &mut runs[i];
            r.pos = r.tokens.len();
            let next = argmax(logits);
            r.got.push(next);
            r.tokens.push(next);
        }
        first = false;
    }
    let mut failures = Vec::new();
    for mut r in runs {
        pool.release(&mut r.table);
        if r.got != r.want {
            let at = r.got.iter().zip(&r.want).position(|(a, b)| a != b);
            failures.push(format!(
                "{}: diverged at step {at:?}: got {:?}, want {:?}",
                r.name, r.got, r.want
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// bf16 weight storage: first-step logits stay within bf16 rounding of the
/// f32 reference and the first greedy token agrees wherever the reference's
/// margin is clear.
#[test]
fn smollm2_bf16_weights_stay_close_to_the_reference() {
    let files = ingot_models::open(&ingot_testkit::smollm2_gguf(), LoadFormat::Auto).unwrap();
    let config = files.config.clone();
    let weights = LlamaWeights::load(&config, files.tensors.as_ref(), &|_, _| {}).unwrap();
    let mut runner = CpuRunner::new(
        config,
        weights,
        CpuRunnerConfig {
            num_blocks: 64,
            block_size: 16,
            weight_dtype: ingot_runner_cpu::WeightDtype::Bf16,
        },
    )
    .unwrap();
    let mut pool = BlockPool::new(64, 16, false);
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(ingot_testkit::fixture("smollm2/expected.json")).unwrap(),
    )
    .unwrap();
    for case in expected.as_array().unwrap() {
        let prompt: Vec<u32> = case["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let ref_logits = read_f32(&ingot_testkit::fixture(&format!(
            "smollm2/{}",
            case["logits_file"].as_str().unwrap()
        )));
        let mut table = BlockTable::new();
        pool.reserve(&mut table, prompt.len()).unwrap();
        let batch = ForwardBatch {
            chunks: vec![SequenceChunk {
                tokens: &prompt,
                start_pos: 0,
                block_table: table.blocks(),
                group_tables: &[],
            }],
            expect_next: false,
            keep_hidden: false,
            score: Vec::new(),
        };
        let logits = runner.forward(&batch).unwrap();
        let scale = ref_logits.iter().fold(0f32, |a, b| a.max(b.abs()));
        let err = max_abs_diff(logits, &ref_logits);
        assert!(
            err < 0.01 * scale,
            "{}: bf16 error {err} vs logit scale {scale}",
            case["name"]
        );
        if case["margins"][0].as_f64().unwrap() > 0.5 {
            assert_eq!(
                argmax(logits),
                case["greedy_ids"][0].as_u64().unwrap() as u32,
                "{}",
                case["name"]
            );
        }
        eprintln!(
            "{}: max abs error {err:.4} (scale {scale:.1})",
            case["name"].as_str().unwrap()
        );
        pool.release(&mut table);
    }
}
