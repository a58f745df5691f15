//! Anthropic's Messages API (`POST /v1/messages`): the request, checked
//! field by field and mapped onto a chat request (so it is rendered,
//! sampled and tool-called exactly as chat is), and the answer's wire
//! types, whole and streamed.
//!
//! Every field is read or refused with a 400 that names it. `metadata` is
//! accepted and unused: its one field, `user_id`, is an opaque id Anthropic
//! keeps for abuse detection and changes no answer. `cache_control` on
//! blocks and tools is accepted and unused: ingot caches every prompt
//! prefix by itself.

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::chat::ValidChatRequest;
use crate::parse::{each_object, object, only_known};
use crate::ProtocolError;

/// The request fields read (see the module doc for `metadata`).
pub const FIELDS: [&str; 12] = [
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "metadata",
];

/// A validated Messages request: the chat request it maps onto, and what
/// shaping the answer needs.
#[derive(Debug, Clone)]
pub struct MessagesRequest {
    /// The conversation, sampling and tools as a chat request.
    pub chat: ValidChatRequest,
    /// `stop_sequences` (the answer names the one that ended it).
    pub stop_sequences: Vec<String>,
}

impl MessagesRequest {
    /// Parses and validates a request body (a JSON object).
    pub fn parse(body: &Value) -> Result<Self, ProtocolError> {
        let obj = object(body)?;
        only_known(obj, &FIELDS, "")?;
        for field in ["model", "messages", "max_tokens"] {
            if obj.get(field).is_none_or(Value::is_null) {
                return Err(ProtocolError::field(
                    field,
                    format!("{field}: Field required"),
                ));
            }
        }
        let temperature = obj.get("temperature").and_then(Value::as_f64);
        if let Some(t) = temperature.filter(|t| !(0.0..=1.0).contains(t)) {
            return Err(ProtocolError::bound("temperature", "in [0, 1]", t));
        }
        let stop_sequences = strings(obj.get("stop_sequences"), "stop_sequences")?;
        let mut chat = Map::new();
        for (from, to) in [
            ("model", "model"),
            ("max_tokens", "max_tokens"),
            ("stream", "stream"),
            ("temperature", "temperature"),
            ("top_p", "top_p"),
            ("top_k", "top_k"),
        ] {
            if let Some(v) = obj.get(from).filter(|v| !v.is_null()) {
                chat.insert(to.into(), v.clone());
            }
        }
        chat.insert("stop".into(), json!(stop_sequences));
        chat.insert("messages".into(), Value::Array(messages(obj)?));
        if let Some(tools) = obj.get("tools").filter(|v| !v.is_null()) {
            chat.insert("tools".into(), Value::Array(functions(tools)?));
        }
        if let Some(choice) = obj.get("tool_choice").filter(|v| !v.is_null()) {
            let (choice, parallel) = tool_choice(choice)?;
            chat.insert("tool_choice".into(), choice);
            chat.insert("parallel_tool_calls".into(), Value::Bool(parallel));
        }
        let chat = ValidChatRequest::parse(&Value::Object(chat))?;
        Ok(Self {
            chat,
            stop_sequences,
        })
    }
}

/// A list of strings (absent: empty).
fn strings(value: Option<&Value>, param: &str) -> Result<Vec<String>, ProtocolError> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|s| {
                s.as_str().map(String::from).ok_or_else(|| {
                    ProtocolError::field(param, format!("{param} must hold strings"))
                })
            })
            .collect(),
        Some(_) => Err(ProtocolError::field(
            param,
            format!("{param} must be a list of strings"),
        )),
    }
}

