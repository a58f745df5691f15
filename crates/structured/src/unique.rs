//! `uniqueItems`, which the grammar engine cannot enforce while generating:
//! the keyword is taken out of the schema the grammar is compiled from
//! (the arrays keep every other constraint), and the finished answer is
//! checked against it ([`UniqueItems::violation`]).

use ingot_core::GrammarSpec;
use serde_json::Value;

/// A JSON schema's `uniqueItems` constraints, checked on finished answers.
#[derive(Debug, Clone, PartialEq)]
pub struct UniqueItems {
    /// The schema as the client sent it (`$ref`s resolve against it).
    schema: Value,
}

impl UniqueItems {
    /// Takes `uniqueItems` out of `schema`; the check of what it asked
    /// for, when any array asked for unique items.
    pub fn split(schema: &mut Value) -> Option<Self> {
        let original = schema.clone();
        strip(schema).then_some(Self { schema: original })
    }

    /// The `uniqueItems` check of a grammar, when it is a JSON schema
    /// that asks for unique items anywhere.
    pub fn of(spec: &GrammarSpec) -> Option<Self> {
        match spec {
            GrammarSpec::JsonSchema(text) => Self::split(&mut serde_json::from_str(text).ok()?),
            _ => None,
        }
    }

    /// Why `answer` (the finished output, JSON) breaks a `uniqueItems`
    /// constraint, naming the array by its JSON pointer; `None` when it
    /// keeps them all (or is not JSON: the grammar already judged it).
    pub fn violation(&self, answer: &str) -> Option<String> {
        let instance: Value = serde_json::from_str(answer).ok()?;
        check(&self.schema, &self.schema, &instance, "", 0)
    }
}

/// Removes every `uniqueItems` keyword; whether one was `true`.
fn strip(schema: &mut Value) -> bool {
    match schema {
        Value::Object(obj) => {
            let unique = obj.remove("uniqueItems") == Some(Value::Bool(true));
            obj.values_mut().fold(unique, |any, v| strip(v) | any)
        }
        Value::Array(items) => items.iter_mut().fold(false, |any, v| strip(v) | any),
        _ => false,
    }
}

/// Deepest `$ref` chain followed (a recursive schema ends here).
const MAX_DEPTH: usize = 64;

/// The first `uniqueItems` violation of `instance` under `schema`. Applies
/// `properties`, `additionalProperties`, `items`, `prefixItems`, `allOf`
/// and local `$ref`s; under `anyOf` and `oneOf` a violation counts only
/// when every branch has one (the answer may match another branch).
fn check(root: &Value, schema: &Value, instance: &Value, at: &str, depth: usize) -> Option<String> {
    let obj = schema.as_object()?;
    if depth > MAX_DEPTH {
        return None;
    }
    if let Some(target) = obj.get("$ref").and_then(Value::as_str).and_then(|r| {
        r.strip_prefix('#')
            .and_then(|pointer| root.pointer(pointer))
    }) {
        if let Some(v) = check(root, target, instance, at, depth + 1) {
            return Some(v);
        }
    }
    for sub in obj
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(v) = check(root, sub, instance, at, depth + 1) {
            return Some(v);
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(branches) = obj.get(key).and_then(Value::as_array) {
            let found: Vec<_> = branches
                .iter()
                .map(|b| check(root, b, instance, at, depth + 1))
                .collect();
            if !found.is_empty() && found.iter().all(Option::is_some) {
                return found.into_iter().flatten().next();
            }
        }
    }
    match instance {
        Value::Array(items) => {
            if obj.get("uniqueItems") == Some(&Value::Bool(true)) {
                for (j, item) in items.iter().enumerate() {
                    if let Some(i) = items[..j].iter().position(|x| x == item) {
                        let at = if at.is_empty() { "/" } else { at };
                        return Some(format!(
                            "the array at {at} repeats an item (indices {i} and {j}: {item}), which uniqueItems forbids"
                        ));
                    }
                }
            }
            let prefix = obj.get("prefixItems").and_then(Value::as_array);
            let rest = obj.get("items");
            items.iter().enumerate().find_map(|(i, item)| {
                let sub = prefix.and_then(|p| p.get(i)).or(rest)?;
                check(root, sub, item, &format!("{at}/{i}"), depth + 1)
            })
        }
        Value::Object(map) => {
            let props = obj.get("properties").and_then(Value::as_object);
            let extra = obj.get("additionalProperties");
            map.iter().find_map(|(k, v)| {
                let sub = props.and_then(|p| p.get(k)).or(extra)?;
                let key = k.replace('~', "~0").replace('/', "~1");
                check(root, sub, v, &format!("{at}/{key}"), depth + 1)
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unique_items_is_split_off_and_checked_on_the_answer() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true},
                "pairs": {"type": "array", "items": {"$ref": "#/$defs/pair"}}
            },
            "$defs": {"pair": {"type": "array", "items": {"type": "integer"}, "uniqueItems": true}}
        });
        let check = UniqueItems::split(&mut schema).unwrap();
        assert!(!schema.to_string().contains("uniqueItems"));
        assert_eq!(
            check.violation(r#"{"tags": ["a", "b"], "pairs": [[1, 2]]}"#),
            None
        );
        let v = check.violation(r#"{"tags": ["a", "b", "a"]}"#).unwrap();
        assert!(
            v.starts_with("the array at /tags repeats an item (indices 0 and 2"),
            "{v}"
        );
        let v = check.violation(r#"{"pairs": [[1, 2], [3, 3]]}"#).unwrap();
        assert!(v.contains("/pairs/1"), "{v}");
        assert_eq!(check.violation("not json"), None);
        let mut plain = json!({"type": "array", "uniqueItems": false});
        assert!(UniqueItems::split(&mut plain).is_none());
        assert_eq!(plain, json!({"type": "array"}));
    }

    #[test]
    fn any_of_counts_only_when_every_branch_breaks() {
        let mut schema = json!({"anyOf": [
            {"type": "array", "uniqueItems": true},
            {"type": "array", "items": {"type": "integer"}}
        ]});
        let check = UniqueItems::split(&mut schema).unwrap();
        assert_eq!(check.violation("[1, 1]"), None);
        let mut schema = json!({"oneOf": [{"type": "array", "uniqueItems": true}]});
        let check = UniqueItems::split(&mut schema).unwrap();
        assert!(check.violation("[1, 1]").is_some());
    }
}
