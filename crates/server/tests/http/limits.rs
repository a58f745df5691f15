//! Limits and refusals: the configured output cap, the engine's refusals
//! (context, overload, unavailable), timeouts, readiness and draining.

use std::time::Duration;

use axum::http::StatusCode;
use ingot_engine::SubmitError;
use ingot_server::pipeline::GenerateError;
use serde_json::json;

use super::harness::*;
use super::tokenizer::chat_ids;

const INVALID: &str = "invalid_request_error";

#[tokio::test]
async fn max_tokens_over_the_configured_cap_is_400() {
    let server = Server::with(|c| c.limits.max_tokens = Some(4));
    let reply = server
        .post("/v1/chat/completions", chat(CHAT, json!({"max_tokens": 5})))
        .await;
    let message = reply.invalid(Some("max_tokens"));
    assert_eq!(message, "max_tokens is 5; this server allows at most 4");
    assert_eq!(server.engine.calls(), 0);
    // Asking for none gets the cap.
    server
        .post("/v1/chat/completions", chat(CHAT, json!({})))
        .await
        .ok();
    server
        .post("/v1/completions", completion(CHAT, json!({})))
        .await
        .ok();
    let caps: Vec<_> = server
        .engine
        .seen()
        .iter()
        .map(|r| r.engine.stop.max_tokens)
        .collect();
    assert_eq!(caps, [4, 4]);
}

#[tokio::test]
async fn a_request_longer_than_the_context_is_400_naming_the_prompt_field() {
    let server = Server::new();
    let room = LIMITS.max_context - chat_ids("user", "Hi").len();
    let fits = chat(CHAT, json!({"max_tokens": room}));
    server.post("/v1/chat/completions", fits).await.ok();
    let cases = [
        (
            "/v1/chat/completions",
            chat(CHAT, json!({"max_tokens": room + 1})),
            "messages",
        ),
        (
            "/v1/completions",
            completion(CHAT, json!({"max_tokens": LIMITS.max_context})),
            "prompt",
        ),
    ];
    for (path, body, param) in cases {
        let reply = server.post(path, body).await;
        let message = reply.error(
            StatusCode::BAD_REQUEST,
            INVALID,
            Some(param),
            Some("context_length_exceeded"),
        );
        assert!(
            message.contains(&LIMITS.max_context.to_string()),
            "{message}"
        );
    }
}

#[tokio::test]
async fn the_engines_too_long_refusal_names_messages_or_prompt() {
    let server = Server::new();
    server.engine.set(Mode::Refuse(GenerateError::Rejected(
        SubmitError::TooLong {
            prompt_tokens: 100,
            max_tokens: 28,
            max_context: 64,
        },
    )));
    for (path, body, param) in [
        ("/v1/chat/completions", chat(CHAT, json!({})), "messages"),
        ("/v1/completions", completion(CHAT, json!({})), "prompt"),
    ] {
        let reply = server.post(path, body).await;
        let message = reply.error(
            StatusCode::BAD_REQUEST,
            INVALID,
            Some(param),
            Some("context_length_exceeded"),
        );
        assert!(
            message.contains("100 prompt tokens and max_tokens 28 (128 in total)"),
            "{message}"
        );
    }
}

#[tokio::test]
async fn an_out_of_vocabulary_token_is_400_naming_the_prompt() {
    let server = Server::new();
    let body = completion(CHAT, json!({"prompt": [1, 2, 10_000_000]}));
    let message = server
        .post("/v1/completions", body)
        .await
        .invalid(Some("prompt"));
    assert!(message.contains("10000000"), "{message}");
}

