//! The JSON schema, and what it says about each leaf's type (environment
//! values are strings; the schema says whether to keep them so).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::config::Config;

/// The JSON schema of [`Config`] (draft 2020-12), generated from the types.
pub fn schema() -> Value {
    schemars::schema_for!(Config).to_value()
}

/// How an environment string becomes a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Kept as a string (paths, names, enums, directives).
    String,
    /// `1/0/true/false/on/off/yes/no`.
    Bool,
    /// A JSON scalar when it parses as one (numbers, and durations or sizes
    /// written as plain numbers), else the string.
    Scalar,
}

/// The kind of every leaf of the struct sections (not `flags`), by dotted path.
pub(crate) fn leaf_kinds() -> BTreeMap<String, Kind> {
    let root = schema();
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut String::new(), &mut out);
    out.retain(|k, _| !k.starts_with("flags"));
    out
}

fn walk(root: &Value, node: &Value, path: &mut String, out: &mut BTreeMap<String, Kind>) {
    let node = resolve(root, node);
    let Some(props) = node.get("properties").and_then(Value::as_object) else {
        out.insert(path.clone(), kind(root, node));
        return;
    };
    for (k, child) in props {
        let len = path.len();
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(k);
        walk(root, child, path, out);
        path.truncate(len);
    }
}

/// Follows a local `$ref` (`#/$defs/Name`).
fn resolve<'a>(root: &'a Value, node: &'a Value) -> &'a Value {
    node.get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/"))
        .and_then(|p| root.pointer(&format!("/{p}")))
        .unwrap_or(node)
}

/// The JSON types a leaf's schema allows, `null` aside.
fn types(root: &Value, node: &Value, out: &mut Vec<String>) {
    let node = resolve(root, node);
    match node.get("type") {
        Some(Value::String(t)) => out.push(t.clone()),
        Some(Value::Array(ts)) => out.extend(ts.iter().filter_map(Value::as_str).map(String::from)),
        _ => {}
    }
    if node.get("enum").is_some() && node.get("type").is_none() {
        out.push("string".into());
    }
    for key in ["anyOf", "oneOf"] {
        for sub in node
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            types(root, sub, out);
        }
    }
    out.retain(|t| t != "null");
}

fn kind(root: &Value, node: &Value) -> Kind {
    let mut ts = Vec::new();
    types(root, node, &mut ts);
    ts.sort();
    ts.dedup();
    match ts.as_slice() {
        [t] if t == "string" => Kind::String,
        [t] if t == "boolean" => Kind::Bool,
        _ => Kind::Scalar,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_kinds_follow_the_types() {
        let k = leaf_kinds();
        assert_eq!(k["model.path"], Kind::String);
        assert_eq!(k["model.served_model_name"], Kind::String);
        assert_eq!(k["model.device"], Kind::String);
        assert_eq!(k["server.host"], Kind::String);
        assert_eq!(k["cuda.l2_prefetch"], Kind::String);
        assert_eq!(k["log.level"], Kind::String);
        assert_eq!(k["cuda.pdl"], Kind::Bool);
        assert_eq!(k["cuda.fused_block"], Kind::Bool);
        assert_eq!(k["cuda.tc_decode_min_rows"], Kind::Scalar);
        assert_eq!(k["cuda.tc_decode_fp8_min_rows"], Kind::Scalar);
        assert_eq!(k["model.threads"], Kind::Scalar);
        assert_eq!(k["server.port"], Kind::Scalar);
        assert_eq!(k["cache.ttl"], Kind::Scalar);
        assert_eq!(k["scheduler.priority_deadlines.critical"], Kind::Scalar);
    }

    #[test]
    fn every_default_leaf_has_a_kind() {
        let defaults = serde_json::to_value(Config::default()).unwrap_or_default();
        let kinds = leaf_kinds();
        for key in crate::tree::leaves(&defaults).keys() {
            if !key.starts_with("flags.") {
                assert!(kinds.contains_key(key), "{key}");
            }
        }
        assert_eq!(
            kinds.len(),
            crate::tree::leaves(&defaults)
                .keys()
                .filter(|k| !k.starts_with("flags."))
                .count()
        );
    }
}
