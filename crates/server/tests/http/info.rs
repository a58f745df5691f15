//! Endpoints answered from the models' fronts alone (`/v1/models`, the
//! tokenizer endpoints) and the probes (`/health`, `/ready`).

use axum::http::StatusCode;
use serde_json::json;

use super::harness::*;
use super::tokenizer::{chat_ids, ids, IM_END, IM_START};

#[tokio::test]
async fn models_lists_every_model_unloaded_with_its_endpoints() {
    let server = Server::new();
    let list = server.get("/v1/models").await.ok();
    assert_eq!(list["object"], "list");
    let cards = list["data"].as_array().unwrap();
    let names: Vec<_> = cards.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(names, [CHAT, PLAIN, EMBED]);
    for card in cards {
        assert_eq!(card["object"], "model");
        assert_eq!(card["owned_by"], "ingot");
        assert_eq!(card["state"], "unloaded");
        assert!(
            card.get("max_model_len").is_none(),
            "no front built yet: {card}"
        );
    }
    assert_eq!(
        cards[0]["endpoints"],
        json!(["/v1/chat/completions", "/v1/completions"])
    );
    assert_eq!(cards[2]["endpoints"], json!(["/v1/embeddings"]));
    // Once a request has built the front, its context length is known.
    server.post("/tokenize", json!({"prompt": "x"})).await.ok();
    let list = server.get("/v1/models").await.ok();
    assert_eq!(list["data"][0]["max_model_len"], LIMITS.max_context);
    server.assert_never_built();
}

#[tokio::test]
async fn tokenize_text_and_messages_without_an_engine() {
    let server = Server::new();
    let text = server
        .post("/tokenize", json!({"prompt": "Hi!"}))
        .await
        .ok();
    assert_eq!(
        text,
        json!({"tokens": ids("Hi!"), "count": 3, "max_model_len": LIMITS.max_context})
    );
    let messages = json!({"model": CHAT, "messages": [{"role": "user", "content": "Hi"}]});
    let chat = server.post("/tokenize", messages).await.ok();
    let want = chat_ids("user", "Hi");
    assert_eq!(chat["tokens"], json!(want));
    assert_eq!(chat["count"], want.len());
    let plain = server
        .post(
            "/tokenize",
            json!({"model": PLAIN, "prompt": "<|im_start|>"}),
        )
        .await
        .ok();
    assert_eq!(
        plain["tokens"],
        json!([IM_START]),
        "special tokens are matched"
    );
    assert_eq!(server.engine.calls(), 0);
    server.assert_never_built();
}

#[tokio::test]
async fn tokenize_messages_needs_a_chat_template() {
    let server = Server::new();
    let body = json!({"model": PLAIN, "messages": [{"role": "user", "content": "Hi"}]});
    let message = server
        .post("/tokenize", body)
        .await
        .invalid(Some("messages"));
    assert!(message.contains("no chat template"), "{message}");
}

#[tokio::test]
async fn detokenize_round_trips_without_an_engine() {
    let server = Server::new();
    let mut tokens = ids("Hi there");
    tokens.push(IM_END);
    let reply = server
        .post("/detokenize", json!({"tokens": tokens}))
        .await
        .ok();
    assert_eq!(reply, json!({"prompt": "Hi there<|im_end|>"}));
    server.assert_never_built();
}

#[tokio::test]
async fn any_text_round_trips_and_messages_hold_their_content() {
    let server = Server::new();
    let text = "Hello world! 1234 ünïcödé 日本語";
    let tokens = server
        .post("/tokenize", json!({"model": CHAT, "prompt": text}))
        .await
        .ok();
    assert_eq!(tokens["count"], text.len(), "one token per byte");
    let back = server
        .post(
            "/detokenize",
            json!({"model": CHAT, "tokens": tokens["tokens"]}),
        )
        .await;
    assert_eq!(back.ok()["prompt"], text);
    let messages = json!({"messages": [{"role": "user", "content": text}]});
    let templated = server.post("/tokenize", messages).await.ok();
    let back = server
        .post("/detokenize", json!({"tokens": templated["tokens"]}))
        .await;
    assert!(back.ok()["prompt"].as_str().unwrap().contains(text));
    assert!(templated["count"].as_u64() > tokens["count"].as_u64());
}

#[tokio::test]
async fn tokenizer_info_names_the_default_models_special_tokens() {
    let server = Server::new();
    let info = server.get("/tokenizer_info").await.ok();
    assert_eq!(info["eos_token"], "<|im_end|>");
    assert_eq!(info["bos_token"], "<|endoftext|>");
    assert_eq!(info["model_max_length"], LIMITS.max_context);
    server.assert_never_built();
}

#[tokio::test]
async fn ready_turns_200_once_set_and_503_while_draining_health_stays_200() {
    let server = Server::starting(|_| {});
    let reply = server.get("/ready").await;
    let message = reply.error(
        StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        None,
        Some("model_loading"),
    );
    assert_eq!(message, "the model is still loading");
    // Computed from how long the load has taken: 1 s at first.
    assert_eq!(reply.header("retry-after"), "1");
    assert_eq!(server.get("/health").await.status, StatusCode::OK);
    server.state.set_ready();
    let reply = server.get("/ready").await;
    assert_eq!((reply.status, reply.text()), (StatusCode::OK, "ready"));
    server.state.start_draining();
    let reply = server.get("/ready").await;
    let message = reply.error(
        StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        None,
        Some("shutting_down"),
    );
    assert_eq!(message, "the server is shutting down");
    assert_eq!(server.get("/health").await.status, StatusCode::OK);
}

#[tokio::test]
async fn models_and_tokenize_wait_for_ready_too() {
    let server = Server::starting(|_| {});
    let reply = server.post("/tokenize", json!({"prompt": "x"})).await;
    reply.error(
        StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        None,
        Some("model_loading"),
    );
    // The model list is served while loading: it reports the states.
    assert_eq!(server.get("/v1/models").await.status, StatusCode::OK);
}

#[tokio::test]
async fn one_model_by_id_or_alias_and_404_for_others() {
    let server = Server::new();
    let card = server.get(&format!("/v1/models/{CHAT}")).await.ok();
    assert_eq!(card["id"], CHAT);
    assert_eq!(card["object"], "model");
    assert_eq!(card["owned_by"], "ingot");
    let by_alias = server.get(&format!("/v1/models/{ALIAS}")).await.ok();
    assert_eq!(by_alias["id"], CHAT, "an alias answers with its model");
    let missing = server.get("/v1/models/nope").await;
    let message = missing.error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("model"),
        Some("model_not_found"),
    );
    assert!(message.contains("nope"), "{message}");
    server.assert_never_built();
}