/// The chat messages: the system prompt, then each turn (a user turn's
/// tool results become `tool` messages, an assistant's `tool_use` blocks
/// its `tool_calls`).
fn messages(obj: &Map<String, Value>) -> Result<Vec<Value>, ProtocolError> {
    let mut out = Vec::new();
    match obj.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => out.push(json!({"role": "system", "content": s})),
        Some(Value::Array(blocks)) => {
            let texts = blocks
                .iter()
                .enumerate()
                .map(|(j, b)| text_block(&format!("system[{j}]"), b))
                .collect::<Result<Vec<_>, _>>()?;
            out.push(json!({"role": "system", "content": texts.join("\n")}));
        }
        Some(_) => {
            return Err(ProtocolError::field(
                "system",
                "system must be a string or a list of text blocks",
            ))
        }
    }
    let turns = obj
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ProtocolError::field("messages", "messages must be a list"))?;
    if turns.is_empty() {
        return Err(ProtocolError::field(
            "messages",
            "messages must not be empty",
        ));
    }
    for (i, turn) in turns.iter().enumerate() {
        message(&format!("messages[{i}]"), turn, &mut out)?;
    }
    Ok(out)
}

/// One turn, as chat messages appended to `out`.
fn message(param: &str, turn: &Value, out: &mut Vec<Value>) -> Result<(), ProtocolError> {
    let obj = turn
        .as_object()
        .ok_or_else(|| ProtocolError::field(param, format!("{param} must be an object")))?;
    only_known(obj, &["role", "content"], &format!("{param}."))?;
    let role = obj.get("role").and_then(Value::as_str);
    let blocks = match obj.get("content") {
        Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
        Some(Value::Array(b)) => b.clone(),
        _ => {
            return Err(ProtocolError::field(
                &format!("{param}.content"),
                format!("{param}.content must be a string or a list of content blocks"),
            ))
        }
    };
    match role {
        Some("user") => user_turn(param, &blocks, out),
        Some("assistant") => assistant_turn(param, &blocks, out),
        _ => Err(ProtocolError::field(
            &format!("{param}.role"),
            format!("{param}.role must be \"user\" or \"assistant\""),
        )),
    }
}

/// A user turn: text, and tool results (each a `tool` message, in order).
fn user_turn(param: &str, blocks: &[Value], out: &mut Vec<Value>) -> Result<(), ProtocolError> {
    let mut text = String::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{param}.content[{j}]");
        if block.get("type").and_then(Value::as_str) == Some("tool_result") {
            if !text.is_empty() {
                out.push(json!({"role": "user", "content": std::mem::take(&mut text)}));
            }
            out.push(tool_result(&at, block)?);
        } else {
            text.push_str(&text_block(&at, block)?);
        }
    }
    if !text.is_empty() || blocks.is_empty() {
        out.push(json!({"role": "user", "content": text}));
    }
    Ok(())
}

/// An assistant turn: its text and its `tool_use` blocks as `tool_calls`.
fn assistant_turn(
    param: &str,
    blocks: &[Value],
    out: &mut Vec<Value>,
) -> Result<(), ProtocolError> {
    let mut text = String::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{param}.content[{j}]");
        if block.get("type").and_then(Value::as_str) == Some("tool_use") {
            calls.push(tool_use(&at, block)?);
        } else {
            text.push_str(&text_block(&at, block)?);
        }
    }
    let mut message = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    out.push(message);
    Ok(())
}

/// The text of a `{"type": "text", "text": ...}` block; any other block
/// is refused (this server reads text, tool_use and tool_result blocks).
fn text_block(at: &str, block: &Value) -> Result<String, ProtocolError> {
    let kind = block.get("type").and_then(Value::as_str);
    let (Some("text"), Some(obj)) = (kind, block.as_object()) else {
        let kind = kind.unwrap_or("(none)");
        return Err(ProtocolError::field(
            &format!("{at}.type"),
            format!("{at}.type {kind:?} is not supported: this server reads text, tool_use and tool_result blocks"),
        ));
    };
    only_known(obj, &["type", "text", "cache_control"], &format!("{at}."))?;
    obj.get("text")
        .and_then(Value::as_str)
        .map(String::from)
        .ok_or_else(|| {
            ProtocolError::field(&format!("{at}.text"), format!("{at}.text must be a string"))
        })
}

