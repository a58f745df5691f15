//! What a request's output must match (structured output), as data: the
//! grammar engine compiles it, the request key hashes it. Every client form
//! (`response_format`, `guided_*`, tool choices) is lowered to one of these
//! three at the edge.

/// A constraint on the generated text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GrammarSpec {
    /// A JSON schema, as compact JSON text (`{}` accepts any JSON value).
    JsonSchema(String),
    /// A regular expression the whole output must match.
    Regex(String),
    /// A Lark grammar (llguidance's dialect, which embeds JSON schemas with
    /// `%json`).
    Lark(String),
}

impl GrammarSpec {
    /// A stable tag for the kind (part of the specified request key:
    /// docs/request-key.md).
    pub fn tag(&self) -> u8 {
        match self {
            GrammarSpec::JsonSchema(_) => 1,
            GrammarSpec::Regex(_) => 2,
            GrammarSpec::Lark(_) => 3,
        }
    }

    /// The grammar's source text.
    pub fn source(&self) -> &str {
        match self {
            GrammarSpec::JsonSchema(s) | GrammarSpec::Regex(s) | GrammarSpec::Lark(s) => s,
        }
    }
}
