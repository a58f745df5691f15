//! Chat templates shipped with llama.cpp (`models/templates/*.jinja`),
//! rendered exactly as transformers renders them.

use std::path::PathBuf;

use ingot_tokenizer::{ChatMessage, ChatTemplate};
use serde_json::json;

use crate::{common, python};

/// 2024-07-26 00:00:00 UTC, the date Llama 3.1's template defaults to.
const NOW: i64 = 1_721_952_000;

fn template_path(name: &str) -> PathBuf {
    common::fetch("fetch-llama-cpp-sdist")
        .join("templates")
        .join(name)
}

fn system_user() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You are a helpful assistant."),
        ChatMessage::new("user", "Hello!"),
    ]
}

fn render(name: &str, bos: Option<&str>, eos: Option<&str>) -> String {
    let source = std::fs::read_to_string(template_path(name)).unwrap();
    ChatTemplate::new(&source, bos, eos)
        .unwrap()
        .with_fixed_time(NOW)
        .render(&system_user(), true, None)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

const LLAMA3_EXPECTED: &str = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n\
    Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n\
    You are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n\
    Hello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";

const CHATML_EXPECTED: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
    <|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n";

#[test]
fn llama_3_1_3_2_3_3() {
    for name in [
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "meta-llama-Llama-3.3-70B-Instruct.jinja",
    ] {
        assert_eq!(
            render(name, Some("<|begin_of_text|>"), Some("<|eot_id|>")),
            LLAMA3_EXPECTED,
            "{name}"
        );
    }
}

#[test]
fn qwen2_5_and_qwen3() {
    for name in ["Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja"] {
        assert_eq!(
            render(name, None, Some("<|im_end|>")),
            CHATML_EXPECTED,
            "{name}"
        );
    }
}

#[test]
fn mistral() {
    assert_eq!(
        render(
            "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            Some("<s>"),
            Some("</s>")
        ),
        "<s>[INST]You are a helpful assistant.\n\nHello![/INST]"
    );
    assert_eq!(
        render(
            "Mistral-Small-3.2-24B-Instruct-2506.jinja",
            Some("<s>"),
            Some("</s>")
        ),
        "<s>[SYSTEM_PROMPT]You are a helpful assistant.[/SYSTEM_PROMPT][INST]Hello![/INST]"
    );
}

#[test]
fn smollm3_chatml() {
    assert_eq!(
        render("HuggingFaceTB-SmolLM3-3B.jinja", None, Some("<|im_end|>")),
        "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nReasoning Mode: /think\n\n\
         ## Custom Instructions\n\nYou are a helpful assistant.\n\n<|im_end|>\n\
         <|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn mistral_rejects_non_alternating_roles() {
    let source =
        std::fs::read_to_string(template_path("mistralai-Mistral-Nemo-Instruct-2407.jinja"))
            .unwrap();
    let t = ChatTemplate::new(&source, Some("<s>"), Some("</s>")).unwrap();
    let msgs = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
    let err = t.render(&msgs, true, None).unwrap_err();
    assert!(err.to_string().contains("alternate"), "{err}");
}

/// The conversations every template is rendered with in the cross-check.
fn conversations() -> Vec<(Vec<serde_json::Value>, bool, Option<serde_json::Value>)> {
    let weather = json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city, e.g. Zürich"}},
                "required": ["city"]
            }
        }
    }]);
    vec![
        (
            vec![
                json!({"role": "system", "content": "You are a helpful assistant."}),
                json!({"role": "user", "content": "Hello!"}),
            ],
            true,
            None,
        ),
        (
            vec![
                json!({"role": "user", "content": "What is 2+2?"}),
                json!({"role": "assistant", "content": "4"}),
                json!({"role": "user", "content": "And 3+3? 🤔"}),
            ],
            false,
            None,
        ),
        (
            vec![json!({"role": "user", "content": "Weather in Zürich?"})],
            true,
            Some(weather),
        ),
    ]
}

/// Renders where we knowingly differ from Jinja2: (template, conversation,
/// why).
const KNOWN_DIFFERENCES: &[(&str, usize, &str)] = &[(
    "meetkai-functionary-medium-v3.1.jinja",
    2,
    "`\"..\"|safe + x|tojson`: markupsafe HTML-escapes a str added to a Markup; \
     minijinja concatenates plain strings",
)];

/// Every llama.cpp template, three conversations each (plain, multi-turn,
/// with tools): our rendering equals Jinja2's under transformers' settings.
/// Where Jinja2 raises, we may render: minijinja iterates `none` as empty
/// (tool_use templates without tools) and serializes `map()` results.
#[test]
fn every_template_matches_jinja2() {
    let dir = common::fetch("fetch-llama-cpp-sdist").join("templates");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".jinja"))
        .collect();
    names.sort();
    assert!(
        names.len() >= 60,
        "only {} templates in {}",
        names.len(),
        dir.display()
    );
    let (bos, eos) = ("<s>", "</s>");
    let mut jobs = Vec::new();
    let mut ours = Vec::new();
    for name in &names {
        let source = std::fs::read_to_string(dir.join(name)).unwrap();
        let template =
            ChatTemplate::new(&source, Some(bos), Some(eos)).map(|t| t.with_fixed_time(NOW));
        for (messages, add_generation_prompt, tools) in conversations() {
            jobs.push(json!({
                "template": source, "bos": bos, "eos": eos, "messages": messages,
                "add_generation_prompt": add_generation_prompt, "tools": tools,
            }));
            let msgs: Vec<ChatMessage> = messages
                .iter()
                .map(|m| serde_json::from_value(m.clone()).unwrap())
                .collect();
            ours.push(match &template {
                Ok(t) => t
                    .render(&msgs, add_generation_prompt, tools.as_ref())
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            });
        }
    }
    let reference = python::run("hf_chat_reference.py", &json!({"now": NOW, "jobs": jobs}));
    let reference = reference.as_array().unwrap();
    let per = conversations().len();
    let mut mismatches = Vec::new();
    for (i, (want, got)) in reference.iter().zip(&ours).enumerate() {
        let name = &names[i / per];
        if KNOWN_DIFFERENCES
            .iter()
            .any(|(n, c, _)| n == name && *c == i % per)
        {
            continue;
        }
        match (want.get("ok").and_then(|v| v.as_str()), got) {
            (Some(w), Ok(g)) if w == g => {}
            (None, _) => {}
            (w, g) => mismatches.push(format!(
                "{name} conversation {}:\n  jinja2: {}\n  ours:   {g:?}",
                i % per,
                w.map_or_else(|| format!("error {}", want["err"]), |w| format!("{w:?}"))
            )),
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} renders differ from Jinja2:\n{}",
        mismatches.len(),
        reference.len(),
        mismatches.join("\n")
    );
}
