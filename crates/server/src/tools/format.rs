//! The tool-call formats models are trained on, and which one a model
//! uses, read from its chat template.

/// How a model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Hermes / Qwen: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`
    /// blocks, one per call.
    Hermes,
    /// Llama 3.x: the answer is `{"name": …, "parameters": {…}}` (after an
    /// optional `<|python_tag|>`), several separated by `;`.
    Llama3Json,
    /// Mistral: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}`.
    Mistral,
}

impl ToolFormat {
    /// The format a template's own tool rendering implies; Hermes when it
    /// shows none (the format small models follow best from a preamble).
    pub fn from_template(source: &str) -> Self {
        if source.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if source.contains("<|python_tag|>")
            || (source.contains("ipython") && source.contains("parameters"))
        {
            ToolFormat::Llama3Json
        } else {
            ToolFormat::Hermes
        }
    }

    /// The key of a call's arguments in this format.
    pub fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3Json => "parameters",
            ToolFormat::Hermes | ToolFormat::Mistral => "arguments",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_read_from_templates() {
        assert_eq!(
            ToolFormat::from_template("{{ '[TOOL_CALLS]' }}"),
            ToolFormat::Mistral
        );
        assert_eq!(
            ToolFormat::from_template("{{- '<|python_tag|>' }}"),
            ToolFormat::Llama3Json
        );
        assert_eq!(
            ToolFormat::from_template("<tool_call>\n{{ tool_call | tojson }}"),
            ToolFormat::Hermes
        );
        assert_eq!(
            ToolFormat::from_template("{{ messages }}"),
            ToolFormat::Hermes
        );
    }
}
