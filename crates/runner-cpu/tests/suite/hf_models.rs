//! Hugging Face model directories end to end, against an independent float64
//! numpy forward pass (tests/reference/hf_tiny_models.py, which also writes the
//! tiny random models: config.json + safetensors, see its docstring).
//!
//! Each model is opened with `ingot_models::open`, its resolved config is
//! checked field by field, and the CPU runner's logits are compared with the
//! reference at every greedy step (max abs error < 1e-3 of the largest
//! reference logit): a whole-prompt prefill then one token a step, a chunked
//! prefill whose second chunk starts mid-block and reads the first chunk's
//! cached blocks, batched in one step with a whole prefill of the same prompt,
//! then a batched decode step. Error paths: an unsupported architecture and a
//! tensor of the wrong shape.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::path::{Path, PathBuf};
use std::process::Command;

use ingot_kv_cache::{BlockPool, BlockTable};
use ingot_models::{
    Architecture, LlamaWeights, LoadFormat, ModelConfig, ModelError, ModelFiles, RopeConfig,
    RopeScaling,
};
use ingot_runner::{ForwardBatch, ModelRunner, SequenceChunk};
use ingot_runner_cpu::quant::QuantKind;
use ingot_runner_cpu::{CpuRunner, CpuRunnerConfig, CpuWeights};
use ingot_testkit::{argmax, max_abs_diff};
use serde_json::Value;
use tempfile::TempDir;

/// Token slots per KV block: small, so a 20-token prompt spans 5 blocks and
/// the chunked prefill's split (position 10) falls inside a block.
pub(crate) const BLOCK_SIZE: usize = 4;
pub(crate) const NUM_BLOCKS: usize = 32;
/// Allowed max abs logit error, relative to the largest reference logit.
pub(crate) const REL_TOL: f32 = 1e-3;

/// What hf_tiny_models.py computed for one model.
pub(crate) struct Reference {
    pub prompt: Vec<u32>,
    pub greedy: Vec<u32>,
    /// Row k holds the logits that pick `greedy[k]`; row 0 follows the prompt.
    pub logits: Vec<Vec<f32>>,
    pub min_margin: f64,
    pub logit_scale: f32,
}

impl Reference {
    pub(crate) fn read(dir: &Path) -> Self {
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap())
                .unwrap();
        let ids = |v: &Value| -> Vec<u32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        let floats = |v: &Value| -> Vec<f32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        };
        Self {
            prompt: ids(&v["prompt_ids"]),
            greedy: ids(&v["greedy_ids"]),
            logits: v["logits"].as_array().unwrap().iter().map(floats).collect(),
            min_margin: v["min_margin"].as_f64().unwrap(),
            logit_scale: v["logit_scale"].as_f64().unwrap() as f32,
        }
    }
}

/// Writes model `name` (and its expected.json) into a fresh temporary directory.
pub(crate) fn generate(name: &str) -> (TempDir, PathBuf) {
    let python = ingot_testkit::fetched("python-env");
    let script = ingot_testkit::workspace_root().join("tests/reference/hf_tiny_models.py");
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(&python)
        .arg(&script)
        .arg("--out")
        .arg(tmp.path())
        .args(["--only", name])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{} failed:\n{log}", script.display());
    eprint!("{log}");
    let dir = tmp.path().join(name);
    (tmp, dir)
}

/// The suite's KV pool for a CPU runner.
pub(crate) fn runner_config() -> CpuRunnerConfig {
    CpuRunnerConfig {
        num_blocks: NUM_BLOCKS,
        block_size: BLOCK_SIZE,
        weight_dtype: Default::default(),
    }
}

/// A CPU runner over `files` on the given weight path (`quantize`: the
/// matrices quantized at load); checks whether it took the native
/// quantized kernels.
pub(crate) fn load_runner(
    files: &ModelFiles,
    weights: CpuWeights,
    quantize: Option<QuantKind>,
    native: bool,
) -> CpuRunner {
    let runner = CpuRunner::load(
        files.config.clone(),
        files.tensors.as_ref(),
        runner_config(),
        weights,
        quantize,
        &|_, _| {},
    )
    .unwrap();
    assert_eq!(
        runner.uses_quantized_weights(),
        native,
        "{weights:?} {quantize:?}"
    );
    runner
}

