//! Compiling a request's output grammar for its model (structured output),
//! with the grammar engine's refusals phrased as 400s naming the field and
//! the feature.

use ingot_engine::{EngineHandle, Grammar, GrammarError};
use ingot_protocol::structured::OutputGrammar;
use ingot_protocol::ProtocolError;

use crate::ApiError;

/// The OpenAI `error.code` of a grammar using a feature we do not support.
pub const UNSUPPORTED_CODE: &str = "unsupported_feature";

/// Compiles `grammar` for `engine`'s vocabulary. Blocking (the first use
/// of a model indexes its vocabulary): call it off the async runtime.
pub fn compile(
    engine: &EngineHandle,
    grammar: Option<&OutputGrammar>,
) -> Result<Option<Grammar>, ApiError> {
    let Some(g) = grammar else {
        return Ok(None);
    };
    let compiler = engine
        .grammar_compiler()
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    compiler
        .compile(&g.spec)
        .map(Some)
        .map_err(|e| refusal(&g.param, e))
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
