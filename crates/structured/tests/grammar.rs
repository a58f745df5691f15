//! Grammars against the real SmolLM2 vocabulary: masks follow the grammar,
//! the output is complete when the grammar says so, and unsupported schema
//! features are named.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, OnceLock};

use ingot_core::GrammarSpec;
use ingot_structured::{Grammar, GrammarCompiler, GrammarError, Limit};
use ingot_tokenizer::Tokenizer;

// Property tests over random schemas, regexes and Lark (issue 37).
#[path = "suite/schema_fuzz.rs"]
mod schema_fuzz;

fn tokenizer() -> Arc<Tokenizer> {
    static T: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| {
        let gguf = ingot_models::gguf::GgufFile::open(&ingot_testkit::smollm2_gguf()).unwrap();
        Arc::new(Tokenizer::from_gguf(&gguf).unwrap())
    })
    .clone()
}

fn compiler() -> &'static GrammarCompiler {
    static C: OnceLock<GrammarCompiler> = OnceLock::new();
    C.get_or_init(|| GrammarCompiler::new(tokenizer()).unwrap())
}

fn allowed(mask: &[u32], t: u32) -> bool {
    mask.get(t as usize / 32)
        .is_some_and(|w| w & (1 << (t % 32)) != 0)
}

/// Follows the grammar greedily by the lowest allowed id that keeps to
/// `text` when one does; returns whether the text was accepted whole.
fn feed(grammar: &mut Grammar, text: &str) -> bool {
    let ids = tokenizer().encode(text, false).unwrap();
    for id in ids {
        let mask = grammar.mask().unwrap();
        if !allowed(&mask, id) {
            return false;
        }
        grammar.accept(id).unwrap();
    }
    true
}

