//! Structured output: compiles a request's [`GrammarSpec`] against a model's
//! vocabulary with llguidance and follows the output token by token, giving
//! the set of tokens allowed next as a bitset the sampler applies.
//!
//! [`GrammarSpec`]: ingot_core::GrammarSpec

mod compiler;
mod error;
mod grammar;
mod refs;
mod unique;
mod vocab;

pub use compiler::{with_layout, GrammarCompiler};
pub use error::GrammarError;
pub use grammar::{Grammar, Limit, TokenMask};
pub use unique::UniqueItems;
