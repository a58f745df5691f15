//! Speculative decoding: a proposer guesses the tokens that follow a
//! decoding sequence; the next step runs them after its last token, and
//! each position's logits verify one guess (kept with its probability under
//! the model, see [`ingot_runner::sampling::sample_row_given`]). A step
//! then yields every kept guess plus one token of the model's own, so
//! answers are exactly those of plain decoding (greedy: token for token;
//! sampled: the same distribution) while a step may yield several tokens.
//!
//! Proposers: [`NgramProposer`] (prompt lookup: the tokens that followed
//! the latest earlier occurrence of the sequence's last n tokens),
//! [`DraftModelProposer`] (a smaller model of the same tokenizer, run
//! greedily ahead of the target in its own KV cache) and [`EagleProposer`]
//! (an EAGLE-3 head reading the target's hidden states). How many tokens a
//! sequence proposes follows a cost model ([`policy`]): its recent
//! acceptance against what an extra token costs in the step and, for a
//! draft model, to make.

mod draft;
mod eagle;
mod ngram;
mod policy;
mod verify;

use ingot_core::TokenId;
use ingot_runner::{DraftHead, ModelRunner};

use crate::handle::RequestId;

pub use draft::{DraftLimits, DraftModelProposer};
pub use eagle::EagleProposer;
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
    /// The n-gram proposer rates its guesses by their match length
    /// ([`Proposer::rates_guesses`]); off: each sequence's acceptance
    /// decides before the lookup.
    pub rate_by_match: bool,
    /// A sequence whose proposer knows it has nothing to guess
    /// ([`Proposer::finds_nothing`]) lets the next step launch ahead.
    pub launch_ahead_unmatched: bool,
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
            rate_by_match: false,
            launch_ahead_unmatched: true,
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
    /// An EAGLE-3 head (given to [`crate::start_engine_with_draft`]).
    Eagle3,
}

/// What a draft-based method proposes with.
pub enum Drafter {
    /// A draft model's runner (`method = "draft"`).
    Model(Box<dyn ModelRunner>),
    /// An EAGLE-3 head on the target's device (`method = "eagle3"`).
    Head(Box<dyn DraftHead>),
}

/// A sequence's rows of a finished step whose next token is known: the
/// hidden states a proposer that reads them ([`Proposer::observe`]) takes.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The sequence.
    pub seq: RequestId,
    /// Position of the first row.
    pub start: usize,
    /// The token that follows each row's position, one per row.
    pub next: &'a [TokenId],
    /// The first row's index among the step's captured rows.
    pub first_row: usize,
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

/// One sequence's guess.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Draft {
    /// The tokens guessed to follow, in order (empty: no guess).
    pub tokens: Vec<TokenId>,
    /// How many tokens of context back the guess, where the proposer can
    /// say (the n-gram proposer: the length of the suffix it matched); 0
    /// where it cannot (a draft model).
    pub matched: usize,
}

