//! Ollama's API (`/api/chat`, `/api/generate`, `/api/embed`, `/api/tags`,
//! `/api/show`, `/api/version`): requests checked field by field and mapped
//! onto the chat and embeddings requests (so they are rendered, sampled and
//! batched exactly as those are), and the answers' wire types.
//!
//! Every field and option is read or refused with a 400 that names it, with
//! two exceptions accepted and unused, because they size or keep what
//! ingot manages by itself: `keep_alive` (the registry unloads idle models
//! by `idle_timeout` and its memory budget) and `options.num_ctx` (the
//! context is the model's; the paged KV cache needs no per-request size).
//! Options left out take ingot's defaults (temperature 1, no top-k or
//! top-p), not a Modelfile's.

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::chat::ValidChatRequest;
use crate::embeddings::{parse_embedding_request, ValidEmbedding};
use crate::parse::{object, only_known};
use crate::ProtocolError;

/// `/api/chat` fields read.
pub const CHAT_FIELDS: [&str; 8] = [
    "model",
    "messages",
    "tools",
    "format",
    "options",
    "stream",
    "keep_alive",
    "think",
];

/// `/api/generate` fields read.
pub const GENERATE_FIELDS: [&str; 9] = [
    "model",
    "prompt",
    "system",
    "raw",
    "format",
    "options",
    "stream",
    "keep_alive",
    "think",
];

/// `/api/embed` fields read.
pub const EMBED_FIELDS: [&str; 6] = [
    "model",
    "input",
    "truncate",
    "options",
    "keep_alive",
    "dimensions",
];

/// `options` and the chat fields they set; `num_ctx` is read and unused
/// (module doc).
pub const OPTIONS: [(&str, &str); 9] = [
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("min_p", "min_p"),
    ("seed", "seed"),
    ("stop", "stop"),
    ("repeat_penalty", "repetition_penalty"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
];

/// A validated `/api/chat` request: the chat request it maps onto.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// Messages, tools, sampling (`stream` defaults to true, as Ollama's).
    pub chat: ValidChatRequest,
}

impl ChatRequest {
    /// Parses and validates a request body.
    pub fn parse(body: &Value) -> Result<Self, ProtocolError> {
        let obj = object(body)?;
        only_known(obj, &CHAT_FIELDS, "")?;
        let mut chat = common(obj)?;
        let messages = obj
            .get("messages")
            .and_then(Value::as_array)
            .ok_or_else(|| ProtocolError::field("messages", "messages must be a list"))?;
        let messages = messages
            .iter()
            .enumerate()
            .map(|(i, m)| message(&format!("messages[{i}]"), m))
            .collect::<Result<Vec<_>, _>>()?;
        chat.insert("messages".into(), Value::Array(messages));
        if let Some(tools) = obj.get("tools").filter(|t| !t.is_null()) {
            chat.insert("tools".into(), tools.clone());
        }
        Ok(Self {
            chat: ValidChatRequest::parse(&Value::Object(chat))?,
        })
    }
}

/// A validated `/api/generate` request.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// The prompt (and `system`) as a chat turn, with the sampling.
    pub chat: ValidChatRequest,
    /// The prompt as sent.
    pub prompt: String,
    /// `raw`: the prompt is tokenized as it is, without the template (also
    /// what a model without a chat template gets).
    pub raw: bool,
}

impl GenerateRequest {
    /// Parses and validates a request body.
    pub fn parse(body: &Value) -> Result<Self, ProtocolError> {
        let obj = object(body)?;
        only_known(obj, &GENERATE_FIELDS, "")?;
        let mut chat = common(obj)?;
        let text = |key: &str| match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ProtocolError::field(key, format!("{key} must be a string"))),
        };
        let prompt = text("prompt")?
            .filter(|p| !p.is_empty())
            .ok_or_else(|| ProtocolError::field("prompt", "prompt is required"))?;
        let raw = match obj.get("raw") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ProtocolError::field("raw", "raw must be a boolean")),
        };
        let system = text("system")?;
        if raw && system.is_some() {
            return Err(ProtocolError::field(
                "system",
                "system cannot be combined with raw (raw skips the template)",
            ));
        }
        let mut messages: Vec<Value> = system
            .map(|s| json!({"role": "system", "content": s}))
            .into_iter()
            .collect();
        messages.push(json!({"role": "user", "content": prompt}));
        chat.insert("messages".into(), Value::Array(messages));
        Ok(Self {
            chat: ValidChatRequest::parse(&Value::Object(chat))?,
            prompt,
            raw,
        })
    }
}

