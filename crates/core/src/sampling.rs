//! Sampling parameters and stop criteria, validated once at the edge.

use crate::TokenId;

/// How the next token is chosen from the logits.
///
/// Defaults follow the OpenAI API (temperature 1, no truncation, no penalties).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Nucleus sampling mass in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p * p_max`; 0 disables.
    pub min_p: f32,
    /// Multiplicative penalty (>1 discourages) on tokens seen in prompt or output; 1 disables.
    pub repetition_penalty: f32,
    /// Subtracted once per occurrence in the output, in [-2, 2].
    pub frequency_penalty: f32,
    /// Subtracted once if the token occurs in the output, in [-2, 2].
    pub presence_penalty: f32,
    /// Per-request seed; the same seed gives the same output.
    pub seed: Option<u64>,
    /// Number of top alternatives to report per token (`None`: no logprobs).
    pub logprobs: Option<usize>,
    /// Number of top alternatives to report per prompt token, whose
    /// logprobs are then computed too (`None`: none; vLLM's
    /// `prompt_logprobs`, OpenAI's `echo` with `logprobs`).
    pub prompt_logprobs: Option<usize>,
    /// Added to these tokens' logits before anything else (OpenAI's
    /// `logit_bias`): sorted by id, each id once, biases in [-100, 100].
    pub logit_bias: Vec<(TokenId, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            ..Self::GREEDY
        }
    }
}

/// A sampling parameter outside its valid range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field} must be {bound}, got {value}")]
pub struct SamplingError {
    /// The offending field, as named in the OpenAI API.
    pub field: &'static str,
    /// The accepted range, in words.
    pub bound: &'static str,
    /// The received value.
    pub value: String,
}

/// The most alternatives a request may ask for per token (OpenAI allows 20).
pub const MAX_LOGPROBS: usize = 20;

/// The most `logit_bias` entries per request.
pub const MAX_LOGIT_BIAS: usize = 1024;

impl SamplingParams {
    /// Greedy decoding, no penalties.
    pub const GREEDY: Self = Self {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        seed: None,
        logprobs: None,
        prompt_logprobs: None,
        logit_bias: Vec::new(),
    };

    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self::GREEDY
    }

    /// Checks every field against its bound.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let err = |field, bound, value: String| {
            Err(SamplingError {
                field,
                bound,
                value,
            })
        };
        if !(self.temperature.is_finite() && (0.0..=2.0).contains(&self.temperature)) {
            return err("temperature", "in [0, 2]", self.temperature.to_string());
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return err("top_p", "in (0, 1]", self.top_p.to_string());
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return err("min_p", "in [0, 1]", self.min_p.to_string());
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 2.0) {
            return err(
                "repetition_penalty",
                "in (0, 2]",
                self.repetition_penalty.to_string(),
            );
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return err(
                "frequency_penalty",
                "in [-2, 2]",
                self.frequency_penalty.to_string(),
            );
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return err(
                "presence_penalty",
                "in [-2, 2]",
                self.presence_penalty.to_string(),
            );
        }
        if let Some(n) = self.logprobs {
            if n > MAX_LOGPROBS {
                return err("top_logprobs", "in [0, 20]", n.to_string());
            }
        }
        if let Some(n) = self.prompt_logprobs {
            if n > MAX_LOGPROBS {
                return err("prompt_logprobs", "in [0, 20]", n.to_string());
            }
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return err(
                "logit_bias",
                "at most 1024 entries",
                self.logit_bias.len().to_string(),
            );
        }
        if let Some(&(id, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(b.is_finite() && (-100.0..=100.0).contains(b)))
        {
            return err(
                "logit_bias",
                "biases in [-100, 100]",
                format!("{b} for token {id}"),
            );
        }
        if self.logit_bias.windows(2).any(|w| w[0].0 >= w[1].0) {
            return err(
                "logit_bias",
                "sorted by token id, each once",
                format!("{:?}", self.logit_bias),
            );
        }
        Ok(())
    }

    /// True when the choice is a plain argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// True when any penalty or bias changes the logits.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
            || !self.logit_bias.is_empty()
    }
}

/// When a sequence stops.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StopCriteria {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Strings that end generation; never emitted.
    pub stop_strings: Vec<String>,
    /// Token ids that end generation (in addition to EOS).
    pub stop_token_ids: Vec<TokenId>,
    /// Keep generating past EOS (benchmarks).
    pub ignore_eos: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(SamplingParams::default().validate(), Ok(()));
        assert_eq!(SamplingParams::greedy().validate(), Ok(()));
    }

    #[test]
    fn out_of_range_names_field_bound_and_value() {
        let p = SamplingParams {
            top_p: 1.5,
            ..Default::default()
        };
        let e = p.validate().unwrap_err();
        assert_eq!(e.field, "top_p");
        assert_eq!(e.to_string(), "top_p must be in (0, 1], got 1.5");
        let p = SamplingParams {
            temperature: f32::NAN,
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "temperature");
    }
}
