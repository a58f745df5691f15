//! JSON parsing with field paths in errors.

use serde::de::DeserializeOwned;

use crate::ProtocolError;

/// Parses `value` as `T`; a type error names the field (`param`) it is in.
pub fn parse_json<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, ProtocolError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." || path.is_empty() {
            ProtocolError {
                message: format!("invalid request: {inner}"),
                param: None,
                code: None,
            }
        } else {
            ProtocolError::field(&path, format!("invalid value for '{path}': {inner}"))
        }
    })
}

/// The body as a JSON object.
pub(crate) fn object(
    body: &serde_json::Value,
) -> Result<&serde_json::Map<String, serde_json::Value>, ProtocolError> {
    body.as_object()
        .ok_or_else(|| ProtocolError::field("body", "the body must be a JSON object"))
}

/// Refuses any key of `obj` not in `known`, naming it (`at` prefixes it).
/// A null is as good as absent (clients serialise unset optional fields as
/// null), so it is never refused.
pub(crate) fn only_known(
    obj: &serde_json::Map<String, serde_json::Value>,
    known: &[&str],
    at: &str,
) -> Result<(), ProtocolError> {
    let unknown = obj
        .iter()
        .find(|(k, v)| !v.is_null() && !known.contains(&k.as_str()));
    match unknown.map(|(k, _)| k) {
        Some(k) => {
            let name = format!("{at}{k}");
            Err(ProtocolError::field(
                &name,
                format!("{name}: this field is not supported by this server"),
            ))
        }
        None => Ok(()),
    }
}

/// `value`, a list of objects (`field` names it, `field[i]` its items),
/// each mapped by `item(at, object)`.
pub(crate) fn each_object<T>(
    value: &serde_json::Value,
    field: &str,
    mut item: impl FnMut(&str, &serde_json::Map<String, serde_json::Value>) -> Result<T, ProtocolError>,
) -> Result<Vec<T>, ProtocolError> {
    let items = value
        .as_array()
        .ok_or_else(|| ProtocolError::field(field, format!("{field} must be a list")))?;
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let at = format!("{field}[{i}]");
            let obj = v
                .as_object()
                .ok_or_else(|| ProtocolError::field(&at, format!("{at} must be an object")))?;
            item(&at, obj)
        })
        .collect()
}

/// Parses a request body: bytes → JSON object.
pub fn body_json(bytes: &[u8]) -> Result<serde_json::Value, ProtocolError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| ProtocolError {
        message: format!("malformed JSON body: {e}"),
        param: None,
        code: None,
    })?;
    if !value.is_object() {
        return Err(ProtocolError {
            message: "the request body must be a JSON object".into(),
            param: None,
            code: None,
        });
    }
    let mut value = value;
    integral_floats_to_integers(&mut value);
    Ok(value)
}

/// Rewrites numbers like `2.0` as `2`: JSON Schema (and so OpenAI's API
/// description) counts them as integers and clients that build bodies from
/// floats send them for `n` or `max_tokens`; serde would refuse them for
/// integer fields. Float fields read integers unchanged.
fn integral_floats_to_integers(value: &mut serde_json::Value) {
    use serde_json::Value;
    // Integers beyond 2^53 are not exact in an f64 anyway.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    match value {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                if f.fract() == 0.0 && f.abs() <= EXACT {
                    *n = if f < 0.0 {
                        (f as i64).into()
                    } else {
                        (f as u64).into()
                    };
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_floats_to_integers),
        Value::Object(map) => map.values_mut().for_each(integral_floats_to_integers),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integral_floats_become_integers_and_others_stay() {
        let v = body_json(br#"{"n": 2.0, "t": 0.5, "ids": [1.0, -3.0], "big": 1e300, "z": -0.0}"#)
            .unwrap();
        assert_eq!(v["n"], serde_json::json!(2));
        assert!(v["n"].is_u64());
        assert_eq!(v["t"], serde_json::json!(0.5));
        assert_eq!(v["ids"], serde_json::json!([1, -3]));
        assert!(v["big"].is_f64(), "not exact as an integer");
        assert!(v["z"].is_u64());
    }
}
