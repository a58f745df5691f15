//! Telling the model about the tools. A template that renders `tools`
//! (and assistant `tool_calls`, and `tool` messages) gets them as they
//! are; for one that does not, the tools go into the system message as a
//! preamble in the model's format, earlier calls into the assistant text
//! and tool results into user turns, so any chat model can be offered
//! tools and shown their results.

use ingot_protocol::tools::{ToolChoice, ValidTools};
use ingot_tokenizer::ChatMessage;
use serde_json::{json, Value};

use super::grammar::signature;
use super::ToolFormat;

/// Rewrites `messages` for a template with `source` as needed, and returns
/// the `tools` value the template should see.
pub fn prepare(
    messages: &mut Vec<ChatMessage>,
    tools: Option<&ValidTools>,
    raw_tools: Option<&Value>,
    source: &str,
    format: ToolFormat,
) -> Option<Value> {
    if !source.contains("tool_calls") {
        for m in messages.iter_mut() {
            if m.role == "assistant" {
                if let Some(calls) = m.tool_calls.take() {
                    let text = calls_text(format, &calls);
                    m.content = [m.content.trim(), text.as_str()]
                        .iter()
                        .filter(|s| !s.is_empty())
                        .copied()
                        .collect::<Vec<_>>()
                        .join("\n");
                }
            }
        }
    }
    if !source.contains("tool") {
        for m in messages.iter_mut().filter(|m| m.role == "tool") {
            m.role = "user".into();
            m.content = format!("<tool_response>\n{}\n</tool_response>", m.content);
            m.tool_call_id = None;
        }
    }
    let offered = tools.filter(|t| t.choice != ToolChoice::None)?;
    if source.contains("tools") {
        return raw_tools.cloned();
    }
    let preamble = preamble(format, offered);
    match messages.first_mut().filter(|m| m.role == "system") {
        Some(system) => system.content = format!("{}\n\n{preamble}", system.content),
        None => messages.insert(0, ChatMessage::new("system", preamble)),
    }
    None
}

/// An assistant's earlier calls (OpenAI `tool_calls`) as the model writes
/// them.
fn calls_text(format: ToolFormat, calls: &Value) -> String {
    let calls: Vec<Value> = calls
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    let f = c.get("function").unwrap_or(c);
                    let args = f.get("arguments").cloned().unwrap_or(json!({}));
                    // OpenAI sends arguments as JSON text.
                    let args = match &args {
                        Value::String(s) => serde_json::from_str(s).unwrap_or(args),
                        _ => args,
                    };
                    let mut call = serde_json::Map::new();
                    call.insert("name".into(), f.get("name").cloned().unwrap_or(Value::Null));
                    call.insert(format.arguments_key().into(), args);
                    Value::Object(call)
                })
                .collect()
        })
        .unwrap_or_default();
    match format {
        ToolFormat::Hermes => calls
            .iter()
            .map(|c| format!("<tool_call>\n{}\n</tool_call>", spaced(c)))
            .collect::<Vec<_>>()
            .join("\n"),
        ToolFormat::Llama3Json => calls.iter().map(spaced).collect::<Vec<_>>().join("; "),
        ToolFormat::Mistral => format!(
            "[TOOL_CALLS][{}]",
            calls.iter().map(spaced).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// JSON with `", "` and `": "` separators, as the grammar generates it.
fn spaced(v: &Value) -> String {
    match v {
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), spaced(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Array(a) => format!("[{}]", a.iter().map(spaced).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

fn preamble(format: ToolFormat, tools: &ValidTools) -> String {
    let list = tools
        .tools
        .iter()
        .map(|t| signature(&t.name, t.description.as_deref(), &t.parameters).to_string())
        .collect::<Vec<_>>()
        .join("\n");
    let how = match format {
        ToolFormat::Hermes => "To call a function, write a JSON object with its name and arguments between <tool_call> and </tool_call>, one block per call:\n<tool_call>\n{\"name\": \"function_name\", \"arguments\": {\"argument\": \"value\"}}\n</tool_call>",
        ToolFormat::Llama3Json => "To call a function, answer with only a JSON object with its name and parameters, several separated by \"; \":\n{\"name\": \"function_name\", \"parameters\": {\"argument\": \"value\"}}",
        ToolFormat::Mistral => "To call functions, answer with [TOOL_CALLS] and a JSON list of calls:\n[TOOL_CALLS][{\"name\": \"function_name\", \"arguments\": {\"argument\": \"value\"}}]",
    };
    format!("You can call functions to answer the user. They are listed here as JSON, one per line, between <tools> and </tools>:\n<tools>\n{list}\n</tools>\n{how}\nA function's results come back in a later message; then answer the user with them.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_protocol::tools::ToolDef;

    fn offered(choice: ToolChoice) -> ValidTools {
        ValidTools {
            tools: vec![ToolDef {
                name: "get_weather".into(),
                description: Some("Weather in a city".into()),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
            }],
            choice,
            parallel: true,
        }
    }

    fn conversation() -> Vec<ChatMessage> {
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = Some(json!([{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]));
        let mut result = ChatMessage::new("tool", "18C");
        result.tool_call_id = Some("call_1".into());
        vec![ChatMessage::new("user", "Weather in Paris?"), call, result]
    }

    #[test]
    fn templates_without_tools_get_a_preamble_and_plain_turns() {
        let mut m = conversation();
        let tools = offered(ToolChoice::Auto);
        let seen = prepare(
            &mut m,
            Some(&tools),
            None,
            "{{ messages }}",
            ToolFormat::Hermes,
        );
        assert_eq!(seen, None);
        assert_eq!(m[0].role, "system");
        assert!(m[0].content.contains("\"get_weather\"") && m[0].content.contains("<tool_call>"));
        assert_eq!(
            m[2].content,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        );
        assert_eq!(
            (m[3].role.as_str(), m[3].content.as_str()),
            ("user", "<tool_response>\n18C\n</tool_response>")
        );
    }

    #[test]
    fn templates_with_tools_see_them_unchanged() {
        let mut m = conversation();
        let raw = json!([{"type": "function"}]);
        let tools = offered(ToolChoice::Required);
        let source = "{% for t in tools %}{% endfor %}{{ m.tool_calls }}{{ 'tool' }}";
        let seen = prepare(&mut m, Some(&tools), Some(&raw), source, ToolFormat::Hermes);
        assert_eq!(seen, Some(raw));
        assert_eq!(m, conversation());
        // tool_choice none: nothing offered.
        let none = offered(ToolChoice::None);
        assert_eq!(
            prepare(&mut m, Some(&none), None, source, ToolFormat::Hermes),
            None
        );
    }
}
