//! ingot-tokenizer: tokenizers, chat templates and streaming detokenization.
//!
//! - [`Tokenizer`]: encode/decode plus special tokens, loaded from a Hugging
//!   Face directory or a GGUF file's embedded vocabulary (built to match
//!   llama.cpp token for token).
//! - [`ChatTemplate`]: Hugging Face chat templates rendered with minijinja.
//! - [`IncrementalDecoder`]: token-by-token detokenization that never emits
//!   a partial UTF-8 character.

mod chat;
mod detokenizer;
mod encoder;
mod error;
mod gguf;
mod hf;
mod tokenizer;

pub use chat::{ChatMessage, ChatTemplate};
pub use detokenizer::IncrementalDecoder;
pub use encoder::EncoderTokenizer;
pub use error::TokenizerError;
pub use tokenizer::{SpecialTokens, TokenInfo, Tokenizer};
