//! Layers → one validated [`Config`], remembering who set each value.
//!
//! Every layer is merged into one JSON tree (defaults first), recording the
//! [`Source`] of each leaf as it is set; the tree is then deserialized into
//! [`Config`] (type errors name their path) and checked (range and
//! cross-field rules). Any failure becomes one line naming key, value,
//! source and rule.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::check::check;
use crate::config::Config;
use crate::env::{plan, EnvOp, FLAG_PREFIX};
use crate::error::{render_value, ConfigError, Source};
use crate::file::FileLayer;
use crate::flags::{valid_flag_name, FlagSpec};
use crate::schema::leaf_kinds;
use crate::tree;

/// The raw inputs, lowest precedence last to first: defaults < `file` <
/// `env` < `flags`.
#[derive(Clone, Debug, Default)]
pub struct Layers {
    /// The TOML config file, if one was given.
    pub file: Option<PathBuf>,
    /// The process environment (only `INGOT_*` is looked at). The binary
    /// passes `std::env::vars()`; nothing below it reads the environment.
    pub env: Vec<(String, String)>,
    /// Command-line flags that were given (absent flags are not listed).
    pub flags: Vec<FlagValue>,
}

/// One command-line flag's value for one key.
#[derive(Clone, Debug, PartialEq)]
pub struct FlagValue {
    /// Dotted key, e.g. `scheduler.max_num_seqs`.
    pub key: &'static str,
    /// The value (strings for durations and sizes are parsed like the file's).
    pub value: Value,
    /// The flag as typed, e.g. `--max-num-seqs`.
    pub flag: &'static str,
}

/// A validated config and the source of each of its leaves.
#[derive(Clone, Debug, PartialEq)]
pub struct Loaded {
    /// The config.
    pub config: Config,
    /// Who set each leaf, by dotted path.
    pub sources: BTreeMap<String, Source>,
}

static DEFAULT_SOURCE: Source = Source::Default;

impl Loaded {
    /// Who set `key` (a leaf, or the first leaf under a table);
    /// [`Source::Default`] for keys the config does not have.
    pub fn source(&self, key: &str) -> &Source {
        source_of(&self.sources, key).unwrap_or(&DEFAULT_SOURCE)
    }

    /// Every leaf as `key = value    # source`, one per line, in key order.
    /// Unset optional keys print as comments. The output is TOML that loads
    /// back to the same config.
    pub fn show(&self) -> String {
        let tree = serde_json::to_value(&self.config).unwrap_or_default();
        let rows: Vec<(String, String)> = tree::leaves(&tree)
            .into_iter()
            .map(|(key, v)| {
                let line = match v {
                    Value::Null => format!("# {key} = (unset)"),
                    v => format!("{key} = {}", render_value(v)),
                };
                (line, self.source(&key).to_string())
            })
            .collect();
        let width = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
        rows.iter()
            .map(|(line, source)| format!("{line:<width$}    # {source}\n"))
            .collect()
    }

    /// An error about `key` naming its current value and source, for rules
    /// checked outside this crate (e.g. the binary parsing `log.level` with
    /// tracing's `EnvFilter`).
    pub fn error(&self, key: &str, message: impl Into<String>) -> ConfigError {
        let tree = serde_json::to_value(&self.config).unwrap_or_default();
        ConfigError::key(
            key,
            tree::get(&tree, key),
            self.source(key).clone(),
            message,
        )
    }
}

fn source_of<'a>(sources: &'a BTreeMap<String, Source>, key: &str) -> Option<&'a Source> {
    sources.get(key).or_else(|| {
        let prefix = format!("{key}.");
        sources
            .range(prefix.clone()..)
            .next()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, s)| s)
    })
}

/// Merges `layers` over the defaults, then deserializes and checks.
pub fn load(layers: &Layers) -> Result<Loaded, ConfigError> {
    let mut merger = Merger::new();
    if let Some(path) = &layers.file {
        let file = FileLayer::read(path)?;
        merger.merge_file(&file)?;
    }
    for op in plan(&layers.env, &leaf_kinds())? {
        merger.apply_env(op)?;
    }
    for f in &layers.flags {
        merger.set(f.key, f.value.clone(), &|_| {
            Source::Flag(f.flag.to_string())
        })?;
    }
    merger.finish()
}

/// An `INGOT_FLAG_<NAME>` value: `on` (enabled, 100 %), `off` (disabled,
/// rollout kept) or a percent (enabled at that rollout).
fn parse_override(raw: &str) -> Option<(bool, Option<f64>)> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "on" => Some((true, Some(100.0))),
        "off" => Some((false, None)),
        p => p
            .parse::<f64>()
            .ok()
            .filter(|p| p.is_finite())
            .map(|p| (true, Some(p))),
    }
}

/// The tree being built and the source of each of its leaves.
struct Merger {
    tree: Value,
    sources: BTreeMap<String, Source>,
}

impl Merger {
    fn new() -> Self {
        let tree = serde_json::to_value(Config::default()).unwrap_or_default();
        let sources = tree::leaves(&tree)
            .into_keys()
            .map(|k| (k, Source::Default))
            .collect();
        Self { tree, sources }
    }

    fn merge_file(&mut self, file: &FileLayer) -> Result<(), ConfigError> {
        let Value::Object(top) = &file.tree else {
            return Ok(());
        };
        for (k, v) in top {
            self.set(k, v.clone(), &|key| file.source(key))?;
        }
        Ok(())
    }

