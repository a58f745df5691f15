//! Logs to stderr through a tracing filter that can be swapped while the
//! process runs: the config's `log.level` sets it once loaded, and a config
//! reload changes it without a restart. The filter applies to the log
//! lines only: with `[tracing] otlp_endpoint` set, ingot's `info` spans go
//! to the OpenTelemetry exporter whatever the log level.

use std::any::TypeId;
use std::io::IsTerminal;
use std::sync::{Arc, OnceLock};

use ingot_config::{LogFormat, TracingSection};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level};
use tracing_log::AsLog;
use tracing_subscriber::filter::{filter_fn, FilterFn, Filtered, LevelFilter};
use tracing_subscriber::layer::{Context, Layer, Layered, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, EnvFilter, Registry};

/// The line writer: text or JSON.
type Writer = Box<dyn Layer<Registry> + Send + Sync>;
/// The log lines: the writer behind the `log.level` filter.
type Logs = Filtered<reload::Layer<Writer, Registry>, reload::Layer<EnvFilter, Registry>, Registry>;
/// The subscriber below the OpenTelemetry layer.
type Base = Layered<Logs, Registry>;
/// The OpenTelemetry layer.
type Otel = tracing_opentelemetry::OpenTelemetryLayer<Base, opentelemetry_sdk::trace::Tracer>;

static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();
static FORMAT: OnceLock<reload::Handle<Writer, Registry>> = OnceLock::new();
static OTEL: OnceLock<Arc<OnceLock<Otel>>> = OnceLock::new();
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The OpenTelemetry layer, filled in once the config is read. Not a
/// `reload::Layer`: that one hides its inner layer from downcasts, and
/// `OpenTelemetrySpanExt::set_parent` (the incoming `traceparent`) finds
/// the layer by downcasting.
struct OtelSlot(Arc<OnceLock<Otel>>);

impl Layer<Base> for OtelSlot {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, Base>) {
        if let Some(l) = self.0.get() {
            l.on_new_span(attrs, id, ctx);
        }
    }

    fn on_record(&self, span: &Id, values: &Record<'_>, ctx: Context<'_, Base>) {
        if let Some(l) = self.0.get() {
            l.on_record(span, values, ctx);
        }
    }

    fn on_follows_from(&self, span: &Id, follows: &Id, ctx: Context<'_, Base>) {
        if let Some(l) = self.0.get() {
            l.on_follows_from(span, follows, ctx);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, Base>) {
        if let Some(l) = self.0.get() {
            l.on_event(event, ctx);
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, Base>) {
        if let Some(l) = self.0.get() {
            l.on_enter(id, ctx);
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, Base>) {
        if let Some(l) = self.0.get() {
            l.on_exit(id, ctx);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, Base>) {
        if let Some(l) = self.0.get() {
            l.on_close(id, ctx);
        }
    }

    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        if id == TypeId::of::<Self>() {
            return Some(self as *const Self as *const ());
        }
        // SAFETY: the inner layer lives as long as `self` (a OnceLock is
        // never emptied), which is what `downcast_raw` asks of the pointer.
        self.0.get().and_then(|l| unsafe { l.downcast_raw(id) })
    }
}

/// Installs the subscriber at `warn` (the default `log.level`) in text,
/// without trace export, until a config says otherwise.
pub fn init() {
    let (filter, handle) = reload::Layer::new(EnvFilter::new("warn"));
    let (writer, format) = reload::Layer::new(writer(LogFormat::Text));
    let otel = Arc::new(OnceLock::new());
    tracing_subscriber::registry()
        .with(writer.with_filter(filter))
        .with(OtelSlot(otel.clone()).with_filter(exported()))
        .init();
    // init() runs once, from main; a second call would have panicked above.
    log::set_max_level(log_level(&EnvFilter::new("warn")));
    let _ = FILTER.set(handle);
    let _ = FORMAT.set(format);
    let _ = OTEL.set(otel);
}

/// The spans exported: ingot's own, at `info` or above.
fn exported() -> FilterFn<fn(&tracing::Metadata<'_>) -> bool> {
    filter_fn(|m| m.is_span() && m.target().starts_with("ingot") && *m.level() <= Level::INFO)
}

/// Starts OTLP/HTTP (protobuf) export of request spans to
/// `<otlp_endpoint>/v1/traces` when the endpoint is set, with a parent-based
/// ratio sampler, and installs the W3C `traceparent` propagator. Call
/// outside an async runtime (the exporter's client blocks); [`shutdown`]
/// flushes.
pub fn start_tracing(t: &TracingSection) -> anyhow::Result<()> {
    let Some(endpoint) = &t.otlp_endpoint else {
        return Ok(());
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            t.sample_ratio,
        ))))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(t.service_name.clone())
                .build(),
        )
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("ingot"));
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    if let Some(slot) = OTEL.get() {
        if slot.set(layer).is_err() {
            anyhow::bail!("trace export is already started");
        }
    }
    // The server exports the engine's phases (queue, prefill, decode) with
    // explicit times through the global tracer.
    opentelemetry::global::set_tracer_provider(provider.clone());
    let _ = PROVIDER.set(provider);
    Ok(())
}