/// A `tool_use` block as an OpenAI tool call.
fn tool_use(at: &str, block: &Value) -> Result<Value, ProtocolError> {
    let obj = block
        .as_object()
        .ok_or_else(|| ProtocolError::field(at, "must be an object"))?;
    only_known(
        obj,
        &["type", "id", "name", "input", "cache_control"],
        &format!("{at}."),
    )?;
    let field = |name: &str| {
        obj.get(name).and_then(Value::as_str).ok_or_else(|| {
            ProtocolError::field(
                &format!("{at}.{name}"),
                format!("{at}.{name} must be a string"),
            )
        })
    };
    let input = obj.get("input").filter(|v| v.is_object()).ok_or_else(|| {
        ProtocolError::field(
            &format!("{at}.input"),
            format!("{at}.input must be an object"),
        )
    })?;
    Ok(json!({
        "id": field("id")?,
        "type": "function",
        "function": {"name": field("name")?, "arguments": input.to_string()},
    }))
}

/// A `tool_result` block as a `tool` message. Its content is a string or
/// text blocks; `is_error` marks the text as an error (chat's tool messages
/// have no such flag), so the model still reads it as one.
fn tool_result(at: &str, block: &Value) -> Result<Value, ProtocolError> {
    let obj = block
        .as_object()
        .ok_or_else(|| ProtocolError::field(at, "must be an object"))?;
    only_known(
        obj,
        &[
            "type",
            "tool_use_id",
            "content",
            "is_error",
            "cache_control",
        ],
        &format!("{at}."),
    )?;
    let id = obj
        .get("tool_use_id")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            ProtocolError::field(
                &format!("{at}.tool_use_id"),
                format!("{at}.tool_use_id must be a string"),
            )
        })?;
    let mut text = match obj.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .enumerate()
            .map(|(k, b)| text_block(&format!("{at}.content[{k}]"), b))
            .collect::<Result<Vec<_>, _>>()?
            .join("\n"),
        Some(_) => {
            return Err(ProtocolError::field(
                &format!("{at}.content"),
                format!("{at}.content must be a string or a list of text blocks"),
            ))
        }
    };
    match obj.get("is_error") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => text = format!("Error: {text}"),
        Some(_) => {
            return Err(ProtocolError::field(
                &format!("{at}.is_error"),
                format!("{at}.is_error must be a boolean"),
            ))
        }
    }
    Ok(json!({"role": "tool", "tool_call_id": id, "content": text}))
}

/// `tools` as chat functions; only client tools (no `type`, or
/// `"custom"`): Anthropic's server tools run on Anthropic's side.
fn functions(tools: &Value) -> Result<Vec<Value>, ProtocolError> {
    each_object(tools, "tools", |at, obj| {
        only_known(
            obj,
            &[
                "type",
                "name",
                "description",
                "input_schema",
                "cache_control",
            ],
            &format!("{at}."),
        )?;
        if let Some(kind) = obj.get("type").filter(|k| *k != "custom" && !k.is_null()) {
            return Err(ProtocolError::field(
                &format!("{at}.type"),
                format!("{at}.type {kind} is not supported: only client tools (type \"custom\" or none) are"),
            ));
        }
        let schema = obj
            .get("input_schema")
            .filter(|s| s.is_object())
            .ok_or_else(|| {
                ProtocolError::field(
                    &format!("{at}.input_schema"),
                    format!("{at}.input_schema must be a JSON schema object"),
                )
            })?;
        let mut function = json!({"name": obj.get("name"), "parameters": schema});
        if let Some(d) = obj.get("description") {
            function["description"] = d.clone();
        }
        Ok(json!({"type": "function", "function": function}))
    })
}

