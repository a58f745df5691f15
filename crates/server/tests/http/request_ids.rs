//! `x-request-id`: a client's valid id is echoed, anything else is
//! replaced by a fresh UUID v4, on every answer, errors included.

use axum::http::HeaderValue;
use serde_json::json;

use super::harness::*;

/// `8-4-4-4-12` lower-case hex, version 4, RFC 4122 variant.
fn is_uuid_v4(id: &str) -> bool {
    let groups: Vec<&str> = id.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    let hex = |g: &&str| g.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    lengths == [8, 4, 4, 4, 12]
        && groups.iter().all(hex)
        && groups[2].starts_with('4')
        && groups[3].starts_with(['8', '9', 'a', 'b'])
}

#[tokio::test]
async fn a_valid_client_id_is_echoed() {
    let server = Server::new();
    let request = post("/v1/completions", &completion(CHAT, json!({})));
    let reply = server
        .send(with_header(request, "x-request-id", "client-id-42 ok~"))
        .await;
    reply.ok();
    assert_eq!(reply.header("x-request-id"), "client-id-42 ok~");
}

#[tokio::test]
async fn every_answer_gets_a_fresh_id() {
    let server = Server::new();
    let replies = [
        server
            .post("/v1/completions", completion(CHAT, json!({})))
            .await,
        server
            .post(
                "/v1/completions",
                completion(CHAT, json!({"max_tokens": -1})),
            )
            .await,
        server.get("/nope").await,
        server.get("/v1/completions").await,
        server.get("/v1/models").await,
    ];
    let statuses: Vec<u16> = replies.iter().map(|r| r.status.as_u16()).collect();
    assert_eq!(statuses, [200, 400, 404, 405, 200]);
    let mut ids: Vec<&str> = replies.iter().map(|r| r.header("x-request-id")).collect();
    assert!(ids.iter().all(|id| is_uuid_v4(id)), "{ids:?}");
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), replies.len(), "ids are unique");
}

#[tokio::test]
async fn invalid_client_ids_are_replaced() {
    let server = Server::new();
    let long = "x".repeat(129);
    for id in [long.as_str(), "café", "tab\there", ""] {
        let mut request = post(
            "/v1/completions",
            &completion(CHAT, json!({"max_tokens": -1})),
        );
        let value = HeaderValue::from_bytes(id.as_bytes()).unwrap();
        request.headers_mut().insert("x-request-id", value);
        let reply = server.send(request).await;
        reply.invalid(Some("max_tokens"));
        assert!(is_uuid_v4(reply.header("x-request-id")), "{id:?}");
    }
}
