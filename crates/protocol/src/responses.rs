//! OpenAI's Responses API (`POST /v1/responses`): the request, checked
//! field by field and mapped onto a chat request (so it is rendered,
//! sampled, constrained and tool-called exactly as chat is), and the
//! answer's wire types: the response object, its output items and the
//! streamed events.
//!
//! Every field of OpenAI's description is honoured or refused with a 400
//! naming it. Accepted and unused: `prompt_cache_key` (a routing hint for
//! OpenAI's cache; ingot caches every prompt prefix by itself) and
//! `max_tool_calls` (it bounds built-in tool calls, and no built-in tool is
//! served). A conversation's earlier turns come from `previous_response_id`
//! (the server looks the stored response up) and are put before the input
//! with [`ResponsesRequest::with_history`].

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::chat::ValidChatRequest;
use crate::fields::UnknownFields;
use crate::parse::{each_object, object, only_known};
use crate::ProtocolError;

/// Sampling fields passed to chat under the same name (chat's extensions
/// among them: vLLM reads them here too).
const SAME_NAME: [&str; 16] = [
    "model",
    "temperature",
    "top_p",
    "stream",
    "seed",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "priority",
    "speculative",
    "top_logprobs",
];

/// Most `metadata` pairs, and their longest key and value (OpenAI's bounds).
const METADATA_PAIRS: usize = 16;
const METADATA_KEY: usize = 64;
const METADATA_VALUE: usize = 512;

/// A validated Responses request.
#[derive(Debug, Clone)]
pub struct ResponsesRequest {
    /// The conversation (instructions, history, input), sampling, output
    /// format and tools as a chat request.
    pub chat: ValidChatRequest,
    /// This request's input as chat messages (what a later turn repeats).
    pub input: Vec<Value>,
    /// `previous_response_id`.
    pub previous_response_id: Option<String>,
    /// `store` (default true).
    pub store: bool,
    /// What the response object repeats of the request.
    pub echo: Echo,
    /// The chat body without its messages (rebuilt with history).
    body: Map<String, Value>,
}

/// The request fields a response object repeats.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Echo {
    /// `instructions`.
    pub instructions: Option<String>,
    /// `max_output_tokens`.
    pub max_output_tokens: Option<u64>,
    /// `temperature` (1 when left out).
    pub temperature: f64,
    /// `top_p` (1 when left out).
    pub top_p: f64,
    /// `parallel_tool_calls` (true when left out).
    pub parallel_tool_calls: bool,
    /// `tool_choice` (`"auto"` when left out).
    pub tool_choice: Value,
    /// The function tools, normalised.
    pub tools: Vec<Value>,
    /// `text` with its format (`{"type": "text"}` when left out).
    pub text: Value,
    /// `metadata` (`{}` when left out).
    pub metadata: Map<String, Value>,
    /// `user`, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl ResponsesRequest {
    /// Parses and validates a request body (a JSON object); a field this
    /// server does not know is refused.
    pub fn parse(body: &Value) -> Result<Self, ProtocolError> {
        Self::parse_with(body, UnknownFields::Refuse)
    }

    /// Parses and validates a request body under the field policy
    /// ([`crate::fields::RESPONSES`]), unknown fields treated as `unknown`
    /// says.
    pub fn parse_with(body: &Value, unknown: UnknownFields) -> Result<Self, ProtocolError> {
        let obj = object(body)?;
        crate::fields::check(body, crate::fields::RESPONSES, unknown)?;
        refuse_unhonoured(obj)?;
        let mut chat = Map::new();
        for field in SAME_NAME {
            if let Some(v) = obj.get(field).filter(|v| !v.is_null()) {
                chat.insert(field.into(), v.clone());
            }
        }
        if let Some(m) = obj.get("max_output_tokens").filter(|v| !v.is_null()) {
            chat.insert("max_tokens".into(), m.clone());
        }
        let user = string(obj, "user")?.or(string(obj, "safety_identifier")?);
        if let Some(u) = &user {
            chat.insert("user".into(), u.clone().into());
        }
        let text = text_param(obj.get("text"))?;
        if let Some(format) = response_format(&text["format"])? {
            chat.insert("response_format".into(), format);
        }
        let tools = match obj.get("tools").filter(|v| !v.is_null()) {
            Some(t) => functions(t)?,
            None => Vec::new(),
        };
        if !tools.is_empty() {
            let chat_tools = tools
                .iter()
                .map(|t| {
                    let mut f = t.clone();
                    if let Some(f) = f.as_object_mut() {
                        f.remove("type");
                    }
                    json!({"type": "function", "function": f})
                })
                .collect();
            chat.insert("tools".into(), Value::Array(chat_tools));
        }
        let tool_choice = obj.get("tool_choice").filter(|v| !v.is_null());
        if let Some(choice) = tool_choice {
            chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
        }
        if let Some(p) = obj.get("parallel_tool_calls").filter(|v| !v.is_null()) {
            chat.insert("parallel_tool_calls".into(), p.clone());
        }
        let instructions = string(obj, "instructions")?;
        let input = match obj.get("input") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![json!({"role": "user", "content": s})],
            Some(Value::Array(items)) => messages(items)?,
            Some(_) => {
                return Err(ProtocolError::field(
                    "input",
                    "input must be a string or a list of input items",
                ))
            }
        };
        let previous_response_id = string(obj, "previous_response_id")?;
        if input.is_empty() && previous_response_id.is_none() {
            return Err(ProtocolError::field("input", "input is required"));
        }
        let echo = Echo {
            instructions: instructions.clone(),
            max_output_tokens: obj.get("max_output_tokens").and_then(Value::as_u64),
            temperature: obj
                .get("temperature")
                .and_then(Value::as_f64)
                .unwrap_or(1.0),
            top_p: obj.get("top_p").and_then(Value::as_f64).unwrap_or(1.0),
            parallel_tool_calls: obj
                .get("parallel_tool_calls")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            tool_choice: tool_choice.cloned().unwrap_or_else(|| json!("auto")),
            tools,
            text,
            metadata: metadata(obj.get("metadata"))?,
            user,
        };
        let mut request = Self {
            chat: placeholder(&chat)?,
            input,
            previous_response_id,
            store: bool_field(obj, "store")?.unwrap_or(true),
            echo,
            body: chat,
        };
        if !request.input.is_empty() {
            request.with_history(&[])?;
        }
        Ok(request)
    }

    /// Puts `history` (the chat messages of earlier turns) before the
    /// input, after the instructions (those of earlier turns are not
    /// carried over, as OpenAI does).
    pub fn with_history(&mut self, history: &[Value]) -> Result<(), ProtocolError> {
        let mut messages = Vec::with_capacity(history.len() + self.input.len() + 1);
        if let Some(i) = &self.echo.instructions {
            messages.push(json!({"role": "system", "content": i}));
        }
        messages.extend(history.iter().cloned());
        messages.extend(self.input.iter().cloned());
        let mut body = self.body.clone();
        body.insert("messages".into(), Value::Array(messages));
        let mut chat = ValidChatRequest::parse(&Value::Object(body)).map_err(renamed)?;
        if let Some(g) = &mut chat.sampling.grammar {
            g.param = "text.format.schema".into();
        }
        self.chat = chat;
        Ok(())
    }
}

