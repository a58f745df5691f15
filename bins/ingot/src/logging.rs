//! Logs to stderr through a tracing filter that can be swapped while the
//! process runs: the config's `log.level` sets it once loaded, and a config
//! reload changes it without a restart.

use std::sync::OnceLock;

use ingot_config::LogFormat;
use tracing_subscriber::layer::{Layer, Layered, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, EnvFilter, Registry};

/// The subscriber below the line writer.
type Filtered = Layered<reload::Layer<EnvFilter, Registry>, Registry>;
/// The line writer: text or JSON.
type Writer = Box<dyn Layer<Filtered> + Send + Sync>;

static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();
static FORMAT: OnceLock<reload::Handle<Writer, Filtered>> = OnceLock::new();

/// Installs the subscriber at `warn` (the default `log.level`) in text
/// until a config says otherwise.
pub fn init() {
    let (filter, handle) = reload::Layer::new(EnvFilter::new("warn"));
    let (writer, format) = reload::Layer::new(writer(LogFormat::Text));
    tracing_subscriber::registry()
        .with(filter)
        .with(writer)
        .init();
    // init() runs once, from main; a second call would have panicked above.
    let _ = FILTER.set(handle);
    let _ = FORMAT.set(format);
}

/// A stderr writer in `format`; JSON lines carry the current span and the
/// span list (so a request's lines carry its `request_id`).
fn writer(format: LogFormat) -> Writer {
    let layer = fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Text => Box::new(layer),
        LogFormat::Json => Box::new(layer.json().with_current_span(true).with_span_list(true)),
    }
}

/// Sets the line format (`log.format`); applied once the config is loaded,
/// before any request (a reload reports a change as needing a restart).
pub fn set_format(format: LogFormat) -> Result<(), String> {
    match FORMAT.get() {
        Some(handle) => handle.reload(writer(format)).map_err(|e| e.to_string()),
        None => Ok(()),
    }
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
