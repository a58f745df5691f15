//! `POST /tokenize` and `POST /detokenize` (vLLM-compatible extensions).

use ingot_core::TokenId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Tokenize text, or a conversation through the chat template.
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TokenizeResponse {
    /// The ids.
    pub tokens: Vec<TokenId>,
    /// How many.
    pub count: usize,
    /// The model's context length.
    pub max_model_len: usize,
}

/// Token ids to text.
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    /// Model name (optional).
    pub model: Option<String>,
    /// The ids.
    pub tokens: Vec<TokenId>,
}

/// The decoded text.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DetokenizeResponse {
    /// Text of the ids.
    pub prompt: String,
}