/// A chat request to hold until the real one is built (validates the body
/// without messages).
fn placeholder(body: &Map<String, Value>) -> Result<ValidChatRequest, ProtocolError> {
    let mut body = body.clone();
    body.insert("messages".into(), json!([{"role": "user", "content": ""}]));
    ValidChatRequest::parse(&Value::Object(body)).map_err(renamed)
}

/// A chat error with the Responses field names (`max_output_tokens`,
/// `text.format`, `input`, `tools[i].name`).
fn renamed(mut e: ProtocolError) -> ProtocolError {
    const NAMES: [(&str, &str); 5] = [
        ("max_tokens", "max_output_tokens"),
        ("response_format.json_schema.schema", "text.format.schema"),
        ("response_format.json_schema", "text.format"),
        ("response_format", "text.format"),
        ("messages", "input"),
    ];
    if let Some(param) = e.param.clone() {
        for (from, to) in NAMES {
            if let Some(rest) = param.strip_prefix(from) {
                let new = format!("{to}{rest}");
                e.message = e.message.replace(&param, &new).replace(from, to);
                e.param = Some(new);
                break;
            }
        }
        if param.starts_with("tools[") {
            e.message = e.message.replace(".function.", ".");
            e.param = Some(param.replace(".function.", "."));
        }
    }
    e
}

/// Refuses the fields this server cannot honour with the value given.
fn refuse_unhonoured(obj: &Map<String, Value>) -> Result<(), ProtocolError> {
    let refuse =
        |param: &str, why: &str| Err(ProtocolError::field(param, format!("{param}: {why}")));
    match obj.get("reasoning") {
        None | Some(Value::Null) => {}
        Some(Value::Object(r)) => {
            // `effort: "none"` asks for no reasoning, which is what is done.
            let none = |k: &str, v: &Value| k == "effort" && v.as_str() == Some("none");
            let asked = r.iter().find(|(k, v)| !v.is_null() && !none(k, v));
            if let Some((k, _)) = asked {
                return refuse(
                    &format!("reasoning.{k}"),
                    "reasoning options are not supported: the model's reasoning is not separated by this server",
                );
            }
        }
        Some(_) => return refuse("reasoning", "reasoning must be an object"),
    }
    match obj.get("stream_options") {
        None | Some(Value::Null) => {}
        Some(Value::Object(_)) if obj.get("stream").and_then(Value::as_bool) == Some(true) => {}
        Some(Value::Object(_)) => {
            return refuse(
                "stream_options",
                "stream_options is only allowed when stream is true",
            )
        }
        Some(_) => return refuse("stream_options", "stream_options must be an object"),
    }
    match obj.get("max_tool_calls") {
        None | Some(Value::Null) => {}
        Some(v) if v.is_u64() => {}
        Some(_) => {
            return refuse(
                "max_tool_calls",
                "max_tool_calls must be a non-negative integer",
            )
        }
    }
    string(obj, "prompt_cache_key")?;
    Ok(())
}

