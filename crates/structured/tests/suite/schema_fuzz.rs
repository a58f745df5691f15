//! Fuzzing JSON schema (and regex, Lark) → grammar as property tests
//! (issue 37): random schemas, recursive ones through `$ref` and `$defs`
//! included, and arbitrary JSON values compile or are refused with a
//! client error (`Invalid`, `Unsupported`, `TooComplex`: the server's
//! 400), never a panic and never an error the server reports as its own
//! fault (`State`, `Vocabulary`: a 500).
//!
//! `INGOT_FUZZ_CASES` sets the number of cases per property (CI runs the
//! small default; docs/benchmarks.md records a long run).

use ingot_core::GrammarSpec;
use ingot_structured::GrammarError;
use ingot_testkit::fuzz_runner;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::compiler;

/// Compiles `spec`: success, or a refusal that is the client's.
fn compiles_or_is_refused(spec: GrammarSpec) -> Result<(), TestCaseError> {
    match compiler().compile(&spec) {
        Ok(_) => {}
        Err(
            GrammarError::Invalid(m) | GrammarError::Unsupported(m) | GrammarError::TooComplex(m),
        ) => {
            prop_assert!(!m.is_empty(), "an empty message for {spec:?}");
        }
        Err(e) => prop_assert!(false, "{spec:?}: a server-side error: {e}"),
    }
    Ok(())
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        prop_oneof![Just(-1.0), Just(0.5), Just(1e300), Just(-1e-300)].prop_map(|x: f64| json!(x)),
        "[a-z$#/]{0,6}".prop_map(Value::String),
    ]
}

/// Any JSON value, as a schema (most are not valid schemas).
fn any_json() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z$]{0,5}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn reference() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just("#"),
        Just("#/$defs/a"),
        Just("#/$defs/b"),
        Just("#/definitions/a"),
        Just("#/properties/x"),
        Just("#/$defs/missing"),
        Just("#/items"),
        Just("other.json#/a"),
        Just("#/$defs/a/properties/x"),
    ]
    .prop_map(|r| json!({ "$ref": r }))
}

fn leaf() -> impl Strategy<Value = Value> {
    let ty = prop_oneof![
        Just("string"),
        Just("integer"),
        Just("number"),
        Just("boolean"),
        Just("null"),
        Just("object"),
        Just("array"),
        Just("tuple"),
    ];
    prop_oneof![
        ty.clone().prop_map(|t| json!({ "type": t })),
        proptest::collection::vec(ty, 0..3).prop_map(|t| json!({ "type": t })),
        reference(),
        Just(json!(true)),
        Just(json!(false)),
        Just(json!({})),
        proptest::collection::vec(scalar(), 0..5).prop_map(|e| json!({ "enum": e })),
        scalar().prop_map(|c| json!({ "const": c })),
        ("[a-z.*+?()\\[\\]{}|\\\\^$0-9]{0,8}", any::<bool>()).prop_map(|(p, bound)| {
            if bound {
                json!({"type": "string", "pattern": p, "maxLength": 4})
            } else {
                json!({"type": "string", "pattern": p})
            }
        }),
        prop_oneof![
            Just("date-time"),
            Just("email"),
            Just("uuid"),
            Just("nonsense")
        ]
        .prop_map(|f| json!({"type": "string", "format": f})),
        (
            prop_oneof![
                Just(json!(0)),
                Just(json!(-5)),
                Just(json!(1e18)),
                Just(json!(3.5))
            ],
            prop_oneof![Just(json!(10)), Just(json!(-10)), Just(json!(u64::MAX))],
        )
            .prop_map(|(lo, hi)| json!({"type": "integer", "minimum": lo, "maximum": hi})),
        (
            0..4u64,
            prop_oneof![Just(2u64), Just(1 << 20), Just(u64::MAX)]
        )
            .prop_map(|(lo, hi)| json!({"type": "string", "minLength": lo, "maxLength": hi})),
    ]
}

/// Schemas nested through every applicator, with `$defs` to refer to.
fn schema() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(6, 48, 4, |inner| {
        let props = proptest::collection::btree_map("[a-z]{1,3}", inner.clone(), 0..4);
        prop_oneof![
            (props.clone(), any::<bool>(), any::<bool>()).prop_map(|(p, req, extra)| {
                let required: Vec<&String> = if req { p.keys().collect() } else { vec![] };
                json!({"type": "object", "properties": p, "required": required,
                       "additionalProperties": extra})
            }),
            (
                inner.clone(),
                0..3u64,
                prop_oneof![Just(None), Just(Some(5u64)), Just(Some(u64::MAX))]
            )
                .prop_map(|(items, lo, hi)| {
                    let mut s = json!({"type": "array", "items": items, "minItems": lo});
                    if let Some(hi) = hi {
                        s["maxItems"] = json!(hi);
                    }
                    s
                }),
            proptest::collection::vec(inner.clone(), 0..3)
                .prop_map(|p| json!({"type": "array", "prefixItems": p})),
            (
                prop_oneof![Just("anyOf"), Just("oneOf"), Just("allOf")],
                proptest::collection::vec(inner.clone(), 0..4)
            )
                .prop_map(|(k, v)| json!({ k: v })),
            inner.clone().prop_map(|s| json!({ "not": s })),
            (
                inner.clone(),
                inner.clone(),
                inner.clone(),
                prop_oneof![Just("$defs"), Just("definitions")]
            )
                .prop_map(|(root, a, b, key)| {
                    let mut root = match root {
                        Value::Object(m) => m,
                        other => {
                            let mut m = Map::new();
                            m.insert("allOf".into(), json!([other]));
                            m
                        }
                    };
                    root.insert(key.into(), json!({"a": a, "b": b}));
                    Value::Object(root)
                }),
        ]
    })
}

#[test]
fn random_schemas_compile_or_are_refused_as_client_errors() {
    fuzz_runner(48)
        .run(&schema(), |s| {
            compiles_or_is_refused(GrammarSpec::JsonSchema(s.to_string()))
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn arbitrary_json_as_a_schema_is_refused_or_compiles() {
    fuzz_runner(32)
        .run(&any_json(), |v| {
            compiles_or_is_refused(GrammarSpec::JsonSchema(v.to_string()))
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn arbitrary_text_as_schema_regex_or_lark_never_panics() {
    let spec = (
        0..3u8,
        prop_oneof![
            ".{0,24}",
            "[a-z()\\[\\]{}|*+?:;\"%/\\\\ \n-]{0,32}",
            Just("start: x\nx: \"a\" x | \"b\"".to_string()),
            Just("start: %json { \"$ref\": \"#\" }".to_string()),
        ],
    )
        .prop_map(|(kind, text)| match kind {
            0 => GrammarSpec::JsonSchema(text),
            1 => GrammarSpec::Regex(text),
            _ => GrammarSpec::Lark(text),
        });
    fuzz_runner(48)
        .run(&spec, compiles_or_is_refused)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Nesting as deep as a request body can hold (serde_json stops at 128).
#[test]
fn deeply_nested_schemas_are_bounded() {
    for depth in [16, 64, 120] {
        let mut s = json!({"type": "integer"});
        for i in 0..depth {
            s = if i % 2 == 0 {
                json!({"type": "array", "items": s})
            } else {
                json!({"anyOf": [s, {"$ref": "#"}]})
            };
        }
        fuzz_runner(1)
            .run(&Just(s), |s| {
                compiles_or_is_refused(GrammarSpec::JsonSchema(s.to_string()))
            })
            .unwrap_or_else(|e| panic!("depth {depth}: {e}"));
    }
}
