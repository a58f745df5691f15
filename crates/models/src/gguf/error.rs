//! Errors from reading GGUF files and dequantizing their tensors.

use std::path::PathBuf;

use super::GgmlType;

/// Why a GGUF file could not be read or a tensor not dequantized. Each
/// message is one line meant for the user.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("cannot read GGUF file {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file does not start with the `GGUF` magic.
    #[error("not a GGUF file: it does not start with the 'GGUF' magic bytes")]
    BadMagic,
    /// The format version is not 2 or 3.
    #[error("unsupported GGUF version {0} (supported: 2 and 3; re-convert version 1 files with a current llama.cpp)")]
    UnsupportedVersion(u32),
    /// The file is in big-endian byte order.
    #[error("big-endian GGUF files are not supported")]
    BigEndian,
    /// The file ends before something it declares.
    #[error("GGUF file truncated: {what}")]
    Truncated {
        /// What was being read, where, and the file size.
        what: String,
    },
    /// The file is structurally invalid (bad lengths, types, offsets...).
    #[error("malformed GGUF file: {what}")]
    Malformed {
        /// What is wrong.
        what: String,
    },
    /// A tensor has a type id that ggml does not define.
    #[error("GGUF tensor '{tensor}' has unknown ggml type id {id}")]
    UnknownType {
        /// The tensor name.
        tensor: String,
        /// The raw type id.
        id: u32,
    },
    /// A tensor has a type that we cannot dequantize (yet).
    #[error("{}", unsupported_message(.tensor, *.ty))]
    UnsupportedType {
        /// The tensor name (empty for a raw buffer given to `dequantize_into`).
        tensor: String,
        /// Its type.
        ty: GgmlType,
    },
    /// No tensor has this name.
    #[error("GGUF file has no tensor '{name}'")]
    TensorNotFound {
        /// The name asked for.
        name: String,
    },
    /// The byte and element counts given to `dequantize_into` disagree.
    #[error("cannot dequantize {bytes} bytes of {ty} into {elements} floats: {ty} stores {block_size} values in {type_size} bytes")]
    LengthMismatch {
        /// The type.
        ty: GgmlType,
        /// Input length in bytes.
        bytes: usize,
        /// Output length in elements.
        elements: usize,
        /// Elements per block of `ty`.
        block_size: usize,
        /// Bytes per block of `ty`.
        type_size: usize,
    },
}

fn unsupported_message(tensor: &str, ty: GgmlType) -> String {
    if tensor.is_empty() {
        format!("dequantizing ggml type {ty} is not supported yet")
    } else {
        format!("GGUF tensor '{tensor}' has ggml type {ty}, which ingot cannot dequantize yet")
    }
}

impl GgufError {
    pub(crate) fn truncated(what: impl Into<String>) -> Self {
        GgufError::Truncated { what: what.into() }
    }

    pub(crate) fn malformed(what: impl Into<String>) -> Self {
        GgufError::Malformed { what: what.into() }
    }
}