/// A string field (absent or null: `None`).
fn string(obj: &Map<String, Value>, field: &str) -> Result<Option<String>, ProtocolError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ProtocolError::field(
            field,
            format!("{field} must be a string"),
        )),
    }
}

/// A boolean field (absent or null: `None`).
fn bool_field(obj: &Map<String, Value>, field: &str) -> Result<Option<bool>, ProtocolError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ProtocolError::field(
            field,
            format!("{field} must be a boolean"),
        )),
    }
}

/// `metadata`: at most 16 string pairs.
fn metadata(value: Option<&Value>) -> Result<Map<String, Value>, ProtocolError> {
    let map = match value {
        None | Some(Value::Null) => return Ok(Map::new()),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(ProtocolError::field(
                "metadata",
                "metadata must be an object of strings",
            ))
        }
    };
    if map.len() > METADATA_PAIRS {
        return Err(ProtocolError::bound(
            "metadata",
            &format!("at most {METADATA_PAIRS} pairs"),
            map.len(),
        ));
    }
    for (k, v) in map {
        let param = format!("metadata.{k}");
        if k.chars().count() > METADATA_KEY {
            return Err(ProtocolError::field(
                &param,
                format!("metadata keys are at most {METADATA_KEY} characters"),
            ));
        }
        match v.as_str() {
            Some(s) if s.chars().count() <= METADATA_VALUE => {}
            _ => {
                return Err(ProtocolError::field(
                    &param,
                    format!("{param} must be a string of at most {METADATA_VALUE} characters"),
                ))
            }
        }
    }
    Ok(map.clone())
}

/// `text`, with its format (`{"type": "text"}` when left out).
fn text_param(value: Option<&Value>) -> Result<Value, ProtocolError> {
    let mut text = match value {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return Err(ProtocolError::field("text", "text must be an object")),
    };
    if text.get("format").is_none_or(Value::is_null) {
        text.insert("format".into(), json!({"type": "text"}));
    }
    text.insert("verbosity".into(), json!("medium"));
    Ok(Value::Object(text))
}

