//! Hugging Face model directories: `config.json` and safetensors weights
//! (single file or sharded through `model.safetensors.index.json`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use crate::{
    Architecture, BlockOptions, HostTensor, ModelConfig, ModelError, MoeConfig, RopeConfig,
    RopeScaling, TensorSource,
};

/// The subset of `config.json` we read; optional fields get HF defaults.
#[derive(Debug, Deserialize)]
struct RawConfig {
    #[serde(default)]
    architectures: Vec<String>,
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    #[serde(default = "default_max_positions")]
    max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    rope_theta: f64,
    rope_scaling: Option<RawRopeScaling>,
    #[serde(default)]
    tie_word_embeddings: bool,
    attention_bias: Option<bool>,
    hidden_act: Option<String>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    /// Qwen3-MoE's expert count (Mixtral: `num_local_experts`).
    #[serde(alias = "num_local_experts")]
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    /// Qwen3-MoE's expert width (Mixtral's is `intermediate_size`).
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    #[serde(default)]
    mlp_only_layers: Vec<usize>,
    decoder_sparse_step: Option<usize>,
}

/// Just enough of `config.json` to name the architecture before the rest
/// is parsed, so an unsupported model is reported as such.
#[derive(Debug, Deserialize)]
struct ArchitectureOnly {
    #[serde(default)]
    architectures: Vec<String>,
    model_type: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawRopeScaling {
    #[serde(alias = "type")]
    rope_type: String,
    #[serde(default = "one")]
    factor: f64,
    #[serde(default = "one")]
    low_freq_factor: f64,
    #[serde(default = "four")]
    high_freq_factor: f64,
    original_max_position_embeddings: Option<usize>,
}

fn default_max_positions() -> usize {
    2048
}
fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    10000.0
}
fn one() -> f64 {
    1.0
}
fn four() -> f64 {
    4.0
}

/// Reads and resolves `config.json`.
pub fn load_config(path: &Path) -> Result<ModelConfig, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |e: serde_json::Error| ModelError::ConfigFile {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let arch: ArchitectureOnly = serde_json::from_str(&text).map_err(bad)?;
    let name = arch.architectures.first().cloned().or(arch.model_type);
    Architecture::from_name(name.as_deref().unwrap_or("unknown"))?;
    let raw: RawConfig = serde_json::from_str(&text).map_err(bad)?;
    resolve(raw)
}

fn resolve(raw: RawConfig) -> Result<ModelConfig, ModelError> {
    let name = raw
        .architectures
        .first()
        .cloned()
        .or(raw.model_type.clone())
        .unwrap_or_default();
    let architecture = Architecture::from_name(&name)?;
    if architecture == Architecture::Gemma3 {
        return Err(ModelError::InvalidConfig(
            "Gemma 3 loads from GGUF files; Hugging Face directories of it are not supported"
                .into(),
        ));
    }
    let moe = moe_of(&raw, architecture)?;
    let scaling = match raw.rope_scaling {
        None => RopeScaling::None,
        Some(s) => match s.rope_type.as_str() {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: s.factor as f32,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: s.factor as f32,
                low_freq_factor: s.low_freq_factor as f32,
                high_freq_factor: s.high_freq_factor as f32,
                original_max_position: s.original_max_position_embeddings.ok_or_else(|| {
                    ModelError::InvalidConfig(
                        "llama3 rope_scaling needs original_max_position_embeddings".into(),
                    )
                })?,
            },
            other => {
                return Err(ModelError::InvalidConfig(format!(
                    "unsupported rope_scaling type '{other}'"
                )))
            }
        },
    };
    if let Some(act) = raw.hidden_act.as_deref().filter(|a| *a != "silu") {
        return Err(ModelError::InvalidConfig(format!(
            "hidden_act '{act}' is not supported (only silu)"
        )));
    }
    // Llama/Mistral/Qwen3 `attention_bias` also adds an o_proj bias, which
    // this decoder does not have; refuse rather than compute the wrong thing.
    if raw.attention_bias == Some(true) && architecture != Architecture::Qwen2 {
        return Err(ModelError::InvalidConfig(
            "attention_bias=true (biased o_proj) is not supported for this architecture".into(),
        ));
    }
    let mut max_context = raw.max_position_embeddings;
    // Sliding-window attention is not implemented: serve only the context
    // where it equals full attention.
    if let Some(window) = raw
        .sliding_window
        .filter(|_| raw.use_sliding_window != Some(false))
    {
        if matches!(architecture, Architecture::Mistral | Architecture::Mixtral)
            && window < max_context
        {
            tracing::warn!(
                window,
                "sliding window attention: capping the context at the window"
            );
            max_context = window;
        }
    }
    let heads = raw.num_attention_heads;
    let config = ModelConfig {
        architecture,
        hidden_size: raw.hidden_size,
        intermediate_size: raw.intermediate_size,
        num_layers: raw.num_hidden_layers,
        num_heads: heads,
        num_kv_heads: raw.num_key_value_heads.unwrap_or(heads),
        head_dim: raw
            .head_dim
            .unwrap_or(raw.hidden_size.checked_div(heads).unwrap_or(0)),
        vocab_size: raw.vocab_size,
        max_context,
        rms_norm_eps: raw.rms_norm_eps as f32,
        rope: RopeConfig {
            theta: raw.rope_theta as f32,
            scaling,
        },
        qkv_bias: raw
            .attention_bias
            .unwrap_or(architecture == Architecture::Qwen2),
        qk_norm: matches!(architecture, Architecture::Qwen3 | Architecture::Qwen3Moe),
        tie_word_embeddings: raw.tie_word_embeddings,
        shard: None,
        block: BlockOptions {
            moe,
            ..Default::default()
        },
    };
    config.validate()?;
    Ok(config)
}