/// A validated `/api/embed` request, as an embeddings request.
pub fn parse_embed(body: &Value) -> Result<ValidEmbedding, ProtocolError> {
    let obj = object(body)?;
    only_known(obj, &EMBED_FIELDS, "")?;
    if obj.get("truncate") == Some(&Value::Bool(true)) {
        return Err(ProtocolError::field(
            "truncate",
            "truncate: true is not supported: an input longer than the model's context is refused",
        ));
    }
    if let Some(options) = obj.get("options").and_then(Value::as_object) {
        only_known(options, &["num_ctx"], "options.")?;
    }
    let mut openai = Map::new();
    for key in ["model", "input", "dimensions"] {
        if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
            openai.insert(key.into(), v.clone());
        }
    }
    parse_embedding_request(&Value::Object(openai))
}

/// The model asked for in `/api/show` (`model`, or the older `name`).
pub fn parse_show(body: &Value) -> Result<String, ProtocolError> {
    let obj = object(body)?;
    only_known(obj, &["model", "name", "verbose"], "")?;
    obj.get("model")
        .or_else(|| obj.get("name"))
        .and_then(Value::as_str)
        .map(String::from)
        .ok_or_else(|| ProtocolError::field("model", "model is required"))
}

/// The chat fields both generating endpoints share: model, stream
/// (default true), format, think and options.
fn common(obj: &Map<String, Value>) -> Result<Map<String, Value>, ProtocolError> {
    let mut chat = Map::new();
    let model = obj
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| ProtocolError::field("model", "model is required"))?;
    chat.insert("model".into(), model.into());
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ProtocolError::field("stream", "stream must be a boolean")),
    };
    chat.insert("stream".into(), stream.into());
    match obj.get("think") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(_) => {
            return Err(ProtocolError::field(
                "think",
                "think: this server does not separate a model's thinking; leave it out or false",
            ))
        }
    }
    if let Some(format) = obj.get("format").filter(|f| !f.is_null()) {
        chat.insert("response_format".into(), response_format(format)?);
    }
    if let Some(options) = obj.get("options").filter(|o| !o.is_null()) {
        options_into(options, &mut chat)?;
    }
    Ok(chat)
}

/// `format`: `"json"` or a JSON schema, as OpenAI's `response_format`.
fn response_format(format: &Value) -> Result<Value, ProtocolError> {
    match format {
        Value::String(s) if s == "json" => Ok(json!({"type": "json_object"})),
        Value::String(s) if s.is_empty() => Ok(json!({"type": "text"})),
        Value::Object(_) => Ok(json!({
            "type": "json_schema",
            "json_schema": {"name": "format", "schema": format},
        })),
        _ => Err(ProtocolError::field(
            "format",
            "format must be \"json\" or a JSON schema object",
        )),
    }
}

/// `options` as chat fields; `num_predict` of -1 or -2 (no limit, fill
/// the context) is the model's context, as when it is left out.
fn options_into(options: &Value, chat: &mut Map<String, Value>) -> Result<(), ProtocolError> {
    let obj = options
        .as_object()
        .ok_or_else(|| ProtocolError::field("options", "options must be an object"))?;
    for (key, value) in obj {
        if value.is_null() || key == "num_ctx" {
            continue;
        }
        if key == "num_predict" {
            match value.as_i64() {
                Some(-1 | -2) => {}
                Some(n) if n >= 1 => {
                    chat.insert("max_tokens".into(), n.into());
                }
                _ => {
                    return Err(ProtocolError::bound(
                        "options.num_predict",
                        "at least 1, or -1 (no limit)",
                        value,
                    ))
                }
            }
            continue;
        }
        let Some((_, field)) = OPTIONS.iter().find(|(name, _)| name == key) else {
            let name = format!("options.{key}");
            return Err(ProtocolError::field(
                &name,
                format!("{name}: this option is not supported by this server"),
            ));
        };
        chat.insert((*field).into(), value.clone());
    }
    Ok(())
}