/// `text.format` as chat's `response_format` (`None` for plain text).
fn response_format(format: &Value) -> Result<Option<Value>, ProtocolError> {
    let obj = format
        .as_object()
        .ok_or_else(|| ProtocolError::field("text.format", "text.format must be an object"))?;
    match obj.get("type").and_then(Value::as_str) {
        Some("text") => {
            only_known(obj, &["type"], "text.format.")?;
            Ok(None)
        }
        Some("json_object") => {
            only_known(obj, &["type"], "text.format.")?;
            Ok(Some(json!({"type": "json_object"})))
        }
        Some("json_schema") => {
            only_known(
                obj,
                &["type", "name", "schema", "strict", "description"],
                "text.format.",
            )?;
            let mut schema = obj.clone();
            schema.remove("type");
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => Err(ProtocolError::field(
            "text.format.type",
            "text.format.type must be \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

/// `tools`: function tools, normalised to `{type, name, description,
/// parameters, strict}`; OpenAI's built-in tools (web search, file search,
/// code interpreter, ...) run on OpenAI's side and are refused.
fn functions(tools: &Value) -> Result<Vec<Value>, ProtocolError> {
    each_object(tools, "tools", |at, obj| {
        match obj.get("type").and_then(Value::as_str) {
            Some("function") => {}
            kind => {
                let kind = kind.unwrap_or("(none)");
                return Err(ProtocolError::field(
                    &format!("{at}.type"),
                    format!("{at}.type {kind:?} is not supported: this server runs no built-in tools, only function tools"),
                ));
            }
        }
        only_known(
            obj,
            &["type", "name", "description", "parameters", "strict"],
            &format!("{at}."),
        )?;
        Ok(json!({
            "type": "function",
            "name": obj.get("name").cloned().unwrap_or(Value::Null),
            "description": obj.get("description").cloned().unwrap_or(Value::Null),
            "parameters": obj.get("parameters").cloned().unwrap_or(Value::Null),
            "strict": obj.get("strict").cloned().unwrap_or(Value::Null),
        }))
    })
}

/// `tool_choice` as chat's.
fn chat_tool_choice(choice: &Value) -> Result<Value, ProtocolError> {
    match choice {
        Value::String(s) if ["none", "auto", "required"].contains(&s.as_str()) => Ok(choice.clone()),
        Value::Object(obj) if obj.get("type").and_then(Value::as_str) == Some("function") => {
            only_known(obj, &["type", "name"], "tool_choice.")?;
            let name = obj.get("name").and_then(Value::as_str).ok_or_else(|| {
                ProtocolError::field("tool_choice.name", "tool_choice.name must be a string")
            })?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        Value::Object(obj) => {
            let kind = obj.get("type").and_then(Value::as_str).unwrap_or("(none)");
            Err(ProtocolError::field(
                "tool_choice.type",
                format!("tool_choice.type {kind:?} is not supported: use \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"name\": ...}}"),
            ))
        }
        _ => Err(ProtocolError::field(
            "tool_choice",
            "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}",
        )),
    }
}

/// Input items as chat messages: messages (`developer` read as `system`,
/// as chat templates know no developer turn), each `function_call` joined
/// to the assistant turn before it, each `function_call_output` a `tool`
/// message.
fn messages(items: &[Value]) -> Result<Vec<Value>, ProtocolError> {
    let mut out: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let obj = item
            .as_object()
            .ok_or_else(|| ProtocolError::field(&at, format!("{at} must be an object")))?;
        match obj.get("type").and_then(Value::as_str) {
            None | Some("message") => {
                let turn = message(&at, obj)?;
                match out.last_mut() {
                    // The answer after its reasoning item: one assistant turn.
                    Some(last) if is_reasoning_only(last) && turn["role"] == "assistant" => {
                        last["content"] = turn["content"].clone();
                    }
                    _ => out.push(turn),
                }
            }
            Some("reasoning") => out.push(reasoning(&at, obj)?),
            Some("function_call") => {
                let call = function_call(&at, obj)?;
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                            Some(calls) => calls.push(call),
                            None => last["tool_calls"] = json!([call]),
                        }
                    }
                    _ => out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
                }
            }
            Some("function_call_output") => out.push(function_output(&at, obj)?),
            Some(other) => {
                return Err(ProtocolError::field(
                    &format!("{at}.type"),
                    format!("{at}.type {other:?} is not supported: this server reads message, reasoning, function_call and function_call_output items"),
                ))
            }
        }
    }
    Ok(out)
}

/// An assistant turn that so far holds only a reasoning item's text.
fn is_reasoning_only(turn: &Value) -> bool {
    turn["role"] == "assistant"
        && turn.get("reasoning_content").is_some()
        && turn["content"] == ""
        && turn.get("tool_calls").is_none()
}

/// A reasoning item (from an earlier answer): an assistant turn holding
/// its text as `reasoning_content`, which chat templates such as Qwen3's
/// render; the answer's message or calls that follow join it.
fn reasoning(at: &str, obj: &Map<String, Value>) -> Result<Value, ProtocolError> {
    only_known(
        obj,
        &[
            "type",
            "id",
            "summary",
            "content",
            "encrypted_content",
            "status",
        ],
        &format!("{at}."),
    )?;
    if obj.get("encrypted_content").is_some_and(|v| !v.is_null()) {
        return Err(ProtocolError::field(
            &format!("{at}.encrypted_content"),
            format!("{at}.encrypted_content: this server writes no encrypted reasoning; send the reasoning's content"),
        ));
    }
    let mut text = String::new();
    for key in ["content", "summary"] {
        let Some(parts) = obj.get(key) else { continue };
        let parts = parts.as_array().ok_or_else(|| {
            ProtocolError::field(
                &format!("{at}.{key}"),
                format!("{at}.{key} must be an array"),
            )
        })?;
        for (j, part) in parts.iter().enumerate() {
            let part_at = format!("{at}.{key}[{j}]");
            let piece = part.get("text").and_then(Value::as_str).ok_or_else(|| {
                ProtocolError::field(&part_at, format!("{part_at} must be an object with a text"))
            })?;
            text.push_str(piece);
        }
        if !text.is_empty() {
            break; // the content when there is one, else the summary
        }
    }
    Ok(json!({"role": "assistant", "content": "", "reasoning_content": text}))
}

/// A message item.
fn message(at: &str, obj: &Map<String, Value>) -> Result<Value, ProtocolError> {
    only_known(
        obj,
        &["type", "role", "content", "id", "status"],
        &format!("{at}."),
    )?;
    let role = match obj.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant" | "system")) => r,
        Some("developer") => "system",
        _ => {
            return Err(ProtocolError::field(
                &format!("{at}.role"),
                format!("{at}.role must be user, assistant, system or developer"),
            ))
        }
    };
    let content = match obj.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                text.push_str(&text_part(&format!("{at}.content[{j}]"), part)?);
            }
            text
        }
        _ => {
            return Err(ProtocolError::field(
                &format!("{at}.content"),
                format!("{at}.content must be a string or a list of content parts"),
            ))
        }
    };
    Ok(json!({"role": role, "content": content}))
}