/// The experts of a Qwen3-MoE or Mixtral config (transformers'
/// `Qwen3MoeConfig`, `MixtralConfig`); `None` for dense architectures.
fn moe_of(raw: &RawConfig, architecture: Architecture) -> Result<Option<MoeConfig>, ModelError> {
    let missing = |field: &str| {
        ModelError::InvalidConfig(format!("{} config.json lacks {field}", architecture.name()))
    };
    let (expert_width, normalize, dense_layers) = match architecture {
        Architecture::Mixtral => (raw.intermediate_size, true, Vec::new()),
        Architecture::Qwen3Moe => {
            let step = raw.decoder_sparse_step.unwrap_or(1).max(1);
            let dense: Vec<usize> = (0..raw.num_hidden_layers)
                .filter(|i| raw.mlp_only_layers.contains(i) || !(i + 1).is_multiple_of(step))
                .collect();
            let width = raw
                .moe_intermediate_size
                .ok_or_else(|| missing("moe_intermediate_size"))?;
            (width, raw.norm_topk_prob.unwrap_or(false), dense)
        }
        _ => return Ok(None),
    };
    let num_experts = raw.num_experts.ok_or_else(|| missing("num_experts"))?;
    Ok(Some(MoeConfig {
        num_experts,
        experts_per_token: raw
            .num_experts_per_tok
            .ok_or_else(|| missing("num_experts_per_tok"))?,
        expert_intermediate_size: expert_width,
        normalize_top_k: normalize,
        dense_layers,
    }))
}

/// Where a canonical tensor's values are in the files.
enum Parts {
    None,
    /// One tensor.
    One(String),
    /// One tensor per expert, stacked in expert order.
    Stack(Vec<String>),
    /// Half `.1` (0: the gate rows, 1: the up rows) of every expert of a
    /// fused `[experts, 2 width, hidden]` gate/up tensor.
    Half(String, usize),
}