/// Opens the directory, checks the storage dtype, and builds a CPU runner.
pub(crate) fn open_model(dir: &Path, dtype: &str) -> (ModelConfig, CpuRunner) {
    let files = ingot_models::open(dir, LoadFormat::Auto).unwrap();
    assert_eq!(files.format, "safetensors");
    let dtypes = files.tensors.dtype_summary();
    assert!(
        dtypes.len() == 1 && dtypes[0].0 == dtype,
        "stored dtypes {dtypes:?}, want only {dtype}"
    );
    let config = files.config.clone();
    let weights = LlamaWeights::load(&config, files.tensors.as_ref(), &|_, _| {}).unwrap();
    let runner = CpuRunner::new(config.clone(), weights, runner_config()).unwrap();
    (config, runner)
}

/// The shape every generated model shares (see hf_tiny_models.py).
fn assert_common_shape(c: &ModelConfig, layers: usize, head_dim: usize) {
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_layers),
        (64, 128, layers)
    );
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (4, 2, head_dim));
    assert_eq!((c.vocab_size, c.max_context), (300, 256));
}

/// Runs one batch and returns a copy of its logits rows.
pub(crate) fn forward(runner: &mut CpuRunner, chunks: Vec<SequenceChunk<'_>>) -> Vec<Vec<f32>> {
    let vocab = runner.config().vocab_size;
    let n = chunks.len();
    let logits = runner
        .forward(&ForwardBatch {
            chunks,
            expect_next: false,
            keep_hidden: false,
            score: Vec::new(),
        })
        .unwrap();
    assert_eq!(logits.len(), n * vocab);
    logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect()
}

pub(crate) fn chunk<'a>(
    tokens: &'a [u32],
    start_pos: usize,
    table: &'a BlockTable,
) -> SequenceChunk<'a> {
    SequenceChunk {
        tokens,
        start_pos,
        block_table: table.blocks(),
        group_tables: &[],
    }
}

/// Collects logit comparisons, so one run reports every failing step.
struct Checker {
    tol: f32,
    worst: f32,
    failures: Vec<String>,
}

impl Checker {
    fn compare(&mut self, what: &str, got: &[f32], want: &[f32]) {
        let err = max_abs_diff(got, want);
        self.worst = self.worst.max(err);
        if err >= self.tol {
            self.failures.push(format!(
                "{what}: max abs error {err:.3e} >= {:.3e}",
                self.tol
            ));
        }
    }
}

/// Every comparison of one model against its reference; panics with all failures.
pub(crate) fn check_against_reference(name: &str, runner: &mut CpuRunner, r: &Reference) {
    let mut pool = BlockPool::new(NUM_BLOCKS, BLOCK_SIZE, false);
    let mut check = Checker {
        tol: REL_TOL * r.logit_scale,
        worst: 0.0,
        failures: Vec::new(),
    };

    // 1. Whole prompt, then one token a step; blocks reserved as the sequence grows.
    let mut a = BlockTable::new();
    let mut tokens = r.prompt.clone();
    let mut got = Vec::new();
    let mut pos = 0;
    let mut prefill = Vec::new();
    for (step, want) in r.logits.iter().enumerate() {
        pool.reserve(&mut a, tokens.len()).unwrap();
        let rows = forward(runner, vec![chunk(&tokens[pos..], pos, &a)]);
        check.compare(&format!("step {step}"), &rows[0], want);
        if step == 0 {
            prefill = rows[0].clone();
        }
        let next = argmax(&rows[0]);
        got.push(next);
        pos = tokens.len();
        tokens.push(next);
    }
    if got != r.greedy {
        check
            .failures
            .push(format!("greedy tokens {got:?}, want {:?}", r.greedy));
    }

    // 2. Chunked prefill of sequence B (split mid-block), its second chunk in
    // one batch with a whole prefill of C; then one batched decode step. B and
    // C reserve in turns, so their blocks interleave in the pool.
    let (mut b, mut c) = (BlockTable::new(), BlockTable::new());
    let total = r.prompt.len() + 1;
    for n in (BLOCK_SIZE..total + BLOCK_SIZE).step_by(BLOCK_SIZE) {
        pool.reserve(&mut b, n.min(total)).unwrap();
        pool.reserve(&mut c, n.min(total)).unwrap();
    }
    let split = r.prompt.len() / 2;
    assert_ne!(
        split % BLOCK_SIZE,
        0,
        "the split should fall inside a block"
    );
    forward(runner, vec![chunk(&r.prompt[..split], 0, &b)]);
    let rows = forward(
        runner,
        vec![
            chunk(&r.prompt[split..], split, &b),
            chunk(&r.prompt, 0, &c),
        ],
    );
    check.compare(
        &format!("chunked prefill (split at {split})"),
        &rows[0],
        &r.logits[0],
    );
    check.compare("whole prefill batched with it", &rows[1], &r.logits[0]);
    let same = max_abs_diff(&rows[0], &prefill).max(max_abs_diff(&rows[1], &prefill));
    let first = [r.greedy[0]];
    let rows = forward(
        runner,
        vec![
            chunk(&first, r.prompt.len(), &b),
            chunk(&first, r.prompt.len(), &c),
        ],
    );
    check.compare("batched decode (B)", &rows[0], &r.logits[1]);
    check.compare("batched decode (C)", &rows[1], &r.logits[1]);
    for t in [&mut a, &mut b, &mut c] {
        pool.release(t);
    }

    eprintln!(
        "{name}: max abs logit error {:.2e} (tolerance {:.2e}, max |logit| {:.2}), \
         chunked vs whole prefill {same:.2e}, reference min margin {:.4}",
        check.worst, check.tol, r.logit_scale, r.min_margin
    );
    assert!(
        check.failures.is_empty(),
        "{name}:\n{}",
        check.failures.join("\n")
    );
}

