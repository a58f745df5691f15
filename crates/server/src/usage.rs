//! What a keyed request used. When the request ends (answered, streamed to
//! the end, or dropped with its client) its tokens are counted per key and
//! the tokens reserved at admission (prompt + max_tokens) but not used go
//! back to the key's tokens-per-minute budget.

use std::sync::Arc;

use ingot_edge::{Key, KEY_TOKENS};

/// A request's usage, settled on drop.
#[derive(Default)]
pub struct KeyUsage {
    key: Option<Arc<Key>>,
    /// Tokens reserved at admission.
    reserved: u64,
    /// Prompt tokens as the reservation counted them (once per choice).
    charged_prompt: u64,
    prompt: u64,
    completion: u64,
}

impl KeyUsage {
    /// Usage of a request by `key` that reserved `reserved` tokens for
    /// `prompt` prompt tokens and `choices` choices of each.
    pub fn new(key: Option<Arc<Key>>, reserved: u64, prompt: u64, choices: u64) -> Self {
        Self {
            key,
            reserved,
            charged_prompt: prompt * choices,
            prompt,
            completion: 0,
        }
    }

    /// One more generated token.
    pub fn add_completion(&mut self, n: u64) {
        self.completion += n;
    }

    /// The final counts (a finished answer knows them exactly).
    pub fn settle(mut self, prompt: u64, completion: u64) {
        self.prompt = prompt;
        self.completion = completion;
    }
}

impl Drop for KeyUsage {
    fn drop(&mut self) {
        let Some(key) = &self.key else {
            return;
        };
        for (kind, n) in [("prompt", self.prompt), ("completion", self.completion)] {
            metrics::counter!(KEY_TOKENS, "key_id" => key.id.clone(), "kind" => kind).increment(n);
        }
        let used = self.charged_prompt + self.completion;
        key.limits.refund_tokens(self.reserved.saturating_sub(used));
    }
}
