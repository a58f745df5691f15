//! Structured-output fields, on both endpoints: OpenAI's `response_format`
//! (`json_object`, `json_schema`) and vLLM's extensions (`guided_json`,
//! `guided_regex`, `guided_choice`, `guided_grammar`, and the same under
//! `structured_outputs`), each lowered to one [`GrammarSpec`]. Whether the
//! grammar engine supports a schema's features is checked when the server
//! compiles it (a 400 naming the feature).

use ingot_core::GrammarSpec;
use serde_json::{Map, Value};

use crate::ProtocolError;

/// vLLM's names under `structured_outputs`, and the `guided_*` field each
/// mirrors.
const FORMS: [(&str, &str); 4] = [
    ("json", "guided_json"),
    ("regex", "guided_regex"),
    ("choice", "guided_choice"),
    ("grammar", "guided_grammar"),
];

/// A request's output grammar and the field it came from (errors about
/// the grammar name that field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputGrammar {
    /// The field, e.g. `response_format.json_schema.schema`.
    pub param: String,
    /// The grammar.
    pub spec: GrammarSpec,
}

/// Longest grammar source accepted (a schema, regex or grammar), in bytes.
pub const MAX_GRAMMAR_BYTES: usize = 1 << 20;

/// The request's output grammar, if it asks for one. At most one form may
/// be given.
pub fn parse_grammar(body: &Value) -> Result<Option<OutputGrammar>, ProtocolError> {
    let mut found: Vec<(String, GrammarSpec)> = Vec::new();
    if let Some(rf) = body.get("response_format").filter(|v| !v.is_null()) {
        if let Some(spec) = response_format(rf)? {
            let param = match spec {
                GrammarSpec::JsonSchema(ref s) if s == ANY_OBJECT => "response_format",
                _ => "response_format.json_schema.schema",
            };
            found.push((param.into(), spec));
        }
    }
    for (short, long) in FORMS {
        if let Some(v) = body.get(long).filter(|v| !v.is_null()) {
            found.push((long.into(), guided(long, short, v)?));
        }
    }
    match body.get("structured_outputs") {
        None | Some(Value::Null) => {}
        Some(Value::Object(obj)) => {
            for (short, _) in FORMS {
                if let Some(v) = obj.get(short).filter(|v| !v.is_null()) {
                    let param = format!("structured_outputs.{short}");
                    found.push((param.clone(), guided(&param, short, v)?));
                }
            }
            if let Some(other) = obj
                .iter()
                .find(|(k, v)| !v.is_null() && !FORMS.iter().any(|(s, _)| s == k))
            {
                return Err(ProtocolError::field(
                    &format!("structured_outputs.{}", other.0),
                    format!(
                        "structured_outputs.{} is not supported; use json, regex, choice or grammar",
                        other.0
                    ),
                ));
            }
        }
        Some(_) => {
            return Err(ProtocolError::field(
                "structured_outputs",
                "structured_outputs must be an object",
            ))
        }
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|f| f.0.as_str()).collect();
        return Err(ProtocolError::field(
            &found[1].0,
            format!(
                "only one output constraint may be given, got {}",
                names.join(" and ")
            ),
        ));
    }
    if let Some((param, spec)) = found.first() {
        if spec.source().len() > MAX_GRAMMAR_BYTES {
            return Err(ProtocolError::bound(
                param,
                &format!("at most {MAX_GRAMMAR_BYTES} bytes"),
                format!("{} bytes", spec.source().len()),
            ));
        }
    }
    Ok(found
        .pop()
        .map(|(param, spec)| OutputGrammar { param, spec }))
}

/// The JSON schema that accepts any JSON object (`json_object` mode).
pub const ANY_OBJECT: &str = r#"{"type":"object"}"#;

