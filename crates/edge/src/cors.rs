//! CORS at the edge of `ingot serve` (`server.cors_allowed_origins`) and
//! `ingot route` (`cors_allowed_origins`): a browser page of an allowed
//! origin may call the API. Outside every other layer, so a preflight
//! `OPTIONS` (which carries no API key) is answered before auth.

use axum::http::{header, HeaderName, HeaderValue, Method};
use axum::Router;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// How long a browser may cache a preflight answer.
const MAX_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// `app` answering browsers of `origins` (`["*"]`: any) as its outermost
/// layer; unchanged when the list is empty (CORS off: no headers, browsers
/// keep other origins out).
pub fn with_cors(app: Router, origins: &[String]) -> Router {
    if origins.is_empty() {
        return app;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        // The config check has validated each origin as a header value.
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    app.layer(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
            // SDKs send their own headers (x-stainless-*, anthropic-version):
            // whatever the preflight asks for is allowed.
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([
                HeaderName::from_static("x-request-id"),
                HeaderName::from_static("x-ingot-cache"),
                header::RETRY_AFTER,
            ])
            .max_age(MAX_AGE),
    )
}
