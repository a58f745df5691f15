//! Where a value came from, and the one-line error that names it.

use std::fmt;
use std::path::PathBuf;

/// The layer that set a value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The built-in default.
    Default,
    /// A line of the config file.
    File {
        /// The file, as given.
        path: PathBuf,
        /// 1-based line.
        line: usize,
    },
    /// An environment variable (its name).
    Env(String),
    /// A command-line flag (as typed, e.g. `--max-num-seqs`).
    Flag(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => f.write_str("default"),
            Self::File { path, line } => write!(f, "{}:{line}", path.display()),
            Self::Env(var) => write!(f, "env {var}"),
            Self::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// A configuration that cannot be used. `Display` is one line naming the
/// key, the value, the source and the rule, so an operator can fix it
/// without reading code.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A key is unknown, or its value has the wrong type or is out of range.
    #[error("{key}{} ({origin}): {message}", value_part(.value))]
    Key {
        /// Dotted path, e.g. `scheduler.max_num_seqs`.
        key: String,
        /// The offending value in JSON syntax, when there is one.
        value: Option<String>,
        /// Who set it.
        origin: Source,
        /// The rule it breaks.
        message: String,
    },
    /// The config file cannot be read.
    #[error("{}: cannot read the config file: {message}", .path.display())]
    Read {
        /// The file, as given.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
    /// The config file is not valid TOML.
    #[error("{origin}: invalid TOML: {message}")]
    Syntax {
        /// File and line of the error.
        origin: Source,
        /// The parser's message.
        message: String,
    },
}

fn value_part(value: &Option<String>) -> String {
    value
        .as_ref()
        .map_or_else(String::new, |v| format!(" = {v}"))
}

impl ConfigError {
    /// An error about `key`, set by `origin` to `value`.
    pub fn key(
        key: impl Into<String>,
        value: Option<&serde_json::Value>,
        origin: Source,
        message: impl Into<String>,
    ) -> Self {
        Self::Key {
            key: key.into(),
            value: value.map(render_value),
            origin,
            message: one_line(&message.into()),
        }
    }
}

/// A value as the error and `show()` print it: TOML (scalars as JSON, which
/// TOML reads the same).
pub(crate) fn render_value(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        // TOML inline tables (e.g. `auth.api_keys` entries), unset fields
        // left out, so `config show` stays loadable TOML. Sorted: serde_json's
        // key order depends on a feature another crate may turn on.
        Value::Object(map) => {
            let mut fields: Vec<String> = map
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| format!("{} = {}", toml_key(k), render_value(v)))
                .collect();
            fields.sort_unstable();
            if fields.is_empty() {
                "{}".into()
            } else {
                format!("{{ {} }}", fields.join(", "))
            }
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(render_value).collect();
            format!("[{}]", items.join(", "))
        }
        scalar => scalar.to_string(),
    }
}

/// A table key, quoted unless it is a bare TOML key.
fn toml_key(k: &str) -> String {
    let bare = !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        k.to_string()
    } else {
        serde_json::Value::from(k).to_string()
    }
}

/// Joins a multi-line message so the error stays one line.
pub(crate) fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}
