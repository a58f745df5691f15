//! Reading tool calls out of a whole answer. Text that does not parse as a
//! call stays content: nothing the model wrote is dropped.

use serde_json::Value;

use super::ToolFormat;

/// A call found in the answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    /// The function.
    pub name: String,
    /// Its arguments as compact JSON text.
    pub arguments: String,
}

/// An answer split into text and calls.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Answer {
    /// What is left once the calls are taken out (`None` when only
    /// whitespace is).
    pub content: Option<String>,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
}

/// Splits `text` as `format` writes calls.
pub fn parse_answer(format: ToolFormat, text: &str) -> Answer {
    match format {
        ToolFormat::Hermes => hermes(text),
        ToolFormat::Llama3Json => llama3(text),
        ToolFormat::Mistral => mistral(text),
    }
}

pub(super) const HERMES_OPEN: &str = "<tool_call>";
pub(super) const HERMES_CLOSE: &str = "</tool_call>";
pub(super) const PYTHON_TAG: &str = "<|python_tag|>";
pub(super) const MISTRAL_MARK: &str = "[TOOL_CALLS]";

fn content_of(text: String) -> Option<String> {
    let t = text.trim();
    (!t.is_empty()).then(|| t.to_string())
}

fn hermes(text: &str) -> Answer {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find(HERMES_OPEN) {
        content.push_str(&rest[..open]);
        let body_start = open + HERMES_OPEN.len();
        let (body, next) = match rest[body_start..].find(HERMES_CLOSE) {
            Some(end) => (
                &rest[body_start..body_start + end],
                body_start + end + HERMES_CLOSE.len(),
            ),
            None => (&rest[body_start..], rest.len()),
        };
        match call_from(body.trim(), "arguments") {
            Some(c) => calls.push(c),
            None => content.push_str(&rest[open..next]),
        }
        rest = &rest[next..];
    }
    content.push_str(rest);
    Answer {
        content: content_of(content),
        calls,
    }
}

/// `{"name": …, "<key>" | "arguments": {…}}` as a call.
pub(super) fn call_from(body: &str, key: &str) -> Option<ParsedCall> {
    let v: Value = serde_json::from_str(body).ok()?;
    call_of(&v, key)
}

fn call_of(v: &Value, key: &str) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get(key).or_else(|| v.get("arguments"))?;
    let arguments = match args {
        Value::Object(_) => args.to_string(),
        // Some models write the arguments as JSON text.
        Value::String(s) if serde_json::from_str::<Value>(s).is_ok_and(|a| a.is_object()) => {
            s.clone()
        }
        _ => return None,
    };
    Some(ParsedCall { name, arguments })
}

/// Consecutive JSON values separated by whitespace or `sep`; `None`
/// unless the whole text is such values.
fn json_values(text: &str, sep: char) -> Option<Vec<Value>> {
    let mut values = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = it.next()?.ok()?;
        values.push(v);
        rest = rest[it.byte_offset()..].trim_start();
        if let Some(r) = rest.strip_prefix(sep) {
            rest = r.trim_start();
        }
    }
    (!values.is_empty()).then_some(values)
}

pub(super) fn llama3(text: &str) -> Answer {
    let body = text.trim_start();
    let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body);
    let calls = json_values(body, ';').and_then(|vs| {
        vs.iter()
            .map(|v| call_of(v, "parameters"))
            .collect::<Option<Vec<_>>>()
    });
    match calls {
        Some(calls) => Answer {
            content: None,
            calls,
        },
        None => Answer {
            content: content_of(text.to_string()),
            calls: Vec::new(),
        },
    }
}

pub(super) fn mistral(text: &str) -> Answer {
    let Some(at) = text.find(MISTRAL_MARK) else {
        return Answer {
            content: content_of(text.to_string()),
            calls: Vec::new(),
        };
    };
    let after = &text[at + MISTRAL_MARK.len()..];
    let calls = json_values(after, ',').and_then(|vs| {
        let items: Vec<&Value> = vs
            .iter()
            .flat_map(|v| match v {
                Value::Array(a) => a.iter().collect::<Vec<_>>(),
                other => vec![other],
            })
            .collect();
        items
            .into_iter()
            .map(|v| call_of(v, "arguments"))
            .collect::<Option<Vec<_>>>()
    });
    match calls {
        Some(calls) => Answer {
            content: content_of(text[..at].to_string()),
            calls,
        },
        None => Answer {
            content: content_of(text.to_string()),
            calls: Vec::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn hermes_blocks_become_calls_and_the_rest_content() {
        let a = parse_answer(
            ToolFormat::Hermes,
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"t\", \"arguments\": \"{}\"}</tool_call>",
        );
        assert_eq!(a.content.as_deref(), Some("Let me check."));
        assert_eq!(
            a.calls,
            [call("get_weather", r#"{"city":"Paris"}"#), call("t", "{}")]
        );
        // Unterminated at the end still counts; broken JSON stays text.
        let a = parse_answer(
            ToolFormat::Hermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": {}}",
        );
        assert_eq!((a.content, a.calls), (None, vec![call("f", "{}")]));
        let a = parse_answer(ToolFormat::Hermes, "x <tool_call>{oops</tool_call>");
        assert_eq!(a.content.as_deref(), Some("x <tool_call>{oops</tool_call>"));
        assert!(a.calls.is_empty());
        assert_eq!(
            parse_answer(ToolFormat::Hermes, "  hi "),
            Answer {
                content: Some("hi".into()),
                calls: vec![]
            }
        );
    }

    #[test]
    fn llama3_answers_are_whole_json_calls() {
        let a = parse_answer(
            ToolFormat::Llama3Json,
            "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}",
        );
        assert_eq!(a.calls, [call("a", r#"{"x":1}"#), call("b", "{}")]);
        assert_eq!(a.content, None);
        let a = parse_answer(ToolFormat::Llama3Json, "{\"answer\": 42}");
        assert!(a.calls.is_empty());
        assert_eq!(a.content.as_deref(), Some("{\"answer\": 42}"));
        assert!(parse_answer(ToolFormat::Llama3Json, "Hello {")
            .calls
            .is_empty());
    }

    #[test]
    fn mistral_calls_follow_the_marker() {
        let a = parse_answer(
            ToolFormat::Mistral,
            "Sure. [TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"q\": \"x;y\"}}, {\"name\": \"b\", \"arguments\": {}}]",
        );
        assert_eq!(a.content.as_deref(), Some("Sure."));
        assert_eq!(a.calls, [call("a", r#"{"q":"x;y"}"#), call("b", "{}")]);
        assert!(parse_answer(ToolFormat::Mistral, "[TOOL_CALLS] nope")
            .calls
            .is_empty());
    }
}
