//! A request the API rejects, phrased for the client.

/// A 400-class problem with a request: what is wrong, which field, and an
/// optional machine-readable code (OpenAI's `error.code`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError {
    /// Human-readable: names the field, the bound and the value received.
    pub message: String,
    /// The offending field (OpenAI's `error.param`).
    pub param: Option<String>,
    /// Machine-readable code, e.g. `context_length_exceeded`.
    pub code: Option<&'static str>,
}

impl ProtocolError {
    /// An error about one field.
    pub fn field(param: &str, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            param: Some(param.to_string()),
            code: None,
        }
    }

    /// "`param` must be `bound`, got `value`".
    pub fn bound(param: &str, bound: &str, value: impl std::fmt::Display) -> Self {
        Self::field(param, format!("{param} must be {bound}, got {value}"))
    }

    /// Sets the code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ProtocolError {}
