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

/// How near an output is to its token limit, for [`Grammar::limit_mask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Far from it (or closing is off): the plain mask.
    Far,
    /// `n` tokens left: closing starts once finishing the document would
    /// take about half of them (estimated every few tokens).
    Near(usize),
    /// In its last stretch: closing now.
    Closing,
}

/// Tokens between two estimates of what finishing would take.
const ESTIMATE_EVERY: usize = 4;

/// The grammar state of one output. Cloning gives an independent state at
/// the same point (every choice of an `n > 1` request gets its own).
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
    spec: Arc<GrammarSpec>,
    closers: Arc<Closers>,
    /// Closing began (it never stops).
    closing: bool,
    /// Tokens accepted, and when the last estimate ran.
    accepted: usize,
    estimated_at: Option<usize>,
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
            closing: false,
            accepted: 0,
            estimated_at: None,
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
    /// a string to the quote that ends it (then to a quote and separator
    /// that end it; else the string goes on as the model writes it);
    /// outside strings to tokens that close objects and arrays, else to
    /// ones that end a value. So a small model
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
        // Inside a string only tokens that start with its closing quote
        // end it (a bare `,` there is more text); outside one a leading
        // quote opens a string. Mixing the two made small models loop on
        // keys such as `","`.
        let in_string = c.letters.iter().any(|&t| allowed(t));
        let tiers = if in_string {
            [ends, and(&mask, &c.quote), and(&mask, &c.quote_separating)]
        } else {
            [ends, and(&mask, &c.container), and(&mask, &c.separating)]
        };
        for narrowed in tiers {
            if narrowed.iter().any(|&w| w != 0) {
                return Ok(narrowed);
            }
        }
        Ok(mask)
    }

    /// The mask for an output `limit` away from its token limit: the plain
    /// [`Self::mask`] until closing starts, then [`Self::closing_mask`].
    /// Closing starts at [`Limit::Closing`], or at [`Limit::Near`] once
    /// [`Self::tokens_to_close`] says finishing would take about half the
    /// tokens left: so a document owing required keys, values and closing
    /// brackets starts closing early enough to finish.
    pub fn limit_mask(&mut self, limit: Limit) -> Result<TokenMask, GrammarError> {
        match limit {
            Limit::Far => {}
            Limit::Closing => self.closing = true,
            Limit::Near(left) => {
                let due = self
                    .estimated_at
                    .is_none_or(|at| self.accepted >= at + ESTIMATE_EVERY);
                if !self.closing && due {
                    self.estimated_at = Some(self.accepted);
                    // Margin: the model's own picks under the closing masks
                    // may take more tokens than the estimate's longest ones.
                    self.closing = self
                        .tokens_to_close(left)
                        .is_none_or(|need| 2 * need + ESTIMATE_EVERY >= left);
                }
            }
        }
        if self.closing {
            self.closing_mask()
        } else {
            self.mask()
        }
    }

    /// How many tokens finishing the output would take from here, taking
    /// at each point the longest token [`Self::closing_mask`] allows (the
    /// end-of-sequence token included); `None` when not within `cap`.
    pub fn tokens_to_close(&self, cap: usize) -> Option<usize> {
        let mut g = self.clone();
        for n in 0..cap {
            if g.is_finished() {
                return Some(n);
            }
            let t = self.closers.longest_allowed(&g.closing_mask().ok()?)?;
            if self.closers.eos.contains(&t) {
                return Some(n + 1);
            }
            g.accept(t).ok()?;
        }
        g.is_finished().then_some(cap)
    }

    /// Advances past a generated token (which the last mask allowed).
    pub fn accept(&mut self, token: TokenId) -> Result<(), GrammarError> {
        self.accepted += 1;
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
