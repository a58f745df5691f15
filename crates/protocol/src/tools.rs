//! Tool calling on chat: the `tools` a request offers, its `tool_choice`
//! and `parallel_tool_calls`, and the `tool_calls` of an answer (whole, or
//! as stream deltas).

use serde::Serialize;
use serde_json::{json, Value};

use crate::ProtocolError;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    /// The function's name.
    pub name: String,
    /// What it does (for the prompt).
    pub description: Option<String>,
    /// JSON schema of its arguments (an object schema).
    pub parameters: Value,
}

/// What the model must do with the tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Answer in text; no call is parsed.
    None,
    /// Call tools or answer, as the model decides.
    Auto,
    /// Call at least one tool (the grammar enforces it).
    Required,
    /// Call this function (the grammar enforces it).
    Named(String),
}

/// The validated tool fields of a chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidTools {
    /// The functions offered.
    pub tools: Vec<ToolDef>,
    /// What the model must do.
    pub choice: ToolChoice,
    /// Several calls in one answer.
    pub parallel: bool,
}

impl ValidTools {
    /// The functions a constrained answer may call: all of them, or the
    /// named one.
    pub fn callable(&self) -> Vec<&ToolDef> {
        match &self.choice {
            ToolChoice::Named(n) => self.tools.iter().filter(|t| &t.name == n).collect(),
            _ => self.tools.iter().collect(),
        }
    }
}

/// Most tools per request.
pub const MAX_TOOLS: usize = 128;

/// Parses `tools`, `tool_choice` and `parallel_tool_calls`; `None` when no
/// tools are offered.
pub fn parse_tools(body: &Value) -> Result<Option<ValidTools>, ProtocolError> {
    let tools = match body.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, t)| tool(i, t))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(ProtocolError::field("tools", "tools must be a list")),
    };
    if tools.len() > MAX_TOOLS {
        return Err(ProtocolError::bound(
            "tools",
            &format!("at most {MAX_TOOLS} tools"),
            tools.len(),
        ));
    }
    for (i, t) in tools.iter().enumerate() {
        if tools[..i].iter().any(|o| o.name == t.name) {
            return Err(ProtocolError::field(
                &format!("tools[{i}].function.name"),
                format!("tools[{i}].function.name {:?} is given twice", t.name),
            ));
        }
    }
    let choice = match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ProtocolError::field(
                    "tool_choice",
                    format!("tool_choice must be none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {other:?}"),
                ))
            }
        }),
        Some(obj @ Value::Object(_)) => {
            let name = obj
                .pointer("/function/name")
                .and_then(Value::as_str)
                .filter(|_| obj.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    ProtocolError::field(
                        "tool_choice",
                        "tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}} to name a function",
                    )
                })?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(ProtocolError::field(
                    "tool_choice.function.name",
                    format!("tool_choice names {name:?}, which is not in tools"),
                ));
            }
            Some(ToolChoice::Named(name.to_owned()))
        }
        Some(_) => {
            return Err(ProtocolError::field(
                "tool_choice",
                "tool_choice must be a string or an object",
            ))
        }
    };
    let parallel = match body.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ProtocolError::field(
                "parallel_tool_calls",
                "parallel_tool_calls must be a boolean",
            ))
        }
    };
    if tools.is_empty() {
        return match choice {
            None | Some(ToolChoice::None) => Ok(None),
            Some(_) => Err(ProtocolError::field(
                "tool_choice",
                "tool_choice is only allowed when tools are given",
            )),
        };
    }
    Ok(Some(ValidTools {
        tools,
        choice: choice.unwrap_or(ToolChoice::Auto),
        parallel,
    }))
}

