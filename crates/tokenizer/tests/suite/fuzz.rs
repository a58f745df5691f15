//! Fuzzing as property tests (issue 37): hostile conversations through the
//! chat templates llama.cpp ships (and SmolLM2's own), arbitrary text and
//! token ids through the SmolLM2 tokenizer. Rendering and tokenizing never
//! panic; a template that refuses a conversation says so in an error.
//! Byte-level BPE promises that any text encodes and decodes back to itself.
//!
//! `INGOT_FUZZ_CASES` sets the number of cases per property (CI runs the
//! small default; docs/benchmarks.md records a long run).

use std::sync::{Arc, OnceLock};

use ingot_models::gguf::GgufFile;
use ingot_testkit::fuzz_runner;
use ingot_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

use crate::common;

fn smollm2() -> Arc<Tokenizer> {
    static T: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| {
        let file = GgufFile::open(&common::fetch("fetch-test-model")).unwrap();
        Arc::new(Tokenizer::from_gguf(&file).unwrap())
    })
    .clone()
}

/// SmolLM2's template and every template in llama.cpp's sdist that
/// compiles here, with its name.
fn templates() -> &'static [(String, ChatTemplate)] {
    static T: OnceLock<Vec<(String, ChatTemplate)>> = OnceLock::new();
    T.get_or_init(|| {
        let mut all = vec![(
            "SmolLM2".to_string(),
            ChatTemplate::for_tokenizer(&smollm2()).unwrap().unwrap(),
        )];
        let dir = common::fetch("fetch-llama-cpp-sdist").join("templates");
        let mut paths: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
            .collect();
        paths.sort();
        for path in paths {
            let source = std::fs::read_to_string(&path).unwrap();
            if let Ok(t) = ChatTemplate::new(&source, Some("<s>"), Some("</s>")) {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                all.push((name, t.with_fixed_time(1_721_952_000)));
            }
        }
        all
    })
}

/// Text a client could send: template syntax, special tokens, control
/// characters, any Unicode.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,24}",
        any::<String>(),
        "(\\{\\{|\\}\\}|\\{%|%\\}|<\\|im_start\\|>|<\\|im_end\\|>|</s>|<think>|\\[INST\\]|\u{0}|\n|\u{202e}|x){0,8}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|x| json!(x)),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("name".to_string()),
                    Just("arguments".to_string()),
                    Just("function".to_string()),
                    Just("type".to_string()),
                    "[a-z]{0,4}"
                ],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Tool calls as sent (well-formed or not).
fn tool_calls() -> impl Strategy<Value = Value> {
    let call = (
        text(),
        prop_oneof![text().prop_map(Value::String), json_value()],
    )
        .prop_map(|(name, arguments)| {
            json!({"id": "call_1", "type": "function",
                                   "function": {"name": name, "arguments": arguments}})
        });
    prop_oneof![
        proptest::collection::vec(call, 0..3).prop_map(Value::Array),
        json_value(),
    ]
}

fn message() -> impl Strategy<Value = ChatMessage> {
    let role = prop_oneof![
        4 => prop_oneof![
            Just("system"),
            Just("user"),
            Just("assistant"),
            Just("tool"),
            Just("developer")
        ]
        .prop_map(str::to_string),
        1 => text(),
    ];
    (
        role,
        text(),
        proptest::option::of(text()),
        proptest::option::weighted(0.3, tool_calls()),
        proptest::option::of(text()),
        proptest::option::weighted(0.2, (text(), json_value())),
    )
        .prop_map(|(role, content, name, tool_calls, tool_call_id, extra)| {
            let mut m = ChatMessage::new(role, content);
            m.name = name;
            m.tool_calls = tool_calls;
            m.tool_call_id = tool_call_id;
            if let Some((reasoning, other)) = extra {
                m.extra
                    .insert("reasoning_content".into(), Value::String(reasoning));
                m.extra.insert("extra".into(), other);
            }
            m
        })
}