/// The text of an `input_text` or `output_text` part (an earlier answer's
/// text given back); other parts (images, files) are refused.
fn text_part(at: &str, part: &Value) -> Result<String, ProtocolError> {
    let kind = part.get("type").and_then(Value::as_str);
    let (Some("input_text" | "output_text"), Some(obj)) = (kind, part.as_object()) else {
        let kind = kind.unwrap_or("(none)");
        return Err(ProtocolError::field(
            &format!("{at}.type"),
            format!("{at}.type {kind:?} is not supported: this model reads input_text and output_text parts"),
        ));
    };
    only_known(
        obj,
        &["type", "text", "annotations", "logprobs"],
        &format!("{at}."),
    )?;
    obj.get("text")
        .and_then(Value::as_str)
        .map(String::from)
        .ok_or_else(|| {
            ProtocolError::field(&format!("{at}.text"), format!("{at}.text must be a string"))
        })
}

/// A required string field of an item.
fn item_string<'a>(
    at: &str,
    obj: &'a Map<String, Value>,
    field: &str,
) -> Result<&'a str, ProtocolError> {
    obj.get(field).and_then(Value::as_str).ok_or_else(|| {
        ProtocolError::field(
            &format!("{at}.{field}"),
            format!("{at}.{field} must be a string"),
        )
    })
}

/// A `function_call` item as a chat tool call.
fn function_call(at: &str, obj: &Map<String, Value>) -> Result<Value, ProtocolError> {
    only_known(
        obj,
        &["type", "id", "call_id", "name", "arguments", "status"],
        &format!("{at}."),
    )?;
    Ok(json!({
        "id": item_string(at, obj, "call_id")?,
        "type": "function",
        "function": {"name": item_string(at, obj, "name")?, "arguments": item_string(at, obj, "arguments")?},
    }))
}

/// A `function_call_output` item as a `tool` message.
fn function_output(at: &str, obj: &Map<String, Value>) -> Result<Value, ProtocolError> {
    only_known(
        obj,
        &["type", "id", "call_id", "output", "status"],
        &format!("{at}."),
    )?;
    let output = match obj.get("output") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, p)| text_part(&format!("{at}.output[{j}]"), p))
            .collect::<Result<Vec<_>, _>>()?
            .concat(),
        _ => {
            return Err(ProtocolError::field(
                &format!("{at}.output"),
                format!("{at}.output must be a string or a list of input_text parts"),
            ))
        }
    };
    Ok(json!({"role": "tool", "tool_call_id": item_string(at, obj, "call_id")?, "content": output}))
}

/// The chat messages an answer's output adds to the conversation: one
/// assistant turn with its text and calls.
pub fn output_messages(output: &[OutputItem]) -> Vec<Value> {
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for item in output {
        match item {
            OutputItem::Reasoning { content, .. } => {
                for part in content {
                    reasoning.push_str(&part.text);
                }
            }
            OutputItem::Message { content, .. } => {
                for part in content {
                    text.push_str(&part.text);
                }
            }
            OutputItem::FunctionCall {
                call_id,
                name,
                arguments,
                ..
            } => calls.push(json!({
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            })),
        }
    }
    let mut message = json!({"role": "assistant", "content": text});
    if !reasoning.is_empty() {
        message["reasoning_content"] = Value::String(reasoning);
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    vec![message]
}

/// The response object.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Response {
    /// `resp_…`.
    pub id: String,
    /// "response".
    pub object: &'static str,
    /// Unix seconds.
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: &'static str,
    /// Unix seconds, once completed.
    pub completed_at: Option<u64>,
    /// Why it failed (`failed` only).
    pub error: Option<ResponseError>,
    /// Why it is incomplete (`incomplete` only).
    pub incomplete_details: Option<IncompleteDetails>,
    /// The model's id.
    pub model: String,
    /// Messages and function calls, in order.
    pub output: Vec<OutputItem>,
    /// The previous response, when this one continues it.
    pub previous_response_id: Option<String>,
    /// Always null: the model's reasoning is not separated.
    pub reasoning: Option<Value>,
    /// Whether it is stored.
    pub store: bool,
    /// Always "disabled".
    pub truncation: &'static str,
    /// Always "default".
    pub service_tier: &'static str,
    /// Token counts (absent until it ends: the description has no null).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<ResponseUsage>,
    /// What it repeats of the request.
    #[serde(flatten)]
    pub echo: Echo,
}

/// `error` of a failed response.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResponseError {
    /// `server_error`.
    pub code: &'static str,
    /// What went wrong.
    pub message: String,
}

/// `incomplete_details`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IncompleteDetails {
    /// `max_output_tokens`.
    pub reason: &'static str,
}

