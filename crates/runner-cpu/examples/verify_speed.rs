//! Times one decode step of the real SmolLM2 GGUF that runs `m` tokens of a
//! sequence (its last token and `m - 1` proposals, as a speculative step
//! does), with logits for the last token only and for every position, on
//! the native kernels (`f32` as the argument: the exact path):
//! `cargo run -p ingot-runner-cpu --example verify_speed [f32]`.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use ingot_kv_cache::{BlockPool, BlockTable};
use ingot_models::LoadFormat;
use ingot_runner::{ForwardBatch, ModelRunner, ScoredChunk, SequenceChunk};
use ingot_runner_cpu::{CpuRunner, CpuRunnerConfig, CpuWeights};

fn main() {
    let files = ingot_models::open(&ingot_testkit::smollm2_gguf(), LoadFormat::Auto).unwrap();
    let config = files.config.clone();
    let weights = match std::env::args().nth(1).as_deref() {
        Some("f32") => CpuWeights::F32,
        _ => CpuWeights::Native,
    };
    let (num_blocks, block_size) = (64, 16);
    let mut runner = CpuRunner::load(
        config,
        files.tensors.as_ref(),
        CpuRunnerConfig {
            num_blocks,
            block_size,
            weight_dtype: Default::default(),
        },
        weights,
        None,
        &|_, _| {},
    )
    .unwrap();
    let mut pool = BlockPool::new(num_blocks, block_size, false);
    let mut table = BlockTable::new();
    pool.reserve(&mut table, 200).unwrap();
    let tokens: Vec<u32> = (0..200).map(|i| 100 + i * 37 % 9000).collect();
    let prefill = SequenceChunk {
        tokens: &tokens[..100],
        start_pos: 0,
        block_table: table.blocks(),
        group_tables: &[],
    };
    runner
        .forward(&ForwardBatch {
            chunks: vec![prefill],
            ..Default::default()
        })
        .unwrap();
    println!("m  last-row ms  all-rows ms");
    for m in 1..=9 {
        let chunk = SequenceChunk {
            tokens: &tokens[100..100 + m],
            start_pos: 100,
            block_table: table.blocks(),
            group_tables: &[],
        };
        let mut time = |scored: bool| {
            let batch = ForwardBatch {
                chunks: vec![chunk],
                score: if scored && m > 1 {
                    vec![ScoredChunk {
                        chunk: 0,
                        next: &tokens[101..100 + m],
                        top: 0,
                    }]
                } else {
                    Vec::new()
                },
                ..Default::default()
            };
            let reps = 10;
            runner.forward(&batch).unwrap();
            let t = Instant::now();
            for _ in 0..reps {
                runner.forward(&batch).unwrap();
            }
            t.elapsed().as_secs_f64() * 1e3 / reps as f64
        };
        let (last, all) = (time(false), time(true));
        println!("{m}  {last:10.2}  {all:10.2}");
    }
}
