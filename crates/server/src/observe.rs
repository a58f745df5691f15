//! Request ids and the access log.
//!
//! Every request gets an id: the client's `x-request-id` when it is 1 to
//! [`MAX_ID_LEN`] printable ASCII characters, else a fresh one. The id is
//! put back on the request (so later layers and handlers see the same
//! value), recorded as the `request_id` field of a `request` span that every
//! log line of the request is emitted in (tower-http's `TraceLayer`, which
//! also enters the span while a streamed body is polled), and echoed in the
//! `x-request-id` response header of every answer, errors included.
//!
//! [`access_log`] writes one line per request at `info` on target
//! `ingot::access`: status, method, route, and what the handler put in the
//! response's [`Access`] extension (model, tenant, tokens, cache result).
//! A streamed answer is logged when its head is sent (`stream=true`,
//! `duration_ms` is the time to the head; tokens are not known yet).

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use rand::Rng;
use tracing::Span;

/// The header carrying the request id, both ways.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest client-supplied id kept.
pub const MAX_ID_LEN: usize = 128;

/// The log target of access lines.
pub const ACCESS_TARGET: &str = "ingot::access";

/// Whether a client's id is kept: 1 to [`MAX_ID_LEN`] bytes of printable
/// ASCII (space to `~`).
pub fn valid_id(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && id.iter().all(|b| (0x20..=0x7e).contains(b))
}

/// A fresh id: 32 hex digits formatted like a UUID v4.
pub fn new_id() -> String {
    let n: u128 = rand::rng().random();
    // Version 4, RFC 4122 variant.
    let n = (n & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let h = format!("{n:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Middleware: keeps a valid client id, else replaces it with a fresh one.
/// Runs before the span is made, so the span and the echo use this value.
pub async fn assign_id(mut req: Request, next: Next) -> Response {
    let keep = req
        .headers()
        .get(&REQUEST_ID)
        .is_some_and(|v| valid_id(v.as_bytes()));
    if !keep {
        // A fresh id is hex and dashes, always a valid header value.
        if let Ok(v) = HeaderValue::from_str(&new_id()) {
            req.headers_mut().insert(REQUEST_ID, v);
        }
    }
    next.run(req).await
}

/// The span of a request (tower-http's `MakeSpan`), with the id as a field.
/// With OpenTelemetry export on (the binary installs the W3C propagator),
/// an incoming `traceparent` becomes the span's remote parent.
pub fn request_span(req: &axum::http::Request<axum::body::Body>) -> Span {
    let id = req
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let span = tracing::info_span!("request", request_id = %id, method = %req.method(), path = %req.uri().path());
    let parent =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(req.headers())));
    if opentelemetry::trace::TraceContextExt::has_active_span(&parent) {
        // Without an OpenTelemetry layer there is nothing to attach to.
        let _ = tracing_opentelemetry::OpenTelemetrySpanExt::set_parent(&span, parent);
    }
    span
}

/// Request headers as OpenTelemetry's propagators read them.
struct Headers<'a>(&'a axum::http::HeaderMap);

impl opentelemetry::propagation::Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// What a handler knows for the access line; put in the response's
/// extensions.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// The model the request named (or the served one).
    pub model: Option<String>,
    /// The API key's tenant, if any.
    pub tenant: Option<String>,
    /// Prompt tokens (over every prompt).
    pub prompt_tokens: Option<u64>,
    /// Completion tokens (over every choice).
    pub completion_tokens: Option<u64>,
    /// Whether the answer is a stream (logged at its head).
    pub stream: bool,
    /// `x-ingot-cache`: hit, coalesced, miss or bypass.
    pub cache: Option<&'static str>,
}

/// Adds `access` to `response`.
pub fn with_access(mut response: Response, access: Access) -> Response {
    response.extensions_mut().insert(access);
    response
}

/// Middleware: one access line per request.
pub async fn access_log(req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("other", |p| p.as_str())
        .to_string();
    let response = next.run(req).await;
    let duration_ms = start.elapsed().as_secs_f64() * 1e3;
    let a = response
        .extensions()
        .get::<Access>()
        .cloned()
        .unwrap_or_default();
    let cache = a.cache.or_else(|| {
        response
            .headers()
            .get("x-ingot-cache")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                ["hit", "coalesced", "miss", "bypass"]
                    .into_iter()
                    .find(|c| *c == v)
            })
    });
    tracing::info!(
        target: ACCESS_TARGET,
        status = response.status().as_u16(),
        method = %method,
        route = %route,
        model = a.model.as_deref(),
        tenant = a.tenant.as_deref(),
        prompt_tokens = a.prompt_tokens,
        completion_tokens = a.completion_tokens,
        stream = a.stream,
        duration_ms = (duration_ms * 1e3).round() / 1e3,
        cache = cache,
        "{}",
        if a.stream { "access (stream, logged at head)" } else { "access" }
    );
    response
}

/// Exports a finished generation's engine phases as OpenTelemetry spans,
/// children of `parent` (the request span): `queue` (submitted until a step
/// first scheduled it), `prefill` (until its first token) and `decode`
/// (until its last). They are built with explicit times, as the engine
/// thread measured them, rather than entered as tracing spans. Nothing
/// happens unless `parent` is sampled for export.
pub fn engine_phases(
    parent: &Span,
    submitted: Instant,
    queue_time: std::time::Duration,
    first_token: Option<Instant>,
    end: Instant,
) {
    use opentelemetry::trace::{Span as _, TraceContextExt, Tracer};
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    let cx = parent.context();
    if !cx.span().span_context().is_sampled() {
        return;
    }
    let (now, wall) = (Instant::now(), std::time::SystemTime::now());
    let at = |t: Instant| wall - now.saturating_duration_since(t);
    let scheduled = (submitted + queue_time).min(end);
    let first = first_token.unwrap_or(end).max(scheduled);
    let tracer = opentelemetry::global::tracer("ingot");
    for (name, from, to) in [
        ("queue", submitted, scheduled),
        ("prefill", scheduled, first),
        ("decode", first, end),
    ] {
        let mut span = tracer
            .span_builder(name)
            .with_start_time(at(from))
            .start_with_context(&tracer, &cx);
        span.end_with_timestamp(at(to));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_bounded_printable_ascii() {
        assert!(valid_id(b"abc-123"));
        assert!(valid_id(b"a b~"));
        assert!(valid_id(&[b'x'; MAX_ID_LEN]));
        assert!(!valid_id(&[b'x'; MAX_ID_LEN + 1]));
        assert!(!valid_id(b""));
        assert!(!valid_id(b"tab\there"));
        assert!(!valid_id("é".as_bytes()));
        assert!(!valid_id(b"nul\0"));
    }

    #[test]
    fn fresh_ids_look_like_uuid_v4() {
        let a = new_id();
        assert_eq!(a.len(), 36);
        assert!(valid_id(a.as_bytes()));
        let parts: Vec<&str> = a.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'));
        assert!(matches!(parts[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'));
        assert_ne!(a, new_id());
    }
}
