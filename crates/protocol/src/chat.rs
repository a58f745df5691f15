//! `POST /v1/chat/completions`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::fields::UnknownFields;
use crate::sampling::{check_top_logprobs, SamplingFields, ValidSampling};
use crate::tools::{ToolCall, ToolCallDelta, ValidTools};
use crate::usage::{TokenLogprobInfo, Usage};
use crate::{parse_json, ProtocolError};

/// Chat-specific request fields (the shared ones are in [`SamplingFields`]).
#[derive(Debug, Deserialize)]
struct ChatFields {
    messages: Option<Vec<Value>>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    tools: Option<Value>,
    add_generation_prompt: Option<bool>,
    chat_template_kwargs: Option<Map<String, Value>>,
}

/// One message, content flattened to text; other fields pass through to
/// the chat template.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatTurn {
    /// system, user, assistant, tool, developer.
    pub role: String,
    /// Text content (parts joined).
    pub content: String,
    /// Every other field of the message (name, tool_calls, tool_call_id...).
    pub extra: Map<String, Value>,
}

/// A validated chat request.
#[derive(Debug, Clone)]
pub struct ValidChatRequest {
    /// Shared fields.
    pub sampling: ValidSampling,
    /// The conversation.
    pub messages: Vec<ChatTurn>,
    /// Tools for the template, as sent.
    pub tools: Option<Value>,
    /// The tools validated, with the tool choice (`None`: no tools).
    pub tool_config: Option<ValidTools>,
    /// Append the assistant header.
    pub add_generation_prompt: bool,
    /// Extra template variables.
    pub template_kwargs: Map<String, Value>,
}

const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];

impl ValidChatRequest {
    /// Parses and validates a request body; a field the endpoint does not
    /// know is refused.
    pub fn parse(body: &Value) -> Result<Self, ProtocolError> {
        Self::parse_with(body, UnknownFields::Refuse)
    }

    /// Parses and validates a request body under the field policy
    /// ([`crate::fields::CHAT`]), unknown fields treated as `unknown` says.
    pub fn parse_with(body: &Value, unknown: UnknownFields) -> Result<Self, ProtocolError> {
        crate::fields::check(body, &crate::fields::CHAT, unknown)?;
        let fields: ChatFields = parse_json(body)?;
        let mut sampling = parse_json::<SamplingFields>(body)?.validate()?;
        sampling.grammar = crate::structured::parse_grammar(body)?;
        let tool_config = crate::tools::parse_tools(body)?;
        if let (Some(t), Some(_)) = (&tool_config, &sampling.grammar) {
            if matches!(
                t.choice,
                crate::tools::ToolChoice::Required | crate::tools::ToolChoice::Named(_)
            ) {
                return Err(ProtocolError::field(
                    "tool_choice",
                    "a required or named tool_choice cannot be combined with response_format or another output constraint",
                ));
            }
        }
        if fields.logprobs == Some(true) {
            let n = fields.top_logprobs.unwrap_or(0) as usize;
            check_top_logprobs("top_logprobs", n)?;
            sampling.params.logprobs = Some(n);
        } else if let Some(n) = fields.top_logprobs {
            check_top_logprobs("top_logprobs", n as usize)?;
            if n > 0 {
                return Err(ProtocolError::field(
                    "top_logprobs",
                    "top_logprobs requires logprobs to be true",
                ));
            }
        }
        let raw = fields
            .messages
            .ok_or_else(|| ProtocolError::field("messages", "messages is required"))?;
        if raw.is_empty() {
            return Err(ProtocolError::field(
                "messages",
                "messages must not be empty",
            ));
        }
        let messages = raw
            .into_iter()
            .enumerate()
            .map(|(i, m)| turn(i, m))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            sampling,
            messages,
            tools: fields.tools,
            tool_config,
            add_generation_prompt: fields.add_generation_prompt.unwrap_or(true),
            template_kwargs: fields.chat_template_kwargs.unwrap_or_default(),
        })
    }
}

fn turn(i: usize, m: Value) -> Result<ChatTurn, ProtocolError> {
    let param = format!("messages[{i}]");
    let Value::Object(mut obj) = m else {
        return Err(ProtocolError::field(
            &param,
            format!("{param} must be an object"),
        ));
    };
    let role = match obj.remove("role") {
        Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r,
        Some(other) => {
            return Err(ProtocolError::field(
                &format!("{param}.role"),
                format!(
                    "{param}.role must be one of {}, got {other}",
                    ROLES.join(", ")
                ),
            ))
        }
        None => {
            return Err(ProtocolError::field(
                &format!("{param}.role"),
                format!("{param}.role is required"),
            ))
        }
    };
    let content = match obj.remove("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s,
        Some(Value::Array(parts)) => parts_text(&param, parts)?,
        Some(other) => {
            return Err(ProtocolError::field(
                &format!("{param}.content"),
                format!("{param}.content must be a string or a list of parts, got {other}"),
            ))
        }
    };
    Ok(ChatTurn {
        role,
        content,
        extra: obj,
    })
}