/// Guesses the tokens that follow sequences.
pub trait Proposer: Send {
    /// For each request, up to `max` tokens likely to follow its tokens
    /// (no tokens where there is no guess). One call per step, every
    /// sequence that speculates in it at once (a draft model batches them).
    fn propose(&mut self, requests: &[ProposeRequest<'_>]) -> Vec<Draft>;

    /// Whether its guesses cost nothing to make and say what backs them
    /// ([`Draft::matched`]): the engine then asks for the most tokens and
    /// the cost model cuts each guess by how often guesses backed alike
    /// were kept, instead of deciding per sequence before the guess.
    fn rates_guesses(&self) -> bool {
        false
    }

    /// Whether a guess after `tokens` is known to be empty without making
    /// it (an n-gram lookup that finds no match); false where only a guess
    /// tells (a model). The engine then lets the next step launch ahead.
    fn finds_nothing(&self, tokens: &[TokenId]) -> bool {
        let _ = tokens;
        false
    }

    /// Target layers whose hidden states it reads (the engine has the
    /// runner capture them and hands them to [`Proposer::observe`]).
    fn hidden_layers(&self) -> Vec<usize> {
        Vec::new()
    }

    /// After a step: the rows whose next token is known, and the captured
    /// hidden states of every row of the step (in batch order).
    fn observe(&mut self, rows: &[Observed<'_>], hidden: &[f32]) {
        let _ = (rows, hidden);
    }

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

/// A sequence's pages in a proposer's own block pool (a draft model's or
/// an EAGLE head's KV cache).
trait HeldPages {
    fn tables(&mut self) -> &mut Vec<ingot_kv_cache::BlockTable>;
    /// The proposer call that last used them.
    fn last_used(&self) -> u64;
}

/// Readies `id`'s tables in `pool` for positions `start..end`, giving back
/// the pages of the least recently used other sequences (none used in call
/// `clock`) while the pool is full. False when none is left to give.
fn reserve_evicting<S: HeldPages>(
    pool: &mut ingot_kv_cache::BlockPool,
    seqs: &mut std::collections::HashMap<RequestId, S>,
    id: RequestId,
    (start, end): (usize, usize),
    clock: u64,
) -> bool {
    loop {
        let Some(seq) = seqs.get_mut(&id) else {
            return false;
        };
        if pool.reserve_groups(seq.tables(), start, end).is_ok() {
            return true;
        }
        let victim = seqs
            .iter()
            .filter(|(k, s)| **k != id && s.last_used() < clock)
            .min_by_key(|(_, s)| s.last_used())
            .map(|(k, _)| *k);
        let Some(mut gone) = victim.and_then(|v| seqs.remove(&v)) else {
            return false;
        };
        pool.release_groups(gone.tables());
    }
}

/// Guesses backed by this many tokens of context or more share one
/// acceptance estimate.
const MATCH_CLASSES: usize = 8;

/// The engine's speculation: its settings, proposer and step-cost fit.
pub(crate) struct Speculation {
    pub config: SpeculativeConfig,
    pub proposer: Box<dyn Proposer>,
    /// The target layers the proposer reads ([`Proposer::hidden_layers`];
    /// empty: none, and no step hands it hidden states).
    pub hidden_layers: Vec<usize>,
    pub cost: StepCost,
    /// For a proposer that rates its guesses: how often guesses backed by
    /// 1, 2, ... [`MATCH_CLASSES`]+ tokens of context were kept, over every
    /// sequence (an n-gram guess from a 6-token match is right far more
    /// often than one from a 1-token match, whatever the sequence).
    by_match: [Acceptance; MATCH_CLASSES],
    /// The last step let the runner launch the next one ahead: a proposal
    /// now would not match the step in flight, so none is made.
    pub launched_ahead: bool,
    /// The step in flight keeps its hidden rows for the proposer
    /// ([`ingot_runner::ForwardBatch::keep_hidden`]).
    pub observing: bool,
}

/// What stops an engine from speculating as configured.
#[derive(Debug, thiserror::Error)]
pub enum SpeculationError {
    /// `method = "draft"` or `"eagle3"` without its drafter.
    #[error("speculative.method = \"{0}\" needs speculative.model")]
    NoDraftModel(&'static str),
    /// A drafter given for another method.
    #[error("a draft model or head was given that speculative.method does not use")]
    UnusedDraftModel,
    /// The draft model cannot propose for the target.
    #[error("{0}")]
    Incompatible(String),
}

impl Speculation {
    /// The speculation `config` asks for, if any, with `draft` the draft
    /// model's runner for `method = "draft"` (a forward of it within
    /// `limits`) or the head for `"eagle3"`; `vocab_size` the target's.
    pub(crate) fn new(
        config: &SpeculativeConfig,
        draft: Option<Drafter>,
        vocab_size: usize,
        limits: DraftLimits,
    ) -> Result<Option<Self>, SpeculationError> {
        use SpeculativeMethod as M;
        let proposer: Box<dyn Proposer> = match (config.method, draft) {
            (None, None) => return Ok(None),
            (Some(M::Ngram), None) => Box::new(
                NgramProposer::new(config.ngram_min, config.ngram_max)
                    .rating_guesses(config.rate_by_match),
            ),
            (Some(M::Draft), Some(Drafter::Model(runner))) => {
                Box::new(DraftModelProposer::new(runner, vocab_size, limits)?)
            }
            (Some(M::Eagle3), Some(Drafter::Head(head))) => Box::new(EagleProposer::new(head)),
            (Some(M::Draft), None) => return Err(SpeculationError::NoDraftModel("draft")),
            (Some(M::Eagle3), None) => return Err(SpeculationError::NoDraftModel("eagle3")),
            (_, Some(_)) => return Err(SpeculationError::UnusedDraftModel),
        };
        Ok((config.num_speculative_tokens > 0).then(|| Self {
            config: config.clone(),
            hidden_layers: proposer.hidden_layers(),
            proposer,
            cost: StepCost::default(),
            by_match: Default::default(),
            launched_ahead: false,
            observing: false,
        }))
    }

    /// The rate a proposal must be kept at in a step running `running`
    /// sequences.
    fn threshold(&self, running: usize) -> f64 {
        self.cost
            .threshold(running, self.proposer.seconds_per_token())
    }

    /// Whether a sequence of `acceptance` may propose in a step running
    /// `running` sequences (the backend launches the next step ahead only
    /// when none may); `proposing`: it proposed in the last step, which
    /// also says so for a proposer that rates its guesses after making
    /// them (its lookups run only in steps not launched ahead, so its own
    /// acceptance keeps those coming as it does for other proposers).
    pub(crate) fn may_propose(
        &self,
        acceptance: &Acceptance,
        proposing: bool,
        running: usize,
    ) -> bool {
        running <= self.config.disable_by_batch_size
            && (!self.config.adaptive
                || (proposing && self.proposer.rates_guesses())
                || acceptance.may_propose(self.threshold(running)))
    }

    /// Whether a sequence holds back the early launch of the step after
    /// this one: it may propose ([`Self::may_propose`]), unless
    /// `launch_ahead_unmatched` and the proposer knows that nothing would
    /// follow its `tokens` (its guess then waits a step once there is one;
    /// the tokens are read only when that question is asked).
    pub(crate) fn holds_back_launch<'t>(
        &self,
        acceptance: &Acceptance,
        proposing: bool,
        running: usize,
        tokens: impl FnOnce() -> &'t [TokenId],
    ) -> bool {
        self.may_propose(acceptance, proposing, running)
            && !(self.config.launch_ahead_unmatched && self.proposer.finds_nothing(tokens()))
    }

    /// Tokens a sequence of `acceptance` asks the proposer for in a step
    /// running `running` sequences (0: none): all it may propose where the
    /// guesses are rated after they are made ([`Self::keep_of`]).
    pub(crate) fn tokens_for(&self, acceptance: &mut Acceptance, running: usize) -> usize {
        if running > self.config.disable_by_batch_size {
            return 0;
        }
        if !self.config.adaptive || self.proposer.rates_guesses() {
            return self.config.num_speculative_tokens;
        }
        acceptance.tokens_worth(self.threshold(running), self.config.num_speculative_tokens)
    }

    /// How many tokens of `draft` to propose in a step running `running`
    /// sequences: the j-th pays while the keep rate of guesses backed as
    /// well, to the j-th power, beats the step's threshold (all of it for a
    /// proposer that does not rate its guesses, or without `adaptive`).
    pub(crate) fn keep_of(&mut self, draft: &Draft, running: usize) -> usize {
        if !self.rates_guesses() || draft.matched == 0 || draft.tokens.is_empty() {
            return draft.tokens.len();
        }
        let threshold = self.threshold(running);
        self.by_match[match_class(draft.matched)].tokens_worth(threshold, draft.tokens.len())
    }

    /// A verification kept `kept` of `proposed` tokens of a guess backed by
    /// `matched` tokens of context (nothing to record for unrated guesses:
    /// `matched` 0, or guesses the engine does not rate).
    pub(crate) fn record_match(&mut self, matched: usize, proposed: usize, kept: usize) {
        if self.rates_guesses() && matched > 0 {
            self.by_match[match_class(matched)].record(proposed, kept);
        }
    }

    /// Whether guesses are cut by their match class (`by_match`) after
    /// they are made: `adaptive`, and a proposer that rates them.
    fn rates_guesses(&self) -> bool {
        self.config.adaptive && self.proposer.rates_guesses()
    }
}

/// The acceptance estimate of guesses backed by `matched` (> 0) tokens.
fn match_class(matched: usize) -> usize {
    matched.min(MATCH_CLASSES) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ngram(adaptive: bool, rate_by_match: bool) -> Speculation {
        let config = SpeculativeConfig {
            method: Some(SpeculativeMethod::Ngram),
            num_speculative_tokens: 7,
            adaptive,
            rate_by_match,
            ..SpeculativeConfig::default()
        };
        let limits = DraftLimits {
            max_rows: 8,
            max_tokens: 64,
        };
        match Speculation::new(&config, None, 100, limits) {
            Ok(Some(s)) => s,
            _ => panic!("n-gram speculation"),
        }
    }

    fn draft(matched: usize) -> Draft {
        Draft {
            tokens: vec![1; 7],
            matched,
        }
    }

    /// The n-gram proposer is asked for the most tokens, and each guess is
    /// cut by the record of guesses backed by as long a match: long matches
    /// that held keep proposing deeply while short ones that failed stop.
    #[test]
    fn guesses_are_cut_by_how_often_alike_ones_held() {
        let mut s = ngram(true, true);
        assert_eq!(s.tokens_for(&mut Acceptance::default(), 1), 7);
        // The prior: even odds against a step-cost threshold of 1/3.
        assert_eq!(s.keep_of(&draft(6), 1), 1);
        for _ in 0..20 {
            s.record_match(6, 7, 7);
            s.record_match(1, 3, 0);
        }
        assert_eq!(s.keep_of(&draft(6), 1), 7);
        assert_eq!(s.keep_of(&draft(1), 1), 0);
        // A match of another length has its own record (here the prior);
        // those of 8 tokens and more share one.
        assert_eq!(s.keep_of(&draft(2), 1), 1);
        for _ in 0..20 {
            s.record_match(9, 7, 7);
        }
        assert_eq!(s.keep_of(&draft(30), 1), 7);
        // Unrated guesses (a draft model's) and the fixed mode keep all.
        assert_eq!(s.keep_of(&draft(0), 1), 7);
        assert_eq!(ngram(false, true).keep_of(&draft(1), 1), 7);
        // A sequence may propose next step when it just did, or when its
        // own acceptance says proposals pay (as for unrated proposers: the
        // backend launches steps ahead only when none may).
        let mut failing = Acceptance::default();
        for _ in 0..20 {
            failing.record(4, 0);
        }
        assert!(s.may_propose(&failing, true, 1) && !s.may_propose(&failing, false, 1));
        assert!(s.may_propose(&Acceptance::default(), false, 1));
        assert!(
            !s.may_propose(&failing, true, 9),
            "above disable_by_batch_size"
        );
    }

    /// By default (`rate_by_match` off) each sequence's own acceptance
    /// decides how many tokens it asks for, before the lookup, and a guess
    /// is kept whole.
    #[test]
    fn unrated_ngram_asks_by_the_sequences_acceptance() {
        let mut s = ngram(true, false);
        // Even odds against the prior threshold of 1/3: one token.
        assert_eq!(s.tokens_for(&mut Acceptance::default(), 1), 1);
        let mut holding = Acceptance::default();
        for _ in 0..20 {
            holding.record(7, 7);
        }
        assert_eq!(s.tokens_for(&mut holding, 1), 7);
        assert_eq!(s.keep_of(&draft(1), 1), 7);
        let mut failing = Acceptance::default();
        for _ in 0..20 {
            failing.record(4, 0);
        }
        assert!(!s.may_propose(&failing, true, 1));
    }
}