#[test]
fn json_schema_masks_allow_valid_text_and_refuse_invalid() {
    let spec = GrammarSpec::JsonSchema(
        r#"{"type":"object","properties":{"age":{"type":"integer"}},"required":["age"],"additionalProperties":false}"#.into(),
    );
    let mut g = compiler().compile(&spec).unwrap();
    assert!(feed(&mut g, r#"{"age": 42}"#));
    assert!(
        g.is_finished() || {
            let mask = g.mask().unwrap();
            tokenizer().eos_ids().iter().any(|&e| allowed(&mask, e))
        }
    );
    let mut g = compiler().compile(&spec).unwrap();
    assert!(!feed(&mut g, r#"{"name": 1}"#));
}

#[test]
fn regex_and_choice_grammars_end_when_complete() {
    let mut g = compiler()
        .compile(&GrammarSpec::Regex("(yes|no)".into()))
        .unwrap();
    assert!(feed(&mut g, "yes"));
    assert!(g.is_finished());
    let mut g = compiler()
        .compile(&GrammarSpec::Lark(r#"start: "red" | "green \"x\"""#.into()))
        .unwrap();
    assert!(feed(&mut g, "green \"x\""));
    assert!(g.is_finished());
}

#[test]
fn a_regex_forcing_a_character_without_a_token_is_followed() {
    // A 4-byte character the vocabulary spells only in byte tokens:
    // llguidance forces its bytes, some not yet UTF-8 on their own, and
    // asks the vocabulary to tokenize them (a 500 from schemathesis once).
    let mut g = compiler()
        .compile(&GrammarSpec::Regex("\u{333C6}n".into()))
        .unwrap();
    let mask = g.mask().unwrap();
    assert!(mask.iter().any(|w| *w != 0));
    assert!(feed(&mut g, "\u{333C6}n"));
    assert!(g.is_finished());
    // One the vocabulary cannot write at all (SmolLM2 has no token with
    // the byte 0xF2): refused at compile time by name, not a failure
    // mid-answer (a 500 from schemathesis too).
    for spec in [
        GrammarSpec::Regex("\u{910AC}D".into()),
        GrammarSpec::JsonSchema(r#"{"const": "\uda04\udfac"}"#.into()),
        GrammarSpec::Lark("start: \"\u{910AC}\"".into()),
    ] {
        match compiler().compile(&spec) {
            Err(GrammarError::Invalid(m)) => assert!(m.contains("byte 0xF2"), "{m}"),
            other => panic!("{spec:?}: {other:?}"),
        }
    }
}

#[test]
fn clones_are_independent() {
    let g = compiler()
        .compile(&GrammarSpec::Regex("a+b".into()))
        .unwrap();
    let mut one = g.clone();
    assert!(feed(&mut one, "aab"));
    let mut two = g.clone();
    assert!(!two.is_finished());
    assert!(!feed(&mut two, "b"));
}

#[test]
fn unsupported_schema_features_are_named() {
    let e = compiler()
        .compile(&GrammarSpec::JsonSchema(
            r#"{"type":"object","if":{"type":"object"},"then":{}}"#.into(),
        ))
        .unwrap_err();
    match e {
        GrammarError::Unsupported(m) => assert!(m.contains("if"), "{m}"),
        other => panic!("{other:?}"),
    }
    let e = compiler()
        .compile(&GrammarSpec::JsonSchema(
            r#"{"type":"string","format":"not-a-format"}"#.into(),
        ))
        .unwrap_err();
    assert!(
        matches!(&e, GrammarError::Unsupported(m) if m.contains("not-a-format")),
        "{e:?}"
    );
    let e = compiler()
        .compile(&GrammarSpec::Regex("(".into()))
        .unwrap_err();
    assert!(matches!(e, GrammarError::Invalid(_)), "{e:?}");
}

#[test]
fn unique_items_compiles_and_the_grammar_keeps_the_array_shape() {
    let schema = r#"{"type":"object","properties":{"tags":{"type":"array","items":{"type":"string"},"uniqueItems":true}},"required":["tags"],"additionalProperties":false}"#;
    let mut g = compiler()
        .compile(&GrammarSpec::JsonSchema(schema.into()))
        .unwrap();
    assert!(feed(&mut g, r#"{"tags": ["a", "#));
    assert!(!feed(&mut g.clone(), "3"), "items stay strings");
}

#[test]
fn lark_grammars_embed_json_schemas_between_literals() {
    // The shape of a Hermes tool-call grammar (crates/server/src/tools).
    let schema = ingot_structured::with_layout(serde_json::json!({
        "type": "object",
        "properties": {"name": {"const": "f"}, "arguments": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
        "required": ["name", "arguments"],
        "additionalProperties": false
    }));
    let src = format!(
        "start: block (\"\\n\" block)*\nblock: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: fn0\nfn0: %json {schema}\n"
    );
    let mut g = compiler().compile(&GrammarSpec::Lark(src)).unwrap();
    assert!(feed(
        &mut g,
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 3}}\n</tool_call>"
    ));
    assert!(!g.is_finished(), "more calls may follow");
    let mask = g.mask().unwrap();
    assert!(tokenizer().eos_ids().iter().any(|&e| allowed(&mask, e)));
}

#[test]
fn closing_masks_head_for_the_end_of_the_json() {
    let spec = GrammarSpec::JsonSchema(
        r#"{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"array","items":{"type":"integer"}}},"required":["a","b"]}"#.into(),
    );
    let only = |mask: &[u32]| -> Vec<String> {
        (0..mask.len() as u32 * 32)
            .filter(|&t| allowed(mask, t))
            .map(|t| tokenizer().decode(&[t], false).unwrap())
            .collect()
    };
    let mut g = compiler().compile(&spec).unwrap();
    // Inside a string: only tokens that end it.
    assert!(feed(&mut g, r#"{"a": "hello"#));
    let inside = only(&g.closing_mask().unwrap());
    assert!(
        !inside.is_empty() && inside.iter().all(|t| t.starts_with('"')),
        "{inside:?}"
    );
    // Inside an array: the closing bracket, not another item.
    assert!(feed(&mut g, r#"", "b": [1, 2"#));
    let array = only(&g.closing_mask().unwrap());
    assert!(
        !array.is_empty() && array.iter().all(|t| t.starts_with(']')),
        "{array:?}"
    );
    assert!(feed(&mut g, "]}"));
    let end = g.closing_mask().unwrap();
    assert!(tokenizer().eos_ids().iter().any(|&e| allowed(&end, e)));
}

#[test]
fn what_finishing_owes_decides_when_closing_starts() {
    // Three required keys still owed after the first string opens.
    let spec = GrammarSpec::JsonSchema(
        r#"{"type":"object","properties":{"name":{"type":"string"},"width":{"type":"number"},"height":{"type":"number"},"depth":{"type":"number"}},"required":["name","width","height","depth"]}"#.into(),
    );
    let mut g = compiler().compile(&spec).unwrap();
    assert!(feed(&mut g, r#"{"name": "a long"#));
    let need = g.tokens_to_close(96).unwrap();
    // The quote, three keys with a value each, the brace and the end.
    assert!((6..40).contains(&need), "{need}");
    assert_eq!(g.tokens_to_close(need - 1), None, "not within fewer tokens");
    // Far from the limit the plain mask allows more words of the string;
    // with fewer than twice what finishing owes left, closing starts.
    let plain = g.clone().limit_mask(Limit::Near(4 * need + 8)).unwrap();
    assert_eq!(plain, g.mask().unwrap());
    let closing = g.limit_mask(Limit::Near(2 * need)).unwrap();
    assert_eq!(closing, g.closing_mask().unwrap());
    assert_ne!(closing, plain);
    // Once begun, closing stays on whatever the limit says.
    assert_eq!(g.limit_mask(Limit::Far).unwrap(), closing);
    // Following the longest closing tokens finishes within the estimate.
    let mut steps = 0;
    while !g.is_finished() && steps <= need {
        let mask = g.limit_mask(Limit::Closing).unwrap();
        let eos = tokenizer()
            .eos_ids()
            .iter()
            .copied()
            .find(|&e| allowed(&mask, e));
        if eos.is_some() {
            steps += 1;
            break;
        }
        let t = (0..mask.len() as u32 * 32)
            .filter(|&t| allowed(&mask, t))
            .max_by_key(|&t| tokenizer().decode(&[t], false).unwrap().len())
            .unwrap();
        g.accept(t).unwrap();
        steps += 1;
    }
    assert!(steps <= need, "{steps} > {need}");
}

#[test]
fn closing_inside_an_unfinished_string_never_narrows_to_bare_commas() {
    // The quote is not allowed until the pattern is met: the closing mask
    // leaves the string's text to the model rather than keeping only `,`
    // (which inside a string is text, and made small models loop).
    let spec = GrammarSpec::JsonSchema(
        r#"{"type":"object","properties":{"p":{"type":"string","pattern":"^[a-z]{5}$"}},"required":["p"]}"#.into(),
    );
    let mut g = compiler().compile(&spec).unwrap();
    assert!(feed(&mut g, r#"{"p": "ab"#));
    let closing = g.closing_mask().unwrap();
    assert_eq!(closing, g.mask().unwrap());
    let c = tokenizer().encode("c", false).unwrap();
    assert!(allowed(&closing, c[0]));
}

#[test]
fn closing_at_a_free_key_never_opens_a_key_with_a_comma() {
    // `b` is still required, so `}` is not allowed yet; the separators
    // allowed there (` ",`) would open a key `","` and loop. The mask is
    // left to the model instead.
    let spec = GrammarSpec::JsonSchema(
        r#"{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},"required":["b"]}"#.into(),
    );
    let mut g = compiler().compile(&spec).unwrap();
    assert!(feed(&mut g, r#"{"a": "x","#));
    let closing = g.closing_mask().unwrap();
    assert_eq!(closing, g.mask().unwrap());
}

/// Whether a refusal's message names something the schema really uses:
/// every quoted word in it occurs in the schema's text, or it names
/// `oneOf` or an unknown format the schema has, or quotes one of the
/// schema's lines (a regex the engine cannot handle).
fn names_a_feature_of(message: &str, schema: &str) -> bool {
    let quoted: Vec<&str> = message.split('"').skip(1).step_by(2).collect();
    if !quoted.is_empty() {
        return quoted.iter().all(|q| schema.contains(q));
    }
    if let Some(format) = message.split("Unknown format: ").nth(1) {
        return format
            .split_whitespace()
            .next()
            .is_some_and(|f| schema.contains(f));
    }
    if message.contains("oneOf") {
        return schema.contains("oneOf");
    }
    message
        .lines()
        .any(|l| l.trim().len() > 5 && schema.contains(l.trim()))
}

/// Every schema of the real-world collection (tests/fixtures/json-schemas,
/// SOURCE.md there) compiles, or is refused as unsupported naming what it
/// uses; none is called invalid. The e2e test generates answers for a
/// sample of them with the real model and validates those.
#[test]
fn every_real_world_schema_compiles_or_is_refused_by_name() {
    let root =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/json-schemas");
    let mut files: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).into_iter().flatten())
        .map(|f| f.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 300, "the fixture collection is incomplete");
    let (mut compiled, mut refused, mut failures) = (0, 0, Vec::new());
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
        let spec = GrammarSpec::JsonSchema(schema.to_string());
        match compiler().compile(&spec) {
            Ok(_) => compiled += 1,
            Err(GrammarError::Unsupported(m)) if names_a_feature_of(&m, &schema.to_string()) => {
                refused += 1
            }
            Err(e) => failures.push(format!("{}: {e}", path.display())),
        }
    }
    println!(
        "{compiled} compiled, {refused} refused by name, of {}",
        files.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A grammar engine update that refuses more shows here first.
    assert!(
        compiled * 100 >= files.len() * 88,
        "{compiled} compiled, {refused} refused"
    );
}

#[test]
fn schemas_no_document_can_match_are_refused_when_compiled() {
    // Found before compiling: the cycle is named.
    for (schema, cycle) in [
        (r##"{"$ref":"#"}"##, "(# → #)"),
        (
            r##"{"properties":{"x":{"$ref":"#/$defs/a"}},"$defs":{"a":{"$ref":"#/$defs/a"}}}"##,
            "(#/$defs/a → #/$defs/a)",
        ),
    ] {
        match compiler().compile(&GrammarSpec::JsonSchema(schema.into())) {
            Err(GrammarError::Invalid(m)) => assert!(m.contains(cycle), "{m}"),
            other => panic!("{schema}: {other:?}"),
        }
    }
    // A recursion with no way out: the engine followed the first one until
    // it ran out of items partway through an answer ("Too many items ...
    // ff_tokens"), an engine error mid-request.
    for (schema, part) in [
        (
            r##"{"anyOf":[{"$ref":"#"}]}"##,
            "# can match no finite document",
        ),
        (
            r##"{"type":"object","properties":{"next":{"$ref":"#"}},"required":["next"]}"##,
            "# can match no finite document",
        ),
        (
            r##"{"type":"object","properties":{"a":{"$ref":"#/$defs/x"}},"$defs":{"x":{"type":"array","minItems":1,"items":{"$ref":"#/$defs/x"}}}}"##,
            "#/$defs/x can match no finite document",
        ),
    ] {
        match compiler().compile(&GrammarSpec::JsonSchema(schema.into())) {
            Err(GrammarError::Invalid(m)) => assert!(m.starts_with(part), "{m}"),
            other => panic!("{schema}: {other:?}"),
        }
    }
    // Recursion that nests compiles.
    let tree = r##"{"type":"object","properties":{"child":{"$ref":"#"}}}"##;
    let mut g = compiler()
        .compile(&GrammarSpec::JsonSchema(tree.into()))
        .unwrap();
    assert!(feed(&mut g, r#"{"child": {"child": {}}}"#));
}
