//! Mixture-of-experts models end to end on the CPU, against the float64
//! numpy forward pass of tests/reference/hf_tiny_models.py (router softmax,
//! top-k with ties to the lower expert index, renormalised or not, dense
//! layers among sparse ones). Each model has two experts with identical
//! router rows whose tie decides a top-k slot for some tokens.
//!
//! - Hugging Face directories (Qwen3-MoE in bf16 with a dense layer,
//!   Mixtral in f32, per-expert tensors stacked at load): the exact path
//!   against the reference, prefill, decode, chunked and batched.
//! - GGUF files (qwen3moe; Mixtral as llama.cpp writes it, `llama` with
//!   experts; Q8_0 stacked experts): the exact path against the reference,
//!   the native path near it, and both bit-identical alone and batched with
//!   sequences that choose other experts.

use std::path::Path;

use ingot_kv_cache::{BlockPool, BlockTable};
use ingot_models::{Architecture, LoadFormat, ModelConfig, MoeConfig};
use ingot_runner_cpu::{CpuRunner, CpuWeights};
use ingot_testkit::argmax;

use crate::hf_models::{
    check_against_reference, chunk, forward, generate, load_runner, open_model, rel_l2, Reference,
    BLOCK_SIZE, NUM_BLOCKS,
};

fn experts(
    num_experts: usize,
    top_k: usize,
    width: usize,
    normalize: bool,
    dense: &[usize],
) -> Option<MoeConfig> {
    Some(MoeConfig {
        num_experts,
        experts_per_token: top_k,
        expert_intermediate_size: width,
        normalize_top_k: normalize,
        dense_layers: dense.to_vec(),
    })
}

#[test]
fn qwen3moe_directory_with_a_dense_layer_matches_reference() {
    let (_tmp, dir) = generate("qwen3moe");
    let (c, mut runner) = open_model(&dir, "BF16");
    assert_eq!(c.architecture, Architecture::Qwen3Moe);
    assert!(c.qk_norm && !c.qkv_bias && !c.tie_word_embeddings);
    assert_eq!(
        (c.num_layers, c.head_dim, c.intermediate_size),
        (3, 32, 128)
    );
    assert_eq!(c.block.moe, experts(8, 2, 32, false, &[1]));
    // Active: the router and 2 of 8 experts of each sparse layer.
    let expert = 3 * 64 * 32;
    assert_eq!(c.num_params() - c.num_active_params(), 2 * 6 * expert);
    check_against_reference("qwen3moe", &mut runner, &Reference::read(&dir));
}

#[test]
fn mixtral_directory_matches_reference() {
    let (_tmp, dir) = generate("mixtral");
    let (c, mut runner) = open_model(&dir, "F32");
    assert_eq!(c.architecture, Architecture::Mixtral);
    assert!(!c.qk_norm && !c.qkv_bias);
    assert_eq!(c.block.moe, experts(4, 2, 64, true, &[]));
    check_against_reference("mixtral", &mut runner, &Reference::read(&dir));
}

/// Opens `dir/model.gguf` on the given weight path.
fn open_gguf(dir: &Path, weights: CpuWeights) -> (ModelConfig, CpuRunner) {
    let files = ingot_models::open(&dir.join("model.gguf"), LoadFormat::Auto).unwrap();
    assert_eq!(files.format, "gguf");
    let runner = load_runner(&files, weights, None, weights != CpuWeights::F32);
    (files.config.clone(), runner)
}

/// The native kernels, and the AMX tiles where this CPU has them.
fn native_paths() -> Vec<CpuWeights> {
    let mut paths = vec![CpuWeights::Native];
    match ingot_runner_cpu::quant::amx_available() {
        true => paths.push(CpuWeights::Amx),
        false => eprintln!("no AMX-INT8 here: the amx path is not run"),
    }
    paths
}

/// The GGUF on the exact path against the reference, and on the native
/// path (int8 activations) near it: every step's logits, teacher-forced on
/// the reference's tokens, within a few percent, and the greedy tokens
/// equal where the reference's margin exceeds the logit error.
fn check_gguf(name: &str, arch: Architecture, moe: Option<MoeConfig>) {
    let (_tmp, dir) = generate(name);
    let r = Reference::read(&dir);
    let (c, mut exact) = open_gguf(&dir, CpuWeights::F32);
    assert_eq!((c.architecture, c.block.moe.clone()), (arch, moe));
    check_against_reference(name, &mut exact, &r);

    for weights in native_paths() {
        check_native(name, &dir, &r, weights);
    }
}

