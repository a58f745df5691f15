//! Integration tests of ingot-models on real GGUF files, in one test binary
//! (one link instead of two): Gemma 3's metadata and weights, and the GGUF
//! reader and dequantizer against the `gguf` Python package, the
//! safetensors reader under hostile headers, and a tensor-parallel rank's
//! slices of SmolLM2's blocks.

// Helpers outside #[test] fns unwrap too: this is a test binary.
#![allow(clippy::unwrap_used)]

#[path = "suite/gemma3_config.rs"]
mod gemma3_config;
#[path = "suite/gguf_dequant.rs"]
mod gguf_dequant;
#[path = "suite/safetensors_fuzz.rs"]
mod safetensors_fuzz;
#[path = "suite/sharded_gguf.rs"]
mod sharded_gguf;
