//! One output's grammar state: which tokens may come next, and the tokens
//! that came.

use std::sync::Arc;

use ingot_core::{GrammarSpec, TokenId};
use llguidance::Matcher;

use crate::vocab::Closers;
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
    closers: Arc<Closers>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("finished", &self.is_finished())
            .finish_non_exhaustive()
    }
}

impl Grammar {
    pub(crate) fn new(matcher: Matcher, spec: GrammarSpec, closers: Arc<Closers>) -> Self {
        Self {
            matcher,
            spec: Arc::new(spec),
            closers,
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

    /// [`Self::mask`] for an output about to run out of tokens: narrowed,
    /// when the grammar allows any, to the end of the output; else inside
    /// a string to the quote that ends it; else to tokens that close
    /// objects and arrays, else to ones that end a value. So a small model
    /// looping inside a JSON value still finishes valid JSON within its
    /// `max_tokens`. Every token left is one the grammar allows.
    pub fn closing_mask(&mut self) -> Result<TokenMask, GrammarError> {
        let mask = self.mask()?;
        let c = &self.closers;
        let allowed = |t: TokenId| {
            mask.get(t as usize / 32)
                .is_some_and(|w| w & (1 << (t % 32)) != 0)
        };
        let mut ends = vec![0u32; mask.len()];
        for &t in c.eos.iter().filter(|&&t| allowed(t)) {
            ends[t as usize / 32] |= 1 << (t % 32);
        }
        let in_string = c.letters.iter().any(|&t| allowed(t));
        let quote = if in_string {
            and(&mask, &c.quote)
        } else {
            Vec::new()
        };
        for narrowed in [
            ends,
            quote,
            and(&mask, &c.container),
            and(&mask, &c.separating),
        ] {
            if narrowed.iter().any(|&w| w != 0) {
                return Ok(narrowed);
            }
        }
        Ok(mask)
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

fn and(a: &[u32], b: &[u32]) -> Vec<u32> {
    a.iter()
        .zip(b.iter().chain(std::iter::repeat(&0)))
        .map(|(x, y)| x & y)
        .collect()
}
