//! The `tojson` filter as transformers defines it: Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)`, byte for byte (`", "` and `": "` separators, no HTML
//! escaping, Python float spelling). minijinja's own `tojson` is compact and
//! HTML-safe, which changes the prompt.

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde_json::Value as Json;

pub(crate) fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let bad = |what: &str| Error::new(ErrorKind::InvalidOperation, format!("tojson: {what}"));
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            (None, Some(s)) => Some(s.to_owned()),
            _ => return Err(bad("indent must be an integer or a string")),
        },
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<String> = v
                .try_iter()
                .map_err(|_| bad("separators must be a pair of strings"))?
                .map(|s| s.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("separators must be a pair of strings"))?;
            match <[String; 2]>::try_from(parts) {
                Ok([item, key]) => (item, key),
                Err(_) => return Err(bad("separators must be a pair of strings")),
            }
        }
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value).map_err(|e| bad(&e.to_string()))?;
    let dumper = Dumper {
        item_sep,
        key_sep,
        indent,
        ensure_ascii,
        sort_keys,
    };
    let mut out = String::new();
    dumper.write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

struct Dumper {
    item_sep: String,
    key_sep: String,
    indent: Option<String>,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl Dumper {
    fn write(&self, v: &Json, level: usize, out: &mut String) {
        match v {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => match n.as_f64().filter(|_| n.is_f64()) {
                Some(f) => out.push_str(&python_float(f)),
                None => out.push_str(&n.to_string()),
            },
            Json::String(s) => self.string(s, out),
            Json::Array(items) => {
                if items.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separator(i, level + 1, out);
                    self.write(item, level + 1, out);
                }
                self.newline(level, out);
                out.push(']');
            }
            Json::Object(map) => {
                if map.is_empty() {
                    out.push_str("{}");
                    return;
                }
                let mut entries: Vec<(&String, &Json)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    self.separator(i, level + 1, out);
                    self.string(k, out);
                    out.push_str(&self.key_sep);
                    self.write(item, level + 1, out);
                }
                self.newline(level, out);
                out.push('}');
            }
        }
    }

    /// Before the `i`-th item of a container whose items sit at `level`.
    fn separator(&self, i: usize, level: usize, out: &mut String) {
        if i > 0 {
            out.push_str(&self.item_sep);
        }
        self.newline(level, out);
    }

    fn newline(&self, level: usize, out: &mut String) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && (c as u32) > 0x7e) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `repr(float)`: shortest round-trip digits, `.0` on integral
/// values, exponent form outside `1e-4 <= |x| < 1e16` (`1e+16`, `1e-05`).
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    let exp = f.abs().log10().floor() as i32;
    if (-4..16).contains(&exp) {
        let s = format!("{f}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        // Rust's `{:e}` is shortest round-trip too: "1.5e-5" → "1.5e-05".
        let s = format!("{f:e}");
        match s.split_once('e') {
            Some((mantissa, e)) => {
                let (sign, digits) = match e.strip_prefix('-') {
                    Some(d) => ('-', d),
                    None => ('+', e),
                };
                format!("{mantissa}e{sign}{digits:0>2}")
            }
            None => s,
        }
    }
}

#[cfg(test)]
mod tests {
    use minijinja::Environment;

    fn render(template: &str, ctx: serde_json::Value) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        env.render_str(template, ctx).unwrap()
    }

    #[test]
    fn matches_python_json_dumps() {
        let ctx = serde_json::json!({"x": {"b": [1, 2.0, 1e-5, 1e16, null, true], "a": "é<\"\n>", "e": {}, "f": []}});
        assert_eq!(
            render("{{ x | tojson }}", ctx.clone()),
            r#"{"b": [1, 2.0, 1e-05, 1e+16, null, true], "a": "é<\"\n>", "e": {}, "f": []}"#
        );
        assert_eq!(
            render(
                "{{ x | tojson(ensure_ascii=True, sort_keys=true) }}",
                ctx.clone()
            ),
            r#"{"a": "\u00e9<\"\n>", "b": [1, 2.0, 1e-05, 1e+16, null, true], "e": {}, "f": []}"#
        );
        assert_eq!(
            render("{{ x.b[:2] | tojson(indent=2) }}", ctx.clone()),
            "[\n  1,\n  2.0\n]"
        );
        assert_eq!(
            render("{{ {'k': [1]} | tojson(indent=4) }}", ctx.clone()),
            "{\n    \"k\": [\n        1\n    ]\n}"
        );
        assert_eq!(
            render("{{ 'x' | tojson(separators=(',', ':')) }}", ctx),
            "\"x\""
        );
    }
}
