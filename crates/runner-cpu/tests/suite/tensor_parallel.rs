//! Tensor parallelism's maths without GPUs: each generated model (dense
//! with q/k/v bias or q/k norms, Qwen3-MoE and Mixtral experts) split by
//! its sharding plan over 2 and 4 ranks, every rank loaded from its slices
//! (`ShardedSource`), computed in turn with the ranks' block outputs summed
//! (`forward_sharded`): the same logits as the unsharded model, prefill
//! and decode, two sequences at once. Each model has two KV heads, so 4
//! ranks replicate them.

use ingot_kv_cache::{BlockPool, BlockTable};
use ingot_models::parallel::{ShardPlan, ShardedSource};
use ingot_models::{LlamaWeights, LoadFormat, ModelConfig, TensorSource};
use ingot_runner::{ForwardBatch, ModelRunner};
use ingot_runner_cpu::{forward_sharded, CpuRunner, CpuRunnerConfig};
use ingot_testkit::argmax;

use crate::hf_models::{chunk, generate, rel_l2, Reference, BLOCK_SIZE, NUM_BLOCKS};

fn runner(config: &ModelConfig, source: &dyn TensorSource) -> CpuRunner {
    let weights = LlamaWeights::load(config, source, &|_, _| {}).unwrap();
    let opts = CpuRunnerConfig {
        num_blocks: NUM_BLOCKS,
        block_size: BLOCK_SIZE,
        weight_dtype: Default::default(),
    };
    CpuRunner::new(config.clone(), weights, opts).unwrap()
}

/// Prefill then decode of two sequences in one batch, unsharded and over
/// `size` ranks; the worst rel L2 of any row.
fn compare(name: &str, size: usize) -> f32 {
    let (_tmp, dir) = generate(name);
    let r = Reference::read(&dir);
    let files = ingot_models::open(&dir, LoadFormat::Auto).unwrap();
    let config = files.config.clone();
    let plan = ShardPlan::new(&config, size).unwrap();
    let source = files.tensors.as_ref();
    let mut whole = runner(&config, source);
    let mut ranks: Vec<CpuRunner> = (0..size)
        .map(|rank| {
            runner(
                &plan.rank_config(rank),
                &ShardedSource::new(source, &plan, rank),
            )
        })
        .collect();
    let mut pool = BlockPool::new(NUM_BLOCKS, BLOCK_SIZE, false);
    let mut tables = [BlockTable::new(), BlockTable::new()];
    let other: Vec<u32> = r.prompt.iter().rev().copied().collect();
    let mut seqs = [r.prompt.clone(), other];
    let mut done = [0, 0];
    let mut worst = 0.0f32;
    for step in 0..4 {
        for (s, t) in seqs.iter().zip(tables.iter_mut()) {
            pool.reserve(t, s.len()).unwrap();
        }
        let chunks = (0..2)
            .map(|i| chunk(&seqs[i][done[i]..], done[i], &tables[i]))
            .collect();
        let batch = ForwardBatch {
            chunks,
            expect_next: false,
            keep_hidden: false,
            score: Vec::new(),
        };
        let want = whole.forward(&batch).unwrap().to_vec();
        let got = forward_sharded(&mut ranks, &batch).unwrap();
        assert_eq!(got.len(), want.len(), "{name}/{size}: logits rows");
        let vocab = config.vocab_size;
        let mut next = [0; 2];
        for (i, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
            worst = worst.max(rel_l2(g, w));
            assert_eq!(argmax(g), argmax(w), "{name}/{size}: step {step} row {i}");
            next[i] = argmax(w);
        }
        for i in 0..2 {
            done[i] = seqs[i].len();
            seqs[i].push(next[i]);
        }
    }
    eprintln!("{name} over {size} ranks: worst rel L2 {worst:.2e}");
    worst
}

#[test]
fn sharded_forward_equals_the_whole_model() {
    // 4 ranks over 2 KV heads: each KV head on two ranks.
    for name in ["qwen2", "qwen3", "qwen3moe", "mixtral"] {
        for size in [2, 4] {
            let worst = compare(name, size);
            assert!(
                worst < 1e-5,
                "{name}/{size}: sharded logits differ by rel L2 {worst}"
            );
        }
    }
}
