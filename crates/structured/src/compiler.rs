//! One [`GrammarCompiler`] per model: llguidance's parser factory over the
//! model's vocabulary (built once; it precomputes token classes), turning
//! each request's [`GrammarSpec`] into a fresh [`Grammar`].

use std::sync::Arc;

use ingot_core::GrammarSpec;
use ingot_tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::vocab::Closers;
use crate::{Grammar, GrammarError};

/// Compiles grammars for one model's vocabulary. `Send + Sync`: share it.
pub struct GrammarCompiler {
    factory: ParserFactory,
    vocab_size: usize,
    closers: Arc<Closers>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("vocab_size", &self.vocab_size)
            .finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// Indexes `tokenizer`'s vocabulary (tens of milliseconds for 50k
    /// tokens: do it once per model, off the async runtime).
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<Self, GrammarError> {
        let (env, closers) = crate::vocab::token_env(tokenizer)?;
        let vocab_size = env.tok_trie().vocab_size();
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory,
            vocab_size,
            closers: Arc::new(closers),
        })
    }

    /// A grammar for one output, at its start.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        let top = match spec {
            GrammarSpec::JsonSchema(text) => {
                let mut schema: Value = serde_json::from_str(text).map_err(|e| {
                    GrammarError::Invalid(format!("the JSON schema is not JSON: {e}"))
                })?;
                // Checked on the finished answer instead (`UniqueItems`).
                crate::UniqueItems::split(&mut schema);
                TopLevelGrammar::from_json_schema(with_layout(schema))
            }
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            GrammarSpec::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| GrammarError::from_compile(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::from_compile(e));
        }
        Ok(Grammar::new(matcher, spec.clone(), self.closers.clone()))
    }

    /// Tokens the grammar engine knows (masks cover this many ids).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

/// The JSON layout generated output keeps, unless the schema says otherwise
/// (llguidance's `x-guidance` options): `", "` and `": "` separators and no
/// other whitespace. Free whitespace lets a small model pad forever; these
/// separators are the ones models saw most in training.
pub fn with_layout(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_added_once() {
        let s = with_layout(json!({"type": "object"}));
        assert_eq!(s["x-guidance"]["whitespace_flexible"], false);
        let own = with_layout(json!({"x-guidance": {"lenient": true}}));
        assert_eq!(own["x-guidance"], json!({"lenient": true}));
        assert_eq!(with_layout(json!(true)), json!(true));
    }
}
