//! Integration tests of ingot-runner-cpu on real models, in one test binary
//! (one link instead of three): SmolLM2 and Gemma 3 against the independent
//! f32 numpy references (tests/reference/), and Hugging Face model
//! directories (dense and mixture-of-experts) and GGUF files of experts
//! against a float64 numpy forward pass; AWQ and GPTQ directories against
//! their dequantized float weights; tensor parallelism's sharded forward
//! against the whole model.

// Helpers outside #[test] fns unwrap too: this is a test binary.
#![allow(clippy::unwrap_used)]

#[path = "suite/gemma3_reference.rs"]
mod gemma3_reference;
#[path = "suite/hf_models.rs"]
mod hf_models;
#[path = "suite/int4_models.rs"]
mod int4_models;
#[path = "suite/moe_models.rs"]
mod moe_models;
#[path = "suite/reference.rs"]
mod reference;
#[path = "suite/tensor_parallel.rs"]
mod tensor_parallel;
