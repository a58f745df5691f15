//! API keys at the edge: who may call, which models exist for them, and
//! their rate limits.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use ingot_config::ApiKeyEntry;
use serde_json::json;

use super::harness::*;

const KEY: &str = "sk-test-SECRET";

/// A server whose only key is `entry`'s, under secret [`KEY`].
fn keyed(edit: impl FnOnce(&mut ApiKeyEntry)) -> Server {
    let mut entry = api_key("k", KEY);
    edit(&mut entry);
    Server::with(|c| c.auth.api_keys = vec![entry])
}

/// `request` presenting `key` as a bearer token.
fn bearer(request: Request<Body>, key: &str) -> Request<Body> {
    with_header(request, "authorization", &format!("Bearer {key}"))
}

fn chat_as(key: &str) -> Request<Body> {
    bearer(post("/v1/chat/completions", &chat(CHAT, json!({}))), key)
}

fn refused_401(reply: &Reply) {
    let code = Some("invalid_api_key");
    reply.error(
        StatusCode::UNAUTHORIZED,
        "invalid_request_error",
        None,
        code,
    );
    assert_eq!(reply.header("www-authenticate"), "Bearer");
}

fn rate_limited(reply: &Reply) -> String {
    let code = Some("rate_limit_exceeded");
    reply.error(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_exceeded",
        None,
        code,
    )
}

#[tokio::test]
async fn without_a_valid_key_a_request_is_401_but_probes_are_open() {
    let server = keyed(|_| {});
    refused_401(
        &server
            .post("/v1/chat/completions", chat(CHAT, json!({})))
            .await,
    );
    refused_401(&server.send(chat_as("sk-wrong")).await);
    refused_401(
        &server
            .send(with_header(get("/v1/models"), "x-api-key", "sk-wrong"))
            .await,
    );
    for path in ["/health", "/ready", "/metrics"] {
        assert_eq!(server.get(path).await.status, StatusCode::OK, "{path}");
    }
    assert_eq!(server.engine.calls(), 0);
}

#[tokio::test]
async fn keys_are_taken_by_bearer_x_api_key_key_file_and_flag() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.toml");
    let from_file = "sk-file-SECRET";
    let entry = format!(
        "[[api_keys]]\nid = \"from-file\"\nsha256 = \"{}\"\n",
        ingot_edge::hash_key_hex(from_file)
    );
    std::fs::write(&file, entry).unwrap();
    let server = Server::with(|c| {
        c.auth.api_keys = vec![api_key("k", KEY)];
        c.auth.key_file = Some(file);
        c.auth.api_key_sha256 = Some(ingot_edge::hash_key_hex("sk-flag-SECRET"));
    });
    server.send(chat_as(KEY)).await.ok();
    let request = post("/v1/chat/completions", &chat(CHAT, json!({})));
    server
        .send(with_header(request, "x-api-key", KEY))
        .await
        .ok();
    server.send(bearer(get("/v1/models"), from_file)).await.ok();
    let reply = server
        .send(bearer(get("/v1/models"), "sk-flag-SECRET"))
        .await;
    reply.ok();
    assert!(
        reply.headers.get("x-ratelimit-limit-requests").is_none(),
        "an unlimited key"
    );
    assert_eq!(server.engine.calls(), 2);
}

#[tokio::test]
async fn a_model_the_key_may_not_use_does_not_exist_for_it() {
    let server = keyed(|k| k.models = vec!["some-other-model".into()]);
    let requests = [
        post("/v1/completions", &completion(CHAT, json!({}))),
        post("/v1/completions", &json!({"prompt": "Hi"})),
        post("/v1/chat/completions", &chat(CHAT, json!({}))),
    ];
    for request in requests {
        let reply = server.send(bearer(request, KEY)).await;
        let code = Some("model_not_found");
        let message = reply.error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("model"),
            code,
        );
        assert_eq!(message, "the model 'm' does not exist");
    }
    let listed = server.send(bearer(get("/v1/models"), KEY)).await.ok();
    assert_eq!(listed["data"], json!([]));
    assert_eq!(server.engine.calls(), 0);
    server.assert_never_built();
}

#[tokio::test]
async fn a_key_sees_only_the_models_it_may_use() {
    let server = keyed(|k| k.models = vec![PLAIN.into()]);
    let listed = server.send(bearer(get("/v1/models"), KEY)).await.ok();
    let ids: Vec<_> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids, [PLAIN]);
    let body = completion(PLAIN, json!({}));
    server
        .send(bearer(post("/v1/completions", &body), KEY))
        .await
        .ok();
}

#[tokio::test]
async fn admin_endpoints_need_an_admin_key() {
    let server = Server::with(|c| {
        let mut root = api_key("root", "sk-root-SECRET");
        root.admin = true;
        c.auth.api_keys = vec![api_key("k", KEY), root];
    });
    refused_401(&server.get("/admin/flags").await);
    let reply = server.send(bearer(get("/admin/flags"), KEY)).await;
    let code = Some("admin_key_required");
    reply.error(StatusCode::FORBIDDEN, "invalid_request_error", None, code);
    server
        .send(bearer(get("/admin/flags"), "sk-root-SECRET"))
        .await
        .ok();
    let config = server
        .send(bearer(get("/admin/config"), "sk-root-SECRET"))
        .await;
    config.ok();
    assert!(!config.text().contains("SECRET"), "no key text");
}