/// Safetensors weights of one directory, memory-mapped.
pub struct SafetensorsSource {
    files: Vec<(PathBuf, Mmap)>,
    /// Tensor name → index into `files`.
    index: HashMap<String, usize>,
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

impl SafetensorsSource {
    /// Maps `model.safetensors` or every shard named by the index.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let index_path = dir.join("model.safetensors.index.json");
        let shard_names: Vec<String> = if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path).map_err(|source| ModelError::Io {
                path: index_path.clone(),
                source,
            })?;
            let idx: ShardIndex =
                serde_json::from_str(&text).map_err(|e| ModelError::ConfigFile {
                    path: index_path.clone(),
                    message: e.to_string(),
                })?;
            let mut names: Vec<String> = idx.weight_map.into_values().collect();
            names.sort();
            names.dedup();
            names
        } else {
            vec!["model.safetensors".to_string()]
        };
        let mut files = Vec::new();
        let mut index = HashMap::new();
        for shard in shard_names {
            let path = dir.join(&shard);
            let file = std::fs::File::open(&path).map_err(|source| ModelError::Io {
                path: path.clone(),
                source,
            })?;
            // SAFETY: the map is read-only; a file truncated under us is a
            // user error we cannot detect cheaply, as in every mmap loader.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|source| ModelError::Io {
                path: path.clone(),
                source,
            })?;
            let st = SafeTensors::deserialize(&mmap).map_err(|e| ModelError::Safetensors {
                path: path.clone(),
                message: e.to_string(),
            })?;
            for name in st.names() {
                index.insert(name.to_string(), files.len());
            }
            files.push((path, mmap));
        }
        Ok(Self { files, index })
    }

    fn with_tensor<T>(
        &self,
        name: &str,
        f: impl FnOnce(safetensors::tensor::TensorView<'_>) -> Result<T, ModelError>,
    ) -> Result<T, ModelError> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })?;
        let (path, mmap) = &self.files[i];
        let st = SafeTensors::deserialize(mmap).map_err(|e| ModelError::Safetensors {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let view = st.tensor(name).map_err(|e| ModelError::Safetensors {
            path: path.clone(),
            message: e.to_string(),
        })?;
        f(view)
    }
}

impl SafetensorsSource {
    /// The tensors of the files behind canonical name `name`: itself, or
    /// Mixtral's name for a router, or for a stack of experts
    /// ([`crate::llama::EXPERTS_GATE`]) one tensor per expert (the published
    /// checkpoints) or transformers 5's fused `experts.gate_up_proj` /
    /// `experts.down_proj` parameters.
    fn parts_of(&self, name: &str) -> Parts {
        if self.index.contains_key(name) {
            return Parts::One(name.to_string());
        }
        let Some((layer, module)) = name
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split_once('.'))
        else {
            return Parts::None;
        };
        let has = |s: &str| {
            let n = format!("model.layers.{layer}.{s}");
            self.index.contains_key(&n).then_some(n)
        };
        let (qwen, mixtral, half) = match module {
            "mlp.gate.weight" => {
                return has("block_sparse_moe.gate.weight").map_or(Parts::None, Parts::One)
            }
            "mlp.experts.gate_proj.weight" => ("gate_proj", "w1", Some(0)),
            "mlp.experts.up_proj.weight" => ("up_proj", "w3", Some(1)),
            "mlp.experts.down_proj.weight" => ("down_proj", "w2", None),
            _ => return Parts::None,
        };
        for prefix in ["mlp", "block_sparse_moe"] {
            let fused = match half {
                Some(h) => {
                    has(&format!("{prefix}.experts.gate_up_proj")).map(|n| Parts::Half(n, h))
                }
                None => has(&format!("{prefix}.experts.down_proj")).map(Parts::One),
            };
            if let Some(parts) = fused {
                return parts;
            }
        }
        for expert in [
            |e: usize, q: &str, _: &str| format!("mlp.experts.{e}.{q}.weight"),
            |e: usize, _: &str, m: &str| format!("block_sparse_moe.experts.{e}.{m}.weight"),
        ] {
            let names: Vec<String> = (0..)
                .map_while(|e| has(&expert(e, qwen, mixtral)))
                .collect();
            if !names.is_empty() {
                return Parts::Stack(names);
            }
        }
        Parts::None
    }

    /// One file tensor as f32.
    fn load_one(&self, name: &str) -> Result<HostTensor, ModelError> {
        self.with_tensor(name, |view| {
            let bytes = view.data();
            let data: Vec<f32> = match view.dtype() {
                Dtype::F32 => bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                Dtype::F16 => bytes
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                Dtype::BF16 => bytes
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                Dtype::F8_E4M3 => {
                    let values: Vec<f32> = bytes.iter().map(|&b| e4m3_to_f32(b)).collect();
                    return self.scale_fp8(name, view.shape(), values);
                }
                other => {
                    return Err(ModelError::UnsupportedDtype {
                        name: name.to_string(),
                        dtype: format!("{other:?}"),
                    })
                }
            };
            Ok(HostTensor::new(view.shape().to_vec(), data))
        })
    }
}

