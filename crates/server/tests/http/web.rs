//! The web page at `/` and its dashboard's `/ui/live`: the page's files
//! need no key (they are code), its data does.

use axum::http::{Method, StatusCode};

use super::harness::*;

const KEY: &str = "sk-web-SECRET";

fn keyed() -> Server {
    Server::with(|c| c.auth.api_keys = vec![api_key("k", KEY)])
}

#[tokio::test]
async fn the_page_is_served_without_a_key_and_its_data_needs_one() {
    let server = keyed();
    for (path, kind) in [("/", "text/html"), ("/ui/app.js", "text/javascript")] {
        let reply = server.get(path).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}");
        assert!(reply.header("content-type").starts_with(kind), "{path}");
    }
    assert!(server.get("/").await.text().contains("/ui/app.js"));
    assert_eq!(
        server.get("/ui/live").await.status,
        StatusCode::UNAUTHORIZED
    );
    let live = server
        .send(with_header(
            get("/ui/live"),
            "authorization",
            &format!("Bearer {KEY}"),
        ))
        .await
        .ok();
    assert_eq!(live["kind"], "server");
}

#[tokio::test]
async fn live_lists_every_model_with_its_state() {
    let server = Server::new();
    let live = server.get("/ui/live").await.ok();
    let models = live["models"].as_array().unwrap();
    let chat = models.iter().find(|m| m["id"] == CHAT).unwrap();
    // Nothing has loaded it (the fake builder refuses engines): no engine.
    assert_eq!(chat["state"], "on disk");
    assert!(chat["engine"].is_null(), "{chat}");
    assert!(models.iter().any(|m| m["id"] == EMBED));
    for counter in ["coalesced", "rejections", "response_cache", "http", "slo"] {
        assert!(!live[counter].is_null(), "{counter} in {live}");
    }
    assert!(live["time_ms"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn a_wrong_method_on_the_page_is_405_in_the_api_shape() {
    let server = Server::new();
    let reply = server.send(with_method(get("/"), Method::POST)).await;
    let message = reply.error(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        None,
        None,
    );
    assert_eq!(message, "method not allowed: POST /");
}