    /// Sets `key` to `value`: a leaf is replaced whole (type errors come at
    /// deserialization), a table is merged key by key. `origin` names the
    /// source of each leaf set.
    fn set(
        &mut self,
        key: &str,
        value: Value,
        origin: &dyn Fn(&str) -> Source,
    ) -> Result<(), ConfigError> {
        let segments: Vec<&str> = key.split('.').collect();
        let is_table = self.resolve(&segments, origin)?;
        match value {
            Value::Object(map) if is_table => {
                for (k, v) in map {
                    self.set(&format!("{key}.{k}"), v, origin)?;
                }
                Ok(())
            }
            v if is_table => Err(ConfigError::key(
                key,
                Some(&v),
                origin(key),
                "expected a table",
            )),
            v => {
                tree::set(&mut self.tree, &segments, v);
                self.sources.insert(key.to_string(), origin(key));
                Ok(())
            }
        }
    }

    /// Checks that `segments` names a key of the config (adding a flag
    /// entry, at its defaults, when a layer introduces a new flag). True for
    /// a table.
    fn resolve(
        &mut self,
        segments: &[&str],
        origin: &dyn Fn(&str) -> Source,
    ) -> Result<bool, ConfigError> {
        if let ["flags", name, ..] = segments {
            self.add_flag(name, origin)?;
        }
        let mut node = &self.tree;
        for (i, k) in segments.iter().enumerate() {
            let key = segments[..=i].join(".");
            let Value::Object(map) = node else {
                let parent = segments[..i].join(".");
                return Err(ConfigError::key(
                    key,
                    None,
                    origin(&segments.join(".")),
                    format!("unknown key; {parent} is a single value, not a table"),
                ));
            };
            node = map.get(*k).ok_or_else(|| {
                // Sorted: serde_json's key order depends on a feature
                // another crate may turn on.
                let mut expected: Vec<&str> = map.keys().map(String::as_str).collect();
                expected.sort_unstable();
                ConfigError::key(
                    &key,
                    None,
                    origin(&key),
                    format!("unknown key; expected one of {}", expected.join(", ")),
                )
            })?;
        }
        Ok(node.is_object())
    }

    /// A flag a layer names for the first time starts at [`FlagSpec`]'s
    /// defaults, so its unset fields have a value and a source.
    fn add_flag(&mut self, name: &str, origin: &dyn Fn(&str) -> Source) -> Result<(), ConfigError> {
        if self.tree["flags"].get(name).is_some() {
            return Ok(());
        }
        let key = format!("flags.{name}");
        if !valid_flag_name(name) {
            return Err(ConfigError::key(
                &key,
                None,
                origin(&key),
                "invalid flag name; use lowercase letters, digits and _",
            ));
        }
        let spec = serde_json::to_value(FlagSpec::default()).unwrap_or_default();
        for leaf in tree::leaves(&spec).into_keys() {
            self.sources
                .insert(format!("{key}.{leaf}"), Source::Default);
        }
        tree::set(&mut self.tree, &["flags", name], spec);
        Ok(())
    }

    fn apply_env(&mut self, op: EnvOp) -> Result<(), ConfigError> {
        match op {
            EnvOp::Set { key, value, var } => self.set(&key, value, &|_| Source::Env(var.clone())),
            EnvOp::Flag { name, raw, var } => self.apply_flag_override(&name, &raw, var),
        }
    }

    /// `INGOT_FLAG_<NAME>=on|off|<percent>` for a flag the defaults or the
    /// file define (an unknown name is most likely a typo).
    fn apply_flag_override(
        &mut self,
        name: &str,
        raw: &str,
        var: String,
    ) -> Result<(), ConfigError> {
        let key = format!("flags.{name}");
        let origin = |_: &str| Source::Env(var.clone());
        let raw_value = Value::String(raw.to_string());
        if self.tree["flags"].get(name).is_none() {
            let mut known: Vec<&str> = self.tree["flags"]
                .as_object()
                .map(|m| m.keys().map(String::as_str).collect())
                .unwrap_or_default();
            known.sort_unstable();
            return Err(ConfigError::key(
                key,
                Some(&raw_value),
                origin(""),
                format!(
                    "unknown flag; defined flags are {} (define new ones in the config file)",
                    known.join(", ")
                ),
            ));
        }
        let Some((enabled, percent)) = parse_override(raw) else {
            let message =
                format!("expected on, off or a rollout percent (0 to 100) in {FLAG_PREFIX}<NAME>");
            return Err(ConfigError::key(key, Some(&raw_value), origin(""), message));
        };
        self.set(&format!("{key}.enabled"), Value::Bool(enabled), &origin)?;
        if let Some(p) = percent {
            self.set(&format!("{key}.rollout_percent"), Value::from(p), &origin)?;
        }
        Ok(())
    }

    /// Deserializes and checks the merged tree.
    fn finish(self) -> Result<Loaded, ConfigError> {
        let config: Config = serde_path_to_error::deserialize(self.tree.clone()).map_err(|e| {
            let key = tree::key_of_error_path(&e.path().to_string());
            self.error(&key, e.inner().to_string())
        })?;
        if let Err(v) = check(&config) {
            return Err(self.error(&v.key, v.message));
        }
        Ok(Loaded {
            config,
            sources: self.sources,
        })
    }

    fn error(&self, key: &str, message: String) -> ConfigError {
        let origin = source_of(&self.sources, key)
            .cloned()
            .unwrap_or(Source::Default);
        ConfigError::key(key, tree::get(&self.tree, key), origin, message)
    }
}
