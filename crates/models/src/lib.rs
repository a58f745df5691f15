//! Model files and architectures: GGUF files and Hugging Face directories in,
//! a resolved [`ModelConfig`] and host weights out.
//!
//! - [`gguf`]: the GGUF container (metadata, tensor infos, dequantization).
//! - [`hf`]: Hugging Face `config.json` + safetensors (sharded or not),
//!   FP8, AWQ and GPTQ checkpoints among them (`int4`: AWQ/GPTQ 4-bit
//!   weights as GGUF Q4_1 blocks).
//! - [`gguf_model`]: GGUF metadata → config, GGUF tensor names → HF names.
//! - [`llama`]: the weights of the Llama-family decoder (dense or with
//!   experts).
//! - [`bert`]: BERT encoder directories (config, pooling, weights).
//! - [`dummy`]: random weights for benchmarking shapes without downloads.
//! - [`parallel`]: tensor parallelism's sharding plan.

pub mod bert;
pub mod config;
pub mod dummy;
pub mod eagle;
mod error;
pub mod gguf;
pub mod gguf_model;
pub mod hf;
mod int4;
pub mod llama;
pub mod parallel;
mod source;
mod tensor;

pub use config::{
    Architecture, BlockOptions, LlamaShape, ModelConfig, MoeConfig, RopeConfig, RopeScaling,
    SlidingWindow,
};
pub use error::ModelError;
pub use llama::{LayerWeights, LlamaWeights, MlpWeights};
pub use source::{open, LoadFormat, ModelFiles, TensorSource};
pub use tensor::{Bf16Tensor, BlockData, E4m3Tensor, HostTensor, QuantTensor};
