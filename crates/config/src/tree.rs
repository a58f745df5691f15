//! Dotted paths over a JSON tree: the common form every layer is merged in.

use std::collections::BTreeMap;

use serde_json::Value;

/// Every leaf (a non-object value, arrays included) by dotted path, in path
/// order. An empty table has no leaves.
pub(crate) fn leaves(tree: &Value) -> BTreeMap<String, &Value> {
    let mut out = BTreeMap::new();
    collect(tree, &mut String::new(), &mut out);
    out
}

fn collect<'a>(v: &'a Value, path: &mut String, out: &mut BTreeMap<String, &'a Value>) {
    let Value::Object(map) = v else {
        out.insert(path.clone(), v);
        return;
    };
    for (k, child) in map {
        let len = path.len();
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(k);
        collect(child, path, out);
        path.truncate(len);
    }
}

/// The value at a dotted path.
pub(crate) fn get<'a>(tree: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(tree, |v, k| v.get(k))
}

/// Sets the value at `segments`, creating tables on the way.
pub(crate) fn set(tree: &mut Value, segments: &[&str], value: Value) {
    let Some((last, parents)) = segments.split_last() else {
        *tree = value;
        return;
    };
    let mut node = tree;
    for k in parents {
        if !node.is_object() {
            *node = Value::Object(serde_json::Map::new());
        }
        node = match node {
            Value::Object(map) => map
                .entry((*k).to_string())
                .or_insert_with(|| Value::Object(serde_json::Map::new())),
            _ => return,
        };
    }
    if let Value::Object(map) = node {
        map.insert((*last).to_string(), value);
    }
}

/// The longest prefix of a serde_path_to_error path (`a.b[0].c`) that names
/// a key: array indexes and unknown segments dropped.
pub(crate) fn key_of_error_path(path: &str) -> String {
    let cut = path.find(['[', '?']).unwrap_or(path.len());
    path[..cut].trim_end_matches('.').to_string()
}
