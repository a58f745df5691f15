//! What a config reload can apply to a running server, and what waits for a
//! restart.

use std::collections::BTreeSet;

use crate::config::Config;
use crate::tree;

/// The keys that differ between two configs, split by whether a running
/// server can take them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reload {
    /// Changed keys a running server applies (flags, the response cache,
    /// the log level).
    pub applied: Vec<String>,
    /// Changed keys that take effect at the next start (the model, engine,
    /// scheduler, server sockets, CUDA switches).
    pub needs_restart: Vec<String>,
}

impl Reload {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.applied.is_empty() && self.needs_restart.is_empty()
    }
}

/// Whether a running server can apply a change to `key`: feature flags, the
/// cache, the API keys (`auth.*`), request limits and
/// `server.ignore_unknown_fields` are read per request,
/// SLOs and `remediation.*` at every evaluation, and the log filter is
/// swapped in place;
/// everything else sized or started something at start-up.
pub fn live(key: &str) -> bool {
    key.starts_with("flags.")
        || key.starts_with("cache.")
        || key.starts_with("auth.")
        || key.starts_with("limits.")
        || key == "log.level"
        || key == "server.ignore_unknown_fields"
        || is_slo_key(key)
}

/// SLOs and the remediation policy are re-read at every evaluation.
fn is_slo_key(key: &str) -> bool {
    key == "slo"
        || key.starts_with("slo.")
        || key.starts_with("slo[")
        || key.starts_with("remediation.")
}

/// The dotted leaf keys that differ (added or removed flags included), in
/// key order.
pub fn diff(old: &Config, new: &Config) -> Reload {
    let old = serde_json::to_value(old).unwrap_or_default();
    let new = serde_json::to_value(new).unwrap_or_default();
    let (a, b) = (tree::leaves(&old), tree::leaves(&new));
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let mut out = Reload::default();
    for key in keys {
        if a.get(key).copied() != b.get(key).copied() {
            let bucket = if live(key) {
                &mut out.applied
            } else {
                &mut out.needs_restart
            };
            bucket.push(key.clone());
        }
    }
    out
}
