//! One [`GrammarCompiler`] per model: llguidance's parser factory over the
//! model's vocabulary (built once; it precomputes token classes), turning
//! each request's [`GrammarSpec`] into a fresh [`Grammar`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use ingot_core::GrammarSpec;
use ingot_tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::vocab::{Closers, Unwritable};
use crate::{Grammar, GrammarError};

/// Compiles grammars for one model's vocabulary. `Send + Sync`: share it.
pub struct GrammarCompiler {
    factory: ParserFactory,
    vocab_size: usize,
    closers: Arc<Closers>,
    unwritable: Unwritable,
    /// Specs [`GrammarCompiler::check`] found good (bounded).
    checked: Mutex<Checked>,
}

/// Specs known to compile, up to [`Checked::MAX_BYTES`] of source text;
/// emptied when full (agents resend the same tools every turn, so the
/// ones in use come back at once).
#[derive(Default)]
struct Checked {
    specs: HashSet<GrammarSpec>,
    bytes: usize,
}

impl Checked {
    const MAX_BYTES: usize = 4 << 20;

    fn insert(&mut self, spec: &GrammarSpec) {
        let len = spec.source().len();
        if self.bytes + len > Self::MAX_BYTES {
            self.specs.clear();
            self.bytes = 0;
        }
        if len <= Self::MAX_BYTES && self.specs.insert(spec.clone()) {
            self.bytes += len;
        }
    }
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
        let (env, closers, unwritable) = crate::vocab::token_env(tokenizer)?;
        let vocab_size = env.tok_trie().vocab_size();
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory,
            vocab_size,
            closers: Arc::new(closers),
            unwritable,
            checked: Mutex::default(),
        })
    }

    /// A grammar for one output, at its start. Its first mask is computed
    /// here: llguidance builds the parser lazily, so a grammar beyond its
    /// budgets compiles and fails only then, and that must be the client's
    /// 400 now rather than an engine error mid-request.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        let top = match spec {
            GrammarSpec::JsonSchema(text) => {
                let mut schema: Value = serde_json::from_str(text).map_err(|e| {
                    GrammarError::Invalid(format!("the JSON schema is not JSON: {e}"))
                })?;
                if let Some(why) = crate::refs::self_reference(&schema)
                    .or_else(|| crate::refs::no_way_out(&schema))
                {
                    return Err(GrammarError::Invalid(why));
                }
                // Its strings unescaped (`serde_json` writes them raw).
                self.unwritable.check(&schema.to_string())?;
                // Checked on the finished answer instead (`UniqueItems`).
                crate::UniqueItems::split(&mut schema);
                TopLevelGrammar::from_json_schema(with_layout(schema))
            }
            GrammarSpec::Regex(rx) => {
                self.unwritable.check(rx)?;
                TopLevelGrammar::from_regex(rx)
            }
            GrammarSpec::Lark(src) => {
                self.unwritable.check(src)?;
                TopLevelGrammar::from_lark(src.clone())
            }
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| GrammarError::from_compile(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::from_compile(e));
        }
        let mut grammar = Grammar::new(matcher, spec.clone(), self.closers.clone());
        grammar.mask().map_err(GrammarError::at_start)?;
        Ok(grammar)
    }

    /// Whether `spec` compiles, as [`Self::compile`] judges it, for a
    /// grammar that is validated but not followed (the tools of a request
    /// whose answer is free). Specs that compiled are remembered, so the
    /// same tools sent every turn are compiled once.
    pub fn check(&self, spec: &GrammarSpec) -> Result<(), GrammarError> {
        let checked = || {
            self.checked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if checked().specs.contains(spec) {
            return Ok(());
        }
        // Compiled outside the lock: other requests' checks go on meanwhile.
        self.compile(spec)?;
        checked().insert(spec);
        Ok(())
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
