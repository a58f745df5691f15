//! `POST /tokenize` and `POST /detokenize` (vLLM-compatible extensions).

use ingot_core::TokenId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Tokenize text, or a conversation through the chat template.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
pub struct TokenizeRequest {
    /// Model name (optional).
    pub model: Option<String>,
    /// Text to tokenize.
    pub prompt: Option<String>,
    /// Or messages to render with the chat template.
    pub messages: Option<Vec<Value>>,
    /// Apply the model's BOS/EOS rules to `prompt` (default true).
    pub add_special_tokens: Option<bool>,
    /// With `messages`: append the assistant header (default true).
    pub add_generation_prompt: Option<bool>,
}

/// Token ids of the input.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct TokenizeResponse {
    /// The ids.
    pub tokens: Vec<TokenId>,
    /// How many.
    pub count: usize,
    /// The model's context length.
    pub max_model_len: usize,
}

/// Token ids to text.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
pub struct DetokenizeRequest {
    /// Model name (optional).
    pub model: Option<String>,
    /// The ids.
    pub tokens: Vec<TokenId>,
}

/// The decoded text.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct DetokenizeResponse {
    /// Text of the ids.
    pub prompt: String,
}

/// `GET /tokenizer_info` (vLLM's): the special tokens, so a client that
/// tokenizes through `/tokenize` (lm-evaluation-harness's remote
/// tokenizer) knows them without downloading the tokenizer.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct TokenizerInfo {
    /// End-of-sequence token text.
    pub eos_token: Option<String>,
    /// Beginning-of-sequence token text.
    pub bos_token: Option<String>,
    /// Padding token text.
    pub pad_token: Option<String>,
    /// Unknown-token text.
    pub unk_token: Option<String>,
    /// Whether encoding prepends BOS.
    pub add_bos_token: bool,
    /// Whether encoding appends EOS.
    pub add_eos_token: bool,
    /// The model's context length.
    pub model_max_length: usize,
    /// Where the tokenizer came from ("gguf", "huggingface").
    pub tokenizer_class: String,
}
