//! `INGOT_*` environment variables: which key each sets, and with what value.
//!
//! Every leaf `a.b_c` is `INGOT_A_B_C`; a handful of older short names keep
//! working. A variable that starts like a section (`INGOT_SCHEDULER_...`) but
//! names no key is an error, so a typo never silently does nothing.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::{ConfigError, Source};
use crate::schema::Kind;

/// Names from before the config layer, and the key each sets. A canonical
/// name set at the same time wins. (`INGOT_CUDA_PROFILE`, `_CHECK`,
/// `_L2_PREFETCH` and `_PDL` are already the canonical names of `cuda.*`.)
pub const LEGACY: [(&str, &str); 6] = [
    ("INGOT_MODEL", "model.path"),
    ("INGOT_HOST", "server.host"),
    ("INGOT_PORT", "server.port"),
    ("INGOT_THREADS", "model.threads"),
    ("INGOT_DEVICE", "model.device"),
    ("INGOT_LOG", "log.level"),
];

/// `INGOT_` variables that are not configuration (build, scripts, tests):
/// never read here and never rejected.
pub const NOT_CONFIG: [&str; 7] = [
    "INGOT_CACHE",                   // asset cache directory of the scripts and build.rs
    "INGOT_REQUIRE_CUDA_KERNELS",    // kernels-cuda build.rs: fail without nvcc
    "INGOT_CUDA_KERNELS_CHECK_ONLY", // kernels-cuda build.rs: unoptimised, never run
    "INGOT_GPU_PROFILE",             // scripts/gpu-bundle: the cargo profile
    "INGOT_BIN",                     // tests/e2e: the binary under test
    "INGOT_BINARY",                  // tests/gpu: the binary under test
    "INGOT_TEST_MODEL",              // tests/e2e: the model under test
];

/// Per-flag override: `INGOT_FLAG_<NAME>=on|off|<percent>`.
pub const FLAG_PREFIX: &str = "INGOT_FLAG_";

/// The canonical variable of a dotted key.
pub fn env_name(key: &str) -> String {
    format!("INGOT_{}", key.replace('.', "_").to_ascii_uppercase())
}

/// One thing the environment asks for, in the order it applies.
#[derive(Debug, PartialEq)]
pub(crate) enum EnvOp {
    /// Set `key` to `value`.
    Set {
        key: String,
        value: Value,
        var: String,
    },
    /// Override flag `name` with `on`, `off` or a percent.
    Flag {
        name: String,
        raw: String,
        var: String,
    },
}

/// What `env` sets: legacy names first, canonical names next (so they win),
/// flag overrides last. Empty values count as unset.
pub(crate) fn plan(
    env: &[(String, String)],
    kinds: &BTreeMap<String, Kind>,
) -> Result<Vec<EnvOp>, ConfigError> {
    let canonical: BTreeMap<String, (&str, Kind)> = kinds
        .iter()
        .map(|(k, &kind)| (env_name(k), (k.as_str(), kind)))
        .collect();
    let mut vars: Vec<&(String, String)> = env
        .iter()
        .filter(|(var, raw)| var.starts_with("INGOT_") && !raw.is_empty())
        .filter(|(var, _)| !NOT_CONFIG.contains(&var.as_str()))
        .collect();
    vars.sort();
    let (mut legacy, mut named, mut flags) = (Vec::new(), Vec::new(), Vec::new());
    for (var, raw) in vars {
        let set = |key: &str, kind| EnvOp::Set {
            key: key.to_string(),
            value: value(raw, kind),
            var: var.clone(),
        };
        if let Some((_, key)) = LEGACY.iter().find(|(name, _)| name == var) {
            let kind = kinds.get(*key).copied().unwrap_or(Kind::Scalar);
            legacy.push(set(key, kind));
        } else if let Some((key, kind)) = canonical.get(var) {
            named.push(set(key, *kind));
        } else if let Some(name) = var.strip_prefix(FLAG_PREFIX) {
            flags.push(EnvOp::Flag {
                name: name.to_ascii_lowercase(),
                raw: raw.clone(),
                var: var.clone(),
            });
        } else {
            reject_lookalike(var, raw, kinds)?;
        }
    }
    legacy.extend(named);
    legacy.extend(flags);
    Ok(legacy)
}

/// An environment string as the value of a leaf of `kind`.
fn value(raw: &str, kind: Kind) -> Value {
    let t = raw.trim();
    match kind {
        Kind::String => Value::String(raw.to_string()),
        Kind::Bool => match t.to_ascii_lowercase().as_str() {
            "1" | "true" | "on" | "yes" => Value::Bool(true),
            "0" | "false" | "off" | "no" => Value::Bool(false),
            _ => Value::String(raw.to_string()),
        },
        Kind::Scalar => match serde_json::from_str::<Value>(t) {
            Ok(v) if !v.is_object() && !v.is_array() => v,
            _ => Value::String(raw.to_string()),
        },
    }
}

