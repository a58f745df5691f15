//! Hugging Face model directories: `config.json` and safetensors weights
//! (single file or sharded through `model.safetensors.index.json`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use crate::gguf::GgmlType;
use crate::int4::{Int4Config, Int4Tensors, Packed};
use crate::{
    Architecture, BlockData, BlockOptions, E4m3Tensor, HostTensor, ModelConfig, ModelError,
    MoeConfig, QuantTensor, RopeConfig, RopeScaling, TensorSource,
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

/// The decoder layer of an EAGLE-3 head's `config.json` (a Llama config
/// named `LlamaForCausalLMEagle3` or `Eagle3LlamaForCausalLM`), resolved as
/// a Llama layer; the head's own fields are read by [`crate::eagle`].
pub(crate) fn load_eagle3_layer_config(path: &Path) -> Result<ModelConfig, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut raw: RawConfig = serde_json::from_str(&text).map_err(|e| ModelError::ConfigFile {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let named = raw.architectures.first().map(String::as_str);
    if !named.is_some_and(|n| crate::eagle::EAGLE3_ARCHITECTURES.contains(&n)) {
        return Err(ModelError::InvalidConfig(format!(
            "{} is not an EAGLE-3 head (architectures {:?}; expected one of {:?})",
            path.display(),
            raw.architectures,
            crate::eagle::EAGLE3_ARCHITECTURES
        )));
    }
    raw.architectures = vec!["LlamaForCausalLM".to_string()];
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
///
/// AWQ and GPTQ checkpoints (module `int4`) keep each quantized linear
/// weight as `<p>.qweight`, `<p>.qzeros`, `<p>.scales` (and GPTQ's
/// `<p>.g_idx`); they appear under `<p>.weight`: dequantized exactly by
/// [`TensorSource::load`], as Q4_1 blocks by [`TensorSource::load_blocks`].
pub struct SafetensorsSource {
    files: Vec<(PathBuf, Mmap)>,
    /// Tensor name → index into `files`.
    index: HashMap<String, usize>,
    /// The AWQ/GPTQ scheme of the directory's quantization config, if any.
    int4: Option<Int4Config>,
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
        let int4 = crate::int4::read_config(dir)?;
        Ok(Self { files, index, int4 })
    }

    fn with_tensor<T>(
        &self,
        name: &str,
        f: impl FnOnce(TensorView<'_>) -> Result<T, ModelError>,
    ) -> Result<T, ModelError> {
        f(self.view(name)?)
    }

    /// File tensor `name`, borrowed from its map.
    fn view(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
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
        st.tensor(name).map_err(|e| ModelError::Safetensors {
            path: path.clone(),
            message: e.to_string(),
        })
    }
}

impl SafetensorsSource {
    /// The tensors of the files behind canonical name `name`: itself, or
    /// Mixtral's name for a router, or for a stack of experts
    /// ([`crate::llama::EXPERTS_GATE`]) one tensor per expert (the published
    /// checkpoints) or transformers 5's fused `experts.gate_up_proj` /
    /// `experts.down_proj` parameters.
    fn parts_of(&self, name: &str) -> Parts {
        if self.index.contains_key(name) || self.int4_prefix(name).is_some() {
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
            (self.index.contains_key(&n) || self.int4_prefix(&n).is_some()).then_some(n)
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

    /// One file tensor as f32 (an AWQ/GPTQ weight dequantized).
    fn load_one(&self, name: &str) -> Result<HostTensor, ModelError> {
        if let Some(prefix) = self
            .int4_prefix(name)
            .filter(|_| !self.index.contains_key(name))
        {
            return self.with_packed(prefix, |p| {
                Ok(HostTensor::new(vec![p.rows, p.cols], p.dequantize()?))
            });
        }
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
                // Index tensors (an EAGLE-3 head's draft-to-target map):
                // exact in f32 below 2^24.
                Dtype::I64 => bytes
                    .chunks_exact(8)
                    .map(|b| {
                        i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32
                    })
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

/// A stacked tensor's shape and values.
type Stacked<T> = (Vec<usize>, Vec<T>);

/// Tensors `names` (one per expert) stacked along a new first dimension:
/// `part` appends one's values and gives its shape, or `None` when it has
/// no such form (then neither has the stack); every part must have the
/// first one's shape.
fn stack<T>(
    names: &[String],
    mut part: impl FnMut(&str, &mut Vec<T>) -> Result<Option<Vec<usize>>, ModelError>,
) -> Result<Option<Stacked<T>>, ModelError> {
    let mut shape: Option<Vec<usize>> = None;
    let mut data = Vec::new();
    for name in names {
        let Some(got) = part(name, &mut data)? else {
            return Ok(None);
        };
        match &shape {
            Some(expected) if *expected != got => {
                return Err(ModelError::ShapeMismatch {
                    name: name.clone(),
                    expected: expected.clone(),
                    got,
                })
            }
            Some(_) => {}
            None => shape = Some(got),
        }
    }
    let mut shape = shape.unwrap_or_default();
    shape.insert(0, names.len());
    Ok(Some((shape, data)))
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

impl SafetensorsSource {
    /// The scale tensor of file tensor `name` when it is a 2-D e4m3 weight
    /// scaled per tensor or per output row (not block-wise), from the
    /// metadata.
    fn e4m3_scale(&self, name: &str) -> Option<String> {
        let (dtype, shape) = self
            .with_tensor(name, |v| Ok((v.dtype(), v.shape().to_vec())))
            .ok()?;
        let (&[rows, _], Dtype::F8_E4M3) = (&shape[..], dtype) else {
            return None;
        };
        let scale = [format!("{name}_scale"), format!("{name}_scale_inv")]
            .into_iter()
            .find(|n| self.index.contains_key(n))?;
        let scale_shape = self.with_tensor(&scale, |v| Ok(v.shape().to_vec())).ok()?;
        let n: usize = scale_shape.iter().product();
        (n == 1 || (n == rows && scale_shape.first() == Some(&rows))).then_some(scale)
    }

    /// File tensor `name` as its e4m3 bytes and row scales.
    fn e4m3_tensor(&self, name: &str, scale: &str) -> Result<E4m3Tensor, ModelError> {
        let (shape, bytes) =
            self.with_tensor(name, |v| Ok((v.shape().to_vec(), v.data().to_vec())))?;
        let scales = self.load_one(scale)?.data;
        let row_scales = match scales[..] {
            [s] => vec![s; shape[0]],
            _ => scales,
        };
        Ok(E4m3Tensor {
            shape,
            bytes,
            row_scales,
        })
    }

    /// `<p>` of canonical name `<p>.weight` when the files hold it packed
    /// by AWQ/GPTQ (as `<p>.qweight` and its companions).
    fn int4_prefix<'n>(&self, name: &'n str) -> Option<&'n str> {
        let prefix = name.strip_suffix(".weight")?;
        self.index
            .contains_key(&format!("{prefix}.qweight"))
            .then_some(prefix)
    }

    /// Runs `f` on the checked tensors of AWQ/GPTQ weight `<prefix>.weight`.
    fn with_packed<T>(
        &self,
        prefix: &str,
        f: impl FnOnce(&Packed<'_>) -> Result<T, ModelError>,
    ) -> Result<T, ModelError> {
        let config = self.int4.as_ref().ok_or_else(|| {
            ModelError::UnsupportedQuantization(format!(
                "{prefix}.qweight is an AWQ/GPTQ-packed weight but the directory has no \
                 quantization_config (config.json) or quantize_config.json saying how"
            ))
        })?;
        let part = |s: &str| self.view(&format!("{prefix}.{s}"));
        let g_idx = format!("{prefix}.g_idx");
        let tensors = Int4Tensors {
            qweight: part("qweight")?,
            qzeros: part("qzeros")?,
            scales: part("scales")?,
            g_idx: (self.index.contains_key(&g_idx))
                .then(|| self.view(&g_idx))
                .transpose()?,
        };
        f(&Packed::new(config, prefix, tensors)?)
    }

    /// File tensor `name` as Q4_1 blocks, when it is an AWQ/GPTQ weight
    /// whose rows are whole blocks.
    fn int4_blocks(&self, name: &str) -> Result<Option<QuantTensor>, ModelError> {
        match self
            .int4_prefix(name)
            .filter(|_| !self.index.contains_key(name))
        {
            None => Ok(None),
            Some(prefix) => self.with_packed(prefix, |p| {
                Ok(p.q4_1()?
                    .map(|blocks| q4_1_tensor(vec![p.rows, p.cols], blocks)))
            }),
        }
    }

    /// Whether file tensor `name` is an AWQ/GPTQ weight [`Self::int4_blocks`]
    /// gives blocks of, from the metadata (its `qweight`'s shape) alone.
    fn int4_stored(&self, name: &str) -> bool {
        let (Some(config), Some(prefix)) = (&self.int4, self.int4_prefix(name)) else {
            return false;
        };
        if self.index.contains_key(name) {
            return false;
        }
        let qweight = format!("{prefix}.qweight");
        let cols = self.with_tensor(&qweight, |v| Ok(config.cols_of(v.shape())));
        let Ok(Some(cols)) = cols else {
            return false;
        };
        // An act-order g_idx (a few KB) leaves the weight no Q4_1 form.
        let g_idx = format!("{prefix}.g_idx");
        let in_order = !self.index.contains_key(&g_idx)
            || matches!(
                self.with_tensor(&g_idx, |v| crate::int4::act_order(
                    prefix,
                    &v,
                    cols,
                    config.group_size(cols)
                )),
                Ok(None)
            );
        cols.is_multiple_of(32) && in_order
    }

    /// The Q4_1 blocks of `names` stacked (one expert each), when all are
    /// AWQ/GPTQ weights of one shape.
    fn int4_stack(&self, names: &[String]) -> Result<Option<QuantTensor>, ModelError> {
        let stacked = stack(names, |name, data| {
            Ok(self.int4_blocks(name)?.map(|q| {
                data.extend_from_slice(q.data.bytes());
                q.shape
            }))
        })?;
        Ok(stacked.map(|(shape, data)| q4_1_tensor(shape, data)))
    }

    /// The storage type file tensor `name` is summarised under, and
    /// whether it counts as a tensor: AWQ/GPTQ weights under their scheme,
    /// their companions (`qzeros`, `scales`, `g_idx`) too but not counted
    /// (their bytes are the weight's).
    fn type_label(&self, name: &str) -> Option<(String, bool)> {
        let packed_part = |suffix: &str| {
            name.strip_suffix(suffix)
                .is_some_and(|p| self.index.contains_key(&format!("{p}.qweight")))
        };
        if let Some(config) = &self.int4 {
            if packed_part(".qweight") {
                return Some((config.label(), true));
            }
            if [".qzeros", ".scales", ".g_idx"]
                .into_iter()
                .any(packed_part)
            {
                return Some((config.label(), false));
            }
        }
        self.with_tensor(name, |v| Ok(format!("{:?}", v.dtype())))
            .ok()
            .map(|t| (t, true))
    }
}

fn q4_1_tensor(shape: Vec<usize>, blocks: Vec<u8>) -> QuantTensor {
    QuantTensor {
        ggml_type: GgmlType::Q4_1,
        shape,
        data: BlockData::Owned(blocks),
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
                let stacked = stack(&names, |part, data| {
                    let t = self.load_one(part)?;
                    data.extend_from_slice(&t.data);
                    Ok(Some(t.shape))
                })?;
                let (shape, data) = stacked.ok_or_else(|| ModelError::MissingTensor {
                    name: name.to_string(),
                })?;
                Ok(HostTensor::new(shape, data))
            }
        }
    }

    /// An AWQ/GPTQ weight (or a stack of them, one per expert) as Q4_1
    /// blocks, `[rows, cols]` (`[experts, rows, cols]`) row-major; `None`
    /// for float tensors.
    fn load_blocks(&self, name: &str) -> Result<Option<QuantTensor>, ModelError> {
        match self.parts_of(name) {
            Parts::One(file_name) => self.int4_blocks(&file_name),
            Parts::Stack(names) => self.int4_stack(&names),
            Parts::None | Parts::Half(..) => Ok(None),
        }
    }

    fn stored_type(&self, name: &str) -> Option<GgmlType> {
        let int4 = match self.parts_of(name) {
            Parts::One(file_name) => self.int4_stored(&file_name),
            Parts::Stack(names) => names.iter().all(|n| self.int4_stored(n)),
            Parts::None | Parts::Half(..) => false,
        };
        int4.then_some(GgmlType::Q4_1)
    }

    fn stored_e4m3(&self, name: &str) -> bool {
        matches!(self.parts_of(name), Parts::One(f) if self.e4m3_scale(&f).is_some())
    }

    fn load_e4m3(&self, name: &str) -> Result<Option<E4m3Tensor>, ModelError> {
        let Parts::One(file_name) = self.parts_of(name) else {
            return Ok(None);
        };
        self.e4m3_scale(&file_name)
            .map(|scale| self.e4m3_tensor(&file_name, &scale))
            .transpose()
    }

    fn contains(&self, name: &str) -> bool {
        !matches!(self.parts_of(name), Parts::None)
    }

    fn dtype_summary(&self) -> Vec<(String, usize)> {
        let mut counts = BTreeMap::new();
        for name in self.index.keys() {
            if let Some((dtype, true)) = self.type_label(name) {
                *counts.entry(dtype).or_insert(0) += 1;
            }
        }
        counts.into_iter().collect()
    }

    fn dtype_bytes(&self) -> Vec<(String, usize)> {
        let mut bytes = BTreeMap::new();
        for name in self.index.keys() {
            let size = self.with_tensor(name, |v| Ok(v.data().len()));
            if let (Some((dtype, _)), Ok(size)) = (self.type_label(name), size) {
                *bytes.entry(dtype).or_insert(0) += size;
            }
        }
        bytes.into_iter().collect()
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

    /// Tensors as `(name, dtype, shape, bytes)`.
    type RawTensors = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

    /// Writes tensors given as `(name, dtype, shape, bytes)` and opens them.
    fn safetensors_raw(
        tag: &str,
        tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)],
    ) -> SafetensorsSource {
        open_raw(tag, tensors, None).unwrap()
    }

    /// Writes tensors, and `config` as `config.json` when given, then opens
    /// the directory.
    fn open_raw(
        tag: &str,
        tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)],
        config: Option<&str>,
    ) -> Result<SafetensorsSource, ModelError> {
        let dir = std::env::temp_dir().join(format!("ingot-hf-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        if let Some(config) = config {
            std::fs::write(dir.join("config.json"), config).unwrap();
        }
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(name, dtype, shape, b)| {
                let view = TensorView::new(*dtype, shape.clone(), b);
                (name.clone(), view.unwrap())
            })
            .collect();
        let path = dir.join("model.safetensors");
        safetensors::serialize_to_file(views, None, &path).unwrap();
        let source = SafetensorsSource::open(&dir);
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
        // Kept as they are where the scale is per tensor or per row: the
        // file's bytes, and a scale a row; block scales and a missing scale
        // are not (those weights load as floats above, or fail).
        let t = source.load_e4m3("t.weight").unwrap().unwrap();
        assert_eq!(
            (t.shape, &t.bytes, t.row_scales),
            (vec![4, 4], &w, vec![0.5; 4])
        );
        let r = source.load_e4m3("r.weight").unwrap().unwrap();
        assert_eq!((&r.bytes, r.row_scales), (&w, vec![1.0, 2.0, 3.0, 4.0]));
        assert!(source.stored_e4m3("t.weight") && source.stored_e4m3("r.weight"));
        for name in [
            "b.weight",
            "none.weight",
            "t.weight_scale",
            "missing.weight",
        ] {
            assert!(!source.stored_e4m3(name), "{name}");
            assert!(source.load_e4m3(name).unwrap().is_none(), "{name}");
        }
    }

    /// Known 4-bit weights of a `rows` x `cols` linear layer (outputs x
    /// inputs): quants `q[i][o]`, zero points and scales `[group][o]`.
    struct Int4Weights {
        rows: usize,
        cols: usize,
        group: usize,
        q: Vec<Vec<u8>>,
        z: Vec<Vec<u8>>,
        s: Vec<Vec<half::f16>>,
    }

    impl Int4Weights {
        /// Pseudo-random weights (`group` `None`: one group over all
        /// inputs); zero points 8 when `sym`, else random with a 0 and a 15
        /// among them. Scales use every mantissa bit, so `-z s` rounds in
        /// f16.
        fn new(rows: usize, cols: usize, group: Option<usize>, sym: bool, seed: u64) -> Self {
            let mut state = seed;
            let mut next = move || {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 33) as u32
            };
            let group = group.unwrap_or(cols);
            let groups = cols.div_ceil(group);
            let q = (0..cols)
                .map(|_| (0..rows).map(|_| (next() % 16) as u8).collect())
                .collect();
            let z = (0..groups)
                .map(|g| {
                    (0..rows)
                        .map(|o| match (sym, g, o) {
                            (true, ..) => 8,
                            (false, 0, 0) => 0,
                            (false, 0, 1) => 15,
                            _ => (next() % 16) as u8,
                        })
                        .collect()
                })
                .collect();
            // 2^-8 <= s < 2^-4, any mantissa.
            let s = (0..groups)
                .map(|_| {
                    (0..rows)
                        .map(|_| half::f16::from_bits(0x1c00 + (next() % 0x1000) as u16))
                        .collect()
                })
                .collect();
            Self {
                rows,
                cols,
                group,
                q,
                z,
                s,
            }
        }

        /// Zero point and scale of output `o` at input `i`.
        fn zs(&self, i: usize, o: usize) -> (f32, f32) {
            let g = i / self.group;
            (f32::from(self.z[g][o]), self.s[g][o].to_f32())
        }

        /// The linear weight `[rows, cols]`: `(q - z) * s`.
        fn weight(&self) -> Vec<f32> {
            let w = |o: usize, i: usize| {
                let (z, s) = self.zs(i, o);
                (f32::from(self.q[i][o]) - z) * s
            };
            (0..self.rows)
                .flat_map(|o| (0..self.cols).map(move |i| w(o, i)))
                .collect()
        }

        fn scales(&self, prefix: &str) -> (String, Dtype, Vec<usize>, Vec<u8>) {
            let bytes = self.s.iter().flatten().flat_map(|s| s.to_le_bytes());
            let shape = vec![self.s.len(), self.rows];
            (
                format!("{prefix}.scales"),
                Dtype::F16,
                shape,
                bytes.collect(),
            )
        }

        /// AutoAWQ's `WQLinear_GEMM.from_linear`: word `c` of input row
        /// `i` holds output `8c + order_map[n]` in bits `4n`; the zeros
        /// likewise.
        fn awq(&self, prefix: &str) -> RawTensors {
            const ORDER_MAP: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
            let pack = |row: &Vec<u8>| -> Vec<u8> {
                (0..row.len() / 8)
                    .map(|c| {
                        (0..8).fold(0u32, |w, n| {
                            w | u32::from(row[8 * c + ORDER_MAP[n]]) << (4 * n)
                        })
                    })
                    .flat_map(u32::to_le_bytes)
                    .collect()
            };
            let words = self.rows / 8;
            vec![
                int32(
                    prefix,
                    "qweight",
                    vec![self.cols, words],
                    self.q.iter().flat_map(pack),
                ),
                int32(
                    prefix,
                    "qzeros",
                    vec![self.z.len(), words],
                    self.z.iter().flat_map(pack),
                ),
                self.scales(prefix),
            ]
        }

        /// AutoGPTQ's `QuantLinear.pack`: word `(r, o)` holds input `8r + j`
        /// of output `o` in bits `4j`; zero word `(g, c)` output `8c + j`,
        /// stored as `z - 1` (4 bits) in v1. `g_idx` `i / group` if asked.
        fn gptq(&self, prefix: &str, v1: bool, g_idx: bool) -> RawTensors {
            let word = |f: &dyn Fn(usize) -> u32| (0..8).fold(0u32, |w, j| w | f(j) << (4 * j));
            let qweight = (0..self.cols / 8).flat_map(|r| {
                (0..self.rows)
                    .flat_map(move |o| word(&|j| u32::from(self.q[8 * r + j][o])).to_le_bytes())
            });
            let stored = |z: u8| u32::from(if v1 { (z + 15) & 15 } else { z });
            let qzeros = self.z.iter().flat_map(|zs| {
                (0..self.rows / 8).flat_map(move |c| word(&|j| stored(zs[8 * c + j])).to_le_bytes())
            });
            let groups = self.z.len();
            let mut t = vec![
                int32(prefix, "qweight", vec![self.cols / 8, self.rows], qweight),
                int32(prefix, "qzeros", vec![groups, self.rows / 8], qzeros),
                self.scales(prefix),
            ];
            if g_idx {
                let g = (0..self.cols).flat_map(|i| ((i / self.group) as i32).to_le_bytes());
                t.push(int32(prefix, "g_idx", vec![self.cols], g));
            }
            t
        }

        /// Checks `name` of `source` against these weights: `load` exactly
        /// `(q - z) * s`; Q4_1 blocks whose `d` is `s` and which the crate's
        /// Q4_1 dequantization reads back within half an f16 ulp of `z s`
        /// (and f32 rounding); the metadata. Returns the largest error of
        /// the blocks in quantization steps.
        fn check(&self, source: &SafetensorsSource, name: &str) -> f32 {
            let want = self.weight();
            let t = source.load(name).unwrap();
            assert_eq!(t.shape, vec![self.rows, self.cols], "{name}");
            assert!(t.data == want, "{name}: load is not (q - z) * s");
            assert!(source.contains(name));
            assert_eq!(source.stored_type(name), Some(GgmlType::Q4_1), "{name}");
            let q = source.load_blocks(name).unwrap().unwrap();
            assert_eq!(
                (q.ggml_type, &q.shape),
                (GgmlType::Q4_1, &vec![self.rows, self.cols])
            );
            let bytes = q.data.bytes();
            let per_row = self.cols / 32;
            for (k, block) in bytes.chunks_exact(20).enumerate() {
                let (o, i) = (k / per_row, k % per_row * 32);
                let (_, s) = self.zs(i, o);
                assert_eq!(half::f16::from_le_bytes([block[0], block[1]]).to_f32(), s);
            }
            let mut got = vec![0f32; want.len()];
            crate::gguf::dequantize_into(GgmlType::Q4_1, bytes, &mut got).unwrap();
            let mut worst = 0f32;
            for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let (o, i) = (k / self.cols, k % self.cols);
                let (z, s) = self.zs(i, o);
                let bound = (z * s).abs() / 2048.0 + w.abs() / (1 << 22) as f32;
                assert!((g - w).abs() <= bound, "{name} [{o}, {i}]: {g} vs {w}");
                worst = worst.max((g - w).abs() / s);
            }
            worst
        }
    }

    /// An int32 tensor `<prefix>.<suffix>` of little-endian bytes.
    fn int32(
        prefix: &str,
        suffix: &str,
        shape: Vec<usize>,
        bytes: impl Iterator<Item = u8>,
    ) -> (String, Dtype, Vec<usize>, Vec<u8>) {
        (
            format!("{prefix}.{suffix}"),
            Dtype::I32,
            shape,
            bytes.collect(),
        )
    }

    /// A `config.json` with `quantization_config` `quant` (JSON text).
    fn quant_config(quant: &str) -> String {
        format!(r#"{{"architectures": ["LlamaForCausalLM"], "quantization_config": {quant}}}"#)
    }

    fn awq_config(group: i64) -> String {
        quant_config(&format!(
            r#"{{"quant_method": "awq", "bits": 4, "group_size": {group}, "zero_point": true,
            "version": "gemm"}}"#
        ))
    }

    /// A GPTQ config; `format` `None` leaves `checkpoint_format` out (v1).
    fn gptq_config(group: i64, sym: bool, format: Option<&str>, desc_act: bool) -> String {
        let format = format.map_or(String::new(), |f| {
            format!(r#", "checkpoint_format": "{f}""#)
        });
        quant_config(&format!(
            r#"{{"quant_method": "gptq", "bits": 4, "group_size": {group}, "sym": {sym},
            "desc_act": {desc_act}{format}}}"#
        ))
    }

    const Q_PROJ: &str = "model.layers.0.self_attn.q_proj";

    /// An f16 embedding beside the quantized weights, which must load as
    /// before.
    fn f16_embedding() -> (String, Dtype, Vec<usize>, Vec<u8>) {
        let values = [1.0f32, -2.0, 0.5, 3.0, 0.25, -1.5];
        let bytes = values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes());
        let name = "model.embed_tokens.weight".to_string();
        (name, Dtype::F16, vec![2, 3], bytes.collect())
    }

    fn check_f16_embedding(source: &SafetensorsSource) {
        let name = "model.embed_tokens.weight";
        let t = source.load(name).unwrap();
        assert_eq!(t.data, vec![1.0, -2.0, 0.5, 3.0, 0.25, -1.5]);
        assert_eq!(source.stored_type(name), None);
        assert!(source.load_blocks(name).unwrap().is_none());
    }

    /// AWQ GEMM checkpoints (groups of 32, 64 and all inputs) load as
    /// `(q - z) * s` exactly and as Q4_1 blocks within the f16 error of
    /// `m`; the float tensors beside them load as before.
    #[test]
    fn awq_weights_load_exactly_and_as_q4_1_blocks() {
        let mut worst = 0f32;
        // 72 rows: one task of 64 rows and a shorter one.
        for (seed, rows, group) in [(1, 24, Some(32)), (2, 72, Some(64)), (3, 8, None)] {
            let w = Int4Weights::new(rows, 128, group, false, seed);
            let mut tensors = w.awq(Q_PROJ);
            tensors.push(f16_embedding());
            let g = group.map_or(-1, |g| g as i64);
            let config = awq_config(g);
            let source = open_raw(&format!("awq{g}"), &tensors, Some(&config)).unwrap();
            worst = worst.max(w.check(&source, &format!("{Q_PROJ}.weight")));
            check_f16_embedding(&source);
            let summary = source.dtype_summary();
            assert_eq!(
                summary,
                vec![(format!("AWQ int4 g{g}"), 1), ("F16".to_string(), 1)]
            );
            // Bytes: the weight's three tensors under its label.
            let packed: usize = tensors[..3].iter().map(|t| t.3.len()).sum();
            let embedding = tensors[3].3.len();
            assert_eq!(
                source.dtype_bytes(),
                vec![
                    (format!("AWQ int4 g{g}"), packed),
                    ("F16".to_string(), embedding)
                ]
            );
        }
        // The scales' mantissas make m round: the bound is not vacuous.
        assert!(
            worst > 0.0 && worst <= crate::int4::M_ERROR_PER_STEP,
            "{worst}"
        );
    }

    /// GPTQ checkpoints, v1 (zero points stored minus one, `checkpoint_format`
    /// "gptq" or absent) and v2, symmetric and not, groups of 32, 64 and all
    /// inputs, with and without `g_idx`, load like AWQ's.
    #[test]
    fn gptq_weights_load_exactly_and_as_q4_1_blocks_v1_and_v2() {
        let formats = [(Some("gptq"), true), (None, true), (Some("gptq_v2"), false)];
        let mut seed = 10;
        for (format, v1) in formats {
            for sym in [true, false] {
                for group in [Some(32), Some(64), None] {
                    seed += 1;
                    let rows = if group == Some(64) { 72 } else { 16 };
                    let w = Int4Weights::new(rows, 128, group, sym, seed);
                    let mut tensors = w.gptq(Q_PROJ, v1, seed % 2 == 0);
                    tensors.push(f16_embedding());
                    let g = group.map_or(-1, |g| g as i64);
                    let config = gptq_config(g, sym, format, false);
                    let source = open_raw(&format!("gptq{seed}"), &tensors, Some(&config));
                    let source = source.unwrap();
                    let worst = w.check(&source, &format!("{Q_PROJ}.weight"));
                    assert!(worst <= crate::int4::M_ERROR_PER_STEP, "{worst}");
                    check_f16_embedding(&source);
                    let summary = source.dtype_summary();
                    assert!(
                        summary.contains(&(format!("GPTQ int4 g{g}"), 1)),
                        "{summary:?}"
                    );
                    assert_eq!(summary.len(), 2, "{summary:?}");
                }
            }
        }
    }

    /// One packed word, written out by hand from the published layouts:
    /// nibble n of 0x76543210 is n. In AWQ it holds outputs in the order
    /// [0, 2, 4, 6, 1, 3, 5, 7] (output j gets nibble [0, 4, 1, 5, 2, 6, 3,
    /// 7][j]); in GPTQ inputs 8r..8r+8 in order.
    #[test]
    fn int4_words_unpack_in_the_published_nibble_order() {
        let word = 0x7654_3210u32.to_le_bytes();
        let words = |n: usize| int32("p", "qweight", vec![], word.repeat(n).into_iter());
        let ones = ("p.scales".to_string(), Dtype::F16, vec![1, 8], {
            half::f16::ONE.to_le_bytes().repeat(8)
        });
        let zero = int32("p", "qzeros", vec![1, 1], [0u8; 4].into_iter());
        // AWQ: 32 inputs x 8 outputs, every row the same word.
        let mut qweight = words(32);
        qweight.2 = vec![32, 1];
        let awq = [qweight, zero.clone(), ones.clone()];
        let source = open_raw("awq-word", &awq, Some(&awq_config(32))).unwrap();
        let t = source.load("p.weight").unwrap();
        let rows: Vec<f32> = t.data.chunks(32).map(|r| r[0]).collect();
        assert_eq!(rows, vec![0.0, 4.0, 1.0, 5.0, 2.0, 6.0, 3.0, 7.0]);
        assert!(t.data.chunks(32).all(|r| r.iter().all(|&v| v == r[0])));
        // GPTQ v2: 32 inputs (4 word rows) x 8 outputs.
        let mut qweight = words(32);
        qweight.2 = vec![4, 8];
        let gptq = [qweight, zero, ones];
        let config = gptq_config(32, false, Some("gptq_v2"), false);
        let source = open_raw("gptq-word", &gptq, Some(&config)).unwrap();
        let t = source.load("p.weight").unwrap();
        let row: Vec<f32> = (0..32).map(|i| (i % 8) as f32).collect();
        assert!(t.data.chunks(32).all(|r| r == row), "{:?}", &t.data[..32]);
    }

    /// Per-expert AWQ/GPTQ weights stack under the canonical expert names,
    /// as floats and as Q4_1 blocks (each expert's blocks in turn).
    #[test]
    fn quantized_experts_stack_as_q4_1_blocks() {
        let experts: Vec<Int4Weights> = (0..3)
            .map(|e| Int4Weights::new(16, 64, Some(32), false, 100 + e))
            .collect();
        let part = |e: usize| format!("model.layers.0.mlp.experts.{e}.gate_proj");
        let tensors: Vec<_> = experts
            .iter()
            .enumerate()
            .flat_map(|(e, w)| w.gptq(&part(e), false, false))
            .collect();
        let config = gptq_config(32, false, Some("gptq_v2"), false);
        let source = open_raw("int4-experts", &tensors, Some(&config)).unwrap();
        let name = format!("model.layers.0.{}", crate::llama::EXPERTS_GATE);
        assert!(source.contains(&name));
        assert_eq!(source.stored_type(&name), Some(GgmlType::Q4_1));
        let t = source.load(&name).unwrap();
        assert_eq!(t.shape, vec![3, 16, 64]);
        let want: Vec<f32> = experts.iter().flat_map(Int4Weights::weight).collect();
        assert!(t.data == want);
        let q = source.load_blocks(&name).unwrap().unwrap();
        assert_eq!((q.ggml_type, &q.shape), (GgmlType::Q4_1, &vec![3, 16, 64]));
        let mut each = Vec::new();
        for (e, expert) in experts.iter().enumerate() {
            let name = format!("{}.weight", part(e));
            expert.check(&source, &name);
            let b = source.load_blocks(&name).unwrap().unwrap();
            each.extend_from_slice(b.data.bytes());
        }
        assert!(q.data.bytes() == each);
    }

    /// What does not load is refused by name: the setting, in one line.
    #[test]
    fn int4_settings_we_cannot_read_are_refused_by_name() {
        let w = Int4Weights::new(8, 64, Some(32), false, 7);
        let tensors = w.gptq(Q_PROJ, true, false);
        let gptq = |extra: &str| {
            quant_config(&format!(
                r#"{{"quant_method": "gptq", "bits": 4, "group_size": 128 {extra}}}"#
            ))
        };
        let awq = |extra: &str| {
            quant_config(&format!(
                r#"{{"quant_method": "awq", "bits": 4, "group_size": 128 {extra}}}"#
            ))
        };
        let cases = [
            (
                gptq(r#", "bits": 8"#).replace(r#""bits": 4, "#, ""),
                "GPTQ bits=8",
            ),
            (awq("").replace("\"bits\": 4", "\"bits\": 3"), "AWQ bits=3"),
            (awq("").replace("128", "48"), "AWQ group_size=48"),
            (gptq("").replace("128", "16"), "GPTQ group_size=16"),
            (gptq("").replace("128", "0"), "GPTQ group_size=0"),
            (awq(r#", "version": "gemv""#), "AWQ version 'gemv'"),
            (
                awq(r#", "version": "GEMV_FAST""#),
                "AWQ version 'gemv_fast'",
            ),
            (awq(r#", "version": "marlin""#), "AWQ version 'marlin'"),
            (awq(r#", "zero_point": false"#), "AWQ zero_point=false"),
            (
                gptq(r#", "checkpoint_format": "marlin""#),
                "checkpoint_format 'marlin'",
            ),
            (
                gptq(r#", "is_marlin_format": true"#),
                "is_marlin_format=true",
            ),
            (gptq(r#", "pack_dtype": "int16""#), "pack_dtype 'int16'"),
            (
                quant_config(r#"{"quant_method": "bitsandbytes"}"#),
                "quant_method 'bitsandbytes'",
            ),
            (quant_config(r#"{"bits": 4}"#), "no quant_method"),
        ];
        for (i, (config, setting)) in cases.iter().enumerate() {
            let Err(err) = open_raw(&format!("refuse{i}"), &tensors, Some(config)) else {
                panic!("{setting} was accepted");
            };
            assert!(
                matches!(err, ModelError::UnsupportedQuantization(_)),
                "{err:?}"
            );
            let message = err.to_string();
            assert!(
                message.contains(setting) && !message.contains('\n'),
                "{message}"
            );
        }
    }

    /// GPTQ act order: a `g_idx` other than `i / group` loads as exact
    /// floats (each input scaled by its own group), with no Q4_1 form; one
    /// naming a group past the scales is refused by name; `desc_act` with
    /// the plain `g_idx` loads as blocks. Packed weights without a
    /// quantization config are refused, an FP8 config is not.
    #[test]
    fn act_order_loads_exactly_and_unexplained_packing_is_refused() {
        let w = Int4Weights::new(8, 64, Some(32), false, 9);
        let name = format!("{Q_PROJ}.weight");
        let mut tensors = w.gptq(Q_PROJ, true, true);
        let config = gptq_config(32, false, None, true);
        let source = open_raw("desc-act-plain", &tensors, Some(&config)).unwrap();
        w.check(&source, &name);
        // Inputs 0 and 32 swap groups.
        let g_idx = &mut tensors.last_mut().unwrap().3;
        g_idx[..4].copy_from_slice(&1i32.to_le_bytes());
        g_idx[128..132].copy_from_slice(&0i32.to_le_bytes());
        let source = open_raw("desc-act", &tensors, Some(&config)).unwrap();
        // Act order: exact floats, each input by its own group; no blocks.
        let t = source.load(&name).unwrap();
        let want: Vec<f32> = (0..w.rows)
            .flat_map(|o| (0..w.cols).map(move |i| (o, i)))
            .map(|(o, i)| {
                let g = match i {
                    0 => 1,
                    32 => 0,
                    i => i / 32,
                };
                let (z, s) = (f32::from(w.z[g][o]), w.s[g][o].to_f32());
                (f32::from(w.q[i][o]) - z) * s
            })
            .collect();
        assert!(
            t.data == want,
            "act order: load is not (q - z[g_idx]) * s[g_idx]"
        );
        assert_ne!(t.data, w.weight(), "the swap must change the weight");
        assert_eq!(source.stored_type(&name), None);
        assert!(source.load_blocks(&name).unwrap().is_none());
        // A group past the scales is refused by name.
        let g_idx = &mut tensors.last_mut().unwrap().3;
        g_idx[4..8].copy_from_slice(&2i32.to_le_bytes());
        let source = open_raw("desc-act-past", &tensors, Some(&config)).unwrap();
        let message = source.load(&name).unwrap_err().to_string();
        assert!(
            message.contains(&format!(
                "{Q_PROJ}.g_idx[1] is 2, but the weight has 2 groups"
            )),
            "{message}"
        );
        let tensors = w.gptq(Q_PROJ, true, false);
        let source = open_raw("no-quant-config", &tensors, None).unwrap();
        let message = source.load(&name).unwrap_err().to_string();
        assert!(message.contains("no quantization_config"), "{message}");
        assert_eq!(source.stored_type(&name), None);
        let fp8 = quant_config(r#"{"quant_method": "fp8", "weight_block_size": [128, 128]}"#);
        let source = open_raw("fp8-config", &[f16_embedding()], Some(&fp8)).unwrap();
        check_f16_embedding(&source);
    }

    /// The error bound stated for Q4_1's `m`: over every positive finite
    /// f16 scale and zero point 0..=15, `f16(-z s)` is within half an f16
    /// ulp of `z s`, at most `15 * 2^-11` (0.73 %) of `s`, and that much is
    /// reached.
    #[test]
    fn q4_1_m_rounding_stays_within_the_stated_bound() {
        let mut worst = 0f64;
        for bits in 1..0x7c00u16 {
            let s = half::f16::from_bits(bits).to_f32();
            for z in 0..16u8 {
                let zs = f32::from(z) * s;
                let m = half::f16::from_f32(-zs);
                if !m.is_finite() {
                    continue;
                }
                let err = f64::from(m.to_f32()) + f64::from(zs);
                assert!(err.abs() <= f64::from(zs) / 2048.0, "s {s} z {z}");
                worst = worst.max(err.abs() / f64::from(s));
            }
        }
        let bound = f64::from(crate::int4::M_ERROR_PER_STEP);
        assert!(worst <= bound && worst > 0.0072, "{worst}");
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