/// Joins `[{type: "text", text}]` parts; other part types are refused.
fn parts_text(param: &str, parts: Vec<Value>) -> Result<String, ProtocolError> {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let kind = part.get("type").and_then(Value::as_str);
        match (kind, part.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(t)) => text.push_str(t),
            _ => {
                return Err(ProtocolError::field(
                    &format!("{param}.content[{j}]"),
                    format!("{param}.content[{j}] must be a text part {{\"type\": \"text\", \"text\": ...}} (this model reads text only)"),
                ))
            }
        }
    }
    Ok(text)
}

/// `logprobs` of a chat choice.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
    /// Refusal tokens; always null (OpenAI requires the field).
    pub refusal: Option<Vec<ChatTokenLogprob>>,
}

/// One token's logprob entry.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct ChatTokenLogprob {
    /// Token text.
    pub token: String,
    /// Log-probability.
    pub logprob: f32,
    /// UTF-8 bytes of the token.
    pub bytes: Vec<u8>,
    /// Alternatives.
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// An alternative token.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct ChatTopLogprob {
    /// Token text.
    pub token: String,
    /// Log-probability.
    pub logprob: f32,
    /// UTF-8 bytes.
    pub bytes: Vec<u8>,
}

impl From<&TokenLogprobInfo> for ChatTokenLogprob {
    fn from(t: &TokenLogprobInfo) -> Self {
        Self {
            token: t.token.clone(),
            logprob: t.logprob,
            bytes: t.bytes.clone(),
            top_logprobs: t
                .top
                .iter()
                .map(|(token, bytes, logprob)| ChatTopLogprob {
                    token: token.clone(),
                    logprob: *logprob,
                    bytes: bytes.clone(),
                })
                .collect(),
        }
    }
}

/// The assistant's message.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct AssistantMessage {
    /// Always "assistant".
    pub role: &'static str,
    /// The generated text (null when the answer is only tool calls, or
    /// only reasoning).
    pub content: Option<String>,
    /// A refusal message; always null (OpenAI requires the field).
    pub refusal: Option<String>,
    /// The model's reasoning, split from the answer by the model's
    /// reasoning parser (vLLM's field).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The calls parsed from the answer, when tools were offered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// One choice of a chat response.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct ChatChoice {
    /// Choice index.
    pub index: usize,
    /// The message.
    pub message: AssistantMessage,
    /// Logprobs when requested.
    pub logprobs: Option<ChatLogprobs>,
    /// stop, length or abort.
    pub finish_reason: Option<&'static str>,
}

/// `chat.completion`.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct ChatCompletion {
    /// `chatcmpl-…`.
    pub id: String,
    /// "chat.completion".
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Model name.
    pub model: String,
    /// Choices.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
    /// Not tracked, so never sent (the schema has no null here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
}

/// The delta of a stream chunk.
#[derive(Debug, Clone, Default, Serialize, PartialEq, schemars::JsonSchema)]
pub struct ChatDelta {
    /// Set on a choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New reasoning text (with a reasoning parser).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Pieces of tool calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice in a stream chunk.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct ChatChunkChoice {
    /// Choice index.
    pub index: usize,
    /// What changed.
    pub delta: ChatDelta,
    /// Logprobs of this chunk's tokens.
    pub logprobs: Option<ChatLogprobs>,
    /// Set on the choice's last chunk.
    pub finish_reason: Option<&'static str>,
}

/// `chat.completion.chunk`.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct ChatCompletionChunk {
    /// Same id for every chunk of a response.
    pub id: String,
    /// "chat.completion.chunk".
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Model name.
    pub model: String,
    /// Choices changed by this chunk (empty in the usage chunk).
    pub choices: Vec<ChatChunkChoice>,
    /// Present (null until the last chunk) when `include_usage` is set.
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
    fn parses_string_and_part_contents() {
        let r = ValidChatRequest::parse(&json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}], "name": "bob"}
            ],
            "logprobs": true, "top_logprobs": 3
        }))
        .unwrap();
        assert_eq!(r.messages[1].content, "hi there");
        assert_eq!(r.messages[1].extra["name"], "bob");
        assert_eq!(r.sampling.params.logprobs, Some(3));
        assert!(r.add_generation_prompt);
    }

    #[test]
    fn rejects_bad_messages_with_their_path() {
        let e = ValidChatRequest::parse(&json!({"messages": []})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = ValidChatRequest::parse(&json!({})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = ValidChatRequest::parse(&json!({"messages": [{"role": "wizard", "content": "x"}]}))
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = ValidChatRequest::parse(
            &json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0]"));
        let e = ValidChatRequest::parse(&json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 50})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
    }

    #[test]
    fn chunk_usage_is_null_until_the_end_only_when_requested() {
        let mut c = ChatCompletionChunk {
            id: "x".into(),
            object: "chat.completion.chunk",
            created: 0,
            model: "m".into(),
            choices: vec![],
            usage: None,
            system_fingerprint: None,
        };
        assert!(!serde_json::to_string(&c).unwrap().contains("usage"));
        c.usage = Some(None);
        assert!(serde_json::to_string(&c)
            .unwrap()
            .contains("\"usage\":null"));
    }
}