fn response_format(rf: &Value) -> Result<Option<GrammarSpec>, ProtocolError> {
    let Value::Object(obj) = rf else {
        return Err(ProtocolError::field(
            "response_format",
            "response_format must be an object",
        ));
    };
    match obj.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonSchema(ANY_OBJECT.into()))),
        Some("json_schema") => {
            let js = obj.get("json_schema").and_then(Value::as_object).ok_or_else(|| {
                ProtocolError::field(
                    "response_format.json_schema",
                    "response_format.json_schema is required when type is json_schema, an object with name and schema",
                )
            })?;
            match js.get("name") {
                Some(Value::String(n)) if valid_name(n) => {}
                Some(_) => {
                    return Err(ProtocolError::field(
                        "response_format.json_schema.name",
                        "response_format.json_schema.name must be a string of 1 to 64 letters, digits, underscores or dashes",
                    ))
                }
                None => {
                    return Err(ProtocolError::field(
                        "response_format.json_schema.name",
                        "response_format.json_schema.name is required",
                    ))
                }
            }
            let strict = match js.get("strict") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(ProtocolError::field(
                        "response_format.json_schema.strict",
                        "response_format.json_schema.strict must be a boolean",
                    ))
                }
            };
            // strict or not, the output follows the schema: a grammar is
            // exact or refused, never approximated. Strict mode also closes
            // every object, as OpenAI's does.
            let param = "response_format.json_schema.schema";
            let mut schema = schema_value(
                param,
                js.get("schema")
                    .cloned()
                    .unwrap_or(Value::Object(Map::new())),
            )?;
            if strict {
                close_objects(&mut schema);
            }
            schema_spec(param, schema).map(Some)
        }
        Some(other) => Err(ProtocolError::field(
            "response_format.type",
            format!("response_format.type must be text, json_object or json_schema, got {other:?}"),
        )),
        None => Err(ProtocolError::field(
            "response_format.type",
            "response_format.type is required",
        )),
    }
}

fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// OpenAI's strict mode: every object schema in `schema` (nested ones,
/// definitions and alternatives included) gets `additionalProperties:
/// false` unless it says otherwise, and all its properties required.
pub fn close_objects(schema: &mut Value) {
    match schema {
        Value::Object(obj) => {
            let is_object = obj.get("type").is_some_and(|t| {
                t == "object"
                    || t.as_array()
                        .is_some_and(|a| a.iter().any(|t| t == "object"))
            }) || obj.contains_key("properties");
            if is_object {
                let names: Vec<Value> = obj
                    .get("properties")
                    .and_then(Value::as_object)
                    .map(|p| p.keys().cloned().map(Value::String).collect())
                    .unwrap_or_default();
                obj.entry("additionalProperties")
                    .or_insert(Value::Bool(false));
                let required = obj
                    .entry("required")
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(required) = required {
                    for name in names {
                        if !required.contains(&name) {
                            required.push(name);
                        }
                    }
                }
            }
            for (key, value) in obj.iter_mut() {
                match key.as_str() {
                    // Maps of names to schemas.
                    "properties" | "$defs" | "definitions" | "patternProperties" => {
                        if let Value::Object(map) = value {
                            map.values_mut().for_each(close_objects);
                        }
                    }
                    // A schema, or a list of them.
                    "items"
                    | "prefixItems"
                    | "anyOf"
                    | "allOf"
                    | "oneOf"
                    | "not"
                    | "additionalProperties"
                    | "additionalItems"
                    | "contains"
                    | "if"
                    | "then"
                    | "else" => close_objects(value),
                    _ => {}
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

/// A schema given as an object (or boolean), or as JSON text.
fn schema_value(param: &str, schema: Value) -> Result<Value, ProtocolError> {
    match schema {
        Value::String(text) => serde_json::from_str(&text).map_err(|e| {
            ProtocolError::field(param, format!("{param} is not a valid JSON schema: {e}"))
        }),
        other => Ok(other),
    }
}

/// A schema given as an object (or boolean), or as JSON text.
fn schema_spec(param: &str, schema: Value) -> Result<GrammarSpec, ProtocolError> {
    let schema = schema_value(param, schema)?;
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(ProtocolError::field(
            param,
            format!("{param} must be a JSON schema (an object)"),
        ));
    }
    Ok(GrammarSpec::JsonSchema(schema.to_string()))
}

fn guided(param: &str, form: &str, v: &Value) -> Result<GrammarSpec, ProtocolError> {
    let text = |what: &str| {
        v.as_str().map(str::to_owned).ok_or_else(|| {
            ProtocolError::field(param, format!("{param} must be a string ({what})"))
        })
    };
    match form {
        "json" => schema_spec(param, v.clone()),
        "regex" => Ok(GrammarSpec::Regex(text("a regular expression")?)),
        "grammar" => {
            let g = text("a Lark grammar")?;
            if g.contains("::=") {
                return Err(ProtocolError::field(
                    param,
                    format!("{param}: GBNF grammars are not supported; send the grammar in Lark syntax (rules as `name: expansion`, starting from `start`)"),
                ));
            }
            Ok(GrammarSpec::Lark(g))
        }
        _ => choice(param, v),
    }
}

/// A list of strings, one of which must be the whole output.
fn choice(param: &str, v: &Value) -> Result<GrammarSpec, ProtocolError> {
    let bad = || {
        ProtocolError::field(
            param,
            format!("{param} must be a non-empty list of strings"),
        )
    };
    let items = v.as_array().filter(|a| !a.is_empty()).ok_or_else(bad)?;
    let mut alternatives = Vec::with_capacity(items.len());
    for item in items {
        let s = item.as_str().ok_or_else(bad)?;
        if s.is_empty() {
            return Err(ProtocolError::field(
                param,
                format!("{param} must not contain an empty string"),
            ));
        }
        // A JSON string literal is a Lark string literal.
        alternatives.push(Value::String(s.to_owned()).to_string());
    }
    Ok(GrammarSpec::Lark(format!(
        "start: {}",
        alternatives.join(" | ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(body: Value) -> Option<GrammarSpec> {
        parse_grammar(&body).unwrap().map(|g| g.spec)
    }

    fn err(body: Value) -> ProtocolError {
        parse_grammar(&body).unwrap_err()
    }

    #[test]
    fn every_form_lowers_to_one_grammar() {
        assert_eq!(spec(json!({})), None);
        assert_eq!(spec(json!({"response_format": {"type": "text"}})), None);
        assert_eq!(
            spec(json!({"response_format": {"type": "json_object"}})),
            Some(GrammarSpec::JsonSchema(ANY_OBJECT.into()))
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let want = Some(GrammarSpec::JsonSchema(schema.to_string()));
        assert_eq!(
            spec(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": false}}})
            ),
            want
        );
        assert_eq!(spec(json!({"guided_json": schema})), want);
        assert_eq!(spec(json!({"guided_json": schema.to_string()})), want);
        assert_eq!(spec(json!({"structured_outputs": {"json": schema}})), want);
        assert_eq!(
            spec(json!({"guided_regex": "[0-9]+"})),
            Some(GrammarSpec::Regex("[0-9]+".into()))
        );
        assert_eq!(
            spec(json!({"structured_outputs": {"choice": ["a", "b \"c\""]}})),
            Some(GrammarSpec::Lark(r#"start: "a" | "b \"c\"""#.into()))
        );
        assert_eq!(
            spec(json!({"guided_grammar": "start: \"x\""})),
            Some(GrammarSpec::Lark("start: \"x\"".into()))
        );
    }

    #[test]
    fn strict_closes_every_object_and_requires_every_property() {
        let schema = json!({
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
                "open": {"type": "object", "additionalProperties": true},
                "ref": {"$ref": "#/$defs/d"}
            },
            "required": ["tags"],
            "$defs": {"d": {"properties": {"x": {"type": "null"}}}}
        });
        let body = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema.to_string(), "strict": true}}});
        let Some(GrammarSpec::JsonSchema(text)) = spec(body) else {
            panic!("no schema")
        };
        let got: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(got["additionalProperties"], false);
        assert_eq!(got["required"], json!(["tags", "open", "ref"]));
        let item = &got["properties"]["tags"]["items"];
        assert_eq!(
            (&item["additionalProperties"], &item["required"]),
            (&json!(false), &json!(["k"]))
        );
        assert_eq!(
            got["properties"]["open"]["additionalProperties"], true,
            "said otherwise"
        );
        assert_eq!(got["$defs"]["d"]["additionalProperties"], false);
        assert_eq!(got["$defs"]["d"]["required"], json!(["x"]));
    }

    #[test]
    fn bad_forms_name_their_field() {
        let param = |e: ProtocolError| e.param.unwrap_or_default();
        assert_eq!(
            param(err(json!({"response_format": {"type": "xml"}}))),
            "response_format.type"
        );
        assert_eq!(
            param(err(json!({"response_format": {"type": "json_schema"}}))),
            "response_format.json_schema"
        );
        assert_eq!(
            param(err(
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}})
            )),
            "response_format.json_schema.name"
        );
        assert_eq!(
            param(err(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": 3}}})
            )),
            "response_format.json_schema.schema"
        );
        assert_eq!(param(err(json!({"guided_choice": []}))), "guided_choice");
        assert_eq!(param(err(json!({"guided_regex": 5}))), "guided_regex");
        assert_eq!(
            param(err(json!({"structured_outputs": {"structural_tag": {}}}))),
            "structured_outputs.structural_tag"
        );
        let gbnf = err(json!({"guided_grammar": "root ::= \"a\""}));
        assert!(gbnf.message.contains("GBNF"), "{}", gbnf.message);
        let two = err(json!({"guided_regex": "a", "response_format": {"type": "json_object"}}));
        assert!(two.message.contains("only one"), "{}", two.message);
    }
}