/// An OCP FP8 e4m3 byte as f32 (4 exponent bits, bias 7, 3 mantissa bits,
/// no infinities; 0x7f and 0xff are NaN).
fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (exp, man) = (i32::from((b >> 3) & 0xf), f32::from(b & 7));
    if exp == 15 && man == 7.0 {
        return f32::NAN;
    }
    let magnitude = if exp == 0 {
        man / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    };
    sign * magnitude
}

impl SafetensorsSource {
    /// An FP8 checkpoint's weight (`values`: its e4m3 bytes decoded) times
    /// its scale, the way the published layouts store it: compressed-tensors
    /// and FBGEMM's `<name>_scale` (one per tensor, or per output row), or
    /// the block-wise `<name>_scale_inv` of DeepSeek-V3 and Qwen3 FP8
    /// (one per block of rows x columns, 128 x 128 in practice; the block
    /// is read from the two shapes). Activation scales (`input_scale`)
    /// are not needed: activations stay in bf16/f32.
    fn scale_fp8(
        &self,
        name: &str,
        shape: &[usize],
        mut values: Vec<f32>,
    ) -> Result<HostTensor, ModelError> {
        let scale_of = |suffix: &str| {
            let n = format!("{name}{suffix}");
            self.index.contains_key(&n).then_some(n)
        };
        let refuse = |why: String| ModelError::UnsupportedDtype {
            name: name.to_string(),
            dtype: format!("F8_E4M3 ({why})"),
        };
        if values.is_empty() {
            return Ok(HostTensor::new(shape.to_vec(), values));
        }
        let Some(scale_name) = scale_of("_scale").or_else(|| scale_of("_scale_inv")) else {
            return Err(refuse(format!(
                "no {name}_scale or {name}_scale_inv beside it"
            )));
        };
        let scale = self.load_one(&scale_name)?;
        let (rows, cols) = match shape {
            [rows, cols] => (*rows, *cols),
            _ => (1, values.len()),
        };
        let per_row = rows > 1 && scale.data.len() == rows && scale.shape.first() == Some(&rows);
        if scale.data.len() == 1 {
            values.iter_mut().for_each(|v| *v *= scale.data[0]);
        } else if per_row {
            for (row, s) in values.chunks_exact_mut(cols).zip(&scale.data) {
                row.iter_mut().for_each(|v| *v *= s);
            }
        } else if let [s_rows, s_cols] = scale.shape[..] {
            let block = |n: usize, s: usize| n.div_ceil(s.max(1)).next_power_of_two();
            let (b0, b1) = (block(rows, s_rows), block(cols, s_cols));
            if rows.div_ceil(b0) != s_rows || cols.div_ceil(b1) != s_cols {
                return Err(refuse(format!(
                    "scales {:?} fit no block size of a {rows} x {cols} weight",
                    scale.shape
                )));
            }
            for (r, row) in values.chunks_exact_mut(cols).enumerate() {
                let scales = &scale.data[r / b0 * s_cols..(r / b0 + 1) * s_cols];
                for (c, v) in row.iter_mut().enumerate() {
                    *v *= scales[c / b1];
                }
            }
        } else {
            return Err(refuse(format!(
                "scales {:?} for a {rows} x {cols} weight",
                scale.shape
            )));
        }
        Ok(HostTensor::new(shape.to_vec(), values))
    }
}