/// A native path (int8 activations) near the reference: every step's
/// logits, teacher-forced on the reference's tokens, within a few percent,
/// and the greedy tokens equal where the reference's margin exceeds the
/// logit error.
fn check_native(name: &str, dir: &Path, r: &Reference, weights: CpuWeights) {
    let (_, mut native) = open_gguf(dir, weights);
    let mut pool = BlockPool::new(NUM_BLOCKS, BLOCK_SIZE, false);
    let mut table = BlockTable::new();
    let mut tokens = r.prompt.clone();
    let mut pos = 0;
    let (mut worst, mut flips) = (0.0f32, Vec::new());
    for (step, want) in r.logits.iter().enumerate() {
        pool.reserve(&mut table, tokens.len()).unwrap();
        let rows = forward(&mut native, vec![chunk(&tokens[pos..], pos, &table)]);
        let err = rel_l2(&rows[0], want);
        worst = worst.max(err);
        let abs = ingot_testkit::max_abs_diff(&rows[0], want);
        let margin = {
            let mut sorted = want.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            sorted[0] - sorted[1]
        };
        if argmax(&rows[0]) != r.greedy[step] && margin > 2.0 * abs {
            flips.push(step);
        }
        pos = tokens.len();
        tokens.push(r.greedy[step]);
    }
    eprintln!("{name}: {weights:?} path, worst rel L2 vs reference {worst:.4}");
    assert!(worst < 0.03, "{name} {weights:?}: rel L2 {worst}");
    assert!(
        flips.is_empty(),
        "{name} {weights:?}: greedy flips at {flips:?}"
    );
}

#[test]
fn qwen3moe_gguf_matches_reference_exact_and_native() {
    check_gguf(
        "qwen3moe_gguf",
        Architecture::Qwen3Moe,
        experts(8, 2, 32, true, &[]),
    );
}

#[test]
fn mixtral_gguf_as_llama_with_experts_matches_reference_exact_and_native() {
    check_gguf(
        "mixtral_gguf",
        Architecture::Mixtral,
        experts(4, 2, 64, true, &[]),
    );
}

/// Sequence A decoded alone, then with two other sequences in every step
/// (prefills and decodes; their tokens route to other experts): A's logits
/// are bit-identical, on every weight path.
#[test]
fn experts_are_batch_invariant_with_mixed_choices() {
    let (_tmp, dir) = generate("qwen3moe_gguf");
    let r = Reference::read(&dir);
    let a = r.prompt.clone();
    let b: Vec<u32> = a.iter().rev().map(|t| (t * 7 + 3) % 300).collect();
    let c: Vec<u32> = (0..11).map(|i| (i * 29 + 5) % 300).collect();
    for weights in [vec![CpuWeights::F32], native_paths()].concat() {
        let (_, mut runner) = open_gguf(&dir, weights);
        let alone = decode(&mut runner, &[&a], 4);
        let batched = decode(&mut runner, &[&a, &b, &c], 4);
        for (step, (x, y)) in alone.iter().zip(&batched).enumerate() {
            assert!(
                x[0] == y[0],
                "{weights:?}: step {step}: A's logits differ batched (max diff {:.3e})",
                ingot_testkit::max_abs_diff(&x[0], &y[0])
            );
        }
    }
}

/// Prefills `prompts` in one step, then decodes each greedily for `steps`
/// steps in one batch; returns every step's logits rows.
fn decode(runner: &mut CpuRunner, prompts: &[&Vec<u32>], steps: usize) -> Vec<Vec<Vec<f32>>> {
    let mut pool = BlockPool::new(NUM_BLOCKS, BLOCK_SIZE, false);
    let mut tables: Vec<BlockTable> = prompts.iter().map(|_| BlockTable::new()).collect();
    let mut seqs: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
    let mut done = vec![0; prompts.len()];
    let mut out = Vec::new();
    for _ in 0..=steps {
        for (t, s) in tables.iter_mut().zip(&seqs) {
            pool.reserve(t, s.len()).unwrap();
        }
        let chunks = seqs
            .iter()
            .zip(&tables)
            .zip(&done)
            .map(|((s, t), &from)| chunk(&s[from..], from, t))
            .collect();
        let rows = forward(runner, chunks);
        for ((s, d), row) in seqs.iter_mut().zip(done.iter_mut()).zip(&rows) {
            *d = s.len();
            s.push(argmax(row));
        }
        out.push(rows);
    }
    out
}
