//! Opening a model: format detection and the [`TensorSource`] seam.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::gguf::GgufFile;
use crate::{
    dummy, gguf_model, hf, Bf16Tensor, E4m3Tensor, HostTensor, ModelConfig, ModelError, QuantTensor,
};

/// Where weights come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadFormat {
    /// Weights from the model files (GGUF or safetensors).
    #[default]
    Auto,
    /// Random weights in the configured shapes (benchmarks only).
    Dummy,
}

/// Named tensors, loaded on demand as f32 under Hugging Face names
/// (`model.layers.0.self_attn.q_proj.weight`, ...).
pub trait TensorSource: Send + Sync {
    /// Loads one tensor by canonical name, converted to f32.
    fn load(&self, name: &str) -> Result<HostTensor, ModelError>;
    /// The tensor in its stored block format when that is a quantized ggml
    /// type (anything but F32/F16/BF16), for backends with native kernels;
    /// `None` when it is stored as floats or the source only yields f32.
    fn load_blocks(&self, name: &str) -> Result<Option<QuantTensor>, ModelError> {
        let _ = name;
        Ok(None)
    }
    /// Loads one tensor in bf16 without going through f32, where its storage
    /// allows that cheaply (bf16 bytes as they are, f16 converted directly).
    /// `None` when it does not: the caller falls back to [`Self::load`].
    fn load_bf16(&self, name: &str) -> Result<Option<Bf16Tensor<'_>>, ModelError> {
        let _ = name;
        Ok(None)
    }
    /// The ggml block type tensor `name` is stored in, when it is a
    /// quantized one (what [`Self::load_blocks`] would give), read from the
    /// metadata without loading it; `None` for float storage, a source that
    /// only yields floats, or a missing tensor.
    fn stored_type(&self, name: &str) -> Option<crate::gguf::GgmlType> {
        let _ = name;
        None
    }
    /// Whether tensor `name` is an FP8 checkpoint's e4m3 weight whose
    /// scale is per tensor or per output row (what [`Self::load_e4m3`]
    /// gives), read from the metadata; false for block-wise scales, other
    /// storage, or a source that only yields floats.
    fn stored_e4m3(&self, name: &str) -> bool {
        let _ = name;
        false
    }
    /// The tensor as its e4m3 bytes and row scales when
    /// [`Self::stored_e4m3`] says so; `None` otherwise.
    fn load_e4m3(&self, name: &str) -> Result<Option<E4m3Tensor>, ModelError> {
        let _ = name;
        Ok(None)
    }
    /// Only the slice `split` picks of tensor `name` in f32 (a
    /// tensor-parallel rank's part; `split` gets the stored shape and
    /// returns `None` for a tensor every rank holds whole), where the
    /// source can read less than the whole tensor for it; `None`: the
    /// caller loads it whole and slices it.
    fn load_slice(
        &self,
        name: &str,
        split: &dyn Fn(&[usize]) -> Option<crate::parallel::Split>,
    ) -> Result<Option<HostTensor>, ModelError> {
        let _ = (name, split);
        Ok(None)
    }
    /// True when the tensor exists.
    fn contains(&self, name: &str) -> bool;
    /// Storage types with their tensor counts, for `ingot inspect`.
    fn dtype_summary(&self) -> Vec<(String, usize)>;
    /// The bytes stored under each of [`Self::dtype_summary`]'s types, for
    /// `ingot inspect`; empty where the source does not read files.
    fn dtype_bytes(&self) -> Vec<(String, usize)> {
        Vec::new()
    }
    /// `Some(seed)` when the weights are random (`--load-format dummy`): a
    /// backend may then generate them in place instead of copying them in.
    fn random_seed(&self) -> Option<u64> {
        None
    }
}

/// An opened model: resolved config plus lazy access to its tensors.
pub struct ModelFiles {
    /// The path given by the user.
    pub path: PathBuf,
    /// The resolved decoder configuration.
    pub config: ModelConfig,
    /// "gguf", "safetensors" or "dummy".
    pub format: &'static str,
    /// The weights.
    pub tensors: Box<dyn TensorSource>,
    /// The GGUF file, when the model is one (its metadata holds the tokenizer).
    pub gguf: Option<Arc<GgufFile>>,
    /// The Hugging Face directory, when the model is one.
    pub hf_dir: Option<PathBuf>,
}

/// Opens a GGUF file or a Hugging Face model directory.
pub fn open(path: &Path, format: LoadFormat) -> Result<ModelFiles, ModelError> {
    let meta = std::fs::metadata(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.is_dir() || path.file_name().is_some_and(|n| n == "config.json") {
        let dir = if meta.is_dir() {
            path.to_path_buf()
        } else {
            path.parent().unwrap_or(Path::new(".")).to_path_buf()
        };
        if !dir.join("config.json").is_file() {
            return Err(ModelError::UnknownFormat {
                path: path.to_path_buf(),
            });
        }
        let config = hf::load_config(&dir.join("config.json"))?;
        let (format_name, tensors): (_, Box<dyn TensorSource>) = match format {
            LoadFormat::Dummy => ("dummy", Box::new(dummy::DummySource::new(&config, 0))),
            LoadFormat::Auto => ("safetensors", Box::new(hf::SafetensorsSource::open(&dir)?)),
        };
        return Ok(ModelFiles {
            path: path.to_path_buf(),
            config,
            format: format_name,
            tensors,
            gguf: None,
            hf_dir: Some(dir),
        });
    }
    let gguf = Arc::new(GgufFile::open(path)?);
    let config = gguf_model::config_from_gguf(&gguf)?;
    let (format_name, tensors): (_, Box<dyn TensorSource>) = match format {
        LoadFormat::Dummy => ("dummy", Box::new(dummy::DummySource::new(&config, 0))),
        LoadFormat::Auto => (
            "gguf",
            Box::new(gguf_model::GgufSource::new(gguf.clone(), &config)),
        ),
    };
    Ok(ModelFiles {
        path: path.to_path_buf(),
        config,
        format: format_name,
        tensors,
        gguf: Some(gguf),
        hf_dir: None,
    })
}
