//! Turning a sequence's picked tokens into client output: the stop
//! rules (stop token ids, EOS, max_tokens, context length, a completed
//! grammar), incremental detokenization and stop strings.

use std::sync::{Arc, Mutex, MutexGuard};

use ingot_core::{FinishReason, SamplingParams, StopCriteria, TokenId};
use ingot_runner::Pick;
use ingot_structured::{Grammar, GrammarError, Limit};
use ingot_tokenizer::{IncrementalDecoder, Tokenizer, TokenizerError};

use crate::sampler::{SampledToken, Sampler};
use crate::stop::StopMatcher;

/// Tokens before its limit from which a constrained output's grammar
/// estimates what finishing would take (each estimate walks at most this
/// many closing steps).
const NEAR_WINDOW: usize = 96;

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

/// Why a picked token could not be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Detokenization failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The grammar refused the token or failed.
    #[error(transparent)]
    Grammar(#[from] GrammarError),
}

/// Output-side state of one sequence.
pub struct Decoding {
    sampler: Sampler,
    /// The grammar the output follows (structured output); shared with the
    /// mask thread, which reads the allowed tokens from it.
    grammar: Option<Arc<Mutex<Grammar>>>,
    criteria: StopCriteria,
    stop: StopMatcher,
    detok: IncrementalDecoder,
    eos: Vec<TokenId>,
    /// Prompt plus output may not exceed this.
    max_context: usize,
    prompt_len: usize,
    num_output: usize,
}

impl Decoding {
    /// Output state for a sequence starting from `prompt`, its output
    /// following `grammar` when given.
    pub fn new(
        prompt: &[TokenId],
        params: SamplingParams,
        criteria: StopCriteria,
        tokenizer: Arc<Tokenizer>,
        max_context: usize,
        grammar: Option<Grammar>,
    ) -> Self {
        let eos = tokenizer.eos_ids().to_vec();
        Self {
            sampler: Sampler::new(params, prompt),
            grammar: grammar.map(|g| Arc::new(Mutex::new(g))),
            stop: StopMatcher::new(&criteria.stop_strings),
            detok: IncrementalDecoder::with_prompt(tokenizer, prompt, true),
            criteria,
            eos,
            max_context,
            prompt_len: prompt.len(),
            num_output: 0,
        }
    }

    /// Tokens generated so far.
    pub fn num_output(&self) -> usize {
        self.num_output
    }

    /// Tokens the output may still take (max_tokens and the context).
    pub fn tokens_left(&self) -> usize {
        self.criteria
            .max_tokens
            .saturating_sub(self.num_output)
            .min(
                self.max_context
                    .saturating_sub(self.prompt_len + self.num_output),
            )
    }

    /// True when the next accepted token will end the sequence by length
    /// (max_tokens or the context).
    pub fn next_hits_limit(&self) -> bool {
        self.num_output + 1 >= self.criteria.max_tokens
            || self.prompt_len + self.num_output + 1 >= self.max_context
    }

    /// How near a constrained output is to its end (max_tokens or the
    /// context): closing now once its tokens left are down to a quarter of
    /// its budget, or 16; within the last [`NEAR_WINDOW`] tokens the grammar
    /// estimates whether it must start earlier. See
    /// [`ingot_structured::Grammar::limit_mask`].
    pub fn limit(&self) -> Limit {
        let left = self.tokens_left();
        if left <= (self.criteria.max_tokens / 4).max(16) {
            Limit::Closing
        } else if left <= NEAR_WINDOW {
            Limit::Near(left)
        } else {
            Limit::Far
        }
    }

    /// The request's `max_tokens`.
    pub(crate) fn max_tokens(&self) -> usize {
        self.criteria.max_tokens
    }

    /// True when the request asked for no output (`max_tokens` 0: only
    /// its prompt's logprobs).
    pub fn generates_nothing(&self) -> bool {
        self.criteria.max_tokens == 0
    }

    /// Whether the backend may pick this sequence's tokens by argmax.
    pub fn is_plain_greedy(&self) -> bool {
        self.sampler.is_plain_greedy() && self.grammar.is_none()
    }

    /// The grammar the output follows, for the mask thread.
    pub fn grammar(&self) -> Option<&Arc<Mutex<Grammar>>> {
        self.grammar.as_ref()
    }

    /// The sampler, for a backend that picks tokens itself.
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// The sampler, to draw a step's randomness.
    pub fn sampler_mut(&mut self) -> &mut Sampler {
        &mut self.sampler
    }

    /// Takes a token the backend picked (greedily or by the sampler's row)
    /// and applies every stop rule.
    pub fn accept_picked(&mut self, pick: Pick) -> Result<TokenOutput, DecodeError> {
        let grammar_done = match self.grammar_to_advance(pick.token) {
            Some(g) => advance_grammar(g, pick.token)?,
            None => false,
        };
        self.accept_picked_advanced(pick, grammar_done)
    }

    /// The grammar `token` advances: every token but one that ends the
    /// output. The engine advances a step's grammars together (see
    /// [`advance_grammar`]), then calls [`Self::accept_picked_advanced`].
    pub fn grammar_to_advance(&self, token: TokenId) -> Option<&Arc<Mutex<Grammar>>> {
        self.grammar.as_ref().filter(|_| !self.is_stop_token(token))
    }

    /// [`Self::accept_picked`] for a pick whose grammar (if any) has
    /// already been advanced; `grammar_done`: it is now complete.
    pub fn accept_picked_advanced(
        &mut self,
        pick: Pick,
        grammar_done: bool,
    ) -> Result<TokenOutput, DecodeError> {
        let sampled = self.sampler.accept_picked(pick);
        self.accept(sampled, grammar_done)
    }

    fn is_stop_token(&self, token: TokenId) -> bool {
        (!self.criteria.ignore_eos && self.eos.contains(&token))
            || self.criteria.stop_token_ids.contains(&token)
    }

    fn accept(
        &mut self,
        sampled: SampledToken,
        grammar_done: bool,
    ) -> Result<TokenOutput, DecodeError> {
        let token = sampled.token;
        self.num_output += 1;
        let is_stop_token = self.is_stop_token(token);
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
        let at_limit = self.num_output >= self.criteria.max_tokens
            || self.prompt_len + self.num_output >= self.max_context;
        let mut finish = None;
        if at_limit || grammar_done {
            // Release text held back for a possible stop string or an
            // incomplete character; a stop string may still complete here.
            let tail = self.stop.push(&self.detok.finish()?.unwrap_or_default());
            text.push_str(&tail.emit);
            if !tail.stopped {
                text.push_str(&self.stop.flush());
            }
            finish = Some(if tail.stopped || grammar_done {
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

/// Advances `grammar` past `token`; whether the output is now complete.
pub fn advance_grammar(grammar: &Mutex<Grammar>, token: TokenId) -> Result<bool, GrammarError> {
    let mut g = lock_grammar(grammar)?;
    g.accept(token)?;
    Ok(g.is_finished())
}

/// Locks a shared grammar; a poisoned one (a panic while it was held) is
/// an error for its request alone.
pub fn lock_grammar(grammar: &Mutex<Grammar>) -> Result<MutexGuard<'_, Grammar>, GrammarError> {
    grammar
        .lock()
        .map_err(|_| GrammarError::State("the grammar state was poisoned".into()))
}