/// One message as OpenAI's: `tool_calls` get ids and JSON-text
/// arguments, a `tool` message's `tool_name` becomes its `name`.
fn message(at: &str, m: &Value) -> Result<Value, ProtocolError> {
    let obj = m
        .as_object()
        .ok_or_else(|| ProtocolError::field(at, format!("{at} must be an object")))?;
    only_known(
        obj,
        &["role", "content", "tool_calls", "tool_name", "thinking"],
        &format!("{at}."),
    )?;
    if obj.get("thinking").is_some_and(|t| !t.is_null() && t != "") {
        return Err(ProtocolError::field(
            &format!("{at}.thinking"),
            format!("{at}.thinking: this server does not separate a model's thinking"),
        ));
    }
    let mut out = json!({"role": obj.get("role"), "content": obj.get("content")});
    if let Some(name) = obj.get("tool_name").filter(|n| !n.is_null()) {
        out["name"] = name.clone();
    }
    if let Some(calls) = obj.get("tool_calls").filter(|c| !c.is_null()) {
        out["tool_calls"] = tool_calls(&format!("{at}.tool_calls"), calls)?;
    }
    Ok(out)
}

fn tool_calls(at: &str, calls: &Value) -> Result<Value, ProtocolError> {
    let calls = calls
        .as_array()
        .ok_or_else(|| ProtocolError::field(at, format!("{at} must be a list")))?;
    let mapped = calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let name = c.pointer("/function/name").and_then(Value::as_str);
            let args = c.pointer("/function/arguments").filter(|a| a.is_object());
            match (name, args) {
                (Some(name), Some(args)) => Ok(json!({
                    "id": format!("call_{i}"),
                    "type": "function",
                    "function": {"name": name, "arguments": args.to_string()},
                })),
                _ => Err(ProtocolError::field(
                    &format!("{at}[{i}]"),
                    format!("{at}[{i}] must be {{\"function\": {{\"name\": ..., \"arguments\": {{...}}}}}}"),
                )),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Value::Array(mapped))
}

/// The closing fields of an answer (`done: true`), durations in ns.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[schemars(rename = "OllamaStats")]
pub struct Stats {
    /// `stop` or `length`.
    pub done_reason: &'static str,
    /// From the request's arrival to its end.
    pub total_duration: u64,
    /// Loading the model (counted in the prompt's time when it loads on
    /// demand; 0 here).
    pub load_duration: u64,
    /// Prompt tokens.
    pub prompt_eval_count: usize,
    /// From arrival to the first token.
    pub prompt_eval_duration: u64,
    /// Generated tokens.
    pub eval_count: usize,
    /// From the first token to the end.
    pub eval_duration: u64,
}

