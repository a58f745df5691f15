//! Compiling a request's output grammar for its model (structured output),
//! with the grammar engine's refusals phrased as 400s naming the field and
//! the problem: whatever a client's schema or grammar does (refer to
//! itself, outgrow the engine's budgets), it is the client's 400, never a
//! 5xx.

use ingot_engine::{Grammar, GrammarCompiler, GrammarError};
use ingot_protocol::structured::OutputGrammar;
use ingot_protocol::ProtocolError;

use crate::ApiError;

/// The OpenAI `error.code` of a grammar using a feature we do not support.
pub const UNSUPPORTED_CODE: &str = "unsupported_feature";

/// The OpenAI `error.code` of a grammar beyond the grammar engine's budgets.
pub const TOO_COMPLEX_CODE: &str = "grammar_too_complex";

/// Compiles `grammar` with `compiler` (a model's vocabulary). Blocking:
/// call it off the async runtime.
pub fn compile(compiler: &GrammarCompiler, grammar: &OutputGrammar) -> Result<Grammar, ApiError> {
    compiler
        .compile(&grammar.spec)
        .map_err(|e| refusal(&grammar.param, e))
}

/// A schema a request carries that is checked on its own (a tool's
/// parameters), so a refusal names its field.
#[derive(Debug, Clone)]
pub struct SchemaCheck {
    /// The schema and the field that gave it.
    pub grammar: OutputGrammar,
    /// The answer is held to it (a required or named tool_choice).
    pub enforced: bool,
}

/// Checks a schema: malformed, self-referential or beyond the engine's
/// budgets is a 400 whether or not the answer is held to it; a feature the
/// engine cannot enforce is a 400 only when it is enforced (else nothing
/// enforces it). Cached by the compiler; blocking, as [`compile`].
pub fn check(compiler: &GrammarCompiler, schema: &SchemaCheck) -> Result<(), ApiError> {
    match compiler.check(&schema.grammar.spec) {
        Ok(()) => Ok(()),
        Err(GrammarError::Unsupported(_)) if !schema.enforced => Ok(()),
        Err(e) => Err(refusal(&schema.grammar.param, e)),
    }
}

fn refusal(param: &str, e: GrammarError) -> ApiError {
    match e {
        GrammarError::Unsupported(m) => ApiError::BadRequest(
            ProtocolError::field(
                param,
                format!("{param} uses a feature this server does not support: {m}"),
            )
            .with_code(UNSUPPORTED_CODE),
        ),
        GrammarError::Invalid(m) => ApiError::BadRequest(ProtocolError::field(
            param,
            format!("{param} is not a valid grammar: {m}"),
        )),
        GrammarError::TooComplex(m) => ApiError::BadRequest(
            ProtocolError::field(
                param,
                format!("{param} is too complex to follow while generating: {m}"),
            )
            .with_code(TOO_COMPLEX_CODE),
        ),
        // The vocabulary or the engine's own state: the server's fault.
        other => ApiError::Internal(other.to_string()),
    }
}
