//! One request's generation state and the post-processing of each sampled
//! token: stop token ids, EOS, max_tokens, incremental detokenization and
//! stop strings.

use std::sync::Arc;

use ingot_core::{FinishReason, SamplingParams, StopCriteria, TokenId};
use ingot_kv_cache::BlockTable;
use ingot_tokenizer::{IncrementalDecoder, Tokenizer, TokenizerError};

use crate::sampler::{SampledToken, Sampler};
use crate::stop::StopMatcher;

/// What one generated token produced for the client.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenOutput {
    /// The sampled token and its logprobs.
    pub sampled: SampledToken,
    /// Text that became final with this token (may be empty).
    pub text: String,
    /// Set when this token ended the sequence.
    pub finish: Option<FinishReason>,
}

/// A sequence being generated.
pub struct Sequence {
    /// Prompt token ids.
    pub prompt: Vec<TokenId>,
    /// Generated token ids (including a final stop token, if any).
    pub output: Vec<TokenId>,
    /// KV blocks holding this sequence's positions.
    pub block_table: BlockTable,
    /// Positions already in the KV cache.
    pub num_computed: usize,
    sampler: Sampler,
    criteria: StopCriteria,
    stop: StopMatcher,
    detok: IncrementalDecoder,
    eos: Vec<TokenId>,
    max_context: usize,
}

impl Sequence {
    /// Prepares a sequence; `eos` are the model's end-of-sequence ids.
    pub fn new(
        prompt: Vec<TokenId>,
        params: SamplingParams,
        criteria: StopCriteria,
        tokenizer: Arc<Tokenizer>,
        max_context: usize,
    ) -> Self {
        let eos = tokenizer.eos_ids().to_vec();
        Self {
            sampler: Sampler::new(params, &prompt),
            stop: StopMatcher::new(&criteria.stop_strings),
            detok: IncrementalDecoder::new(tokenizer, true),
            prompt,
            output: Vec::new(),
            block_table: BlockTable::new(),
            num_computed: 0,
            criteria,
            eos,
            max_context,
        }
    }

    /// Prompt plus output length.
    pub fn len(&self) -> usize {
        self.prompt.len() + self.output.len()
    }

    /// True for a sequence with no tokens at all (never valid to run).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens not yet in the KV cache.
    pub fn pending_tokens(&self) -> Vec<TokenId> {
        let all = self.prompt.iter().chain(self.output.iter());
        all.skip(self.num_computed).copied().collect()
    }

    /// Samples from this sequence's logits row and applies every stop rule.
    pub fn accept_logits(&mut self, logits: &mut [f32]) -> Result<TokenOutput, TokenizerError> {
        let sampled = self.sampler.sample(logits);
        let token = sampled.token;
        self.output.push(token);
        let is_stop_token = (!self.criteria.ignore_eos && self.eos.contains(&token))
            || self.criteria.stop_token_ids.contains(&token);
        if is_stop_token {
            let text = self.stop.flush();
            return Ok(TokenOutput {
                sampled,
                text,
                finish: Some(FinishReason::Stop),
            });
        }
        let piece = self.detok.step(token)?.unwrap_or_default();
        let outcome = self.stop.push(&piece);
        if outcome.stopped {
            return Ok(TokenOutput {
                sampled,
                text: outcome.emit,
                finish: Some(FinishReason::Stop),
            });
        }
        let mut text = outcome.emit;
        let at_limit =
            self.output.len() >= self.criteria.max_tokens || self.len() >= self.max_context;
        let mut finish = None;
        if at_limit {
            // Release text held back for a possible stop string or an
            // incomplete character; a stop string may still complete here.
            let tail = self.stop.push(&self.detok.finish()?.unwrap_or_default());
            text.push_str(&tail.emit);
            if !tail.stopped {
                text.push_str(&self.stop.flush());
            }
            finish = Some(if tail.stopped {
                FinishReason::Stop
            } else {
                FinishReason::Length
            });
        }
        Ok(TokenOutput {
            sampled,
            text,
            finish,
        })
    }
}