#[test]
fn llama3_rope_scaling_untied_f32_matches_reference() {
    let (_tmp, dir) = generate("llama3");
    let (c, mut runner) = open_model(&dir, "F32");
    assert_eq!(c.architecture, Architecture::Llama);
    assert_common_shape(&c, 2, 16);
    assert!(!c.qkv_bias && !c.qk_norm && !c.tie_word_embeddings);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(
        c.rope,
        RopeConfig {
            theta: 500000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 64,
            },
        }
    );
    check_against_reference("llama3", &mut runner, &Reference::read(&dir));
}

#[test]
fn qwen2_bias_tied_bf16_matches_reference() {
    let (_tmp, dir) = generate("qwen2");
    let (c, mut runner) = open_model(&dir, "BF16");
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert_common_shape(&c, 2, 16);
    assert!(c.qkv_bias && !c.qk_norm && c.tie_word_embeddings);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(
        c.rope,
        RopeConfig {
            theta: 1e6,
            scaling: RopeScaling::None,
        }
    );
    check_against_reference("qwen2", &mut runner, &Reference::read(&dir));
}

#[test]
fn qwen3_qk_norm_wide_heads_f16_matches_reference() {
    let (_tmp, dir) = generate("qwen3");
    let (c, mut runner) = open_model(&dir, "F16");
    assert_eq!(c.architecture, Architecture::Qwen3);
    // head_dim 32 is not hidden / heads (16): q is 128 wide, o_proj maps 128 -> 64.
    assert_common_shape(&c, 3, 32);
    assert_eq!((c.q_dim(), c.kv_dim()), (128, 64));
    assert!(!c.qkv_bias && c.qk_norm && !c.tie_word_embeddings);
    assert_eq!(c.rope.scaling, RopeScaling::None);
    check_against_reference("qwen3", &mut runner, &Reference::read(&dir));
}

#[test]
fn sharded_llama_linear_rope_matches_reference() {
    let (_tmp, dir) = generate("sharded");
    assert!(dir.join("model.safetensors.index.json").is_file());
    assert!(!dir.join("model.safetensors").exists());
    let (c, mut runner) = open_model(&dir, "F32");
    assert_eq!(c.architecture, Architecture::Llama);
    assert_common_shape(&c, 3, 16);
    assert!(!c.qkv_bias && !c.qk_norm && !c.tie_word_embeddings);
    // Legacy `"type": "linear"` key.
    assert_eq!(
        c.rope,
        RopeConfig {
            theta: 10000.0,
            scaling: RopeScaling::Linear { factor: 2.0 },
        }
    );
    check_against_reference("sharded", &mut runner, &Reference::read(&dir));
}

fn write_config(dir: &Path, config: &Value) {
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
}

#[test]
fn unsupported_architecture_is_named() {
    // Llama-shaped fields, so only the architecture is wrong.
    let tmp = tempfile::tempdir().unwrap();
    write_config(
        tmp.path(),
        &serde_json::json!({
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 300,
        }),
    );
    let err = ingot_models::open(tmp.path(), LoadFormat::Auto)
        .err()
        .expect("GPT-2 must be rejected");
    assert!(
        matches!(&err, ModelError::UnsupportedArchitecture { name } if name == "GPT2LMHeadModel"),
        "{err:?}"
    );
    assert!(err.to_string().contains("GPT2LMHeadModel"), "{err}");
}