#[tokio::test]
async fn an_overloaded_engine_is_429_with_retry_after() {
    let server = Server::new();
    server.engine.set(Mode::Refuse(GenerateError::Rejected(
        SubmitError::Overloaded {
            waiting: 3,
            retry_after: Duration::from_millis(1500),
        },
    )));
    let reply = server
        .post("/v1/chat/completions", chat(CHAT, json!({})))
        .await;
    let message = reply.error(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_exceeded",
        None,
        Some("server_overloaded"),
    );
    assert!(message.contains("3 requests waiting"), "{message}");
    assert_eq!(reply.header("retry-after"), "2", "1.5 s rounds up");
    // A refused stream is a plain 429 too, not an SSE stream with an error.
    let body = completion(CHAT, json!({"stream": true}));
    let reply = server.post("/v1/completions", body).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("content-type"), "application/json");
}

#[tokio::test]
async fn an_unavailable_engine_is_503_with_retry_after() {
    let server = Server::new();
    server.engine.set(Mode::Refuse(GenerateError::Unavailable(
        "engine stopped".into(),
    )));
    let reply = server
        .post("/v1/completions", completion(CHAT, json!({})))
        .await;
    let message = reply.error(
        StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        None,
        None,
    );
    assert_eq!(message, "engine stopped");
    assert_eq!(reply.header("retry-after"), "1");
}

#[tokio::test]
async fn before_ready_and_while_draining_generation_is_503() {
    let server = Server::starting(|_| {});
    let reply = server
        .post("/v1/chat/completions", chat(CHAT, json!({})))
        .await;
    let message = reply.error(
        StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        None,
        Some("model_loading"),
    );
    assert_eq!(message, "the model is still loading");
    // Computed from how long the load has taken: 1 s at first.
    assert_eq!(reply.header("retry-after"), "1");
    server.state.set_ready();
    server
        .post("/v1/chat/completions", chat(CHAT, json!({})))
        .await
        .ok();
    server.state.start_draining();
    let reply = server
        .post("/v1/completions", completion(CHAT, json!({})))
        .await;
    let message = reply.error(
        StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        None,
        Some("shutting_down"),
    );
    assert_eq!(message, "the server is shutting down");
    // The default 30 s drain (less the moments this test took), then 1 s.
    let secs: u64 = reply.header("retry-after").parse().unwrap();
    assert!((30..=31).contains(&secs), "{secs}");
    assert_eq!(server.engine.calls(), 1);
}

#[tokio::test]
async fn the_shutdown_503_says_how_long_the_drain_can_still_take() {
    let server = Server::with(|c| {
        c.server.shutdown_timeout = ingot_config::Duration::from_secs(20);
    });
    server.state.start_draining();
    let generation = server
        .post("/v1/completions", completion(CHAT, json!({})))
        .await;
    for (path, reply) in [
        ("/v1/completions", generation),
        ("/ready", server.get("/ready").await),
    ] {
        reply.error(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            None,
            Some("shutting_down"),
        );
        let secs: u64 = reply.header("retry-after").parse().unwrap();
        assert!((20..=21).contains(&secs), "{path}: {secs}");
    }
}

/// A server whose normal tier waits at most 50 ms for a first token.
fn impatient() -> Server {
    let server = Server::with(|c| {
        c.limits.first_token_timeout.normal = ingot_config::Duration::from_millis(50);
    });
    server.engine.set(Mode::Hang);
    server
}

#[tokio::test]
async fn no_first_token_in_time_is_504() {
    let server = impatient();
    let reply = server
        .post("/v1/chat/completions", chat(CHAT, json!({})))
        .await;
    let message = reply.error(
        StatusCode::GATEWAY_TIMEOUT,
        "timeout_error",
        None,
        Some("first_token_timeout"),
    );
    assert!(message.contains("0.050 s"), "{message}");
}

#[tokio::test]
async fn no_first_token_in_time_ends_a_stream_in_a_timeout_event() {
    let server = impatient();
    let body = chat(CHAT, json!({"stream": true}));
    let chunks = server.post("/v1/chat/completions", body).await.events();
    let error = &chunks.last().unwrap()["error"];
    assert_eq!(error["type"], "timeout_error");
    assert_eq!(error["code"], "first_token_timeout");
}