/// Flushes and stops trace export (a no-op when it never started).
pub fn shutdown() {
    if let Some(p) = PROVIDER.get() {
        if let Err(e) = p.shutdown() {
            eprintln!("warning: trace export shutdown: {e}");
        }
    }
}

/// A stderr writer in `format`; JSON lines carry the current span and the
/// span list (so a request's lines carry its `request_id`).
fn writer(format: LogFormat) -> Writer {
    let layer = fmt::layer().with_writer(std::io::stderr).with_ansi(ansi());
    match format {
        LogFormat::Text => Box::new(layer),
        LogFormat::Json => Box::new(layer.json().with_current_span(true).with_span_list(true)),
    }
}

/// Colour codes only for a person at a terminal: never into a file or a
/// pipe (log collectors store them as text), and never with `NO_COLOR` set
/// to anything but empty (no-color.org).
fn ansi() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Sets the line format (`log.format`); applied once the config is loaded,
/// before any request (a reload reports a change as needing a restart).
pub fn set_format(format: LogFormat) -> Result<(), String> {
    let Some(handle) = FORMAT.get() else {
        return Ok(());
    };
    handle.reload(writer(format)).map_err(|e| e.to_string())?;
    // A reload lifts `log`'s cap to tracing's global level: set it again.
    if let Some(level) = FILTER.get().and_then(|h| h.with_current(log_level).ok()) {
        log::set_max_level(level);
    }
    Ok(())
}

/// Parses a `log.level` directive the way [`set`] will.
pub fn parse(directive: &str) -> Result<EnvFilter, String> {
    EnvFilter::try_new(directive).map_err(|e| e.to_string())
}

/// Whether `directive` passes `debug` lines of some target (so asks for
/// backtraces too).
pub fn is_debug(directive: &str) -> bool {
    parse(directive)
        .ok()
        .and_then(|f| f.max_level_hint())
        .is_some_and(|level| level >= LevelFilter::DEBUG)
}

/// Whether the filter in force passes `debug` lines of some target.
pub fn debug_enabled() -> bool {
    FILTER
        .get()
        .and_then(|h| h.with_current(EnvFilter::max_level_hint).ok())
        .flatten()
        .is_some_and(|level| level >= LevelFilter::DEBUG)
}

/// Replaces the filter with `directive`.
pub fn set(directive: &str) -> Result<(), String> {
    let filter = parse(directive)?;
    let level = log_level(&filter);
    if let Some(handle) = FILTER.get() {
        handle.reload(filter).map_err(|e| e.to_string())?;
    }
    log::set_max_level(level);
    Ok(())
}

/// The `log` crate's level cap for `filter`: the most verbose level it can
/// pass. Set after every reload (a reload lifts the cap to tracing's global
/// level, which the span exporter's filter leaves at `trace`). Without it,
/// libraries that use `log` (tokenizers logs per character in its
/// normalizer) hand every record to the tracing bridge to be filtered out
/// there: that was about 40 % of the time to tokenize a 1,024-token
/// prompt, on the path of every request's first token
/// (docs/perf/http-ttft.md). The exporter takes spans, never `log` records.
fn log_level(filter: &EnvFilter) -> log::LevelFilter {
    // No hint: the filter may pass anything.
    filter
        .max_level_hint()
        .map_or(log::LevelFilter::Trace, |level| level.as_log())
}
