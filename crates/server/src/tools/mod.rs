//! Tool calling on chat: how the model is told about the tools (the chat
//! template, or a system preamble for templates that do not render
//! tools), the grammar that enforces a `required` or named `tool_choice`,
//! and the parsers that turn the answer (whole or streamed) into
//! `tool_calls`, for the common formats.

mod format;
mod grammar;
mod parse;
mod prompt;
pub(crate) mod stream;

pub use format::ToolFormat;
pub use grammar::{tool_grammar, tool_schemas};
pub use parse::{parse_answer, Answer, ParsedCall};
pub use prompt::prepare;
pub(crate) use stream::held_prefix;
pub use stream::{Piece, Pieces, ToolStream};

/// A new call id (`call_` and 24 letters and digits, as OpenAI's).
pub fn call_id() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!("call_{}", Alphanumeric.sample_string(&mut rand::rng(), 24))
}
