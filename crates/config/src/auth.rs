//! `[auth]`: API keys, what each may do, and its rate limits. The config
//! holds only SHA-256 hashes of keys, so `config show`, `/admin/config` and
//! logs can print it whole without leaking a key.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API keys and the paths that need none. Auth is off (every request is
/// served, as before keys existed) while no key is configured: no
/// `api_keys`, no `key_file` and no `--api-key`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSection {
    /// The keys, each with its limits.
    pub api_keys: Vec<ApiKeyEntry>,
    /// A TOML file of more keys (`[[api_keys]]` entries as above), read at
    /// start-up and at every reload. Setting it turns auth on even while the
    /// file lists no key.
    pub key_file: Option<PathBuf>,
    /// SHA-256 (hex) of the `--api-key` key: an admin key without limits.
    /// The binary hashes the flag's value, so the key itself is never kept.
    pub api_key_sha256: Option<String>,
    /// Paths served without a key (exact matches).
    pub open_paths: Vec<String>,
}

impl Default for AuthSection {
    fn default() -> Self {
        Self {
            api_keys: Vec::new(),
            key_file: None,
            api_key_sha256: None,
            open_paths: ["/health", "/ready", "/metrics"].map(String::from).to_vec(),
        }
    }
}

impl AuthSection {
    /// Whether any key is configured (else every request is served).
    pub fn enabled(&self) -> bool {
        !self.api_keys.is_empty() || self.key_file.is_some() || self.api_key_sha256.is_some()
    }
}

/// A priority tier, as a key's ceiling.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Most urgent.
    Critical,
    /// Above normal.
    High,
    /// The default tier.
    Normal,
    /// Below normal.
    Low,
    /// Batch work.
    Background,
}

impl Tier {
    /// 0 for critical … 4 for background (the scheduler's order).
    pub fn rank(self) -> usize {
        self as usize
    }
}

/// One API key.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyEntry {
    /// Names the key in logs, metrics and errors (the key never appears).
    pub id: String,
    /// SHA-256 of the key, 64 hex digits (`printf %s KEY | sha256sum`).
    pub sha256: String,
    /// Scopes shared answers: the response cache never serves one tenant's
    /// answer to another. Keys without a tenant share one scope.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Models this key may use; `*` is any.
    #[serde(default = "any_model")]
    pub models: Vec<String>,
    /// The most urgent tier this key may ask for; more urgent requests are
    /// lowered to it.
    #[serde(default)]
    pub max_priority: Option<Tier>,
    /// May use `/admin/*`.
    #[serde(default)]
    pub admin: bool,
    /// Requests per minute (a bucket of this size refilled evenly).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub requests_per_minute: Option<u32>,
    /// Tokens per minute: prompt + max_tokens are reserved at admission.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub tokens_per_minute: Option<u32>,
    /// Requests in flight at once (streams count until they end).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_concurrent: Option<u32>,
    /// Overrides `limits.request_timeout` for this key's requests (`0s`:
    /// none).
    #[serde(default)]
    pub request_timeout: Option<crate::units::Duration>,
    /// Overrides `limits.first_token_timeout` for this key's requests
    /// (`0s`: none).
    #[serde(default)]
    pub first_token_timeout: Option<crate::units::Duration>,
}

fn any_model() -> Vec<String> {
    vec!["*".to_string()]
}

impl ApiKeyEntry {
    /// The first rule this entry breaks: (field, rule).
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.id.trim().is_empty() {
            return Err(("id", "must not be empty".into()));
        }
        if self.sha256.len() != 64 || !self.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err((
                "sha256",
                "must be 64 hex digits (SHA-256 of the key)".into(),
            ));
        }
        let limits = [
            ("requests_per_minute", self.requests_per_minute),
            ("tokens_per_minute", self.tokens_per_minute),
            ("max_concurrent", self.max_concurrent),
        ];
        for (field, v) in limits {
            if v == Some(0) {
                return Err((field, "must be at least 1 (omit it for no limit)".into()));
            }
        }
        Ok(())
    }
}

/// The first problem in a list of keys: an entry's rule, or a repeated id
/// (ids name keys in metrics and must be unique). Returns (index, field,
/// rule).
pub fn check_keys(keys: &[ApiKeyEntry]) -> Result<(), (usize, &'static str, String)> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, k) in keys.iter().enumerate() {
        k.check().map_err(|(f, m)| (i, f, m))?;
        if !seen.insert(k.id.as_str()) {
            return Err((i, "id", format!("duplicate key id {:?}", k.id)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::{load, Layers};

    fn load_text(text: &str) -> Result<crate::Loaded, String> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("ingot-auth-{}-{n}.toml", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, text).unwrap();
        let layers = Layers {
            file: Some(path.clone()),
            ..Layers::default()
        };
        let out = load(&layers).map_err(|e| e.to_string());
        let _ = std::fs::remove_file(path);
        out
    }

    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn keys_load_with_defaults_and_turn_auth_on() {
        assert!(!crate::Config::default().auth.enabled());
        let text = format!(
            "[[auth.api_keys]]\nid = \"a\"\nsha256 = \"{HASH}\"\nrequests_per_minute = 60\nmax_priority = \"high\"\n"
        );
        let l = load_text(&text).unwrap();
        let k = &l.config.auth.api_keys[0];
        assert!(l.config.auth.enabled());
        assert_eq!(k.models, vec!["*"]);
        assert_eq!(k.max_priority, Some(super::Tier::High));
        assert_eq!(k.requests_per_minute, Some(60));
        assert!(!k.admin && k.tenant.is_none());
        assert_eq!(l.config.auth.open_paths, ["/health", "/ready", "/metrics"]);
    }

    #[test]
    fn bad_entries_are_one_line_errors() {
        let e = load_text("[[auth.api_keys]]\nid = \"a\"\nsha256 = \"abc\"\n").unwrap_err();
        assert!(e.contains("auth.api_keys") && e.contains("64 hex"), "{e}");
        let two = format!(
            "[[auth.api_keys]]\nid = \"a\"\nsha256 = \"{HASH}\"\n[[auth.api_keys]]\nid = \"a\"\nsha256 = \"{HASH}\"\n"
        );
        assert!(load_text(&two).unwrap_err().contains("duplicate key id"));
        let zero =
            format!("[[auth.api_keys]]\nid = \"a\"\nsha256 = \"{HASH}\"\nmax_concurrent = 0\n");
        assert!(load_text(&zero).unwrap_err().contains("max_concurrent"));
        let typo = format!("[[auth.api_keys]]\nid = \"a\"\nsha256 = \"{HASH}\"\nrpm = 1\n");
        assert!(load_text(&typo).unwrap_err().contains("rpm"));
    }

    #[test]
    fn show_prints_keys_as_toml_that_loads_back() {
        let text = format!(
            "[[auth.api_keys]]\nid = \"a\"\nsha256 = \"{HASH}\"\ntenant = \"t\"\nmax_concurrent = 2\n"
        );
        let l = load_text(&text).unwrap();
        let shown = l.show();
        assert!(
            shown.contains("auth.api_keys = [{ admin = false, id = \"a\""),
            "{shown}"
        );
        assert_eq!(load_text(&shown).unwrap().config, l.config);
    }

    #[test]
    fn auth_is_live() {
        assert!(crate::live("auth.api_keys"));
        assert!(crate::live("auth.key_file"));
    }
}
