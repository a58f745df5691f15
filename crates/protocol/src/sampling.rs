//! Fields shared by chat and text completions: sampling, stopping, `n`,
//! priority, streaming. Parsed from the same JSON object as the
//! endpoint-specific fields (which fields exist is [`crate::fields`]'s).

use std::collections::BTreeMap;

use ingot_core::{Priority, SamplingParams, StopCriteria, TokenId, MAX_LOGIT_BIAS, MAX_LOGPROBS};
use serde::{Deserialize, Deserializer};

use crate::ProtocolError;

/// Most choices per request.
pub const MAX_N: u32 = 16;
/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes.
pub const MAX_STOP_LEN: usize = 256;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum StopField {
    /// A single stop string.
    One(#[schemars(length(min = 1, max = MAX_STOP_LEN))] String),
    /// Several.
    Many(
        #[schemars(length(max = MAX_STOP_STRINGS), inner(length(min = 1, max = MAX_STOP_LEN)))]
        Vec<String>,
    ),
}

/// `priority`: a tier name or its rank (0 = critical … 4 = background).
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum PriorityField {
    /// "critical", "high", "normal", "low", "background".
    Name(#[schemars(extend("enum" = ["critical", "high", "normal", "low", "background"]))] String),
    /// 0..=4.
    Rank(#[schemars(range(min = 0, max = 4))] i64),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a final chunk with usage.
    #[serde(default)]
    pub include_usage: Option<bool>,
    /// Every chunk carries the usage so far (vLLM's extension).
    #[serde(default)]
    pub continuous_usage_stats: Option<bool>,
}

/// The shared fields as sent.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
pub struct SamplingFields {
    /// Model name.
    pub model: Option<String>,
    /// Output token limit (completions; deprecated in chat).
    #[schemars(range(min = 1))]
    pub max_tokens: Option<u32>,
    /// Output token limit (chat).
    #[schemars(range(min = 1))]
    pub max_completion_tokens: Option<u32>,
    /// Sampling temperature.
    #[schemars(range(min = 0.0, max = 2.0))]
    pub temperature: Option<f32>,
    /// Nucleus mass.
    #[serde(default, deserialize_with = "positive_f32")]
    #[schemars(with = "Option<f32>", extend("exclusiveMinimum" = 0, "maximum" = 1))]
    pub top_p: Option<f32>,
    /// Top-k (extension). 0 or -1 disables.
    #[schemars(range(min = -1, max = i32::MAX))]
    pub top_k: Option<i32>,
    /// Min-p (extension).
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_p: Option<f32>,
    /// Choices per prompt.
    #[schemars(range(min = 1, max = MAX_N))]
    pub n: Option<u32>,
    /// Stop strings.
    pub stop: Option<StopField>,
    /// Stop token ids (extension).
    pub stop_token_ids: Option<Vec<TokenId>>,
    /// Seed.
    pub seed: Option<i64>,
    /// Presence penalty.
    #[schemars(range(min = -2.0, max = 2.0))]
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
    #[schemars(range(min = -2.0, max = 2.0))]
    pub frequency_penalty: Option<f32>,
    /// Repetition penalty (extension).
    #[serde(default, deserialize_with = "positive_f32")]
    #[schemars(with = "Option<f32>", extend("exclusiveMinimum" = 0, "maximum" = 2))]
    pub repetition_penalty: Option<f32>,
    /// Keep going past EOS (extension).
    pub ignore_eos: Option<bool>,
    /// Scheduling tier (extension).
    pub priority: Option<PriorityField>,
    /// `false`: never decode this request speculatively (extension; where
    /// the server speculates, greedy answers are the same either way).
    pub speculative: Option<bool>,
    /// Stream with SSE.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// End-user id (the feature-flag unit when there is no API key).
    pub user: Option<String>,
    /// Token id (as a string) → bias added to its logit.
    pub logit_bias: Option<BTreeMap<String, f32>>,
}

/// A number as `f32`, a positive one kept positive: JSON numbers are
/// `f64`, and one below `f32`'s range (`1e-300`) would round to 0, which a
/// bound such as `top_p > 0` then refuses as a value the client never sent.
/// Such a value becomes the smallest normal `f32` (for `top_p`: keep only
/// the likeliest token, as the client asked; `repetition_penalty` too).
fn positive_f32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f32>, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.map(|x| {
        let narrowed = x as f32;
        if narrowed == 0.0 && x > 0.0 {
            f32::MIN_POSITIVE
        } else {
            narrowed
        }
    }))
}

/// Validated shared fields.
#[derive(Debug, Clone)]
pub struct ValidSampling {
    /// The requested model name, if any.
    pub model: Option<String>,
    /// Sampling parameters (logprobs filled in by the endpoint).
    pub params: SamplingParams,
    /// Stop criteria; `max_tokens` is `None` when the client left it to
    /// the server (fill with the room left in the context).
    pub stop: StopCriteria,
    /// Requested output limit, if any.
    pub max_tokens: Option<usize>,
    /// Choices per prompt.
    pub n: usize,
    /// Scheduling tier.
    pub priority: Priority,
    /// May be decoded speculatively.
    pub speculative: bool,
    /// Stream with SSE.
    pub stream: bool,
    /// Final usage chunk when streaming.
    pub include_usage: bool,
    /// Usage so far in every stream chunk.
    pub continuous_usage: bool,
    /// End-user id, if given.
    pub user: Option<String>,
    /// The grammar the output must follow (structured output; filled in by
    /// the endpoint).
    pub grammar: Option<crate::structured::OutputGrammar>,
}

impl SamplingFields {
    /// Checks every bound; errors name the field the client used.
    pub fn validate(self) -> Result<ValidSampling, ProtocolError> {
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => Some(("max_completion_tokens", m)),
            (None, Some(m)) => Some(("max_tokens", m)),
            (None, None) => None,
        };
        if let Some((field, 0)) = max_tokens {
            return Err(ProtocolError::bound(field, "at least 1", 0));
        }
        if self.stream_options.is_some() && self.stream != Some(true) {
            return Err(ProtocolError::field(
                "stream_options",
                "stream_options is only allowed when stream is true",
            ));
        }
        let n = self.n.unwrap_or(1);
        if n == 0 || n > MAX_N {
            return Err(ProtocolError::bound("n", &format!("in [1, {MAX_N}]"), n));
        }
        let stop_strings = match self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s],
            Some(StopField::Many(v)) => v,
        };
        if stop_strings.len() > MAX_STOP_STRINGS {
            return Err(ProtocolError::bound(
                "stop",
                &format!("at most {MAX_STOP_STRINGS} strings"),
                format!("{} strings", stop_strings.len()),
            ));
        }
        // An empty stop string would match before any text: the answer
        // could never say anything.
        if stop_strings.iter().any(String::is_empty) {
            return Err(ProtocolError::field(
                "stop",
                "stop strings must not be empty",
            ));
        }
        if let Some(s) = stop_strings.iter().find(|s| s.len() > MAX_STOP_LEN) {
            return Err(ProtocolError::bound(
                "stop",
                &format!("strings of at most {MAX_STOP_LEN} bytes"),
                format!("{} bytes", s.len()),
            ));
        }
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => return Err(ProtocolError::bound("top_k", "-1, 0 or positive", k)),
        };
        let priority = match self.priority {
            None => Priority::Normal,
            Some(PriorityField::Name(name)) => name
                .parse()
                .map_err(|e: String| ProtocolError::field("priority", e))?,
            Some(PriorityField::Rank(r)) if (0..=4).contains(&r) => Priority::from_rank(r as usize),
            Some(PriorityField::Rank(r)) => {
                return Err(ProtocolError::bound(
                    "priority",
                    "in [0, 4] or a tier name",
                    r,
                ))
            }
        };
        let params = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k,
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            seed: self.seed.map(|s| s as u64),
            logprobs: None,
            prompt_logprobs: None,
            logit_bias: logit_bias(self.logit_bias)?,
        };
        params
            .validate()
            .map_err(|e| ProtocolError::field(e.field, e.to_string()))?;
        Ok(ValidSampling {
            model: self.model,
            params,
            stop: StopCriteria {
                max_tokens: max_tokens.map_or(0, |(_, m)| m as usize),
                stop_strings,
                stop_token_ids: self.stop_token_ids.unwrap_or_default(),
                ignore_eos: self.ignore_eos.unwrap_or(false),
            },
            max_tokens: max_tokens.map(|(_, m)| m as usize),
            n: n as usize,
            priority,
            speculative: self.speculative.unwrap_or(true),
            stream: self.stream.unwrap_or(false),
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage == Some(true)),
            continuous_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.continuous_usage_stats == Some(true)),
            user: self.user,
            grammar: None,
        })
    }
}

