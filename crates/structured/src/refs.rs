//! Self-reference a JSON schema cannot be followed through: a `$ref`
//! chain (through `$ref` and `allOf` only) that comes back to where it
//! started without passing through `properties`, `items` or any other
//! keyword that nests the value. `{"$ref": "#"}` and a `$defs` entry
//! referring to itself are the plain cases. Such a schema describes no
//! finite document; the grammar engine does not refuse it when compiling
//! but runs out of its item budget on the first mask ("Too many items"),
//! so it is found here first and refused by name.
//!
//! Recursion that nests (`{"properties": {"child": {"$ref": "#"}}}`) is
//! fine and left alone. A cycle through `anyOf`/`oneOf` is left to the
//! engine as well: another branch may end it.

use std::collections::HashMap;

use serde_json::Value;

/// Most schema nodes looked at; a bigger schema is left to the grammar
/// engine's own limits.
const MAX_NODES: usize = 100_000;

/// Why `schema` cannot be followed, naming the cycle by JSON pointers
/// (`#/$defs/a → #/$defs/a`); `None` when it has no such cycle.
pub(crate) fn self_reference(schema: &Value) -> Option<String> {
    let mut nodes = Vec::new();
    collect(schema, String::new(), &mut nodes);
    if nodes.len() > MAX_NODES {
        return None;
    }
    let index: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, (ptr, _))| (ptr.as_str(), i))
        .collect();
    let edges: Vec<Vec<usize>> = nodes
        .iter()
        .map(|(ptr, node)| unit_edges(ptr, node, &index))
        .collect();
    find_cycle(&edges).map(|cycle| {
        let path: Vec<String> = cycle
            .iter()
            .map(|&i| format!("#{}", nodes[i].0))
            .collect();
        format!(
            "the schema refers to itself with nothing in between ({}), so no document can match it; a recursive schema must nest the reference inside properties or items",
            path.join(" → ")
        )
    })
}

/// Every object in `value` with its JSON pointer, `value` first.
fn collect<'a>(value: &'a Value, ptr: String, out: &mut Vec<(String, &'a Value)>) {
    if out.len() > MAX_NODES {
        return;
    }
    match value {
        Value::Object(map) => {
            out.push((ptr.clone(), value));
            for (k, v) in map {
                let key = k.replace('~', "~0").replace('/', "~1");
                collect(v, format!("{ptr}/{key}"), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                collect(v, format!("{ptr}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// The nodes a value matching `node` must also match as a whole: its
/// local `$ref` target and its `allOf` members.
fn unit_edges(ptr: &str, node: &Value, index: &HashMap<&str, usize>) -> Vec<usize> {
    let mut out = Vec::new();
    if let Some(target) = node
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
    {
        // A fragment may percent-encode the pointer; such a reference is
        // not followed here (the grammar engine still judges it).
        if let Some(&i) = index.get(target) {
            out.push(i);
        }
    }
    if let Some(all) = node.get("allOf").and_then(Value::as_array) {
        for i in 0..all.len() {
            if let Some(&j) = index.get(format!("{ptr}/allOf/{i}").as_str()) {
                out.push(j);
            }
        }
    }
    out
}

/// A cycle in the graph, as the nodes along it with the first repeated at
/// the end. Iterative three-colour depth-first search: a chain of
/// thousands of references cannot overflow the stack.
fn find_cycle(edges: &[Vec<usize>]) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Colour {
        New,
        OnPath,
        Done,
    }
    let mut colour = vec![Colour::New; edges.len()];
    for start in 0..edges.len() {
        if colour[start] != Colour::New {
            continue;
        }
        // (node, next edge to follow)
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        colour[start] = Colour::OnPath;
        while let Some(&(node, next)) = path.last() {
            let Some(&to) = edges[node].get(next) else {
                colour[node] = Colour::Done;
                path.pop();
                continue;
            };
            if let Some(top) = path.last_mut() {
                top.1 += 1;
            }
            match colour[to] {
                Colour::New => {
                    colour[to] = Colour::OnPath;
                    path.push((to, 0));
                }
                Colour::OnPath => {
                    let from = path.iter().position(|&(n, _)| n == to).unwrap_or(0);
                    let mut cycle: Vec<usize> = path[from..].iter().map(|&(n, _)| n).collect();
                    cycle.push(to);
                    return Some(cycle);
                }
                Colour::Done => {}
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_reference_to_itself_is_found_by_name() {
        let m = self_reference(&json!({"$ref": "#"})).unwrap();
        assert!(m.contains("(# → #)"), "{m}");
        let defs = json!({
            "type": "object",
            "properties": {"x": {"$ref": "#/$defs/a"}},
            "$defs": {"a": {"$ref": "#/$defs/a"}}
        });
        let m = self_reference(&defs).unwrap();
        assert!(m.contains("#/$defs/a → #/$defs/a"), "{m}");
        let through_all_of = json!({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]},
            "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"});
        assert!(self_reference(&through_all_of).is_some());
    }

    #[test]
    fn nested_recursion_and_plain_schemas_pass() {
        for ok in [
            json!({"type": "object", "properties": {"child": {"$ref": "#"}}}),
            json!({"type": "array", "items": {"$ref": "#"}}),
            json!({"anyOf": [{"type": "null"}, {"$ref": "#"}]}),
            json!({"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a"}),
            json!({"$ref": "#/missing"}),
            json!(true),
        ] {
            assert_eq!(self_reference(&ok), None, "{ok}");
        }
    }

    #[test]
    fn a_long_chain_does_not_overflow() {
        let mut defs = serde_json::Map::new();
        for i in 0..20_000 {
            defs.insert(
                format!("d{i}"),
                json!({"$ref": format!("#/$defs/d{}", i + 1)}),
            );
        }
        defs.insert("d20000".into(), json!({"$ref": "#/$defs/d0"}));
        let schema = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        assert!(self_reference(&schema).is_some());
    }
}
