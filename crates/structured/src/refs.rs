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
//! fine and left alone, unless it has no way out: an object whose required
//! property refers back to it (an array whose `minItems` does) matches no
//! finite document either, and the engine runs out of items partway
//! through the answer, which would be an engine error mid-request.
//! [`no_way_out`] finds such a schema (a least fixpoint of "some finite
//! document matches"). A cycle through `anyOf`/`oneOf` with another branch
//! is fine.

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
    let index = by_pointer(&nodes);
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

/// Each node's position in `nodes`, by its JSON pointer.
fn by_pointer<'a>(nodes: &'a [(String, &Value)]) -> HashMap<&'a str, usize> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, (ptr, _))| (ptr.as_str(), i))
        .collect()
}

/// Most schema nodes [`no_way_out`] looks at (it is quadratic at worst);
/// a bigger schema is left to the grammar engine's own limits.
const MAX_FIXPOINT_NODES: usize = 5_000;

/// A schema position: a node (an object schema), or `true`/`false`.
#[derive(Clone, Copy)]
enum Child {
    Node(usize),
    Always,
    Never,
}

/// What a node needs of others for some finite document to match it.
#[derive(Default)]
struct Needs {
    /// All of these (its `$ref` target, its `allOf` members).
    all: Vec<Child>,
    /// One of each group (`anyOf`, `oneOf`).
    groups: Vec<Vec<Child>>,
    /// One of these alternatives, each needing all its children (a type
    /// the value may have: an object needs its required properties, an
    /// array its first `minItems` items); `None`: a primitive is allowed.
    types: Option<Vec<Vec<Child>>>,
    /// Every schema below it, for what a document may reach.
    below: Vec<Child>,
}

/// Why `schema` has a part no finite document matches (a recursion with
/// no way out), naming it by JSON pointer; `None` when every part it can
/// reach has a finite document.
pub(crate) fn no_way_out(schema: &Value) -> Option<String> {
    let mut nodes = Vec::new();
    collect(schema, String::new(), &mut nodes);
    if nodes.is_empty() || nodes.len() > MAX_FIXPOINT_NODES {
        return None;
    }
    let index = by_pointer(&nodes);
    let needs: Vec<Needs> = nodes
        .iter()
        .map(|(ptr, node)| needs_of(ptr, node, &index))
        .collect();
    // Least fixpoint: a node is productive once what it needs is.
    let mut productive = vec![false; nodes.len()];
    let ok = |c: &Child, p: &[bool]| match *c {
        Child::Node(j) => p[j],
        Child::Always => true,
        Child::Never => false,
    };
    loop {
        let mut changed = false;
        for (i, n) in needs.iter().enumerate() {
            if productive[i] {
                continue;
            }
            let now = n.all.iter().all(|c| ok(c, &productive))
                && n.groups
                    .iter()
                    .all(|g| g.iter().any(|c| ok(c, &productive)))
                && n.types.as_ref().is_none_or(|alternatives| {
                    alternatives
                        .iter()
                        .any(|a| a.iter().all(|c| ok(c, &productive)))
                });
            if now {
                productive[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    // What each part that has no document needs and lacks: a part on a
    // cycle of those is a recursion with no way out. (One that merely has
    // no value, such as crossed bounds, is left to the engine, which
    // copes with it as before.)
    let lacking: Vec<Vec<usize>> = needs
        .iter()
        .enumerate()
        .map(|(i, n)| {
            if productive[i] {
                return Vec::new();
            }
            let alternatives = n.types.iter().flatten().flatten();
            n.all
                .iter()
                .chain(n.groups.iter().flatten())
                .chain(alternatives)
                .filter_map(|c| match *c {
                    Child::Node(j) if !productive[j] => Some(j),
                    _ => None,
                })
                .collect()
        })
        .collect();
    // The first such part a document can reach (breadth first from the
    // root).
    let mut seen = vec![false; nodes.len()];
    let mut queue = std::collections::VecDeque::from([0usize]);
    seen[0] = true;
    while let Some(i) = queue.pop_front() {
        if !productive[i] && on_cycle(i, &lacking) {
            return Some(format!(
                "#{} can match no finite document: each match must hold another (a recursion with no way out, such as a required property whose schema refers back to it)",
                nodes[i].0
            ));
        }
        let n = &needs[i];
        for c in n
            .all
            .iter()
            .chain(n.groups.iter().flatten())
            .chain(&n.below)
        {
            if let Child::Node(j) = *c {
                if !seen[j] {
                    seen[j] = true;
                    queue.push_back(j);
                }
            }
        }
    }
    None
}

/// Whether `start` reaches itself along `edges` (iteratively).
fn on_cycle(start: usize, edges: &[Vec<usize>]) -> bool {
    let mut seen = vec![false; edges.len()];
    let mut stack: Vec<usize> = edges[start].clone();
    while let Some(i) = stack.pop() {
        if i == start {
            return true;
        }
        if !std::mem::replace(&mut seen[i], true) {
            stack.extend(&edges[i]);
        }
    }
    false
}

/// The schema at `value` (under `ptr`) as a [`Child`]; `None` for what is
/// not a schema.
fn child(value: &Value, ptr: &str, index: &HashMap<&str, usize>) -> Option<Child> {
    match value {
        Value::Bool(true) => Some(Child::Always),
        Value::Bool(false) => Some(Child::Never),
        Value::Object(_) => index.get(ptr).map(|&i| Child::Node(i)),
        _ => None,
    }
}

fn needs_of(ptr: &str, node: &Value, index: &HashMap<&str, usize>) -> Needs {
    let mut n = Needs::default();
    let key = |k: &str| k.replace('~', "~0").replace('/', "~1");
    if let Some(target) = node
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
    {
        if let Some(&i) = index.get(target) {
            n.all.push(Child::Node(i));
        }
    }
    let members = |k: &str| -> Vec<Child> {
        node.get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .enumerate()
                    .filter_map(|(i, v)| child(v, &format!("{ptr}/{k}/{i}"), index))
                    .collect()
            })
            .unwrap_or_default()
    };
    n.all.extend(members("allOf"));
    for k in ["anyOf", "oneOf"] {
        let group = members(k);
        if !group.is_empty() {
            n.groups.push(group);
        }
    }
    // A fixed value always has a document; an empty enum never does.
    if node
        .get("enum")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty)
    {
        n.types = Some(Vec::new());
        return n;
    }
    if node.get("const").is_some() || node.get("enum").is_some() {
        return n;
    }
    let props = node.get("properties").and_then(Value::as_object);
    let prop = |k: &str| {
        props
            .and_then(|p| p.get(k))
            .and_then(|v| child(v, &format!("{ptr}/properties/{}", key(k)), index))
    };
    let extra = node
        .get("additionalProperties")
        .and_then(|v| child(v, &format!("{ptr}/additionalProperties"), index));
    n.below
        .extend(props.into_iter().flatten().filter_map(|(k, _)| prop(k)));
    n.below.extend(extra);
    let prefix = node.get("prefixItems").and_then(Value::as_array);
    let items = node
        .get("items")
        .and_then(|v| child(v, &format!("{ptr}/items"), index));
    let item = |i: usize| {
        prefix
            .and_then(|p| p.get(i))
            .and_then(|v| child(v, &format!("{ptr}/prefixItems/{i}"), index))
            .or(items)
    };
    let prefix_len = prefix.map_or(0, Vec::len);
    n.below.extend((0..prefix_len).filter_map(item));
    n.below.extend(items);
    let types: Vec<&str> = match node.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return n,
    };
    let mut alternatives = Vec::new();
    for t in types {
        match t {
            "object" => {
                // A required key without a schema of its own takes
                // additionalProperties (or anything).
                let required = node.get("required").and_then(Value::as_array);
                let needs = required
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .filter_map(|k| prop(k).or(extra))
                    .collect();
                alternatives.push(needs);
            }
            // Contradictory bounds leave a type no value (a way out that
            // is none).
            "array" if bounds_cross(node, "minItems", "maxItems") => {
                alternatives.push(vec![Child::Never]);
            }
            "string" if bounds_cross(node, "minLength", "maxLength") => {
                alternatives.push(vec![Child::Never]);
            }
            "integer" | "number" if bounds_cross(node, "minimum", "maximum") => {
                alternatives.push(vec![Child::Never]);
            }
            "array" => {
                let min = node.get("minItems").and_then(Value::as_u64).unwrap_or(0);
                // The first few needed items say enough (a longer prefix
                // of the same schema adds nothing).
                let needed = usize::try_from(min)
                    .unwrap_or(usize::MAX)
                    .min(prefix_len + 1);
                alternatives.push((0..needed).filter_map(item).collect());
            }
            _ => alternatives.push(Vec::new()),
        }
    }
    n.types = Some(alternatives);
    n
}

