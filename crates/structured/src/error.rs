//! Why a grammar was refused.

/// A grammar that cannot be used: the client's fault (a 400) unless it is
/// [`GrammarError::Vocabulary`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrammarError {
    /// The grammar uses a feature the engine does not implement (a JSON
    /// schema keyword, string format, `oneOf`, ...); the message names it.
    #[error("unsupported feature: {0}")]
    Unsupported(String),
    /// The grammar is malformed (bad JSON schema, regex or Lark syntax).
    #[error("invalid grammar: {0}")]
    Invalid(String),
    /// The model's vocabulary could not be indexed for the grammar engine.
    #[error("the tokenizer cannot be used for structured output: {0}")]
    Vocabulary(String),
    /// The grammar reached a state that allows no token (an engine bug or
    /// an unsatisfiable grammar discovered late).
    #[error("grammar state: {0}")]
    State(String),
}

impl GrammarError {
    /// Sorts llguidance's compile message into unsupported vs invalid: its
    /// unimplemented-feature errors share these phrasings.
    pub(crate) fn from_compile(message: String) -> Self {
        const UNSUPPORTED: [&str; 5] = [
            "Unimplemented keys",
            "not supported",
            "Unknown format",
            "Unknown applicator",
            "unsupported",
        ];
        if UNSUPPORTED.iter().any(|p| message.contains(p)) {
            GrammarError::Unsupported(message)
        } else {
            GrammarError::Invalid(message)
        }
    }
}