/// An output item.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The assistant's text.
    Message {
        /// `msg_…`.
        id: String,
        /// `in_progress`, `completed` or `incomplete`.
        status: &'static str,
        /// "assistant".
        role: &'static str,
        /// Its text parts.
        content: Vec<OutputText>,
    },
    /// A call of a function tool.
    FunctionCall {
        /// `fc_…`.
        id: String,
        /// `call_…`, which its output names.
        call_id: String,
        /// The function.
        name: String,
        /// Its arguments as JSON text.
        arguments: String,
        /// `in_progress`, `completed` or `incomplete`.
        status: &'static str,
    },
    /// The model's reasoning (with a reasoning parser), before its answer.
    Reasoning {
        /// `rs_…`.
        id: String,
        /// Always empty (no summaries are written).
        summary: Vec<Value>,
        /// The reasoning text, as one part.
        content: Vec<ReasoningText>,
        /// `in_progress`, `completed` or `incomplete`.
        status: &'static str,
    },
}

/// A `reasoning_text` part.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReasoningText {
    /// "reasoning_text".
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The text.
    pub text: String,
}

impl ReasoningText {
    /// A part holding `text`.
    pub fn new(text: String) -> Self {
        Self {
            kind: "reasoning_text",
            text,
        }
    }
}

/// An `output_text` part.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OutputText {
    /// "output_text".
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The text.
    pub text: String,
    /// Always empty.
    pub annotations: Vec<Value>,
    /// Always empty (log probabilities are not returned here).
    pub logprobs: Vec<Value>,
}

impl OutputText {
    /// A part holding `text`.
    pub fn new(text: String) -> Self {
        Self {
            kind: "output_text",
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

/// `usage`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct ResponseUsage {
    /// Prompt tokens.
    pub input_tokens: usize,
    /// Their cache details.
    pub input_tokens_details: InputTokensDetails,
    /// Generated tokens.
    pub output_tokens: usize,
    /// Their details.
    pub output_tokens_details: OutputTokensDetails,
    /// The sum.
    pub total_tokens: usize,
}

impl From<crate::usage::Usage> for ResponseUsage {
    fn from(u: crate::usage::Usage) -> Self {
        Self {
            input_tokens: u.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: u.prompt_tokens_details.cached_tokens,
                cache_write_tokens: 0,
            },
            output_tokens: u.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: 0,
            },
            total_tokens: u.total_tokens,
        }
    }
}

/// `usage.input_tokens_details`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct InputTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Always 0 (the prefix cache is not billed).
    pub cache_write_tokens: usize,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct OutputTokensDetails {
    /// Always 0 (reasoning tokens are not counted apart).
    pub reasoning_tokens: usize,
}

/// A streamed event (its SSE `event:` name is its `type`); the stream
/// adds each one's `sequence_number`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type")]
pub enum StreamEvent {
    /// The response, `in_progress`, with no output.
    #[serde(rename = "response.created")]
    Created {
        /// The response.
        response: Box<Response>,
    },
    /// Generation started.
    #[serde(rename = "response.in_progress")]
    InProgress {
        /// The response.
        response: Box<Response>,
    },
    /// An output item opens.
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        /// Its index in `output`.
        output_index: usize,
        /// The item, `in_progress`.
        item: OutputItem,
    },
    /// A message's part opens.
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        /// The message.
        item_id: String,
        /// Its index in `output`.
        output_index: usize,
        /// The part's index.
        content_index: usize,
        /// The part, empty.
        part: OutputText,
    },
    /// More text.
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        /// The message.
        item_id: String,
        /// Its index in `output`.
        output_index: usize,
        /// The part's index.
        content_index: usize,
        /// The text.
        delta: String,
        /// Always empty.
        logprobs: Vec<Value>,
    },
    /// A part's whole text.
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        /// The message.
        item_id: String,
        /// Its index in `output`.
        output_index: usize,
        /// The part's index.
        content_index: usize,
        /// The whole text.
        text: String,
        /// Always empty.
        logprobs: Vec<Value>,
    },
    /// A message's part closes.
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        /// The message.
        item_id: String,
        /// Its index in `output`.
        output_index: usize,
        /// The part's index.
        content_index: usize,
        /// The whole part.
        part: OutputText,
    },
    /// More reasoning text.
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta {
        /// The reasoning item.
        item_id: String,
        /// Its index in `output`.
        output_index: usize,
        /// The part's index.
        content_index: usize,
        /// The text.
        delta: String,
    },
    /// The whole reasoning text.
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningTextDone {
        /// The reasoning item.
        item_id: String,
        /// Its index in `output`.
        output_index: usize,
        /// The part's index.
        content_index: usize,
        /// The whole text.
        text: String,
    },
    /// More of a call's arguments.
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        /// The call item.
        item_id: String,
        /// Its index in `output`.
        output_index: usize,
        /// The arguments text.
        delta: String,
    },
    /// A call's whole arguments.
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        /// The call item.
        item_id: String,
        /// Its index in `output`.
        output_index: usize,
        /// The function.
        name: String,
        /// The whole arguments text.
        arguments: String,
    },
    /// An output item closes.
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        /// Its index in `output`.
        output_index: usize,
        /// The whole item.
        item: OutputItem,
    },
    /// The response ended.
    #[serde(rename = "response.completed")]
    Completed {
        /// The whole response.
        response: Box<Response>,
    },
    /// The response was cut short (`max_output_tokens`).
    #[serde(rename = "response.incomplete")]
    Incomplete {
        /// The whole response, as far as it got.
        response: Box<Response>,
    },
    /// The response failed after its head.
    #[serde(rename = "response.failed")]
    Failed {
        /// The response, with its error.
        response: Box<Response>,
    },
    /// An error after the head.
    #[serde(rename = "error")]
    Error {
        /// A machine-readable code, if any.
        code: Option<String>,
        /// What went wrong.
        message: String,
        /// The field at fault, if any.
        param: Option<String>,
    },
}

