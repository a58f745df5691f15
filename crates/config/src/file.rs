//! The config file: TOML into the JSON tree, with the line of every key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use toml::de::{DeTable, DeValue};

use crate::error::{one_line, ConfigError, Source};

/// A parsed config file.
pub(crate) struct FileLayer {
    path: PathBuf,
    /// The file's values.
    pub tree: Value,
    /// 1-based line of every dotted key the file names (tables included).
    lines: BTreeMap<String, usize>,
}

impl FileLayer {
    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Self::parse(path, &text)
    }

    /// Parses `text`, read from `path`. The spanned parse gives lines; the
    /// typed parse gives values (integers, floats and dates as TOML means
    /// them).
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let syntax = |e: toml::de::Error| ConfigError::Syntax {
            origin: Source::File {
                path: path.to_path_buf(),
                line: e.span().map_or(1, |s| line_of(text, s.start)),
            },
            message: one_line(e.message()),
        };
        let spanned = DeTable::parse(text).map_err(syntax)?;
        let table: toml::Table = toml::from_str(text).map_err(syntax)?;
        let mut lines = BTreeMap::new();
        record_lines(spanned.get_ref(), text, &mut String::new(), &mut lines);
        Ok(Self {
            path: path.to_path_buf(),
            tree: toml_to_json(toml::Value::Table(table)),
            lines,
        })
    }

    /// Where `key` (or its nearest named ancestor) is set.
    pub fn source(&self, key: &str) -> Source {
        let mut k = key;
        let line = loop {
            if let Some(&line) = self.lines.get(k) {
                break line;
            }
            match k.rfind('.') {
                Some(i) => k = &k[..i],
                None => break 1,
            }
        };
        Source::File {
            path: self.path.clone(),
            line,
        }
    }
}

/// 1-based line of byte `offset`.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

fn record_lines(
    table: &DeTable<'_>,
    text: &str,
    path: &mut String,
    out: &mut BTreeMap<String, usize>,
) {
    for (key, value) in table {
        let len = path.len();
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key.get_ref());
        out.entry(path.clone())
            .or_insert_with(|| line_of(text, key.span().start));
        if let DeValue::Table(inner) = value.get_ref() {
            record_lines(inner, text, path, out);
        }
        path.truncate(len);
    }
}

/// TOML to JSON. Dates become strings; a non-finite float becomes its TOML
/// spelling (JSON has none), which then fails as a type error naming it.
fn toml_to_json(v: toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => Value::from(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f)
            .map_or_else(|| Value::String(f.to_string()), Value::Number),
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.into_iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => {
            Value::Object(t.into_iter().map(|(k, v)| (k, toml_to_json(v))).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn every_key_gets_its_line() {
        let text = "# comment\n[scheduler]\nmax_num_seqs = 8\n\n[flags.coalescing]\nenabled = false\n[server]\nport = 9\nhost = \"x\"\n";
        let f = FileLayer::parse(Path::new("c.toml"), text).unwrap();
        let line = |k: &str| match f.source(k) {
            Source::File { line, .. } => line,
            other => panic!("{other:?}"),
        };
        assert_eq!(line("scheduler"), 2);
        assert_eq!(line("scheduler.max_num_seqs"), 3);
        assert_eq!(line("flags.coalescing.enabled"), 6);
        assert_eq!(line("server.host"), 9);
        assert_eq!(f.tree["scheduler"]["max_num_seqs"], 8);
    }

    #[test]
    fn malformed_toml_names_file_and_line() {
        let text = "[server]\nport = 8000\nhost = \n";
        let e = FileLayer::parse(Path::new("bad.toml"), text).err().unwrap();
        let s = e.to_string();
        assert!(s.starts_with("bad.toml:3: invalid TOML: "), "{s}");
        assert_eq!(s.lines().count(), 1, "{s}");
    }

    #[test]
    fn duplicate_keys_are_syntax_errors() {
        let text = "[server]\nport = 1\nport = 2\n";
        let e = FileLayer::parse(Path::new("d.toml"), text).err().unwrap();
        assert!(e.to_string().starts_with("d.toml:3: "), "{e}");
    }
}
