//! What the response cache and the coalescer decide, as `x-ingot-cache`
//! reports it and as the engine stage sees it. A hit touches no engine:
//! the registry never builds the model.

use serde_json::{json, Value};

use super::harness::*;

async fn twice(server: &Server, body: Value, header: Option<&str>) -> [String; 2] {
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let mut request = post("/v1/chat/completions", &body);
        if let Some(value) = header {
            request = with_header(request, "cache-control", value);
        }
        let reply = server.send(request).await;
        assert_eq!(reply.ok()["choices"][0]["message"]["content"], REPLY);
        statuses.push(reply.cache().to_string());
    }
    statuses.try_into().unwrap()
}

#[tokio::test]
async fn a_greedy_request_repeated_is_a_hit_without_any_engine() {
    let server = Server::with(response_cache);
    let statuses = twice(&server, chat(CHAT, json!({})), None).await;
    assert_eq!(statuses, ["miss", "hit"]);
    assert_eq!(server.engine.calls(), 1);
    assert!(server.engine.seen()[0].key.is_some());
    server.assert_never_built();
}

#[tokio::test]
async fn a_hit_replays_the_same_answer_and_usage_streamed() {
    let server = Server::with(response_cache);
    let whole = server
        .post("/v1/completions", completion(CHAT, json!({})))
        .await
        .ok();
    let body = completion(
        CHAT,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let reply = server.post("/v1/completions", body).await;
    let chunks = reply.events();
    assert_eq!(reply.cache(), "hit", "streaming does not change the key");
    assert_eq!(streamed_text(&chunks), whole["choices"][0]["text"]);
    assert_eq!(chunks.last().unwrap()["usage"], whole["usage"]);
    assert_eq!(server.engine.calls(), 1);
}

#[tokio::test]
async fn a_seeded_sampled_request_is_cached_too() {
    let server = Server::with(response_cache);
    let body = chat(CHAT, json!({"temperature": 0.8, "seed": 3}));
    assert_eq!(twice(&server, body, None).await, ["miss", "hit"]);
}

#[tokio::test]
async fn sampled_without_seed_is_never_shared() {
    let server = Server::with(response_cache);
    let body = chat(CHAT, json!({"temperature": 0.8}));
    assert_eq!(twice(&server, body, None).await, ["bypass", "bypass"]);
    assert_eq!(server.engine.calls(), 2);
    assert!(server.engine.seen().iter().all(|r| r.key.is_none()));
}

#[tokio::test]
async fn no_store_bypasses_and_no_cache_generates_afresh() {
    let server = Server::with(response_cache);
    let body = chat(CHAT, json!({}));
    assert_eq!(
        twice(&server, body.clone(), Some("no-store")).await,
        ["bypass", "bypass"]
    );
    // no-cache skips the lookup but stores: a later plain request hits.
    assert_eq!(
        twice(&server, body.clone(), Some("no-cache")).await,
        ["miss", "miss"]
    );
    assert_eq!(twice(&server, body, None).await, ["hit", "hit"]);
    assert_eq!(server.engine.calls(), 4);
}

#[tokio::test]
async fn with_the_cache_off_a_repeat_is_a_new_generation() {
    let server = Server::new();
    assert_eq!(
        twice(&server, chat(CHAT, json!({})), None).await,
        ["miss", "miss"]
    );
    assert_eq!(server.engine.calls(), 2);
}

#[tokio::test]
async fn identical_requests_in_flight_share_one_generation() {
    let server = Server::new();
    let gate = server.engine.hold();
    let body = chat(CHAT, json!({"stream": true}));
    // A stream's head comes once its generation started (or was joined),
    // so both have arrived before the gate opens.
    let first = server.head(post("/v1/chat/completions", &body)).await;
    let second = server.head(post("/v1/chat/completions", &body)).await;
    assert_eq!(first.headers()["x-ingot-cache"], "miss");
    assert_eq!(second.headers()["x-ingot-cache"], "coalesced");
    gate.open();
    for response in [first, second] {
        let chunks = Reply::read(response).await.events();
        assert_eq!(streamed_text(&chunks), REPLY);
    }
    assert_eq!(server.engine.calls(), 1);
    server.assert_never_built();
}

#[tokio::test]
async fn different_requests_in_flight_are_not_shared() {
    let server = Server::new();
    let gate = server.engine.hold();
    let first = server
        .head(post(
            "/v1/chat/completions",
            &chat(CHAT, json!({"stream": true})),
        ))
        .await;
    let other = chat(CHAT, json!({"stream": true, "max_tokens": 2}));
    let second = server.head(post("/v1/chat/completions", &other)).await;
    assert_eq!(second.headers()["x-ingot-cache"], "miss");
    gate.open();
    let texts = [
        streamed_text(&Reply::read(first).await.events()),
        streamed_text(&Reply::read(second).await.events()),
    ];
    assert_eq!(texts, [REPLY, &REPLY[..2]]);
    assert_eq!(server.engine.calls(), 2);
}

#[tokio::test]
async fn sampled_requests_in_flight_are_not_coalesced() {
    let server = Server::new();
    let gate = server.engine.hold();
    let body = chat(CHAT, json!({"stream": true, "temperature": 0.9}));
    let first = server.head(post("/v1/chat/completions", &body)).await;
    let second = server.head(post("/v1/chat/completions", &body)).await;
    assert_eq!(first.headers()["x-ingot-cache"], "bypass");
    assert_eq!(second.headers()["x-ingot-cache"], "bypass");
    gate.open();
    drop((first, second));
    assert_eq!(server.engine.calls(), 2);
}

#[tokio::test]
async fn the_key_ignores_field_order_and_any_output_relevant_change_misses() {
    let server = Server::with(response_cache);
    let base = completion(CHAT, json!({"max_tokens": 5}));
    let first = server.post("/v1/completions", base.clone()).await;
    assert_eq!(first.cache(), "miss");
    let reordered =
        "{\n   \"max_tokens\": 5, \"temperature\": 0,\n \"prompt\": \"Hi\", \"model\": \"m\"}";
    let hit = server.send(raw_post("/v1/completions", reordered)).await;
    assert_eq!(hit.cache(), "hit");
    let (a, b) = (first.ok(), hit.ok());
    assert_eq!((&a["choices"], &a["usage"]), (&b["choices"], &b["usage"]));
    assert_ne!(a["id"], b["id"], "a replay is a new response");
    let variants = [
        json!({"stop": ["\n"]}),
        json!({"max_tokens": 4}),
        json!({"seed": 5, "temperature": 0.7}),
        json!({"seed": 6, "temperature": 0.7}),
        json!({"logprobs": 2}),
        json!({"presence_penalty": 0.5}),
    ];
    for variant in variants {
        let reply = server
            .post("/v1/completions", merged(base.clone(), &variant))
            .await;
        assert_eq!(reply.cache(), "miss", "{variant}");
    }
    assert_eq!(server.engine.calls(), 7);
}

#[tokio::test]
async fn a_chat_hit_with_logprobs_replays_them() {
    let server = Server::with(response_cache);
    let body = chat(CHAT, json!({"logprobs": true, "top_logprobs": 2}));
    let a = server.post("/v1/chat/completions", body.clone()).await;
    let b = server.post("/v1/chat/completions", body).await;
    assert_eq!((a.cache(), b.cache()), ("miss", "hit"));
    let choices = a.ok()["choices"].clone();
    assert_eq!(
        choices[0]["logprobs"]["content"].as_array().unwrap().len(),
        REPLY.len()
    );
    assert_eq!(b.ok()["choices"], choices);
}

#[tokio::test]
async fn purging_the_cache_makes_the_next_request_a_miss() {
    let server = Server::with(response_cache);
    let body = completion(CHAT, json!({}));
    server.post("/v1/completions", body.clone()).await.ok();
    let purged = server
        .post("/admin/cache/purge", json!({"model": "no-such-model"}))
        .await;
    assert_eq!(purged.ok()["purged"], 0);
    let purged = server.send(raw_post("/admin/cache/purge", "")).await;
    assert_eq!(purged.ok()["purged"], 1);
    assert_eq!(server.post("/v1/completions", body).await.cache(), "miss");
}

#[tokio::test]
async fn flags_come_from_the_environment_and_are_listed() {
    let server = Server::with_env(&[("INGOT_FLAG_COALESCING", "off")]);
    let flags = server.get("/admin/flags").await.ok();
    let coalescing = flags["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "coalescing")
        .unwrap()
        .clone();
    assert_eq!(coalescing["enabled"], false);
    let source = coalescing["sources"]["enabled"].as_str().unwrap();
    assert!(source.contains("INGOT_FLAG_COALESCING"), "{source}");
    let reply = server
        .post("/v1/completions", completion(CHAT, json!({})))
        .await;
    assert_eq!(
        reply.cache(),
        "bypass",
        "coalescing and the cache off: nothing shared"
    );
}