impl StreamEvent {
    /// The SSE event name (the `type`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Created { .. } => "response.created",
            Self::InProgress { .. } => "response.in_progress",
            Self::OutputItemAdded { .. } => "response.output_item.added",
            Self::ContentPartAdded { .. } => "response.content_part.added",
            Self::OutputTextDelta { .. } => "response.output_text.delta",
            Self::OutputTextDone { .. } => "response.output_text.done",
            Self::ContentPartDone { .. } => "response.content_part.done",
            Self::ReasoningTextDelta { .. } => "response.reasoning_text.delta",
            Self::ReasoningTextDone { .. } => "response.reasoning_text.done",
            Self::FunctionCallArgumentsDelta { .. } => "response.function_call_arguments.delta",
            Self::FunctionCallArgumentsDone { .. } => "response.function_call_arguments.done",
            Self::OutputItemDone { .. } => "response.output_item.done",
            Self::Completed { .. } => "response.completed",
            Self::Incomplete { .. } => "response.incomplete",
            Self::Failed { .. } => "response.failed",
            Self::Error { .. } => "error",
        }
    }
}

/// An event with its place in the stream.
#[derive(Debug, Serialize)]
pub struct Sequenced<'a> {
    /// The event.
    #[serde(flatten)]
    pub event: &'a StreamEvent,
    /// Its number, from 0.
    pub sequence_number: u64,
}