/// `INGOT_<SECTION>_<anything>` that matched no key: a typo, reported with
/// the section's keys. Anything else under `INGOT_` is not ours to judge.
fn reject_lookalike(
    var: &str,
    raw: &str,
    kinds: &BTreeMap<String, Kind>,
) -> Result<(), ConfigError> {
    let origin = Source::Env(var.to_string());
    let value = Value::String(raw.to_string());
    if var.starts_with("INGOT_FLAGS_") {
        return Err(ConfigError::key(
            "flags",
            Some(&value),
            origin,
            "unknown variable; flags are set with INGOT_FLAG_<NAME>=on|off|<percent>",
        ));
    }
    let sections: Vec<&str> = kinds.keys().filter_map(|k| k.split('.').next()).collect();
    for section in sections {
        let prefix = format!("INGOT_{}_", section.to_ascii_uppercase());
        let Some(rest) = var.strip_prefix(&prefix) else {
            continue;
        };
        let keys: Vec<&str> = kinds
            .keys()
            .filter_map(|k| k.strip_prefix(section)?.strip_prefix('.'))
            .collect();
        return Err(ConfigError::key(
            format!("{section}.{}", rest.to_ascii_lowercase()),
            Some(&value),
            origin,
            format!("unknown key; expected one of {}", keys.join(", ")),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::schema::leaf_kinds;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn canonical_names_are_unique() {
        let kinds = leaf_kinds();
        let mut names: Vec<String> = kinds.keys().map(|k| env_name(k)).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), kinds.len());
        assert_eq!(
            env_name("scheduler.max_num_seqs"),
            "INGOT_SCHEDULER_MAX_NUM_SEQS"
        );
    }

    #[test]
    fn non_config_variables_are_never_rejected() {
        let env = vars(&[
            ("INGOT_CACHE", "/tmp/c"),
            ("INGOT_REQUIRE_CUDA_KERNELS", "1"),
            ("INGOT_BIN", "target/debug/ingot"),
            ("INGOT_BINARY", "ingot"),
            ("INGOT_TEST_MODEL", "/m.gguf"),
            ("INGOT_SOMETHING_ELSE", "x"),
            ("PATH", "/bin"),
        ]);
        assert_eq!(plan(&env, &leaf_kinds()).unwrap(), vec![]);
    }

    #[test]
    fn legacy_names_apply_before_canonical_ones() {
        let env = vars(&[("INGOT_SERVER_PORT", "9001"), ("INGOT_PORT", "9000")]);
        let ops = plan(&env, &leaf_kinds()).unwrap();
        let keys: Vec<(&str, &Value)> = ops
            .iter()
            .map(|op| match op {
                EnvOp::Set { var, value, .. } => (var.as_str(), value),
                EnvOp::Flag { .. } => panic!("{op:?}"),
            })
            .collect();
        assert_eq!(
            keys,
            vec![
                ("INGOT_PORT", &Value::from(9000)),
                ("INGOT_SERVER_PORT", &Value::from(9001))
            ]
        );
    }

    #[test]
    fn values_follow_the_leaf_kind() {
        assert_eq!(value("8000", Kind::String), Value::from("8000"));
        assert_eq!(value("1", Kind::Bool), Value::Bool(true));
        assert_eq!(value("0", Kind::Bool), Value::Bool(false));
        assert_eq!(value("maybe", Kind::Bool), Value::from("maybe"));
        assert_eq!(value("64", Kind::Scalar), Value::from(64));
        assert_eq!(value("10m", Kind::Scalar), Value::from("10m"));
        assert_eq!(value("[1]", Kind::Scalar), Value::from("[1]"));
    }

    #[test]
    fn lookalikes_are_typos() {
        let env = vars(&[("INGOT_SCHEDULER_MAX_NUM_SEQ", "8")]);
        let e = plan(&env, &leaf_kinds()).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "scheduler.max_num_seq = \"8\" (env INGOT_SCHEDULER_MAX_NUM_SEQ): unknown key; expected one of "
            ),
            "{e}"
        );
        assert!(e.contains("max_num_seqs"), "{e}");
        let env = vars(&[("INGOT_FLAGS_COALESCING", "off")]);
        let e = plan(&env, &leaf_kinds()).unwrap_err().to_string();
        assert!(e.contains("INGOT_FLAG_<NAME>"), "{e}");
    }
}