#[test]
fn real_gpt2_config_names_its_architecture() {
    // openai-community/gpt2's config.json as transformers writes it.
    let tmp = tempfile::tempdir().unwrap();
    write_config(
        tmp.path(),
        &serde_json::json!({
            "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
            "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
            "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
            "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
            "resid_pdrop": 0.1, "summary_activation": null, "summary_first_dropout": 0.1,
            "summary_proj_to_labels": true, "summary_type": "cls_index", "summary_use_proj": true,
            "vocab_size": 50257,
        }),
    );
    let err = ingot_models::open(tmp.path(), LoadFormat::Auto)
        .err()
        .expect("GPT-2 must be rejected");
    assert!(err.to_string().contains("GPT2LMHeadModel"), "{err}");
}

/// Writes zero-filled f32 tensors as one safetensors file (format: 8-byte
/// little-endian header length, JSON header, raw data).
fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>)]) {
    let mut header = serde_json::Map::new();
    let mut offset = 0;
    for (name, shape) in tensors {
        let bytes = 4 * shape.iter().product::<usize>();
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let header = serde_json::to_vec(&header).unwrap();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header);
    file.resize(file.len() + offset, 0);
    std::fs::write(path, file).unwrap();
}

#[test]
fn wrong_tensor_shape_is_a_shape_mismatch_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    write_config(
        tmp.path(),
        &serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 300, "tie_word_embeddings": false,
        }),
    );
    let config = ingot_models::hf::load_config(&tmp.path().join("config.json")).unwrap();
    // Every tensor right except one, stored transposed: same element count,
    // so only the shape check can catch it.
    let bad = "model.layers.1.mlp.down_proj.weight";
    let tensors: Vec<_> = ingot_models::llama::expected_shapes(&config)
        .into_iter()
        .map(|(name, mut shape)| {
            if name == bad {
                shape.reverse();
            }
            (name, shape)
        })
        .collect();
    write_safetensors(&tmp.path().join("model.safetensors"), &tensors);
    let files = ingot_models::open(tmp.path(), LoadFormat::Auto).unwrap();
    let err = LlamaWeights::load(&config, files.tensors.as_ref(), &|_, _| {}).unwrap_err();
    match &err {
        ModelError::ShapeMismatch {
            name,
            expected,
            got,
        } => {
            assert_eq!(name, bad);
            assert_eq!(
                (expected.as_slice(), got.as_slice()),
                (&[64, 128][..], &[128, 64][..])
            );
        }
        other => panic!("want ShapeMismatch for {bad}, got {other:?}"),
    }
    assert!(err.to_string().contains(bad), "{err}");
}

/// Relative L2 distance of `got` from `want`.
pub(crate) fn rel_l2(got: &[f32], want: &[f32]) -> f32 {
    let err: f32 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let norm: f32 = want.iter().map(|b| b * b).sum();
    (err / norm).sqrt()
}

#[test]
fn hf_directory_quantized_at_load_runs_native_and_stays_near_the_reference() {
    // `--quantization q8_0|q4_0|q4_k` on a Hugging Face directory: every
    // weight matrix goes to blocks on the native kernels; first-step logits
    // stay near the float64 reference, 8-bit closer than 4-bit.
    let (_tmp, dir) = generate("llama3");
    let r = Reference::read(&dir);
    let files = ingot_models::open(&dir, LoadFormat::Auto).unwrap();
    let mut errs = Vec::new();
    for kind in [QuantKind::Q8_0, QuantKind::Q4_0, QuantKind::Q4K] {
        let mut runner = load_runner(&files, CpuWeights::Native, Some(kind), true);
        let mut pool = BlockPool::new(NUM_BLOCKS, BLOCK_SIZE, false);
        let mut table = BlockTable::new();
        pool.reserve(&mut table, r.prompt.len()).unwrap();
        let rows = forward(&mut runner, vec![chunk(&r.prompt, 0, &table)]);
        errs.push(rel_l2(&rows[0], &r.logits[0]));
    }
    eprintln!(
        "rel L2 vs reference: q8_0 {:.4}, q4_0 {:.4}, q4_k {:.4}",
        errs[0], errs[1], errs[2]
    );
    assert!(errs[0] < 0.05, "q8_0 {errs:?}");
    assert!(errs[1] < 0.3 && errs[2] < 0.3, "4-bit {errs:?}");
    assert!(errs[0] < errs[1], "q8_0 should beat q4_0: {errs:?}");
}