/// `DELETE /v1/responses/{id}`'s answer.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct Deleted {
    /// The response.
    pub id: String,
    /// "response".
    pub object: &'static str,
    /// true.
    pub deleted: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolChoice;

    fn parse(body: Value) -> Result<ResponsesRequest, ProtocolError> {
        ResponsesRequest::parse(&body)
    }

    fn base(extra: Value) -> Value {
        let mut body = json!({"model": "m", "input": "Hi"});
        for (k, v) in extra.as_object().into_iter().flatten() {
            body[k] = v.clone();
        }
        body
    }

    fn roles(r: &ResponsesRequest) -> Vec<&str> {
        r.chat.messages.iter().map(|m| m.role.as_str()).collect()
    }

    #[test]
    fn text_input_with_instructions_and_sampling() {
        let r = parse(base(json!({
            "instructions": "Be brief.", "max_output_tokens": 16, "temperature": 0.5,
            "top_p": 0.9, "seed": 7, "store": false, "metadata": {"k": "v"}, "user": "u",
            "prompt_cache_key": "x", "truncation": "disabled", "reasoning": {"effort": null},
        })))
        .unwrap();
        assert_eq!(roles(&r), ["system", "user"]);
        assert_eq!(r.chat.messages[0].content, "Be brief.");
        assert_eq!(r.chat.sampling.max_tokens, Some(16));
        assert_eq!(r.chat.sampling.params.temperature, 0.5);
        assert_eq!(r.chat.sampling.params.seed, Some(7));
        assert_eq!(r.chat.sampling.user.as_deref(), Some("u"));
        assert!(!r.store);
        assert_eq!(r.echo.metadata["k"], "v");
        assert_eq!(
            r.echo.text,
            json!({"format": {"type": "text"}, "verbosity": "medium"})
        );
        assert_eq!(r.input, [json!({"role": "user", "content": "Hi"})]);
    }

    #[test]
    fn items_become_chat_turns() {
        let r = parse(base(json!({"input": [
            {"role": "developer", "content": "Rules."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "in Paris?"}]},
            {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
            {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
        ]})))
        .unwrap();
        assert_eq!(roles(&r), ["system", "user", "assistant", "tool", "tool"]);
        assert_eq!(r.chat.messages[1].content, "Weather in Paris?");
        let calls = &r.chat.messages[2].extra["tool_calls"];
        assert_eq!(calls[0]["id"], "call_1");
        assert_eq!(calls[1]["function"]["name"], "get_time");
        assert_eq!(r.chat.messages[2].content, "Checking.");
        assert_eq!(r.chat.messages[3].extra["tool_call_id"], "call_1");
        assert_eq!(r.chat.messages[4].content, "noon");
    }

    #[test]
    fn history_goes_between_instructions_and_input() {
        let mut r = parse(base(
            json!({"instructions": "Be brief.", "previous_response_id": "resp_1"}),
        ))
        .unwrap();
        r.with_history(&[
            json!({"role": "user", "content": "Before"}),
            json!({"role": "assistant", "content": "Ok"}),
        ])
        .unwrap();
        assert_eq!(roles(&r), ["system", "user", "assistant", "user"]);
        assert_eq!(r.chat.messages[1].content, "Before");
        assert_eq!(r.previous_response_id.as_deref(), Some("resp_1"));
        let only_previous = parse(json!({"previous_response_id": "resp_1"})).unwrap();
        assert!(only_previous.input.is_empty());
    }

    #[test]
    fn text_format_and_tools_map_onto_chat() {
        let r = parse(base(json!({
            "text": {"format": {"type": "json_schema", "name": "city", "schema": {"type": "object", "properties": {"name": {"type": "string"}}}, "strict": true}},
        })))
        .unwrap();
        let g = r.chat.sampling.grammar.unwrap();
        assert_eq!(g.param, "text.format.schema");
        let r = parse(base(json!({"text": {"format": {"type": "json_object"}}}))).unwrap();
        assert!(r.chat.sampling.grammar.is_some());
        let r = parse(base(json!({
            "tools": [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": false,
        })))
        .unwrap();
        let tools = r.chat.tool_config.unwrap();
        assert_eq!(tools.choice, ToolChoice::Named("get_weather".into()));
        assert!(!tools.parallel);
        assert_eq!(r.echo.tools[0]["name"], "get_weather");
        assert_eq!(r.echo.tool_choice["name"], "get_weather");
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (json!({"bogus": 1}), "bogus"),
            (json!({"conversation": "c"}), "conversation"),
            (json!({"prompt": {"id": "p"}}), "prompt"),
            (json!({"background": true}), "background"),
            (
                json!({"include": ["message.output_text.logprobs"]}),
                "include",
            ),
            (json!({"reasoning": {"effort": "high"}}), "reasoning.effort"),
            (json!({"truncation": "auto"}), "truncation"),
            (json!({"service_tier": "flex"}), "service_tier"),
            (json!({"top_logprobs": 2}), "top_logprobs"),
            (
                json!({"stream": true, "stream_options": {"include_obfuscation": true}}),
                "stream_options.include_obfuscation",
            ),
            (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
            (
                json!({"tools": [{"type": "function", "name": "f", "parameters": {}, "defer_loading": true}]}),
                "tools[0].defer_loading",
            ),
            (
                json!({"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}),
                "tool_choice.type",
            ),
            (
                json!({"text": {"format": {"type": "grammar"}}}),
                "text.format.type",
            ),
            (json!({"text": {"verbosity": "low"}}), "text.verbosity"),
            (json!({"max_output_tokens": 0}), "max_output_tokens"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input[0].content[0].type",
            ),
            (
                json!({"input": [{"type": "item_reference", "id": "x"}]}),
                "input[0].type",
            ),
            (
                json!({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "x"}]}),
                "input[0].encrypted_content",
            ),
            (
                json!({"input": [{"type": "function_call_output", "output": "x"}]}),
                "input[0].call_id",
            ),
            (
                json!({"input": [{"role": "tool", "content": "x"}]}),
                "input[0].role",
            ),
            (json!({"input": []}), "input"),
            (json!({"metadata": {"k": 1}}), "metadata.k"),
        ];
        for (extra, param) in cases {
            let e = parse(base(extra.clone())).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {e}");
            assert!(e.message.contains(param), "{extra}: {e}");
        }
    }

    #[test]
    fn output_is_one_assistant_turn() {
        let output = [
            OutputItem::Message {
                id: "msg_1".into(),
                status: "completed",
                role: "assistant",
                content: vec![OutputText::new("Checking.".into())],
            },
            OutputItem::FunctionCall {
                id: "fc_1".into(),
                call_id: "call_1".into(),
                name: "f".into(),
                arguments: "{}".into(),
                status: "completed",
            },
        ];
        let m = output_messages(&output);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0]["content"], "Checking.");
        assert_eq!(m[0]["tool_calls"][0]["id"], "call_1");
    }

    #[test]
    fn events_serialise_with_their_type_and_number() {
        let e = StreamEvent::OutputTextDelta {
            item_id: "msg_1".into(),
            output_index: 0,
            content_index: 0,
            delta: "Hi".into(),
            logprobs: Vec::new(),
        };
        let v = serde_json::to_value(Sequenced {
            event: &e,
            sequence_number: 3,
        })
        .unwrap();
        assert_eq!(
            v,
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "Hi", "logprobs": [], "sequence_number": 3})
        );
        assert_eq!(e.name(), "response.output_text.delta");
        let item = OutputItem::FunctionCall {
            id: "fc_1".into(),
            call_id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
            status: "completed",
        };
        assert_eq!(
            serde_json::to_value(&item).unwrap()["type"],
            "function_call"
        );
    }
}
