//! Speculative decoding: a proposer guesses the tokens that follow a
//! decoding sequence; the next step runs them after its last token, and
//! each position's logits verify one guess (kept with its probability under
//! the model, see [`ingot_runner::sampling::sample_row_given`]). A step
//! then yields every kept guess plus one token of the model's own, so
//! answers are exactly those of plain decoding (greedy: token for token;
//! sampled: the same distribution) while a step may yield several tokens.
//!
//! Proposers: [`NgramProposer`] (prompt lookup: the tokens that followed
//! the latest earlier occurrence of the sequence's last n tokens) and
//! [`DraftModelProposer`] (a smaller model of the same tokenizer, run
//! greedily ahead of the target in its own KV cache). How many tokens a
//! sequence proposes follows a cost model ([`policy`]): its recent
//! acceptance against what an extra token costs in the step and, for a
//! draft model, to make.

mod draft;
mod ngram;
mod policy;
mod verify;

use ingot_core::TokenId;
use ingot_runner::ModelRunner;

use crate::handle::RequestId;

pub use draft::{DraftLimits, DraftModelProposer};
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
    /// A draft model (given to [`crate::start_engine_with_draft`]).
    Draft,
}

/// One sequence's request for proposals.
#[derive(Debug, Clone, Copy)]
pub struct ProposeRequest<'a> {
    /// The sequence (its request's id): a proposer may keep state per
    /// sequence between steps.
    pub seq: RequestId,
    /// Its tokens so far, prompt and output.
    pub tokens: &'a [TokenId],
    /// Most tokens to propose (at least 1).
    pub max: usize,
}

/// Guesses the tokens that follow sequences.
pub trait Proposer: Send {
    /// For each request, up to `max` tokens likely to follow its tokens;
    /// empty where there is no guess. One call per step, every sequence
    /// that speculates in it at once (a draft model batches them).
    fn propose(&mut self, requests: &[ProposeRequest<'_>]) -> Vec<Vec<TokenId>>;

    /// Forgets the sequences `live` says have ended.
    fn retain(&mut self, live: &dyn Fn(RequestId) -> bool) {
        let _ = live;
    }

    /// Seconds one proposed token cost the last call that proposed (0 for
    /// a proposer that runs no model): the cost model counts it.
    fn seconds_per_token(&self) -> f64 {
        0.0
    }
}

/// The engine's speculation: its settings, proposer and step-cost fit.
pub(crate) struct Speculation {
    pub config: SpeculativeConfig,
    pub proposer: Box<dyn Proposer>,
    pub cost: StepCost,
}

/// What stops an engine from speculating as configured.
#[derive(Debug, thiserror::Error)]
pub enum SpeculationError {
    /// `method = "draft"` without a draft model's runner.
    #[error("speculative.method = \"draft\" needs a draft model (speculative.model)")]
    NoDraftModel,
    /// A draft runner given for another method.
    #[error("a draft model was given, and speculative.method is not \"draft\"")]
    UnusedDraftModel,
    /// The draft model cannot propose for the target.
    #[error("{0}")]
    Incompatible(String),
}

impl Speculation {
    /// The speculation `config` asks for, if any, with `draft` the draft
    /// model's runner for `method = "draft"` (a forward of it within
    /// `limits`); `vocab_size` the target's.
    pub(crate) fn new(
        config: &SpeculativeConfig,
        draft: Option<Box<dyn ModelRunner>>,
        vocab_size: usize,
        limits: DraftLimits,
    ) -> Result<Option<Self>, SpeculationError> {
        let proposer: Box<dyn Proposer> = match (config.method, draft) {
            (None, None) => return Ok(None),
            (Some(SpeculativeMethod::Ngram), None) => {
                Box::new(NgramProposer::new(config.ngram_min, config.ngram_max))
            }
            (Some(SpeculativeMethod::Draft), Some(runner)) => {
                Box::new(DraftModelProposer::new(runner, vocab_size, limits)?)
            }
            (Some(SpeculativeMethod::Draft), None) => return Err(SpeculationError::NoDraftModel),
            (_, Some(_)) => return Err(SpeculationError::UnusedDraftModel),
        };
        Ok((config.num_speculative_tokens > 0).then(|| Self {
            config: config.clone(),
            proposer,
            cost: StepCost::default(),
        }))
    }

    /// The rate a proposal must be kept at in a step running `running`
    /// sequences.
    fn threshold(&self, running: usize) -> f64 {
        self.cost
            .threshold(running, self.proposer.seconds_per_token())
    }

    /// Whether a sequence of `acceptance` may propose in a step running
    /// `running` sequences.
    pub(crate) fn may_propose(&self, acceptance: &Acceptance, running: usize) -> bool {
        running <= self.config.disable_by_batch_size
            && (!self.config.adaptive || acceptance.may_propose(self.threshold(running)))
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
        acceptance.tokens_worth(self.threshold(running), self.config.num_speculative_tokens)
    }
}
