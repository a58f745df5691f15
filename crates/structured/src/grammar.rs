//! One output's grammar state: which tokens may come next, and the tokens
//! that came.

use std::sync::Arc;

use ingot_core::{GrammarSpec, TokenId};
use llguidance::Matcher;

use crate::GrammarError;

/// Allowed next tokens: bit `t % 32` of word `t / 32` is set when token `t`
/// is allowed; ids past the end are not.
pub type TokenMask = Vec<u32>;

/// The grammar state of one output. Cloning gives an independent state at
/// the same point (every choice of an `n > 1` request gets its own).
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
    spec: Arc<GrammarSpec>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("finished", &self.is_finished())
            .finish_non_exhaustive()
    }
}

impl Grammar {
    pub(crate) fn new(matcher: Matcher, spec: GrammarSpec) -> Self {
        Self {
            matcher,
            spec: Arc::new(spec),
        }
    }

    /// What it was compiled from (part of the request key).
    pub fn spec(&self) -> &GrammarSpec {
        &self.spec
    }

    /// The tokens allowed next (only end-of-sequence once the grammar is
    /// complete). Tens of microseconds typically; run it off the critical
    /// path.
    pub fn mask(&mut self) -> Result<TokenMask, GrammarError> {
        let vob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError::State(e.to_string()))?;
        if vob.is_zero() {
            return Err(GrammarError::State(
                "no token can continue the output".into(),
            ));
        }
        Ok(vob.into())
    }

    /// Advances past a generated token (which the last mask allowed).
    pub fn accept(&mut self, token: TokenId) -> Result<(), GrammarError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError::State(e.to_string()))
    }

    /// True once the output is complete: nothing may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}
