//! AWQ and GPTQ checkpoints end to end on the CPU. The tiny Llama of
//! tests/reference/hf_tiny_models.py (`llama3`, f32 weights) has its linear
//! layers quantized here to 4 bits in groups of 32 (AutoAWQ's min/max
//! quantization, f16 scales) and packed by this file's own packers of the
//! published layouts: AutoAWQ's GEMM and AutoGPTQ's v1 (zero points stored
//! minus one, `g_idx`). Embeddings and LM head are f16, norms f32, in these
//! and in a third, float directory holding the dequantized weights
//! `(q - z) * s` as f32.
//!
//! - exact path (`--cpu-weights f32`): AWQ and GPTQ give the float
//!   directory's logits bit for bit at every step (prefill, then decode);
//! - native path (Q4_1 blocks, int8 activations): AWQ and GPTQ give each
//!   other's logits bit for bit (the same blocks) and stay within the
//!   native-vs-exact bound of moe_models.rs (`check_gguf`: rel L2 < 0.03 at
//!   every step, teacher-forced, and the greedy token equal wherever the
//!   exact path's top-2 margin exceeds twice the logit error);
//! - the stored types `ingot inspect` lists: "AWQ int4 g32" / "GPTQ int4 g32"
//!   for the 14 matrices (GPTQ's `g_idx` not counted), F16 and F32 beside.

use std::path::Path;

use half::f16;
use ingot_kv_cache::{BlockPool, BlockTable};
use ingot_models::gguf::GgmlType;
use ingot_models::{LoadFormat, ModelConfig};
use ingot_runner_cpu::{CpuRunner, CpuWeights};
use ingot_testkit::{argmax, max_abs_diff};
use serde_json::{json, Value};

use crate::hf_models::{
    chunk, forward, generate, load_runner, rel_l2, Reference, BLOCK_SIZE, NUM_BLOCKS,
};

const GROUP: usize = 32;
/// Greedy steps compared (the prompt's, then one token a step).
const STEPS: usize = 8;
/// AutoAWQ's `order_map`: bits `4n..4n + 4` of a word hold output
/// `8c + ORDER_MAP[n]`.
const ORDER_MAP: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// One linear weight `[rows, cols]` (outputs x inputs) in 4 bits: quants
/// `q[o * cols + i]`, zero points and scales `[g * rows + o]`.
struct Quantized {
    rows: usize,
    cols: usize,
    q: Vec<u8>,
    z: Vec<u8>,
    s: Vec<f16>,
}

impl Quantized {
    /// AutoAWQ's `pseudo_quantize_tensor` (zero point, 4 bits) per group of
    /// 32 inputs: `s = (max - min) / 15` (here rounded to f16 first, as the
    /// checkpoint stores it), `z = clamp(-round(min / s), 0, 15)`,
    /// `q = clamp(round(w / s) + z, 0, 15)`.
    fn new(w: &[f32], rows: usize, cols: usize) -> Self {
        let groups = cols / GROUP;
        let mut q = vec![0u8; rows * cols];
        let (mut z, mut s) = (vec![0u8; groups * rows], vec![f16::ZERO; groups * rows]);
        for o in 0..rows {
            for g in 0..groups {
                let span = o * cols + g * GROUP..o * cols + (g + 1) * GROUP;
                let (lo, hi) = w[span.clone()]
                    .iter()
                    .fold((f32::MAX, f32::MIN), |(l, h), &x| (l.min(x), h.max(x)));
                let scale = f16::from_f32((hi - lo).max(1e-5) / 15.0);
                let step = scale.to_f32();
                let zero = (-(lo / step).round()).clamp(0.0, 15.0);
                for i in span {
                    q[i] = ((w[i] / step).round() + zero).clamp(0.0, 15.0) as u8;
                }
                (z[g * rows + o], s[g * rows + o]) = (zero as u8, scale);
            }
        }
        Self {
            rows,
            cols,
            q,
            z,
            s,
        }
    }

    /// The weight the checkpoint means: `(q - z) * s`.
    fn dequantized(&self) -> Vec<f32> {
        let (rows, cols) = (self.rows, self.cols);
        (0..rows * cols)
            .map(|k| {
                let g = (k % cols) / GROUP * rows + k / cols;
                (f32::from(self.q[k]) - f32::from(self.z[g])) * self.s[g].to_f32()
            })
            .collect()
    }

    fn scales(&self, p: &str) -> Tensor {
        let bytes = self.s.iter().flat_map(|s| s.to_le_bytes()).collect();
        (
            format!("{p}.scales"),
            "F16",
            vec![self.s.len() / self.rows, self.rows],
            bytes,
        )
    }

