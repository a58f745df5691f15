//! Speculative decoding: a proposer guesses the tokens that follow a
//! decoding sequence; the next step runs them after its last token, and
//! each position's logits verify one guess (kept with its probability under
//! the model, see [`ingot_runner::sampling::sample_row_given`]). A step
//! then yields every kept guess plus one token of the model's own, so
//! answers are exactly those of plain decoding (greedy: token for token;
//! sampled: the same distribution) while a step may yield several tokens.
//!
//! Proposers: [`NgramProposer`] (prompt lookup: the tokens that followed
//! the latest earlier occurrence of the sequence's last n tokens). How many
//! tokens a sequence proposes follows a cost model ([`policy`]): its recent
//! acceptance against what an extra token costs in the step.

mod ngram;
mod policy;
mod verify;

use ingot_core::TokenId;

pub use ngram::NgramProposer;
pub(crate) use policy::{Acceptance, StepCost};
pub(crate) use verify::{verify_ids, verify_rows, Verified};

/// How the engine speculates (`[speculative]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeculativeConfig {
    /// The proposer (`None`: no speculation).
    pub method: Option<SpeculativeMethod>,
    /// Most tokens proposed per sequence and step (fewer where they are
    /// unlikely to be kept or the step is compute-bound).
    pub num_speculative_tokens: usize,
    /// Shortest suffix the n-gram proposer matches.
    pub ngram_min: usize,
    /// Longest suffix the n-gram proposer matches (tried first).
    pub ngram_max: usize,
    /// No speculation in a step when more sequences than this run: a large
    /// batch already uses the weights it reads, and verifying guesses then
    /// costs compute the batch needs.
    pub disable_by_batch_size: usize,
    /// Propose as many tokens as pay (the cost model); off: always
    /// `num_speculative_tokens` where the proposer has them (vLLM's way).
    pub adaptive: bool,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        Self {
            method: None,
            num_speculative_tokens: 4,
            ngram_min: 2,
            ngram_max: 4,
            disable_by_batch_size: 8,
            adaptive: true,
        }
    }
}

/// Where proposals come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpeculativeMethod {
    /// Prompt lookup: no model, works for every model.
    Ngram,
}

/// Guesses the tokens that follow a sequence.
pub trait Proposer: Send {
    /// Up to `max` tokens likely to follow `tokens` (prompt and output so
    /// far); empty when it has no guess.
    fn propose(&mut self, tokens: &[TokenId], max: usize) -> Vec<TokenId>;
}

/// The engine's speculation: its settings, proposer and step-cost fit.
pub(crate) struct Speculation {
    pub config: SpeculativeConfig,
    pub proposer: Box<dyn Proposer>,
    pub cost: StepCost,
}

impl Speculation {
    /// The speculation `config` asks for, if any.
    pub(crate) fn new(config: &SpeculativeConfig) -> Option<Self> {
        let proposer: Box<dyn Proposer> = match config.method? {
            SpeculativeMethod::Ngram => {
                Box::new(NgramProposer::new(config.ngram_min, config.ngram_max))
            }
        };
        (config.num_speculative_tokens > 0).then(|| Self {
            config: config.clone(),
            proposer,
            cost: StepCost::default(),
        })
    }

    /// Whether a sequence of `acceptance` may propose in a step running
    /// `running` sequences.
    pub(crate) fn may_propose(&self, acceptance: &Acceptance, running: usize) -> bool {
        running <= self.config.disable_by_batch_size
            && (!self.config.adaptive || acceptance.may_propose(self.cost.threshold(running)))
    }

    /// Tokens a sequence of `acceptance` proposes in a step running
    /// `running` sequences (0: none).
    pub(crate) fn tokens_for(&self, acceptance: &mut Acceptance, running: usize) -> usize {
        if running > self.config.disable_by_batch_size {
            return 0;
        }
        if !self.config.adaptive {
            return self.config.num_speculative_tokens;
        }
        acceptance.tokens_worth(
            self.cost.threshold(running),
            self.config.num_speculative_tokens,
        )
    }
}
