//! Errors raised while reading model files.

use std::path::PathBuf;

use crate::gguf::GgufError;

/// Anything that stops a model from loading, phrased for the user.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A file could not be read.
    #[error("cannot read {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The GGUF container is malformed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A safetensors file is malformed.
    #[error("invalid safetensors file {path}: {message}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// `config.json` is missing fields or malformed.
    #[error("invalid config {path}: {message}")]
    ConfigFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The model's architecture is not one we implement.
    #[error("unsupported model architecture '{name}' (supported: llama, mistral, qwen2, qwen3)")]
    UnsupportedArchitecture {
        /// The name found in the file.
        name: String,
    },
    /// The resolved configuration is inconsistent.
    #[error("invalid model configuration: {0}")]
    InvalidConfig(String),
    /// A tensor the architecture needs is absent.
    #[error("model file has no tensor '{name}'")]
    MissingTensor {
        /// Canonical (Hugging Face) name.
        name: String,
    },
    /// A tensor has an unexpected shape.
    #[error("tensor '{name}' has shape {got:?}, expected {expected:?}")]
    ShapeMismatch {
        /// Canonical name.
        name: String,
        /// Shape the config implies.
        expected: Vec<usize>,
        /// Shape in the file.
        got: Vec<usize>,
    },
    /// A tensor dtype we cannot convert.
    #[error("tensor '{name}' has unsupported dtype {dtype}")]
    UnsupportedDtype {
        /// Canonical name.
        name: String,
        /// The dtype in the file.
        dtype: String,
    },
    /// A quantized checkpoint (AWQ, GPTQ, ...) in a setting or layout we do
    /// not read: the message names the setting and, where there is one, the
    /// fix.
    #[error("unsupported quantization: {0}")]
    UnsupportedQuantization(String),
    /// The path is neither a GGUF file nor a model directory.
    #[error("{path} is not a GGUF file or a Hugging Face model directory (no config.json)")]
    UnknownFormat {
        /// The path given.
        path: PathBuf,
    },
}