    /// AutoAWQ's `WQLinear_GEMM.from_linear`: `qweight` `[cols, rows / 8]`,
    /// word `c` of input `i` holding output `8c + ORDER_MAP[n]` in bits
    /// `4n`; `qzeros` `[groups, rows / 8]` packed alike.
    fn awq(&self, p: &str) -> Vec<Tensor> {
        let (rows, cols) = (self.rows, self.cols);
        let pack = |nibble: &dyn Fn(usize) -> u8| -> u32 {
            (0..8).fold(0, |w, n| w | u32::from(nibble(ORDER_MAP[n])) << (4 * n))
        };
        let qweight = (0..cols)
            .flat_map(|i| (0..rows / 8).map(move |c| pack(&|j| self.q[(8 * c + j) * cols + i])));
        let qzeros = (0..cols / GROUP)
            .flat_map(|g| (0..rows / 8).map(move |c| pack(&|j| self.z[g * rows + 8 * c + j])));
        vec![
            int32(p, "qweight", vec![cols, rows / 8], qweight),
            int32(p, "qzeros", vec![cols / GROUP, rows / 8], qzeros),
            self.scales(p),
        ]
    }

    /// AutoGPTQ's `QuantLinear.pack` (v1): `qweight` `[cols / 8, rows]`,
    /// input `8r + j` of output `o` in bits `4j` of word `(r, o)`; `qzeros`
    /// `[groups, rows / 8]`, output `8c + j` in bits `4j`, stored as
    /// `z - 1` (4 bits); `g_idx` `i / 32`.
    fn gptq(&self, p: &str) -> Vec<Tensor> {
        let (rows, cols) = (self.rows, self.cols);
        let pack = |nibble: &dyn Fn(usize) -> u8| -> u32 {
            (0..8).fold(0, |w, j| w | u32::from(nibble(j)) << (4 * j))
        };
        let qweight = (0..cols / 8)
            .flat_map(|r| (0..rows).map(move |o| pack(&|j| self.q[o * cols + 8 * r + j])));
        let qzeros = (0..cols / GROUP).flat_map(|g| {
            (0..rows / 8).map(move |c| pack(&|j| (self.z[g * rows + 8 * c + j] + 15) & 15))
        });
        let g_idx = (0..cols).map(|i| (i / GROUP) as u32);
        vec![
            int32(p, "qweight", vec![cols / 8, rows], qweight),
            int32(p, "qzeros", vec![cols / GROUP, rows / 8], qzeros),
            self.scales(p),
            int32(p, "g_idx", vec![cols], g_idx),
        ]
    }
}

/// `(name, safetensors dtype, shape, little-endian bytes)`.
type Tensor = (String, &'static str, Vec<usize>, Vec<u8>);

fn int32(p: &str, suffix: &str, shape: Vec<usize>, words: impl Iterator<Item = u32>) -> Tensor {
    let bytes = words.flat_map(u32::to_le_bytes).collect();
    (format!("{p}.{suffix}"), "I32", shape, bytes)
}

fn floats(name: &str, shape: &[usize], v: &[f32], f16s: bool) -> Tensor {
    let (dtype, bytes) = if f16s {
        let b = v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes());
        ("F16", b.collect())
    } else {
        ("F32", v.iter().flat_map(|x| x.to_le_bytes()).collect())
    };
    (name.to_string(), dtype, shape.to_vec(), bytes)
}

/// Writes `dir/model.safetensors` (8-byte header length, JSON header, data)
/// and `dir/config.json`.
fn write_dir(dir: &Path, config: &Value, tensors: &[Tensor]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let offsets = [data.len(), data.len() + bytes.len()];
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": offsets}),
        );
        data.extend_from_slice(bytes);
    }
    let header = serde_json::to_vec(&header).unwrap();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header);
    file.extend_from_slice(&data);
    std::fs::write(dir.join("model.safetensors"), file).unwrap();
}

/// Writes `float`, `awq` and `gptq` under `root` from the f32 model in `src`.
fn write_quantized(src: &Path, root: &Path) {
    let files = ingot_models::open(src, LoadFormat::Auto).unwrap();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let (mut float, mut awq, mut gptq) = (Vec::new(), Vec::new(), Vec::new());
    for (name, shape) in ingot_models::llama::expected_shapes(&files.config) {
        let w = files.tensors.load(&name).unwrap().data;
        let prefix = name.strip_suffix(".weight").unwrap();
        if shape.len() == 1 || !name.starts_with("model.layers.") {
            // Norms f32, embeddings and LM head f16: the same in all three.
            let t = floats(&name, &shape, &w, shape.len() == 2);
            for dir in [&mut float, &mut awq, &mut gptq] {
                dir.push(t.clone());
            }
            continue;
        }
        let q = Quantized::new(&w, shape[0], shape[1]);
        float.push(floats(&name, &shape, &q.dequantized(), false));
        awq.extend(q.awq(prefix));
        gptq.extend(q.gptq(prefix));
    }
    let with = |quant: Value| {
        let mut c = config.clone();
        c["quantization_config"] = quant;
        c
    };
    let awq_config = json!({"quant_method": "awq", "bits": 4, "group_size": GROUP,
        "zero_point": true, "version": "gemm"});
    let gptq_config = json!({"quant_method": "gptq", "bits": 4, "group_size": GROUP,
        "sym": false, "desc_act": false, "checkpoint_format": "gptq"});
    write_dir(&root.join("float"), &config, &float);
    write_dir(&root.join("awq"), &with(awq_config), &awq);
    write_dir(&root.join("gptq"), &with(gptq_config), &gptq);
}