/// `tool_choice` as chat's, and whether several calls may come.
fn tool_choice(choice: &Value) -> Result<(Value, bool), ProtocolError> {
    let obj = choice
        .as_object()
        .ok_or_else(|| ProtocolError::field("tool_choice", "tool_choice must be an object"))?;
    only_known(
        obj,
        &["type", "name", "disable_parallel_tool_use"],
        "tool_choice.",
    )?;
    let parallel = match obj.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => !b,
        Some(_) => {
            return Err(ProtocolError::field(
                "tool_choice.disable_parallel_tool_use",
                "tool_choice.disable_parallel_tool_use must be a boolean",
            ))
        }
    };
    let mapped = match (obj.get("type").and_then(Value::as_str), obj.get("name")) {
        (Some("auto"), None) => json!("auto"),
        (Some("any"), None) => json!("required"),
        (Some("none"), None) => json!("none"),
        (Some("tool"), Some(Value::String(name))) => {
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(ProtocolError::field(
                "tool_choice",
                "tool_choice must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": ...}",
            ))
        }
    };
    Ok((mapped, parallel))
}

/// A whole answer.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
#[schemars(rename = "AnthropicMessage")]
pub struct Message {
    /// `msg_…`.
    pub id: String,
    /// "message".
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// "assistant".
    pub role: &'static str,
    /// The model's id.
    pub model: String,
    /// Text and tool_use blocks, in order.
    pub content: Vec<ContentBlock>,
    /// Why it ended (`None` in `message_start`).
    pub stop_reason: Option<&'static str>,
    /// The stop sequence that ended it, if one did.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: MessageUsage,
}

/// A block of an answer.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
#[schemars(rename = "AnthropicContentBlock")]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call.
    ToolUse {
        /// `toolu_…`.
        id: String,
        /// The tool.
        name: String,
        /// Its arguments (`{}` in `content_block_start`).
        input: Value,
    },
}

/// `usage`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[schemars(rename = "AnthropicMessageUsage")]
pub struct MessageUsage {
    /// Prompt tokens.
    pub input_tokens: usize,
    /// Generated tokens.
    pub output_tokens: usize,
}

/// A streamed event; its SSE `event:` name is its `type`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    /// The answer's head (no content, `output_tokens` 0).
    MessageStart {
        /// The head.
        message: Message,
    },
    /// A block opens.
    ContentBlockStart {
        /// Its index.
        index: usize,
        /// Its start (empty text, or a call with `{}` input).
        content_block: ContentBlock,
    },
    /// Keeps the connection alive.
    Ping,
    /// More of a block.
    ContentBlockDelta {
        /// The block.
        index: usize,
        /// What is added.
        delta: BlockDelta,
    },
    /// A block closes.
    ContentBlockStop {
        /// The block.
        index: usize,
    },
    /// The answer's end: why, and its output tokens.
    MessageDelta {
        /// The stop reason and sequence.
        delta: MessageDelta,
        /// Output tokens.
        usage: DeltaUsage,
    },
    /// The last event.
    MessageStop,
}

impl StreamEvent {
    /// The SSE event name (the `type`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::Ping => "ping",
            Self::ContentBlockDelta { .. } => "content_block_delta",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
        }
    }
}

/// What a `content_block_delta` adds.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    /// Text.
    TextDelta {
        /// The text.
        text: String,
    },
    /// Part of a call's input JSON.
    InputJsonDelta {
        /// The JSON text.
        partial_json: String,
    },
}

/// `message_delta.delta`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MessageDelta {
    /// Why it ended.
    pub stop_reason: &'static str,
    /// The stop sequence that ended it, if one did.
    pub stop_sequence: Option<String>,
}

/// `message_delta.usage`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct DeltaUsage {
    /// Generated tokens.
    pub output_tokens: usize,
}

