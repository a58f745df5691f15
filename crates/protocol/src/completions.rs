//! `POST /v1/completions`.

use std::collections::BTreeMap;

use ingot_core::TokenId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
    #[serde(default)]
    echo: bool,
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
    /// Parses and validates a request body.
    pub fn parse(body: &Value) -> Result<Self, ProtocolError> {
        let fields: CompletionFields = parse_json(body)?;
        let mut sampling = parse_json::<SamplingFields>(body)?.validate()?;
        sampling.grammar = crate::structured::parse_grammar(body)?;
        if let Some(n) = fields.logprobs {
            check_top_logprobs("logprobs", n as usize)?;
            sampling.params.logprobs = Some(n as usize);
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
            echo: fields.echo,
        })
    }
}

/// Legacy completions logprobs: parallel arrays.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their logprobs.
    pub token_logprobs: Vec<f32>,
    /// Alternatives per token: text → logprob.
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Character offset of each token in the choice text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends one token whose text starts at `offset`.
    pub fn push(&mut self, t: &TokenLogprobInfo, offset: usize) {
        self.tokens.push(t.token.clone());
        self.token_logprobs.push(t.logprob);
        self.top_logprobs
            .push(t.top.iter().map(|(s, _, l)| (s.clone(), *l)).collect());
        self.text_offset.push(offset);
    }
}

/// One choice.
#[derive(Debug, Clone, Serialize, PartialEq)]
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
#[derive(Debug, Clone, Serialize, PartialEq)]
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
    /// Not tracked.
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
    }
}
