//! Walks the request properties of every endpoint ingot serves in OpenAI's
//! published API description (`../shared/specs/openai/openapi.json`, or
//! `INGOT_OPENAI_SPEC`) and fails on any property the field policy
//! (`ingot_protocol::fields`, the lists the parsers refuse by) neither
//! handles nor refuses. Nested objects are walked where the policy lists
//! their fields (`stream_options`, `response_format`). The description
//! lives outside this repository: without it the test says so and passes,
//! under CI too (../shared is not in CI by design).

use std::path::PathBuf;

use ingot_protocol::fields::{policy, Field, Policy};
use serde_json::Value;

/// The endpoints ingot serves, by their path in the description.
const ENDPOINTS: [&str; 4] = [
    "/chat/completions",
    "/completions",
    "/embeddings",
    "/responses",
];

fn spec_path() -> PathBuf {
    match std::env::var_os("INGOT_OPENAI_SPEC") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/specs/openai/openapi.json"),
    }
}

/// `schema` with `$ref`s followed.
fn resolve<'a>(spec: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r.rsplit('/').next().unwrap_or_default();
            resolve(spec, &spec["components"]["schemas"][name])
        }
        None => schema,
    }
}

/// The properties a schema may have: its own and those of every
/// `allOf`, `anyOf` and `oneOf` branch, by name.
fn properties<'a>(spec: &'a Value, schema: &'a Value, out: &mut Vec<(String, &'a Value)>) {
    let schema = resolve(spec, schema);
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, value) in props {
            if !out.iter().any(|(n, _)| n == name) {
                out.push((name.clone(), value));
            }
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        for branch in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            properties(spec, branch, out);
        }
    }
}

/// Every property under `schema`, named by its path from `prefix`, walking
/// into the objects whose fields `fields` lists.
fn walk(spec: &Value, schema: &Value, prefix: &str, fields: &[Field], out: &mut Vec<String>) {
    let mut props = Vec::new();
    properties(spec, schema, &mut props);
    for (name, value) in props {
        let path = format!("{prefix}{name}");
        let nested = format!("{path}.");
        if fields.iter().any(|f| f.name.starts_with(&nested)) {
            walk(spec, value, &nested, fields, out);
        }
        out.push(path);
    }
}

#[test]
fn every_request_property_of_the_served_endpoints_is_handled_or_refused() {
    let path = spec_path();
    let Ok(text) = std::fs::read_to_string(&path) else {
        println!(
            "skipped: OpenAI's API description is not at {} (../shared is not in CI by design)",
            path.display()
        );
        return;
    };
    let spec: Value = serde_json::from_str(&text).expect("the description is JSON");
    let mut missing = Vec::new();
    for endpoint in ENDPOINTS {
        let Some(fields) = policy(endpoint) else {
            println!("skipped {endpoint}: ingot has no field list for it (not served yet)");
            continue;
        };
        let body = &spec["paths"][endpoint]["post"]["requestBody"]["content"]["application/json"]
            ["schema"];
        assert!(
            !body.is_null(),
            "{endpoint} has no JSON request body in the description"
        );
        let mut names = Vec::new();
        walk(&spec, body, "", fields, &mut names);
        assert!(names.len() > 3, "{endpoint}: only {names:?}");
        let (mut honoured, mut unused, mut refused) = (0, 0, 0);
        for name in &names {
            match fields.iter().find(|f| f.name == name).map(|f| f.policy) {
                Some(Policy::Honoured) => honoured += 1,
                Some(Policy::Unused(_)) => unused += 1,
                Some(Policy::Refused { .. }) => refused += 1,
                None => missing.push(format!("{endpoint}: {name}")),
            }
        }
        println!(
            "{endpoint}: {} properties: {honoured} honoured, {unused} accepted unused, {refused} refused",
            names.len()
        );
    }
    assert!(
        missing.is_empty(),
        "properties neither handled nor refused (add them to crates/protocol/src/fields.rs):\n{}",
        missing.join("\n")
    );
}
