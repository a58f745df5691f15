//! The grammar a `required` or named `tool_choice` puts on the answer: one
//! or more calls in the model's format, each naming an offered function
//! with arguments that follow its parameters schema.

use ingot_core::GrammarSpec;
use ingot_protocol::structured::OutputGrammar;
use ingot_protocol::tools::{ToolChoice, ValidTools};
use serde_json::{json, Value};

use super::ToolFormat;
use crate::structured::SchemaCheck;

/// The answer's grammar, or `None` when the model may answer freely
/// (`auto`, `none`). Errors about it name `tools`.
pub fn tool_grammar(format: ToolFormat, tools: &ValidTools) -> Option<OutputGrammar> {
    if !matches!(tools.choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return None;
    }
    let callable = tools.callable();
    let mut rules = Vec::with_capacity(callable.len());
    let mut names = Vec::with_capacity(callable.len());
    for (i, t) in callable.iter().enumerate() {
        // `{"name": "f", "arguments": ` as a literal, then the parameters
        // as a schema of their own: nested in a wrapper schema, their
        // `$ref`s (pydantic's `#/$defs/...`) would resolve against the
        // wrapper and miss. Lark string literals are JSON strings.
        let head = format!(
            "{{\"name\": {}, \"{}\": ",
            Value::from(t.name.as_str()),
            format.arguments_key()
        );
        let schema = ingot_structured::with_layout(t.parameters.clone());
        rules.push(format!("fn{i}: {} args{i} \"}}\"", Value::from(head)));
        rules.push(format!("args{i}: %json {schema}"));
        names.push(format!("fn{i}"));
    }
    // A named choice is exactly one call, as OpenAI answers it.
    let many = tools.parallel && matches!(tools.choice, ToolChoice::Required);
    let call = names.join(" | ");
    let top = match format {
        ToolFormat::Hermes => {
            let block = r#""<tool_call>\n" call "\n</tool_call>""#;
            if many {
                format!("start: block (\"\\n\" block)*\nblock: {block}")
            } else {
                format!("start: {block}")
            }
        }
        ToolFormat::Llama3Json => {
            if many {
                "start: call (\"; \" call)*".to_string()
            } else {
                "start: call".to_string()
            }
        }
        ToolFormat::Mistral => {
            if many {
                "start: \"[TOOL_CALLS][\" call (\", \" call)* \"]\"".to_string()
            } else {
                "start: \"[TOOL_CALLS][\" call \"]\"".to_string()
            }
        }
    };
    let source = format!("{top}\ncall: {call}\n{}\n", rules.join("\n"));
    Some(OutputGrammar {
        param: "tools".into(),
        spec: GrammarSpec::Lark(source),
    })
}

/// Every offered function's parameters schema, named by its field, to be
/// checked whatever the tool_choice (see [`crate::structured::check`]);
/// enforced for the functions a required or named choice may call.
pub fn tool_schemas(tools: &ValidTools) -> Vec<SchemaCheck> {
    tools
        .tools
        .iter()
        .enumerate()
        .map(|(i, t)| SchemaCheck {
            grammar: OutputGrammar {
                param: format!("tools[{i}].function.parameters"),
                spec: GrammarSpec::JsonSchema(t.parameters.to_string()),
            },
            enforced: match &tools.choice {
                ToolChoice::Required => true,
                ToolChoice::Named(name) => *name == t.name,
                _ => false,
            },
        })
        .collect()
}

/// The schema text of one function (for prompts).
pub(super) fn signature(name: &str, description: Option<&str>, parameters: &Value) -> Value {
    json!({
        "type": "function",
        "function": {"name": name, "description": description.unwrap_or(""), "parameters": parameters},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_protocol::tools::ToolDef;

    fn tools(choice: ToolChoice, parallel: bool) -> ValidTools {
        ValidTools {
            tools: vec![
                ToolDef {
                    name: "a".into(),
                    description: None,
                    parameters: json!({"type": "object"}),
                },
                ToolDef {
                    name: "b".into(),
                    description: None,
                    parameters: json!({"type": "object"}),
                },
            ],
            choice,
            parallel,
        }
    }

    #[test]
    fn only_required_and_named_choices_are_constrained() {
        assert!(tool_grammar(ToolFormat::Hermes, &tools(ToolChoice::Auto, true)).is_none());
        assert!(tool_grammar(ToolFormat::Hermes, &tools(ToolChoice::None, true)).is_none());
        let g = tool_grammar(ToolFormat::Hermes, &tools(ToolChoice::Required, true)).unwrap();
        assert_eq!(g.param, "tools");
        let src = g.spec.source().to_string();
        assert!(
            src.contains("block (") && src.contains("fn0") && src.contains("fn1"),
            "{src}"
        );
        let named = tool_grammar(
            ToolFormat::Hermes,
            &tools(ToolChoice::Named("b".into()), true),
        )
        .unwrap()
        .spec;
        let src = named.source();
        assert!(
            src.contains(r#"\"name\": \"b\""#) && !src.contains("fn1"),
            "{src}"
        );
        assert!(!src.contains("block ("), "{src}");
    }
}