impl TensorSource for SafetensorsSource {
    /// A tensor of the files, or a stack of per-expert tensors (each of the
    /// first expert's shape) under its canonical name.
    fn load(&self, name: &str) -> Result<HostTensor, ModelError> {
        match self.parts_of(name) {
            Parts::None => Err(ModelError::MissingTensor {
                name: name.to_string(),
            }),
            Parts::One(file_name) => self.load_one(&file_name),
            Parts::Half(file_name, half) => {
                let t = self.load_one(&file_name)?;
                let [experts, rows, cols] = t.shape[..] else {
                    return Err(ModelError::ShapeMismatch {
                        name: file_name,
                        expected: vec![0, 0, 0],
                        got: t.shape,
                    });
                };
                let width = rows / 2;
                let data = t
                    .data
                    .chunks_exact(rows * cols)
                    .flat_map(|e| &e[half * width * cols..(half + 1) * width * cols])
                    .copied()
                    .collect();
                Ok(HostTensor::new(vec![experts, width, cols], data))
            }
            Parts::Stack(names) => {
                let mut shape = Vec::new();
                let mut data = Vec::new();
                for part in &names {
                    let t = self.load_one(part)?;
                    if shape.is_empty() {
                        shape = t.shape.clone();
                    } else if t.shape != shape {
                        return Err(ModelError::ShapeMismatch {
                            name: part.clone(),
                            expected: shape,
                            got: t.shape,
                        });
                    }
                    data.extend_from_slice(&t.data);
                }
                shape.insert(0, names.len());
                Ok(HostTensor::new(shape, data))
            }
        }
    }

    fn contains(&self, name: &str) -> bool {
        !matches!(self.parts_of(name), Parts::None)
    }