/// Opens `dir` on the given weight path; checks its stored types (any
/// order) and the type `q_proj` reports.
fn open(dir: &Path, weights: CpuWeights, types: &[(&str, usize)]) -> (ModelConfig, CpuRunner) {
    let files = ingot_models::open(dir, LoadFormat::Auto).unwrap();
    let summary = files.tensors.dtype_summary();
    let mut want: Vec<(String, usize)> = types.iter().map(|&(t, n)| (t.to_string(), n)).collect();
    want.sort();
    assert_eq!(summary, want, "{}", dir.display());
    let q_proj = files
        .tensors
        .stored_type("model.layers.0.self_attn.q_proj.weight");
    let int4 = types.len() == 3;
    assert_eq!(q_proj, int4.then_some(GgmlType::Q4_1), "{}", dir.display());
    let runner = load_runner(&files, weights, None, int4 && weights == CpuWeights::Native);
    (files.config.clone(), runner)
}

/// The logits after `prompt`, then after each next token fed one at a time:
/// `forced`'s, or the greedy ones when `None`.
fn decode(runner: &mut CpuRunner, prompt: &[u32], forced: Option<&[u32]>) -> Vec<Vec<f32>> {
    let mut pool = BlockPool::new(NUM_BLOCKS, BLOCK_SIZE, false);
    let mut table = BlockTable::new();
    let (mut tokens, mut pos, mut rows) = (prompt.to_vec(), 0, Vec::new());
    for step in 0..STEPS {
        pool.reserve(&mut table, tokens.len()).unwrap();
        let row = forward(runner, vec![chunk(&tokens[pos..], pos, &table)]).remove(0);
        pos = tokens.len();
        tokens.push(forced.map_or_else(|| argmax(&row), |f| f[step]));
        rows.push(row);
    }
    rows
}

#[test]
fn awq_and_gptq_directories_match_their_dequantized_floats_exact_and_native() {
    let (_tmp, src) = generate("llama3");
    let r = Reference::read(&src);
    let root = tempfile::tempdir().unwrap();
    write_quantized(&src, root.path());
    let (dir, p) = (|n: &str| root.path().join(n), &r.prompt);
    let float_types = [("F16", 2), ("F32", 19)];
    let types = |label| [(label, 14), ("F16", 2), ("F32", 5)];

    // Exact path: the float directory's greedy run, then AWQ and GPTQ
    // teacher-forced on its tokens, bit for bit.
    let (config, mut exact) = open(&dir("float"), CpuWeights::F32, &float_types);
    let want = decode(&mut exact, p, None);
    let greedy: Vec<u32> = want.iter().map(|row| argmax(row)).collect();
    for (name, label) in [("awq", "AWQ int4 g32"), ("gptq", "GPTQ int4 g32")] {
        let (c, mut runner) = open(&dir(name), CpuWeights::F32, &types(label));
        assert_eq!(c, config, "{name}");
        let got = decode(&mut runner, p, Some(&greedy));
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            let diff = max_abs_diff(g, w);
            assert!(g == w, "{name} exact, step {step}: max abs diff {diff:.3e}");
        }
    }

    // Native path: Q4_1 blocks, the same from either packing.
    let (_, mut awq) = open(&dir("awq"), CpuWeights::Native, &types("AWQ int4 g32"));
    let (_, mut gptq) = open(&dir("gptq"), CpuWeights::Native, &types("GPTQ int4 g32"));
    let native = decode(&mut awq, p, Some(&greedy));
    assert!(
        native == decode(&mut gptq, p, Some(&greedy)),
        "AWQ vs GPTQ native"
    );
    let (mut worst, mut flips) = (0f32, Vec::new());
    for (step, (got, want)) in native.iter().zip(&want).enumerate() {
        worst = worst.max(rel_l2(got, want));
        let mut sorted = want.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if argmax(got) != greedy[step] && sorted[0] - sorted[1] > 2.0 * max_abs_diff(got, want) {
            flips.push(step);
        }
    }
    eprintln!("int4 native vs exact: worst rel L2 {worst:.4}, greedy {greedy:?}");
    assert!(worst < 0.03, "native rel L2 {worst}");
    assert!(flips.is_empty(), "native greedy flips at {flips:?}");
}
