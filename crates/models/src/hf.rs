//! Hugging Face model directories: `config.json` and safetensors weights
//! (single file or sharded through `model.safetensors.index.json`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use crate::{
    Architecture, HostTensor, ModelConfig, ModelError, RopeConfig, RopeScaling, TensorSource,
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
        if architecture == Architecture::Mistral && window < max_context {
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
        qk_norm: architecture == Architecture::Qwen3,
        tie_word_embeddings: raw.tie_word_embeddings,
        block: Default::default(),
    };
    config.validate()?;
    Ok(config)
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

impl TensorSource for SafetensorsSource {
    fn load(&self, name: &str) -> Result<HostTensor, ModelError> {
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

    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
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