#[tokio::test]
async fn the_admin_config_shows_no_key_hash() {
    let keys = [KEY, "sk-root-SECRET", "sk-flag"];
    let server = Server::with(|c| {
        let mut root = api_key("root", keys[1]);
        root.admin = true;
        c.auth.api_keys = vec![api_key("k", KEY), root];
        c.auth.api_key_sha256 = Some(ingot_edge::hash_key_hex(keys[2]));
    });
    let reply = server
        .send(bearer(get("/admin/config"), "sk-root-SECRET"))
        .await;
    let body = reply.ok();
    let text = reply.text().to_ascii_lowercase();
    for key in keys {
        let hash = ingot_edge::hash_key_hex(key);
        assert!(!text.contains(&hash), "the hash of {key} is shown: {text}");
        assert!(!text.contains(key.to_ascii_lowercase().as_str()), "{key}");
    }
    assert_eq!(body["api_keys"]["count"], 3);
    assert_eq!(body["api_keys"]["ids"], json!(["k", "root", "api-key"]));
    let auth = &body["config"]["auth"];
    assert_eq!(auth["api_keys"][0]["id"], "k");
    assert_eq!(auth["api_keys"][0]["sha256"], "<redacted>");
    assert_eq!(auth["api_key_sha256"], "<redacted>");
}

#[tokio::test]
async fn rate_limit_headers_count_down() {
    let server = keyed(|k| {
        k.requests_per_minute = Some(60);
        k.tokens_per_minute = Some(600);
    });
    let mut remaining = Vec::new();
    for _ in 0..3 {
        let reply = server.send(bearer(get("/v1/models"), KEY)).await;
        assert_eq!(reply.header("x-ratelimit-limit-requests"), "60");
        assert!(reply.header("x-ratelimit-reset-requests").ends_with('s'));
        assert_eq!(reply.header("x-ratelimit-remaining-tokens"), "600");
        remaining.push(reply.header("x-ratelimit-remaining-requests").to_string());
    }
    assert_eq!(remaining, ["59", "58", "57"]);
    let body = completion(CHAT, json!({"max_tokens": 4}));
    let reply = server
        .send(bearer(post("/v1/completions", &body), KEY))
        .await;
    let reserved = reply.ok()["usage"]["prompt_tokens"].as_u64().unwrap() + 4;
    let left: u64 = reply
        .header("x-ratelimit-remaining-tokens")
        .parse()
        .unwrap();
    // 600/min refills one token per 100 ms: none in a test this fast.
    assert!(
        (600 - reserved..600 - reserved + 2).contains(&left),
        "{left}"
    );
    // More than a minute's tokens can never fit: 429 without Retry-After.
    let body = completion(CHAT, json!({"max_tokens": 700}));
    let reply = server
        .send(bearer(post("/v1/completions", &body), KEY))
        .await;
    rate_limited(&reply);
    assert!(reply.headers.get("retry-after").is_none());
}

#[tokio::test]
async fn over_the_request_rate_is_429_with_retry_after() {
    let server = keyed(|k| k.requests_per_minute = Some(2));
    server.send(chat_as(KEY)).await.ok();
    server.send(chat_as(KEY)).await.ok();
    let refused = server.send(chat_as(KEY)).await;
    let message = rate_limited(&refused);
    assert!(!message.contains(KEY), "the key never appears: {message}");
    assert_eq!(refused.header("retry-after"), "30");
    assert_eq!(refused.header("x-ratelimit-remaining-requests"), "0");
    assert_eq!(server.engine.calls(), 2);
}

#[tokio::test]
async fn the_concurrency_cap_holds_until_the_stream_ends() {
    let server = keyed(|k| k.max_concurrent = Some(1));
    let gate = server.engine.hold();
    let body = chat(CHAT, json!({"stream": true}));
    let stream = server
        .head(bearer(post("/v1/chat/completions", &body), KEY))
        .await;
    let refused = server.send(chat_as(KEY)).await;
    rate_limited(&refused);
    assert_eq!(refused.header("retry-after"), "1");
    // Read to its end, the stream frees the slot.
    gate.open();
    Reply::read(stream).await.events();
    let server = keyed(|k| k.max_concurrent = Some(1));
    server.engine.set(Mode::Hang);
    // Sampled: not shared, so the next request cannot join the hung one.
    let sampled = chat(CHAT, json!({"stream": true, "temperature": 0.9}));
    let stream = server
        .head(bearer(post("/v1/chat/completions", &sampled), KEY))
        .await;
    rate_limited(&server.send(chat_as(KEY)).await);
    // So does a client that hangs up mid-stream.
    drop(stream);
    server.engine.set(Mode::Answer);
    server.send(chat_as(KEY)).await.ok();
}
