//! CORS at the edge (`server.cors_allowed_origins`): preflights answered
//! before auth, simple requests marked, off by default.

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use serde_json::json;

use super::harness::*;

fn preflight(path: &str, origin: &str) -> Request<Body> {
    Request::builder()
        .method(Method::OPTIONS)
        .uri(path)
        .header(header::ORIGIN, origin)
        .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
        .header(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            "authorization, content-type, x-stainless-os",
        )
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn any_origin_gets_preflights_answered_without_a_key() {
    let server = Server::with(|c| {
        c.server.cors_allowed_origins = vec!["*".into()];
        c.auth.api_keys.push(api_key("k", "secret"));
    });
    let reply = server
        .send(preflight("/v1/chat/completions", "http://localhost:3000"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.header("access-control-allow-origin"), "*");
    assert!(reply
        .header("access-control-allow-methods")
        .contains("POST"));
    let headers = reply.header("access-control-allow-headers");
    assert!(headers.contains("authorization") && headers.contains("x-stainless-os"));
    // A simple request still needs its key, and carries the header either way.
    let request = with_header(
        post("/v1/chat/completions", &chat(CHAT, json!({}))),
        "origin",
        "http://localhost:3000",
    );
    let refused = server.send(request).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.header("access-control-allow-origin"), "*");
}

#[tokio::test]
async fn listed_origins_only() {
    let server = Server::with(|c| {
        c.server.cors_allowed_origins = vec!["https://app.example".into()];
    });
    let origin = |o| with_header(get("/v1/models"), "origin", o);
    let allowed = server.send(origin("https://app.example")).await;
    assert_eq!(allowed.status, StatusCode::OK);
    assert_eq!(
        allowed.header("access-control-allow-origin"),
        "https://app.example"
    );
    assert!(allowed
        .header("access-control-expose-headers")
        .contains("x-request-id"));
    let other = server.send(origin("https://other.example")).await;
    assert!(other.headers.get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn off_by_default_so_options_is_not_allowed() {
    let server = Server::new();
    let reply = server
        .send(preflight("/v1/chat/completions", "https://app.example"))
        .await;
    assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(reply.headers.get("access-control-allow-origin").is_none());
}
