//! Counts every HTTP answer by route and status class, so error rates and
//! traffic per endpoint come from the server itself rather than a proxy.
//!
//! The route label is axum's matched path (a fixed set), never the raw
//! URI: arbitrary paths from clients would make the series unbounded.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use ingot_edge::status_class;
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, Unit};

/// The series name.
pub const HTTP_REQUESTS: &str = "ingot_http_requests_total";

/// Request head to its generations handed to the engine (histogram).
pub const PREPARE_SECONDS: &str = "ingot_request_prepare_seconds";

/// Request head to the first token's SSE chunk (histogram, streams only).
pub const HTTP_TTFT_SECONDS: &str = "ingot_http_time_to_first_token_seconds";

/// The route label of a request that matched no route.
const OTHER_ROUTE: &str = "other";

/// A response extension naming the model that served the request: its
/// answer is counted under that model, not under the recorder's global
/// `model` label (the server's default model).
#[derive(Debug, Clone)]
pub struct ServedBy(pub String);

/// Describes the server's own series (HELP text and units); called once
/// the recorder is installed.
pub fn describe() {
    describe_counter!(
        HTTP_REQUESTS,
        Unit::Count,
        "HTTP answers by matched route and status class (2xx, 4xx, 5xx)."
    );
    describe_counter!(
        crate::error::REJECTIONS,
        Unit::Count,
        "Requests refused before generating, by reason."
    );
    describe_counter!(
        crate::routes::STREAMS_CUT,
        Unit::Count,
        "Streams cut off because the client stopped reading, by reason (stall, overflow)."
    );
    // Exported at zero from the start, so rate() and alerts see them.
    for reason in ["stall", "overflow"] {
        metrics::counter!(crate::routes::STREAMS_CUT, "reason" => reason).absolute(0);
    }
    describe_histogram!(
        PREPARE_SECONDS,
        Unit::Seconds,
        "From a generation request's head to its generations being handed to the engine: body, parsing, validation, chat template, tokenization, admission."
    );
    describe_histogram!(
        HTTP_TTFT_SECONDS,
        Unit::Seconds,
        "From a streaming request's head to its first token's SSE chunk being queued for the connection."
    );
    describe_gauge!(
        crate::conn::CONNECTIONS,
        Unit::Count,
        "Open HTTP connections."
    );
    describe_counter!(
        crate::conn::TAKEN_OVER,
        Unit::Count,
        "Connections closed at the connection cap to give their slot to a new one: the connection idle longest, with no request in flight."
    );
    describe_counter!(
        ingot_edge::KEY_REQUESTS,
        Unit::Count,
        "Answers to requests with an API key, by key id and status class."
    );
    describe_counter!(
        ingot_edge::KEY_TOKENS,
        Unit::Count,
        "Tokens used by requests with an API key, by key id and kind (prompt, completion)."
    );
    describe_pipeline();
}

/// HELP text of the response cache's, the coalescer's and the flags'
/// series (kept here, next to the other server series, rather than spread
/// over the modules that update them).
fn describe_pipeline() {
    let counters = [
        (
            "ingot_response_cache_hits_total",
            "Requests answered from the response cache.",
        ),
        (
            "ingot_response_cache_misses_total",
            "Shareable requests the response cache did not hold.",
        ),
        (
            "ingot_response_cache_evictions_total",
            "Responses evicted from the cache (bounds or TTL).",
        ),
        (
            "ingot_coalesced_requests_total",
            "Requests that joined an identical generation in flight.",
        ),
        (
            "ingot_flag_decisions_total",
            "Feature flag decisions, by flag and result.",
        ),
    ];
    for (name, help) in counters {
        describe_counter!(name, Unit::Count, help);
    }
    describe_gauge!(
        "ingot_response_cache_entries",
        Unit::Count,
        "Responses in the cache."
    );
    describe_gauge!(
        "ingot_response_cache_bytes",
        Unit::Bytes,
        "Bytes of responses in the cache."
    );
    describe_gauge!(
        "ingot_coalesced_subscribers",
        Unit::Count,
        "Requests currently reading a shared generation."
    );
}

/// Middleware: counts the answer once its status is known (for a stream,
/// when the headers go out).
pub async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| OTHER_ROUTE.to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    let status = status_class(response.status());
    match response.extensions().get::<ServedBy>() {
        Some(ServedBy(model)) => counter!(
            HTTP_REQUESTS,
            "route" => route,
            "status" => status,
            "model" => model.clone()
        )
        .increment(1),
        None => counter!(HTTP_REQUESTS, "route" => route, "status" => status).increment(1),
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn status_classes() {
        assert_eq!(status_class(StatusCode::OK), "2xx");
        assert_eq!(status_class(StatusCode::TOO_MANY_REQUESTS), "4xx");
        assert_eq!(status_class(StatusCode::SERVICE_UNAVAILABLE), "5xx");
        assert_eq!(status_class(StatusCode::NOT_MODIFIED), "3xx");
    }
}
