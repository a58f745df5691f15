//! `POST /v1/completions`.

use std::collections::BTreeMap;

use ingot_core::TokenId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::fields::UnknownFields;
use crate::sampling::{check_top_logprobs, SamplingFields, ValidSampling};
use crate::usage::{TokenLogprobInfo, Usage};
use crate::{parse_json, ProtocolError};

/// Most prompts in one request.
pub const MAX_PROMPTS: usize = 64;

/// `prompt`: text, texts, token ids, or lists of token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<TokenId>),
    IdLists(Vec<Vec<TokenId>>),
}

#[derive(Debug, Deserialize)]
struct CompletionFields {
    prompt: Option<Value>,
    logprobs: Option<u32>,
    /// Null is false (the description marks it nullable).
    echo: Option<bool>,
    best_of: Option<u32>,
    suffix: Option<String>,
}

/// One prompt, as text or already tokenized.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text to tokenize (with the model's BOS rules).
    Text(String),
    /// Token ids, used as is.
    Ids(Vec<TokenId>),
}

/// A validated completions request.
#[derive(Debug, Clone)]
pub struct ValidCompletionRequest {
    /// Shared fields.
    pub sampling: ValidSampling,
    /// One or more prompts; each yields `n` choices.
    pub prompts: Vec<Prompt>,
    /// Prepend the prompt to each choice's text.
    pub echo: bool,
}

impl ValidCompletionRequest {
    /// Parses and validates a request body; a field the endpoint does not
    /// know is refused.
    pub fn parse(body: &Value) -> Result<Self, ProtocolError> {
        Self::parse_with(body, UnknownFields::Refuse)
    }

    /// Parses and validates a request body under the field policy
    /// ([`crate::fields::COMPLETIONS`]), unknown fields treated as
    /// `unknown` says.
    pub fn parse_with(body: &Value, unknown: UnknownFields) -> Result<Self, ProtocolError> {
        crate::fields::check(body, &crate::fields::COMPLETIONS, unknown)?;
        let fields: CompletionFields = parse_json(body)?;
        if fields.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ProtocolError::field(
                "suffix",
                "suffix is not supported: the served models have no fill-in-the-middle template; send the text before the gap as the prompt",
            ));
        }
        let echo = fields.echo.unwrap_or(false);
        let mut raw_sampling = parse_json::<SamplingFields>(body)?;
        // `max_tokens: 0` with `echo` returns the prompt alone (with its
        // logprobs: how evaluation harnesses score text).
        let prompt_only = echo
            && raw_sampling.max_tokens == Some(0)
            && raw_sampling.max_completion_tokens.is_none();
        if prompt_only {
            raw_sampling.max_tokens = None;
        }
        let mut sampling = raw_sampling.validate()?;
        check_best_of(fields.best_of, sampling.n)?;
        if prompt_only {
            sampling.max_tokens = Some(0);
            sampling.stop.max_tokens = 0;
        }
        sampling.grammar = crate::structured::parse_grammar(body)?;
        if let Some(n) = fields.logprobs {
            check_top_logprobs("logprobs", n as usize)?;
            sampling.params.logprobs = Some(n as usize);
            if echo {
                sampling.params.prompt_logprobs = Some(n as usize);
            }
        }
        let raw = fields
            .prompt
            .ok_or_else(|| ProtocolError::field("prompt", "prompt is required"))?;
        let prompt: PromptField = serde_json::from_value(raw).map_err(|_| {
            ProtocolError::field(
                "prompt",
                "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids",
            )
        })?;
        let prompts = match prompt {
            PromptField::Text(t) => vec![Prompt::Text(t)],
            PromptField::Texts(v) => v.into_iter().map(Prompt::Text).collect(),
            PromptField::Ids(ids) => vec![Prompt::Ids(ids)],
            PromptField::IdLists(v) => v.into_iter().map(Prompt::Ids).collect(),
        };
        if prompts.is_empty() || prompts.len() > MAX_PROMPTS {
            return Err(ProtocolError::bound(
                "prompt",
                &format!("1 to {MAX_PROMPTS} prompts"),
                prompts.len(),
            ));
        }
        if prompts
            .iter()
            .any(|p| matches!(p, Prompt::Ids(ids) if ids.is_empty()))
        {
            return Err(ProtocolError::field(
                "prompt",
                "prompt token lists must not be empty",
            ));
        }
        Ok(Self {
            sampling,
            prompts,
            echo,
        })
    }
}

/// `best_of`: at least `n`; more than `n` (generating candidates to
/// return only the likeliest) is refused by name.
fn check_best_of(best_of: Option<u32>, n: usize) -> Result<(), ProtocolError> {
    match best_of.map(|b| b as usize) {
        None => Ok(()),
        Some(b) if b < n => Err(ProtocolError::bound(
            "best_of",
            &format!("at least n ({n})"),
            b,
        )),
        Some(b) if b > n => Err(ProtocolError::field(
            "best_of",
            format!("best_of greater than n is not supported (got best_of {b}, n {n}): ask for n choices and pick among them with their logprobs"),
        )),
        Some(_) => Ok(()),
    }
}