    fn dtype_summary(&self) -> Vec<(String, usize)> {
        let mut counts = BTreeMap::new();
        for name in self.index.keys() {
            if let Ok(dtype) = self.with_tensor(name, |v| Ok(format!("{:?}", v.dtype()))) {
                *counts.entry(dtype).or_insert(0) += 1;
            }
        }
        counts.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_llama3_config_with_defaults() {
        let raw: RawConfig = serde_json::from_str(
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":4096,"intermediate_size":14336,
            "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,
            "max_position_embeddings":131072,"rms_norm_eps":1e-5,"rope_theta":500000.0,
            "rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"}}"#,
        )
        .unwrap();
        let c = resolve(raw).unwrap();
        assert_eq!(c.head_dim, 128);
        assert_eq!(c.kv_dim(), 1024);
        assert!(!c.tie_word_embeddings && !c.qkv_bias && !c.qk_norm);
        assert!(matches!(c.rope.scaling, RopeScaling::Llama3 { .. }));
        // Llama-3.1-8B has 8.03 B parameters.
        assert_eq!(c.num_parameters() / 10_000_000, 803);
    }

    /// A config of tests/gpu/configs.
    fn gpu_config(name: &str) -> ModelConfig {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/gpu/configs");
        load_config(&dir.join(name).join("config.json")).unwrap()
    }

    #[test]
    fn mixture_of_experts_configs_count_every_expert_and_the_active_ones() {
        // Qwen3-30B-A3B: 30.5 B parameters, 3.3 B active (its model card).
        let q = gpu_config("qwen3-30b-a3b");
        assert_eq!(q.architecture, Architecture::Qwen3Moe);
        assert!(q.qk_norm);
        let moe = q.block.moe.clone().unwrap();
        assert_eq!(
            (
                moe.num_experts,
                moe.experts_per_token,
                moe.expert_intermediate_size
            ),
            (128, 8, 768)
        );
        assert!(moe.normalize_top_k && moe.dense_layers.is_empty());
        assert_eq!(q.num_params() / 100_000_000, 305);
        assert_eq!(q.num_active_params() / 100_000_000, 33);
        // Mixtral-8x7B: 46.7 B, 12.9 B active (12.88).
        let m = gpu_config("mixtral-8x7b");
        assert_eq!(m.architecture, Architecture::Mixtral);
        assert_eq!(m.num_params() / 100_000_000, 467);
        assert_eq!(m.num_active_params() / 10_000_000, 1287);
        // A dense model reads every parameter.
        let d = gpu_config("qwen3-8b");
        assert_eq!(d.num_params(), d.num_active_params());
    }

    #[test]
    fn qwen3_moe_dense_layers_come_from_mlp_only_layers_and_the_sparse_step() {
        let config = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut v = serde_json::json!({
                "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 10, "num_experts": 4,
                "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                "mlp_only_layers": [0], "decoder_sparse_step": 2
            });
            edit(&mut v);
            resolve(serde_json::from_value(v).unwrap())
        };
        let moe = config(&|_| {}).unwrap().block.moe.unwrap();
        assert_eq!(moe.dense_layers, vec![0, 2, 4]);
        assert!(
            !moe.normalize_top_k,
            "transformers' default norm_topk_prob is false"
        );
        assert!(!moe.is_sparse(0) && moe.is_sparse(1) && moe.is_sparse(5));
        // More experts per token than experts, or no expert width, is
        // refused by name.
        let err = config(&|v| v["num_experts_per_tok"] = 5.into()).unwrap_err();
        assert!(err.to_string().contains("experts per token (5)"), "{err}");
        let err = config(&|v| {
            v.as_object_mut().unwrap().remove("moe_intermediate_size");
        })
        .unwrap_err();
        assert!(err.to_string().contains("moe_intermediate_size"), "{err}");
    }

    /// Writes `tensors` (f32) as `dir/model.safetensors` and opens it.
    fn safetensors_dir(tag: &str, tensors: &[(String, Vec<usize>, Vec<f32>)]) -> SafetensorsSource {
        let raw: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
            .iter()
            .map(|(name, shape, v)| {
                let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                (name.clone(), Dtype::F32, shape.clone(), bytes)
            })
            .collect();
        safetensors_raw(tag, &raw)
    }

    /// Writes tensors given as `(name, dtype, shape, bytes)` and opens them.
    fn safetensors_raw(
        tag: &str,
        tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)],
    ) -> SafetensorsSource {
        let dir = std::env::temp_dir().join(format!("ingot-hf-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .map(|(name, dtype, shape, b)| {
                let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), b);
                (name.clone(), view.unwrap())
            })
            .collect();
        let path = dir.join("model.safetensors");
        safetensors::serialize_to_file(views, None, &path).unwrap();
        let source = SafetensorsSource::open(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        source
    }

    #[test]
    fn e4m3_bytes_decode_to_their_values() {
        for (b, v) in [
            (0x38, 1.0),
            (0x40, 2.0),
            (0xb8, -1.0),
            (0x7e, 448.0),
            (0x01, 2f32.powi(-9)),
            (0x00, 0.0),
        ] {
            assert_eq!(e4m3_to_f32(b), v, "{b:#x}");
        }
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        // Every finite byte round-trips through its value's neighbours' order.
        let finite: Vec<f32> = (0u8..0x7f).map(e4m3_to_f32).collect();
        assert!(finite.windows(2).all(|w| w[0] < w[1]));
    }

    /// FP8 checkpoints load as their e4m3 values times their scales, for
    /// each published scale layout; a weight without scales is refused.
    #[test]
    fn fp8_weights_load_scaled_by_tensor_row_or_block() {
        // A 4 x 4 weight of e4m3 1.0, 2.0, ... (bytes 0x38, 0x40, 0x44, 0x48 repeated).
        let w: Vec<u8> = (0..16).map(|i| [0x38u8, 0x40, 0x44, 0x48][i % 4]).collect();
        let base = [1.0f32, 2.0, 3.0, 4.0];
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let fp8 = |name: &str| (name.to_string(), Dtype::F8_E4M3, vec![4, 4], w.clone());
        let tensors = vec![
            fp8("t.weight"),
            ("t.weight_scale".into(), Dtype::F32, vec![1], f32s(&[0.5])),
            fp8("r.weight"),
            (
                "r.weight_scale".into(),
                Dtype::F32,
                vec![4, 1],
                f32s(&[1.0, 2.0, 3.0, 4.0]),
            ),
            fp8("b.weight"),
            (
                "b.weight_scale_inv".into(),
                Dtype::F32,
                vec![2, 2],
                f32s(&[1.0, 10.0, 100.0, 1000.0]),
            ),
            fp8("none.weight"),
        ];
        let source = safetensors_raw("fp8", &tensors);
        let t = source.load("t.weight").unwrap();
        assert_eq!(t.shape, vec![4, 4]);
        assert_eq!(t.data[..4], base.map(|x| x * 0.5));
        let r = source.load("r.weight").unwrap();
        assert_eq!(r.data[12..], base.map(|x| x * 4.0));
        // Blocks of 2 x 2: row 3, columns 2-3 take the last block's scale.
        let b = source.load("b.weight").unwrap();
        assert_eq!(b.data[..4], [1.0, 2.0, 30.0, 40.0]);
        assert_eq!(b.data[12..], [100.0, 200.0, 3000.0, 4000.0]);
        let err = source.load("none.weight").unwrap_err().to_string();
        assert!(err.contains("none.weight_scale"), "{err}");
    }

    #[test]
    fn experts_stack_from_each_published_layout() {
        // 3 experts of width 2 over hidden 4: expert e's gate row r is
        // 100e + 10r + c, its up row 1000 + the same, its down row 2000 + ...
        let (n, w, h) = (3, 2, 4);
        let rows = |base: f32, e: usize, r: usize, cols: usize| -> Vec<f32> {
            (0..cols)
                .map(|c| base + (100 * e + 10 * r + c) as f32)
                .collect()
        };
        let matrix = |base: f32, e: usize, out: usize, cols: usize| -> Vec<f32> {
            (0..out).flat_map(|r| rows(base, e, r, cols)).collect()
        };
        let stack = |base: f32, out: usize, cols: usize| -> Vec<f32> {
            (0..n).flat_map(|e| matrix(base, e, out, cols)).collect()
        };
        let p = |s: &str| format!("model.layers.0.{s}");
        let mut qwen = Vec::new();
        let mut mixtral = Vec::new();
        for e in 0..n {
            for (q, m, base, out, cols) in [
                ("gate_proj", "w1", 0.0, w, h),
                ("up_proj", "w3", 1000.0, w, h),
                ("down_proj", "w2", 2000.0, h, w),
            ] {
                let data = matrix(base, e, out, cols);
                qwen.push((
                    p(&format!("mlp.experts.{e}.{q}.weight")),
                    vec![out, cols],
                    data.clone(),
                ));
                mixtral.push((
                    p(&format!("block_sparse_moe.experts.{e}.{m}.weight")),
                    vec![out, cols],
                    data,
                ));
            }
        }
        let gate_up: Vec<f32> = (0..n)
            .flat_map(|e| [matrix(0.0, e, w, h), matrix(1000.0, e, w, h)].concat())
            .collect();
        let fused = vec![
            (p("mlp.experts.gate_up_proj"), vec![n, 2 * w, h], gate_up),
            (
                p("mlp.experts.down_proj"),
                vec![n, h, w],
                stack(2000.0, h, w),
            ),
        ];
        for (tag, tensors) in [("qwen", qwen), ("mixtral", mixtral), ("fused", fused)] {
            let source = safetensors_dir(tag, &tensors);
            for (name, base, out, cols) in [
                (crate::llama::EXPERTS_GATE, 0.0, w, h),
                (crate::llama::EXPERTS_UP, 1000.0, w, h),
                (crate::llama::EXPERTS_DOWN, 2000.0, h, w),
            ] {
                let t = source.load(&p(name)).unwrap();
                assert_eq!(t.shape, vec![n, out, cols], "{tag} {name}");
                assert_eq!(t.data, stack(base, out, cols), "{tag} {name}");
                assert!(source.contains(&p(name)));
            }
            assert!(!source.contains(&p(crate::llama::ROUTER)));
        }
    }

    #[test]
    fn qwen_flags_follow_architecture() {
        let base = r#""hidden_size":64,"intermediate_size":128,"num_hidden_layers":1,
            "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":10"#;
        let q2: RawConfig = serde_json::from_str(&format!(
            r#"{{"architectures":["Qwen2ForCausalLM"],{base}}}"#
        ))
        .unwrap();
        let q3: RawConfig = serde_json::from_str(&format!(
            r#"{{"architectures":["Qwen3ForCausalLM"],"head_dim":32,{base}}}"#
        ))
        .unwrap();
        let (q2, q3) = (resolve(q2).unwrap(), resolve(q3).unwrap());
        assert!(q2.qkv_bias && !q2.qk_norm);
        assert!(!q3.qkv_bias && q3.qk_norm && q3.head_dim == 32);
    }
}