/// `logit_bias` as sorted (token id, bias) pairs; its keys must be token
/// ids (the bias range and the vocabulary are checked with the other
/// sampling values, and by the engine).
fn logit_bias(field: Option<BTreeMap<String, f32>>) -> Result<Vec<(TokenId, f32)>, ProtocolError> {
    let Some(map) = field else {
        return Ok(Vec::new());
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(ProtocolError::bound(
            "logit_bias",
            &format!("at most {MAX_LOGIT_BIAS} entries"),
            map.len(),
        ));
    }
    let mut pairs = map
        .into_iter()
        .map(|(k, bias)| match k.trim().parse::<TokenId>() {
            Ok(id) => Ok((id, bias)),
            Err(_) => Err(ProtocolError::field(
                "logit_bias",
                format!("logit_bias keys must be token ids, got {k:?}"),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    pairs.sort_by_key(|p| p.0);
    if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(ProtocolError::field(
            "logit_bias",
            format!("logit_bias gives token {} twice", w[0].0),
        ));
    }
    Ok(pairs)
}

/// Checks a requested number of top alternatives.
pub fn check_top_logprobs(field: &str, n: usize) -> Result<(), ProtocolError> {
    if n > MAX_LOGPROBS {
        return Err(ProtocolError::bound(
            field,
            &format!("in [0, {MAX_LOGPROBS}]"),
            n,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_json;

    fn parse(v: serde_json::Value) -> Result<ValidSampling, ProtocolError> {
        parse_json::<SamplingFields>(&v)?.validate()
    }

    #[test]
    fn defaults_follow_openai() {
        let s = parse(serde_json::json!({})).unwrap();
        assert_eq!(s.params.temperature, 1.0);
        assert_eq!((s.n, s.stream, s.max_tokens), (1, false, None));
        assert_eq!(s.priority, Priority::Normal);
    }

    #[test]
    fn type_errors_name_the_field() {
        let e = parse(serde_json::json!({"temperature": "hot"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = parse(serde_json::json!({"max_tokens": -1})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
    }

    #[test]
    fn bounds_name_field_bound_and_value() {
        let e = parse(serde_json::json!({"temperature": 5})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert_eq!(e.message, "temperature must be in [0, 2], got 5");
        let e = parse(serde_json::json!({"n": 0})).unwrap_err();
        assert_eq!(e.message, "n must be in [1, 16], got 0");
        let stops: Vec<String> = (0..17).map(|i| i.to_string()).collect();
        let e = parse(serde_json::json!({ "stop": stops })).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop"));
        let e = parse(serde_json::json!({"priority": "urgent"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("priority"));
    }

    #[test]
    fn logit_bias_is_sorted_and_checked() {
        let s = parse(serde_json::json!({"logit_bias": {"50": -100, "7": 2.5}})).unwrap();
        assert_eq!(s.params.logit_bias, vec![(7, 2.5), (50, -100.0)]);
        for bad in [
            serde_json::json!({"x": 1}),
            serde_json::json!({"5": 101}),
            serde_json::json!({"5": "a"}),
            serde_json::json!({"-1": 1}),
        ] {
            let e = parse(serde_json::json!({ "logit_bias": bad })).unwrap_err();
            let param = e.param.unwrap_or_default();
            assert!(param.starts_with("logit_bias"), "{bad}: {param}");
        }
    }

    #[test]
    fn stop_and_priority_forms() {
        let s = parse(serde_json::json!({"stop": "x", "priority": "critical"})).unwrap();
        assert_eq!(s.stop.stop_strings, vec!["x"]);
        assert_eq!(s.priority, Priority::Critical);
        let s = parse(serde_json::json!({"stop": ["a", "b"], "priority": 4})).unwrap();
        assert_eq!(s.stop.stop_strings.len(), 2);
        assert_eq!(s.priority, Priority::Background);
    }
}