/// Anthropic's error body.
pub fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// Anthropic's error type for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 | 405 | 415 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolChoice;

    fn parse(body: Value) -> Result<MessagesRequest, ProtocolError> {
        MessagesRequest::parse(&body)
    }

    fn base(extra: Value) -> Value {
        let mut body =
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]});
        for (k, v) in extra.as_object().into_iter().flatten() {
            body[k] = v.clone();
        }
        body
    }

    #[test]
    fn maps_system_turns_and_sampling_onto_chat() {
        let r = parse(base(json!({
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "Again"}
            ],
            "temperature": 0.5, "top_k": 4, "stop_sequences": ["END"], "metadata": {"user_id": "u"}
        })))
        .unwrap();
        let roles: Vec<_> = r.chat.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(r.chat.messages[0].content, "Be brief.\nBe kind.");
        assert_eq!(r.chat.sampling.params.temperature, 0.5);
        assert_eq!(r.chat.sampling.params.top_k, 4);
        assert_eq!(r.chat.sampling.max_tokens, Some(8));
        assert_eq!(r.chat.sampling.stop.stop_strings, ["END"]);
        assert_eq!(r.stop_sequences, ["END"]);
    }

    #[test]
    fn tool_use_and_results_become_calls_and_tool_messages() {
        let r = parse(base(json!({
            "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Let me check.", "citations": null}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}, "caller": null}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]}, {"type": "text", "text": "Thanks"}]}
            ]
        })))
        .unwrap();
        let roles: Vec<_> = r.chat.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "user"]);
        let calls = &r.chat.messages[1].extra["tool_calls"];
        assert_eq!(calls[0]["function"]["arguments"], r#"{"city":"Paris"}"#);
        assert_eq!(r.chat.messages[2].extra["tool_call_id"], "toolu_1");
        assert_eq!(r.chat.messages[2].content, "sunny");
        let tools = r.chat.tool_config.unwrap();
        assert_eq!(tools.choice, ToolChoice::Named("get_weather".into()));
        assert!(!tools.parallel);
    }

    #[test]
    fn tool_choice_forms() {
        let tools = json!([{"name": "f", "input_schema": {"type": "object"}}]);
        for (choice, want) in [
            (json!({"type": "auto"}), ToolChoice::Auto),
            (json!({"type": "any"}), ToolChoice::Required),
            (json!({"type": "none"}), ToolChoice::None),
        ] {
            let r = parse(base(json!({"tools": tools, "tool_choice": choice}))).unwrap();
            assert_eq!(
                r.chat
                    .tool_config
                    .map(|t| t.choice)
                    .unwrap_or(ToolChoice::None),
                want
            );
        }
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (json!({"thinking": {"type": "enabled"}}), "thinking"),
            (json!({"max_tokens": null}), "max_tokens"),
            (json!({"temperature": 1.5}), "temperature"),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"messages": [{"role": "system", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x", "name": "n"}]}),
                "messages[0].name",
            ),
            (
                json!({"tools": [{"type": "web_search_20250305", "name": "w"}]}),
                "tools[0].type",
            ),
            (
                json!({"tool_choice": {"type": "sometimes"}, "tools": [{"name": "f", "input_schema": {}}]}),
                "tool_choice",
            ),
        ];
        for (extra, param) in cases {
            let e = parse(base(extra.clone())).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {e}");
            assert!(e.message.contains(param), "{extra}: {e}");
        }
        let e = parse(json!({"model": "m", "messages": []})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
    }

    #[test]
    fn events_serialise_as_anthropic_sends_them() {
        let e = StreamEvent::ContentBlockDelta {
            index: 0,
            delta: BlockDelta::TextDelta { text: "Hi".into() },
        };
        assert_eq!(e.name(), "content_block_delta");
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}})
        );
        let block = ContentBlock::ToolUse {
            id: "toolu_1".into(),
            name: "f".into(),
            input: json!({}),
        };
        assert_eq!(serde_json::to_value(&block).unwrap()["type"], "tool_use");
        assert_eq!(
            error_body("not_found_error", "x")["error"]["type"],
            "not_found_error"
        );
    }
}
