//! Compiling a request's output grammar for its model (structured output),
//! with the grammar engine's refusals phrased as 400s naming the field and
//! the feature.

use ingot_engine::{Grammar, GrammarCompiler, GrammarError};
use ingot_protocol::structured::OutputGrammar;
use ingot_protocol::ProtocolError;

use crate::ApiError;

/// The OpenAI `error.code` of a grammar using a feature we do not support.
pub const UNSUPPORTED_CODE: &str = "unsupported_feature";

/// Compiles `grammar` with `compiler` (a model's vocabulary). Blocking:
/// call it off the async runtime.
pub fn compile(compiler: &GrammarCompiler, grammar: &OutputGrammar) -> Result<Grammar, ApiError> {
    compiler
        .compile(&grammar.spec)
        .map_err(|e| refusal(&grammar.param, e))
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
        other => ApiError::Internal(other.to_string()),
    }
}
