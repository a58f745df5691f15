//! Live reload (SIGHUP or `POST /admin/reload`): the config is loaded again
//! from its sources; keys that are safe to change live (feature flags, the
//! response cache's bounds, the log level, API keys and their limits, with
//! the key file re-read) take effect at once, every other
//! changed key is reported as needing a restart and keeps its running
//! value, so a reload never half-applies a setting.

use std::sync::Arc;

use ingot_config::{ConfigError, Loaded};

use crate::AppState;

/// Loads the config again from the same sources.
pub type ReloadFn = Arc<dyn Fn() -> Result<Loaded, ConfigError> + Send + Sync>;
/// Swaps the log filter (a tracing `EnvFilter` directive).
pub type LogLevelFn = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Keys now in effect.
    pub applied: Vec<String>,
    /// Keys that changed but keep their running value until a restart.
    pub needs_restart: Vec<String>,
}

/// Reloads `state`'s config. Fails (changing nothing) when the new config
/// is invalid or reloading is not set up.
pub fn reload(state: &AppState) -> Result<ReloadReport, String> {
    let load = state
        .reloader()
        .ok_or("this server was started without a reloadable config")?;
    let new = load().map_err(|e| e.to_string())?;
    // First, as it can still fail (the key file is re-read every time).
    state
        .edge()
        .reload(&new.config.auth)
        .map_err(|e| e.to_string())?;
    let old = state.runtime();
    let diff = ingot_config::diff(&old.config, &new.config);
    let merged = live_merge(&old, &new);
    if merged.config.log.level != old.config.log.level {
        if let Some(set) = state.log_level_setter() {
            set(&merged.config.log.level)?;
        }
    }
    state.set_runtime(merged);
    for key in &diff.applied {
        tracing::info!(key, "config reloaded");
    }
    for key in &diff.needs_restart {
        tracing::warn!(key, "config changed; needs a restart to take effect");
    }
    Ok(ReloadReport {
        applied: diff.applied,
        needs_restart: diff.needs_restart,
    })
}

/// The running config with only the live-safe sections taken from `new`.
fn live_merge(old: &Loaded, new: &Loaded) -> Loaded {
    let mut merged = old.clone();
    merged.config.flags = new.config.flags.clone();
    merged.config.cache = new.config.cache.clone();
    merged.config.log.level = new.config.log.level.clone();
    merged.config.auth = new.config.auth.clone();
    merged.config.slo = new.config.slo.clone();
    merged.config.remediation = new.config.remediation.clone();
    merged.sources.retain(|k, _| !ingot_config::live(k));
    merged.sources.extend(
        new.sources
            .iter()
            .filter(|(k, _)| ingot_config::live(k))
            .map(|(k, s)| (k.clone(), s.clone())),
    );
    merged
}
