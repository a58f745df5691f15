//! The key table: every configured key as its SHA-256 hash with what it
//! may do. A presented key is hashed and compared with every entry in
//! constant time, so response timing says nothing about how close a guess
//! came.

use std::path::Path;
use std::sync::Arc;

use ingot_config::{check_keys, ApiKeyEntry, AuthSection};
use ingot_core::Priority;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::EdgeError;
use crate::limit::KeyLimits;

/// The id of the `--api-key` key.
pub const API_KEY_ID: &str = "api-key";

/// SHA-256 of a key.
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// SHA-256 of a key, lowercase hex (what `[auth]` stores).
pub fn hash_key_hex(key: &str) -> String {
    hash_key(key).iter().map(|b| format!("{b:02x}")).collect()
}

/// 64 hex digits as 32 bytes.
fn parse_hex(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// One configured key: who it is and what it may do. Holds no key text.
pub struct Key {
    /// The configured id (what logs and metrics show).
    pub id: String,
    hash: [u8; 32],
    /// Scopes the response cache.
    pub tenant: Option<String>,
    /// Allowed models (`*`: any).
    pub models: Vec<String>,
    /// The most urgent tier allowed.
    pub max_priority: Option<Priority>,
    /// May use `/admin/*`.
    pub admin: bool,
    /// Its buckets and concurrency cap.
    pub limits: Arc<KeyLimits>,
    /// Overrides the server's request timeout (`Some(ZERO)`: none).
    pub request_timeout: Option<std::time::Duration>,
    /// Overrides the server's first-token timeout (`Some(ZERO)`: none).
    pub first_token_timeout: Option<std::time::Duration>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Key {
    /// Whether this key may use `model`.
    pub fn allows_model(&self, model: &str) -> bool {
        self.models.iter().any(|m| m == "*" || m == model)
    }

    /// `asked`, lowered to this key's ceiling.
    pub fn clamp(&self, asked: Priority) -> Priority {
        match self.max_priority {
            Some(ceiling) if asked < ceiling => ceiling,
            _ => asked,
        }
    }
}

/// Every key, and whether auth is on at all.
#[derive(Default, Debug)]
pub struct KeyTable {
    enabled: bool,
    keys: Vec<Arc<Key>>,
    open_paths: Vec<String>,
}

impl KeyTable {
    /// The table `auth` describes (reading its key file). Keys whose id and
    /// limits are unchanged from `previous` keep their buckets, so a reload
    /// does not hand a flooding key a fresh minute.
    pub fn build(auth: &AuthSection, previous: Option<&KeyTable>) -> Result<Self, EdgeError> {
        let mut entries = auth.api_keys.clone();
        if let Some(path) = &auth.key_file {
            entries.extend(read_key_file(path)?);
        }
        if let Some(sha256) = &auth.api_key_sha256 {
            entries.push(admin_entry(sha256));
        }
        if let Err((i, field, rule)) = check_keys(&entries) {
            return Err(EdgeError::Parse {
                path: auth
                    .key_file
                    .as_deref()
                    .map_or_else(|| "(none)".into(), |p| p.display().to_string()),
                message: format!("key {i}: {field} {rule}"),
            });
        }
        let keys = entries
            .iter()
            .filter_map(|e| key_of(e, previous))
            .map(Arc::new)
            .collect();
        Ok(Self {
            enabled: auth.enabled(),
            keys,
            open_paths: auth.open_paths.clone(),
        })
    }

    /// Whether requests need a key.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether `path` is served without a key.
    pub fn is_open(&self, path: &str) -> bool {
        self.open_paths.iter().any(|p| p == path)
    }

    /// Every key's id, in table order (configured keys, the key file's,
    /// then `--api-key`'s).
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.id.as_str())
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there is no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key whose hash matches `presented`'s. Every entry is compared
    /// (no early exit), each comparison in constant time.
    pub fn lookup(&self, presented: &str) -> Option<Arc<Key>> {
        let hash = hash_key(presented);
        let mut found = None;
        for key in &self.keys {
            if bool::from(key.hash.ct_eq(&hash)) {
                found = Some(key.clone());
            }
        }
        found
    }

    /// Shares every key's limits through `fleet`.
    pub(crate) fn share_limits(&self, fleet: &ingot_fleet::Fleet) {
        for key in &self.keys {
            key.limits.share(fleet, &key.id);
        }
    }

    fn get(&self, id: &str) -> Option<&Arc<Key>> {
        self.keys.iter().find(|k| k.id == id)
    }
}

fn admin_entry(sha256: &str) -> ApiKeyEntry {
    ApiKeyEntry {
        id: API_KEY_ID.to_string(),
        sha256: sha256.to_string(),
        tenant: None,
        models: vec!["*".into()],
        max_priority: None,
        admin: true,
        requests_per_minute: None,
        tokens_per_minute: None,
        max_concurrent: None,
        request_timeout: None,
        first_token_timeout: None,
    }
}

fn key_of(e: &ApiKeyEntry, previous: Option<&KeyTable>) -> Option<Key> {
    let hash = parse_hex(&e.sha256.to_ascii_lowercase())?;
    let spec = (e.requests_per_minute, e.tokens_per_minute, e.max_concurrent);
    let limits = previous
        .and_then(|t| t.get(&e.id))
        .filter(|k| k.limits.spec == spec)
        .map(|k| k.limits.clone())
        .unwrap_or_else(|| Arc::new(KeyLimits::new(spec.0, spec.1, spec.2)));
    Some(Key {
        id: e.id.clone(),
        hash,
        tenant: e.tenant.clone(),
        models: e.models.clone(),
        max_priority: e.max_priority.map(|t| Priority::from_rank(t.rank())),
        admin: e.admin,
        limits,
        request_timeout: e.request_timeout.map(|d| d.get()),
        first_token_timeout: e.first_token_timeout.map(|d| d.get()),
    })
}

/// The `[[api_keys]]` entries of a key file.
fn read_key_file(path: &Path) -> Result<Vec<ApiKeyEntry>, EdgeError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct KeyFile {
        #[serde(default)]
        api_keys: Vec<ApiKeyEntry>,
    }
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| EdgeError::Read {
        path: shown.clone(),
        message: e.to_string(),
    })?;
    let file: KeyFile = toml::from_str(&text).map_err(|e| EdgeError::Parse {
        path: shown,
        message: e.message().replace('\n', " "),
    })?;
    Ok(file.api_keys)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// `printf %s test | sha256sum`.
    const TEST_SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn entry(id: &str, key: &str) -> ApiKeyEntry {
        ApiKeyEntry {
            id: id.into(),
            sha256: hash_key_hex(key),
            tenant: None,
            models: vec!["*".into()],
            max_priority: None,
            admin: false,
            requests_per_minute: Some(10),
            tokens_per_minute: None,
            max_concurrent: None,
            request_timeout: None,
            first_token_timeout: None,
        }
    }

    fn auth(keys: Vec<ApiKeyEntry>) -> AuthSection {
        AuthSection {
            api_keys: keys,
            ..AuthSection::default()
        }
    }

    #[test]
    fn hashes_are_sha256_hex() {
        assert_eq!(hash_key_hex("test"), TEST_SHA);
        assert_eq!(parse_hex(TEST_SHA), Some(hash_key("test")));
        assert_eq!(parse_hex("zz"), None);
        assert_eq!(parse_hex(&"g".repeat(64)), None);
    }

    #[test]
    fn lookup_matches_only_the_exact_key() {
        let t = KeyTable::build(&auth(vec![entry("a", "sk-a"), entry("b", "sk-b")]), None).unwrap();
        assert!(t.enabled());
        assert_eq!(t.lookup("sk-a").unwrap().id, "a");
        assert_eq!(t.lookup("sk-b").unwrap().id, "b");
        assert!(t.lookup("sk-").is_none());
        assert!(t.lookup("sk-a ").is_none());
        assert!(t.lookup("").is_none());
        // Upper-case hex in the config matches too.
        let mut upper = entry("u", "sk-u");
        upper.sha256 = upper.sha256.to_ascii_uppercase();
        let t = KeyTable::build(&auth(vec![upper]), None).unwrap();
        assert!(t.lookup("sk-u").is_some());
    }

    #[test]
    fn no_key_means_auth_off_and_api_key_is_admin() {
        let t = KeyTable::build(&AuthSection::default(), None).unwrap();
        assert!(!t.enabled() && t.is_empty());
        assert!(t.is_open("/health") && !t.is_open("/v1/models"));
        let a = AuthSection {
            api_key_sha256: Some(hash_key_hex("sk-admin")),
            ..AuthSection::default()
        };
        let t = KeyTable::build(&a, None).unwrap();
        let k = t.lookup("sk-admin").unwrap();
        assert!(k.admin && k.id == API_KEY_ID && k.limits.requests.is_none());
    }

    #[test]
    fn models_and_priority_ceiling() {
        let mut e = entry("a", "sk-a");
        e.models = vec!["m1".into()];
        e.max_priority = Some(ingot_config::Tier::High);
        let t = KeyTable::build(&auth(vec![e]), None).unwrap();
        let k = t.lookup("sk-a").unwrap();
        assert!(k.allows_model("m1") && !k.allows_model("m2"));
        assert_eq!(k.clamp(Priority::Critical), Priority::High);
        assert_eq!(k.clamp(Priority::Low), Priority::Low);
    }

    #[test]
    fn a_reload_keeps_the_buckets_of_unchanged_keys() {
        let old =
            KeyTable::build(&auth(vec![entry("a", "sk-a"), entry("b", "sk-b")]), None).unwrap();
        let mut changed = entry("b", "sk-b");
        changed.requests_per_minute = Some(20);
        let new = KeyTable::build(&auth(vec![entry("a", "sk-a"), changed]), Some(&old)).unwrap();
        let same =
            |id: &str| Arc::ptr_eq(&old.get(id).unwrap().limits, &new.get(id).unwrap().limits);
        assert!(same("a"));
        assert!(!same("b"));
    }

    #[test]
    fn key_files_add_keys_and_bad_ones_are_errors() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("ingot-edge-keys-{}.toml", std::process::id()));
        let text = format!(
            "[[api_keys]]\nid = \"f\"\nsha256 = \"{}\"\ntenant = \"acme\"\n",
            hash_key_hex("sk-f")
        );
        std::fs::write(&path, text).unwrap();
        let a = AuthSection {
            key_file: Some(path.clone()),
            ..AuthSection::default()
        };
        let t = KeyTable::build(&a, None).unwrap();
        assert_eq!(t.lookup("sk-f").unwrap().tenant.as_deref(), Some("acme"));
        std::fs::write(&path, "[[api_keys]]\nid = \"f\"\nsha256 = \"nothex\"\n").unwrap();
        let e = KeyTable::build(&a, None).unwrap_err().to_string();
        assert!(e.contains("64 hex"), "{e}");
        std::fs::write(&path, "api_keys = 3\n").unwrap();
        assert!(KeyTable::build(&a, None).is_err());
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            KeyTable::build(&a, None),
            Err(EdgeError::Read { .. })
        ));
        // A key file turns auth on even when it lists nothing.
        std::fs::write(&path, "").unwrap();
        assert!(KeyTable::build(&a, None).unwrap().enabled());
        std::fs::remove_file(&path).unwrap();
    }
}
