//! CORS at the router's edge (`cors_allowed_origins`).

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};

use super::harness::{header_of, start, FakeWorker};

fn config(origins: &str, worker: &FakeWorker) -> String {
    format!(
        "cors_allowed_origins = {origins}\npolicy = \"round_robin\"\n[workers]\nurls = [{:?}]\n",
        worker.url
    )
}

#[tokio::test(start_paused = true)]
async fn preflight_and_simple_requests_of_an_allowed_origin() {
    let a = FakeWorker::ok("cors-a");
    let r = start(&config(r#"["https://app.example"]"#, &a), &[&a]).await;
    let preflight = Request::builder()
        .method(Method::OPTIONS)
        .uri("/v1/chat/completions")
        .header(header::ORIGIN, "https://app.example")
        .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
        .header(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            "authorization, content-type",
        )
        .body(Body::empty())
        .expect("request");
    let resp = r.call(preflight).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let allowed = |name| header_of(&resp, name).map(str::to_string);
    assert_eq!(
        allowed("access-control-allow-origin").as_deref(),
        Some("https://app.example")
    );
    assert!(allowed("access-control-allow-methods").is_some_and(|m| m.contains("POST")));
    assert!(allowed("access-control-allow-headers").is_some_and(|h| h.contains("authorization")));
    assert_eq!(a.posts(), 0, "a preflight never reaches a worker");
    let simple = Request::get("/v1/models")
        .header(header::ORIGIN, "https://app.example")
        .body(Body::empty())
        .expect("request");
    let resp = r.call(simple).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        header_of(&resp, "access-control-allow-origin"),
        Some("https://app.example")
    );
    let other = Request::get("/v1/models")
        .header(header::ORIGIN, "https://evil.example")
        .body(Body::empty())
        .expect("request");
    let resp = r.call(other).await;
    assert_eq!(header_of(&resp, "access-control-allow-origin"), None);
}

#[tokio::test(start_paused = true)]
async fn off_by_default() {
    let a = FakeWorker::ok("cors-off-a");
    let r = start(&config("[]", &a), &[&a]).await;
    let simple = Request::get("/v1/models")
        .header(header::ORIGIN, "https://app.example")
        .body(Body::empty())
        .expect("request");
    let resp = r.call(simple).await;
    assert_eq!(header_of(&resp, "access-control-allow-origin"), None);
}