fn tool(i: usize, t: &Value) -> Result<ToolDef, ProtocolError> {
    let param = format!("tools[{i}]");
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return Err(ProtocolError::field(
            &format!("{param}.type"),
            format!("{param}.type must be \"function\""),
        ));
    }
    let f = t
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            ProtocolError::field(
                &format!("{param}.function"),
                format!("{param}.function must be an object with a name"),
            )
        })?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| {
            (1..=64).contains(&n.len())
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        })
        .ok_or_else(|| {
            ProtocolError::field(
                &format!("{param}.function.name"),
                format!("{param}.function.name must be 1 to 64 letters, digits, underscores, dots or dashes"),
            )
        })?;
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(ProtocolError::field(
                &format!("{param}.function.parameters"),
                format!("{param}.function.parameters must be a JSON schema object"),
            ))
        }
    };
    Ok(ToolDef {
        name: name.to_owned(),
        description: f
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_owned),
        parameters,
    })
}

/// A function call in an answer.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ToolCall {
    /// `call_…`, unique in the response.
    pub id: String,
    /// Always "function".
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The call.
    pub function: FunctionCall,
}

/// Name and arguments of a call.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct FunctionCall {
    /// The function.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

/// A piece of a call in a stream chunk: the first of a call carries its
/// id, type and name; later ones more of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ToolCallDelta {
    /// Which call of the choice.
    pub index: usize,
    /// Set on the call's first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// "function", on the call's first delta.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// Name and/or arguments text.
    pub function: FunctionCallDelta,
}

/// Name and/or a piece of the arguments.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct FunctionCallDelta {
    /// Set on the call's first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// More argument text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "d",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    #[test]
    fn tools_and_choices_parse() {
        assert_eq!(parse_tools(&json!({})).unwrap(), None);
        let t = parse_tools(&json!({"tools": [weather()]}))
            .unwrap()
            .unwrap();
        assert_eq!(t.choice, ToolChoice::Auto);
        assert!(t.parallel);
        assert_eq!(t.tools[0].name, "get_weather");
        let t = parse_tools(&json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": false}))
            .unwrap()
            .unwrap();
        assert_eq!(t.choice, ToolChoice::Named("get_weather".into()));
        assert!(!t.parallel);
        assert_eq!(t.callable().len(), 1);
        let t = parse_tools(&json!({"tools": [weather()], "tool_choice": "required"}))
            .unwrap()
            .unwrap();
        assert_eq!(t.choice, ToolChoice::Required);
    }

    #[test]
    fn bad_tools_name_their_field() {
        let param = |b: Value| parse_tools(&b).unwrap_err().param.unwrap_or_default();
        assert_eq!(param(json!({"tools": {}})), "tools");
        assert_eq!(
            param(json!({"tools": [{"type": "retrieval"}]})),
            "tools[0].type"
        );
        assert_eq!(
            param(json!({"tools": [{"type": "function", "function": {"name": "a b"}}]})),
            "tools[0].function.name"
        );
        assert_eq!(
            param(json!({"tools": [weather(), weather()]})),
            "tools[1].function.name"
        );
        assert_eq!(
            param(json!({"tools": [weather()], "tool_choice": "always"})),
            "tool_choice"
        );
        assert_eq!(
            param(
                json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}})
            ),
            "tool_choice.function.name"
        );
        assert_eq!(param(json!({"tool_choice": "required"})), "tool_choice");
    }

    #[test]
    fn deltas_serialise_in_openai_shape() {
        let first = ToolCallDelta {
            index: 0,
            id: Some("call_1".into()),
            kind: Some("function"),
            function: FunctionCallDelta {
                name: Some("f".into()),
                arguments: Some(String::new()),
            },
        };
        assert_eq!(
            serde_json::to_value(&first).unwrap(),
            json!({"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}})
        );
        let more = ToolCallDelta {
            index: 0,
            id: None,
            kind: None,
            function: FunctionCallDelta {
                name: None,
                arguments: Some("{}".into()),
            },
        };
        assert_eq!(
            serde_json::to_value(&more).unwrap(),
            json!({"index": 0, "function": {"arguments": "{}"}})
        );
    }
}
