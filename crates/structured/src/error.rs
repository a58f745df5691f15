//! Why a grammar was refused.

/// A grammar that cannot be used: the client's fault (a 400) unless it is
/// [`GrammarError::Vocabulary`] or [`GrammarError::State`].
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
    /// The grammar is beyond the grammar engine's bounds (its item or
    /// lexer budget per token: deep ambiguity, huge alternations).
    #[error("the grammar exceeds the grammar engine's limits: {0}")]
    TooComplex(String),
    /// The model's vocabulary could not be indexed for the grammar engine.
    #[error("the tokenizer cannot be used for structured output: {0}")]
    Vocabulary(String),
    /// The grammar reached a state that allows no token (an engine bug or
    /// an unsatisfiable grammar discovered late).
    #[error("grammar state: {0}")]
    State(String),
}

impl GrammarError {
    /// Sorts a failure of a grammar's first mask, computed at compile
    /// time: a budget the engine ran out of is [`GrammarError::TooComplex`],
    /// anything else (no token can start the output) [`GrammarError::Invalid`].
    pub(crate) fn at_start(e: GrammarError) -> Self {
        const LIMITS: [&str; 3] = ["Too many items", "fuel", "lexer states"];
        let GrammarError::State(m) = e else {
            return e;
        };
        // llguidance's message goes on with a dump of its state (the
        // grammar's text included): its first line says what happened.
        let first = m.lines().next().unwrap_or_default().to_string();
        if LIMITS.iter().any(|p| first.contains(p)) {
            GrammarError::TooComplex(first)
        } else {
            GrammarError::Invalid(format!("no output can match it ({first})"))
        }
    }

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