#[test]
fn hostile_conversations_render_or_are_refused() {
    let templates = templates();
    assert!(templates.len() > 30, "only {} templates", templates.len());
    let strategy = (
        0..templates.len(),
        proptest::collection::vec(message(), 0..5),
        any::<bool>(),
        proptest::option::weighted(0.3, json_value()),
        any::<bool>(),
    );
    fuzz_runner(64)
        .run(&strategy, |(i, messages, generation, tools, thinking)| {
            let (name, template) = &templates[i];
            let mut kwargs = Map::new();
            kwargs.insert("enable_thinking".into(), Value::Bool(thinking));
            match template.render_with_kwargs(&messages, generation, tools.as_ref(), &kwargs) {
                Ok(_) => {}
                Err(e) => prop_assert!(!e.to_string().is_empty(), "{name}: an empty error"),
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The bytes SmolLM2's vocabulary has no token for: GPT-2's byte-level
/// alphabet maps every byte to a character, but this vocabulary lacks some
/// of them (C0, C1 and F5–FF, which never occur in UTF-8; F1 and F2, the
/// lead bytes of planes 4–11; six control characters), and BPE without an
/// unknown token drops a byte it cannot spell, as Hugging Face's does.
fn unspellable_bytes(tok: &Tokenizer) -> Vec<u8> {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut next = 256;
    (0..=255u8)
        .filter(|&b| {
            let c = if printable(u32::from(b)) {
                u32::from(b)
            } else {
                next += 1;
                next - 1
            };
            let c = char::from_u32(c).map(String::from).unwrap_or_default();
            tok.token_to_id(&c).is_none()
        })
        .collect()
}

#[test]
fn any_text_round_trips_through_smollm2() {
    let tok = smollm2();
    let unspellable = unspellable_bytes(&tok);
    // Control characters and text beyond plane 3 only: everything else
    // must come back as it went in.
    assert!(
        unspellable
            .iter()
            .all(|&b| matches!(b, 0..=0x1f | 0xc0 | 0xc1 | 0xf1..=0xff)),
        "{unspellable:x?}"
    );
    let strategy = prop_oneof![
        text(),
        proptest::collection::vec(any::<u8>(), 0..64)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ];
    fuzz_runner(256)
        .run(&strategy, |s| {
            let ids = tok
                .encode(&s, false)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let back = tok
                .decode(&ids, false)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            if !s.bytes().any(|b| unspellable.contains(&b)) {
                prop_assert_eq!(back, s);
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn arbitrary_ids_decode_or_are_refused() {
    let tok = smollm2();
    let vocab = tok.vocab_size() as u32;
    let id = prop_oneof![8 => 0..vocab, 1 => any::<u32>()];
    let strategy = (proptest::collection::vec(id, 0..32), any::<bool>());
    fuzz_runner(256)
        .run(&strategy, |(ids, skip)| {
            if ids.iter().all(|&id| id < vocab) {
                // In-vocabulary ids always decode, and streaming them gives
                // the same text.
                common::check_streaming(&tok, &ids, skip).map_err(TestCaseError::fail)?;
            } else if let Err(e) = tok.decode(&ids, skip) {
                prop_assert!(!e.to_string().is_empty());
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Found by `hostile_conversations_render_or_are_refused`: templates that
/// reverse the messages (`messages[::-1]`; Reka Edge's before any other
/// check) made minijinja 2.24 index an empty list and panic for an empty
/// conversation. Now an error.
#[test]
fn an_empty_conversation_through_a_reversing_template_is_an_error() {
    let reversing: Vec<_> = templates()
        .iter()
        .filter(|(_, t)| t.source().contains("[::-1]"))
        .collect();
    assert!(!reversing.is_empty());
    for (name, template) in reversing {
        match template.render(&[], true, None) {
            Err(e) if name == "Reka-Edge.jinja" => {
                assert!(e.to_string().contains("template engine failed"), "{e}")
            }
            Err(e) => assert!(!e.to_string().is_empty(), "{name}"),
            Ok(_) => {}
        }
    }
}
