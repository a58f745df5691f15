//! The page's files, compiled into the binary: no network at run time and
//! nothing to install beside it. They are hand-written (no build step), so
//! what is committed is what is served.

use axum::http::{header, HeaderName, HeaderValue};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// Every file of the page: its path, its type and its bytes.
pub const ASSETS: &[(&str, &str, &str)] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("../assets/index.html"),
    ),
    (
        "/ui/app.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/app.js"),
    ),
    (
        "/ui/app.css",
        "text/css; charset=utf-8",
        include_str!("../assets/app.css"),
    ),
    (
        "/ui/favicon.svg",
        "image/svg+xml",
        include_str!("../assets/favicon.svg"),
    ),
];

/// The page's own origin only: no CDN, no inline script, no framing.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
                   img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'";

/// The page's routes (`GET` of each of [`ASSETS`]), for any state type:
/// merged beside the API outside its key check.
pub fn page_routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    ASSETS
        .iter()
        .fold(Router::new(), |router, &(path, content_type, body)| {
            router.route(path, get(move || async move { serve(content_type, body) }))
        })
}

fn serve(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    let headers: [(HeaderName, HeaderValue); 4] = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        // Revalidated on every load: a new binary's page is never mixed
        // with an old one's script.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
    ];
    (headers, body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    #[tokio::test]
    async fn every_asset_is_served_with_its_type_and_policy() {
        for &(path, content_type, body) in ASSETS {
            let app: Router = page_routes();
            let req = Request::get(path).body(Body::empty()).unwrap();
            let resp = app.oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
            assert_eq!(resp.headers()[header::CONTENT_TYPE], content_type);
            assert!(resp.headers()[header::CONTENT_SECURITY_POLICY]
                .to_str()
                .unwrap()
                .contains("connect-src 'self'"));
            let got = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap();
            assert_eq!(got, body.as_bytes(), "{path}");
        }
    }

    #[test]
    fn the_page_references_only_its_own_files() {
        let (_, _, html) = ASSETS[0];
        for needle in ["/ui/app.js", "/ui/app.css", "/ui/favicon.svg"] {
            assert!(html.contains(needle), "index.html loads {needle}");
        }
        for &(path, _, body) in ASSETS {
            // An SVG's namespace is a name, not an address it loads.
            let body = body.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
            assert!(
                !body.contains("http://") && !body.contains("https://"),
                "{path} points off the origin"
            );
        }
    }
}
