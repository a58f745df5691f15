//! Domain types shared by every ingot crate: token ids, sampling parameters,
//! stop criteria, finish reasons and output grammars. No I/O, no tensors.

mod grammar;
mod priority;
mod sampling;
pub mod window;

pub use grammar::GrammarSpec;
pub use priority::Priority;
pub use sampling::{SamplingError, SamplingParams, StopCriteria, MAX_LOGIT_BIAS, MAX_LOGPROBS};
pub use window::SampleWindow;

/// A vocabulary index.
pub type TokenId = u32;

/// Why a sequence stopped generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An EOS token, a stop token id or a stop string was produced.
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
    /// The request was cancelled (client gone, shutdown).
    Abort,
}

impl FinishReason {
    /// The OpenAI wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}