/// Whether `node`'s lower bound `low` is above its upper bound `high`.
fn bounds_cross(node: &Value, low: &str, high: &str) -> bool {
    match (
        node.get(low).and_then(Value::as_f64),
        node.get(high).and_then(Value::as_f64),
    ) {
        (Some(l), Some(h)) => l > h,
        _ => false,
    }
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
    fn a_recursion_with_no_way_out_is_found_and_one_with_a_way_out_passes() {
        let chain = json!({"type": "object", "properties": {"next": {"$ref": "#"}},
            "required": ["next"]});
        let m = no_way_out(&chain).unwrap();
        assert!(m.starts_with("# can match no finite document"), "{m}");
        let deep = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}},
            "$defs": {"x": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/x"}}}});
        let m = no_way_out(&deep).unwrap();
        assert!(m.starts_with("#/$defs/x can match"), "{m}");
        for ok in [
            json!({"type": "object", "properties": {"next": {"$ref": "#"}}}),
            json!({"type": ["object", "null"], "properties": {"next": {"$ref": "#"}},
                "required": ["next"]}),
            json!({"type": "object", "properties": {"next": {"anyOf": [{"type": "null"},
                {"$ref": "#"}]}}, "required": ["next"]}),
            json!({"type": "array", "items": {"$ref": "#"}}),
            json!({"properties": {"next": {"$ref": "#"}}, "required": ["next"]}),
            json!({"type": "string"}),
            // No value, but no recursion: left to the engine.
            json!({"type": "object", "properties": {"a": {"type": "string",
                "minLength": 3, "maxLength": 1}}}),
        ] {
            assert_eq!(no_way_out(&ok), None, "{ok}");
        }
        // An empty enum, or bounds that cross, are no way out.
        let empty = json!({"type": "array", "minItems": 1, "items": {"anyOf": [
            {"$ref": "#"}, {"enum": []}]}});
        assert!(no_way_out(&empty).is_some());
        let crossed = json!({"anyOf": [{"type": "string", "minLength": 3, "maxLength": 1},
            {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}]});
        assert!(no_way_out(&crossed).is_some());
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