/// An answer's message.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
#[schemars(rename = "OllamaMessage")]
pub struct Message {
    /// "assistant".
    pub role: &'static str,
    /// Text.
    pub content: String,
    /// Calls, if any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// A call: `{"function": {"name", "arguments": {...}}}`.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
#[schemars(rename = "OllamaToolCall")]
pub struct ToolCall {
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// A called function.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
#[schemars(rename = "OllamaFunctionCall")]
pub struct FunctionCall {
    /// Its name.
    pub name: String,
    /// Its arguments, an object.
    pub arguments: Value,
}

/// A `/api/chat` line (or whole answer).
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
#[schemars(rename = "OllamaChatChunk")]
pub struct ChatChunk {
    /// The model's id.
    pub model: String,
    /// RFC 3339.
    pub created_at: String,
    /// What this line adds.
    pub message: Message,
    /// Whether this is the last line.
    pub done: bool,
    /// On the last line.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
}

/// A `/api/generate` line (or whole answer).
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
#[schemars(rename = "OllamaGenerateChunk")]
pub struct GenerateChunk {
    /// The model's id.
    pub model: String,
    /// RFC 3339.
    pub created_at: String,
    /// What this line adds.
    pub response: String,
    /// Whether this is the last line.
    pub done: bool,
    /// On the last line.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_maps_options_format_and_streams_by_default() {
        let r = ChatRequest::parse(&json!({
            "model": "m",
            "messages": [{"role": "user", "content": "Hi"}],
            "format": "json",
            "keep_alive": "5m",
            "options": {"temperature": 0.2, "num_predict": 5, "top_k": 3, "top_p": 0.9, "seed": 7, "stop": ["x"], "num_ctx": 4096, "repeat_penalty": 1.1}
        }))
        .unwrap();
        let s = &r.chat.sampling;
        assert!(s.stream, "Ollama streams unless told not to");
        assert_eq!(
            (s.params.temperature, s.params.top_k, s.params.seed),
            (0.2, 3, Some(7))
        );
        assert_eq!(s.max_tokens, Some(5));
        assert_eq!(s.stop.stop_strings, ["x"]);
        assert_eq!(s.params.repetition_penalty, 1.1);
        assert!(s.grammar.is_some(), "format json constrains the output");
        let r = ChatRequest::parse(
            &json!({"model": "m", "messages": [], "stream": false, "options": {"num_predict": -1}}),
        );
        assert!(r.is_err(), "chat needs messages");
    }

    #[test]
    fn tool_calls_and_results_map_onto_chat() {
        let r = ChatRequest::parse(&json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "sunny", "tool_name": "w"}
            ],
            "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]
        }))
        .unwrap();
        let calls = &r.chat.messages[1].extra["tool_calls"];
        assert_eq!(calls[0]["function"]["arguments"], r#"{"city":"Paris"}"#);
        assert_eq!(r.chat.messages[2].extra["name"], "w");
        assert!(r.chat.tool_config.is_some());
    }

    #[test]
    fn generate_takes_prompt_system_and_raw() {
        let r = GenerateRequest::parse(
            &json!({"model": "m", "prompt": "Hi", "system": "Be brief.", "stream": false}),
        )
        .unwrap();
        assert_eq!(r.chat.messages.len(), 2);
        assert!(!r.raw && !r.chat.sampling.stream);
        let r =
            GenerateRequest::parse(&json!({"model": "m", "prompt": "Hi", "raw": true})).unwrap();
        assert!(r.raw);
        assert_eq!(r.prompt, "Hi");
    }

    #[test]
    fn refusals_name_the_field_or_option() {
        let chat = |extra: Value| {
            let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}]});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            ChatRequest::parse(&body).unwrap_err()
        };
        assert_eq!(
            chat(json!({"options": {"mirostat": 1}})).param.as_deref(),
            Some("options.mirostat")
        );
        assert_eq!(chat(json!({"images": []})).param.as_deref(), Some("images"));
        assert_eq!(chat(json!({"think": true})).param.as_deref(), Some("think"));
        assert_eq!(chat(json!({"format": 3})).param.as_deref(), Some("format"));
        let e = GenerateRequest::parse(&json!({"model": "m", "prompt": "x", "suffix": "y"}))
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("suffix"));
        let e = GenerateRequest::parse(
            &json!({"model": "m", "prompt": "x", "options": {"num_predict": 0}}),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("options.num_predict"));
    }

    #[test]
    fn embed_maps_onto_embeddings() {
        let r = parse_embed(&json!({"model": "e", "input": ["a", "b"], "keep_alive": 0})).unwrap();
        assert_eq!(r.input.len(), 2);
        let e = parse_embed(&json!({"model": "e", "input": "a", "truncate": true})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("truncate"));
    }

    #[test]
    fn the_last_line_carries_the_stats_flat() {
        let line = GenerateChunk {
            model: "m".into(),
            created_at: "t".into(),
            response: String::new(),
            done: true,
            stats: Some(Stats {
                done_reason: "stop",
                total_duration: 3,
                load_duration: 0,
                prompt_eval_count: 1,
                prompt_eval_duration: 1,
                eval_count: 2,
                eval_duration: 2,
            }),
        };
        let v = serde_json::to_value(line).unwrap();
        assert_eq!(v["done_reason"], "stop");
        assert_eq!(v["eval_count"], 2);
    }
}