/// Legacy completions logprobs: parallel arrays. With `echo` they start
/// with the prompt's tokens, the first of which has no logprob (null, as
/// in OpenAI's and vLLM's answers).
#[derive(Debug, Clone, Default, Serialize, PartialEq, schemars::JsonSchema)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their logprobs.
    pub token_logprobs: Vec<Option<f32>>,
    /// Alternatives per token: text → logprob.
    pub top_logprobs: Vec<Option<BTreeMap<String, f32>>>,
    /// Character offset of each token in the choice text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends one token whose text starts at `offset`.
    pub fn push(&mut self, t: &TokenLogprobInfo, offset: usize) {
        self.tokens.push(t.token.clone());
        self.token_logprobs.push(Some(t.logprob));
        self.top_logprobs.push(Some(
            t.top.iter().map(|(s, _, l)| (s.clone(), *l)).collect(),
        ));
        self.text_offset.push(offset);
    }

    /// Appends the first prompt token (nothing precedes it: no logprob).
    pub fn push_first(&mut self, token: String, offset: usize) {
        self.tokens.push(token);
        self.token_logprobs.push(None);
        self.top_logprobs.push(None);
        self.text_offset.push(offset);
    }
}

/// One choice.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct CompletionChoice {
    /// prompt index × n + choice number.
    pub index: usize,
    /// Generated text (after the prompt when echoing).
    pub text: String,
    /// Logprobs when requested.
    pub logprobs: Option<CompletionLogprobs>,
    /// stop, length or abort; null in non-final stream chunks.
    pub finish_reason: Option<&'static str>,
}

/// `text_completion` (the response and each stream chunk).
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct Completion {
    /// `cmpl-…`.
    pub id: String,
    /// "text_completion".
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Model name.
    pub model: String,
    /// Choices.
    pub choices: Vec<CompletionChoice>,
    /// Token counts (always in responses; in streams only the usage chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    /// Not tracked, so never sent (the schema has no null here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_prompt_form() {
        let p = |v| {
            ValidCompletionRequest::parse(&json!({ "prompt": v }))
                .unwrap()
                .prompts
        };
        assert_eq!(p(json!("hi")), vec![Prompt::Text("hi".into())]);
        assert_eq!(p(json!(["a", "b"])).len(), 2);
        assert_eq!(p(json!([1, 2, 3])), vec![Prompt::Ids(vec![1, 2, 3])]);
        assert_eq!(p(json!([[1], [2, 3]])).len(), 2);
    }

    #[test]
    fn bad_prompts_are_named() {
        for body in [
            json!({}),
            json!({"prompt": 5}),
            json!({"prompt": []}),
            json!({"prompt": [[]]}),
        ] {
            let e = ValidCompletionRequest::parse(&body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("prompt"), "{body}");
        }
        let e = ValidCompletionRequest::parse(&json!({"prompt": "x", "logprobs": 21})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logprobs"));
        for (body, param) in [
            (json!({"prompt": "x", "suffix": "y"}), "suffix"),
            (json!({"prompt": "x", "best_of": 2}), "best_of"),
            (json!({"prompt": "x", "best_of": 1, "n": 2}), "best_of"),
            (json!({"prompt": "x", "frobnicate": 1}), "frobnicate"),
        ] {
            let e = ValidCompletionRequest::parse(&body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
        for body in [
            json!({"prompt": "x", "suffix": "", "best_of": 2, "n": 2}),
            json!({"prompt": "x", "suffix": null, "best_of": null}),
        ] {
            assert!(ValidCompletionRequest::parse(&body).is_ok(), "{body}");
        }
        assert!(ValidCompletionRequest::parse_with(
            &json!({"prompt": "x", "frobnicate": 1}),
            UnknownFields::Ignore
        )
        .is_ok());
    }

    #[test]
    fn echo_with_logprobs_scores_the_prompt_and_may_skip_generation() {
        let r = ValidCompletionRequest::parse(
            &json!({"prompt": "x", "echo": true, "logprobs": 1, "max_tokens": 0}),
        )
        .unwrap();
        assert_eq!(r.sampling.params.prompt_logprobs, Some(1));
        assert_eq!(
            (r.sampling.max_tokens, r.sampling.stop.max_tokens),
            (Some(0), 0)
        );
        let r = ValidCompletionRequest::parse(&json!({"prompt": "x", "logprobs": 1})).unwrap();
        assert_eq!(
            r.sampling.params.prompt_logprobs, None,
            "no echo, no prompt"
        );
        // Without echo an empty answer is useless: max_tokens stays >= 1.
        let e =
            ValidCompletionRequest::parse(&json!({"prompt": "x", "max_tokens": 0})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
    }
}
