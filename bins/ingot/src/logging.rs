//! Logs to stderr through a tracing filter that can be swapped while the
//! process runs: the config's `log.level` sets it once loaded, and a config
//! reload changes it without a restart.

use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, EnvFilter, Registry};

static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Installs the subscriber at `warn` (the default `log.level`) until a
/// config says otherwise.
pub fn init() {
    let (filter, handle) = reload::Layer::new(EnvFilter::new("warn"));
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt::layer().with_writer(std::io::stderr))
        .init();
    // init() runs once, from main; a second call would have panicked above.
    let _ = FILTER.set(handle);
}

/// Parses a `log.level` directive the way [`set`] will.
pub fn parse(directive: &str) -> Result<EnvFilter, String> {
    EnvFilter::try_new(directive).map_err(|e| e.to_string())
}

/// Replaces the filter with `directive`.
pub fn set(directive: &str) -> Result<(), String> {
    let filter = parse(directive)?;
    match FILTER.get() {
        Some(handle) => handle.reload(filter).map_err(|e| e.to_string()),
        None => Ok(()),
    }
}
