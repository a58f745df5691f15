//! The GGUF container: metadata, tensor infos and dequantization to f32.
//!
//! GGUF is llama.cpp's single-file model format
//! (<https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>). We read
//! versions 2 and 3 (little-endian) through a memory map:
//!
//! ```no_run
//! # fn main() -> Result<(), ingot_models::gguf::GgufError> {
//! use ingot_models::gguf::GgufFile;
//! let file = GgufFile::open(std::path::Path::new("model.gguf"))?;
//! let layers = file.get_u64("llama.block_count");
//! let embeddings: Vec<f32> = file.dequantize("token_embd.weight")?;
//! # Ok(()) }
//! ```
//!
//! - [`reader`]: [`GgufFile`], parsing and validation (never panics on
//!   malformed input; every tensor's data must lie inside the file).
//! - [`dequant`]: [`dequantize_into`], bit-exact with ggml's reference
//!   `dequantize_row_*` for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
//!   the k-quants Q2_K..Q6_K.
//! - [`types`]: [`GgmlType`], [`MetaValue`], [`TensorInfo`].

pub mod dequant;
mod error;
pub mod reader;
pub mod types;

// Its writer builds GGUF files for other modules' tests too.
#[cfg(test)]
pub(crate) mod tests;
// Property tests over corrupted files (issue 37).
#[cfg(test)]
mod fuzz;

pub use dequant::dequantize_into;
pub use error::GgufError;
pub use reader::GgufFile;
pub use types::{GgmlType, MetaValue, TensorInfo};
