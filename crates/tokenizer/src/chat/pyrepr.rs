//! Python's `repr` of template values: what Jinja2 prints for a dict or a
//! list (`{{ tool }}` gives `{'type': 'function', ...}`), which some
//! templates put straight into the prompt.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};

/// `repr(value)` as Python would print the equivalent object.
pub(crate) fn repr(value: &Value) -> String {
    let mut out = String::new();
    write_repr(value, &mut out);
    out
}

fn write_repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::String => write_str_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(items) = value.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(&item, out);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(&key, out);
                    out.push_str(": ");
                    write_repr(&value.get_item(&key).unwrap_or_default(), out);
                }
            }
            out.push('}');
        }
        // Bools (True/False), numbers (floats keep ".0") and anything else:
        // minijinja's Display already follows Python.
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Python's string repr: single quotes unless the text has a single quote
/// and no double quote; control characters escaped.
fn write_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests {
    use super::repr;
    use minijinja::value::Value;

    #[test]
    fn like_python() {
        let v = Value::from_serialize(
            serde_json::json!({"a": [1, 2.5, true, null], "b": "it's \"x\"\n", "c": "it's"}),
        );
        assert_eq!(
            repr(&v),
            r#"{'a': [1, 2.5, True, None], 'b': 'it\'s "x"\n', 'c': "it's"}"#
        );
    }
}
