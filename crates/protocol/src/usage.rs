//! Token accounting and logprob shapes shared by responses.

use serde::Serialize;

/// Prompt-token details.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// `usage` of a response.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Usage {
    /// Prompt tokens (summed over prompts; counted once per prompt).
    pub prompt_tokens: usize,
    /// Generated tokens over all choices.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// Cache details.
    pub prompt_tokens_details: PromptTokensDetails,
}

impl Usage {
    /// Builds usage from its parts.
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// One token's text and logprob, as the server resolved it.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobInfo {
    /// The token's text (may be a partial character, shown with U+FFFD).
    pub token: String,
    /// Its raw bytes.
    pub bytes: Vec<u8>,
    /// Natural-log probability.
    pub logprob: f32,
    /// Alternatives, most likely first.
    pub top: Vec<(String, Vec<u8>, f32)>,
}
