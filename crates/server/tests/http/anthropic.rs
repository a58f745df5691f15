//! `POST /v1/messages` (Anthropic's Messages API) over the fake engine: the
//! message shape, stop reasons, its SSE events and its error shape. Tool
//! calls are covered by the unit tests (the fake context is too short for
//! a tool preamble) and by tests/e2e/test_anthropic.py.

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::harness::*;
use super::tokenizer::{chat_ids, ids, IM_END, IM_START};

fn message(extra: Value) -> Value {
    merged(
        json!({"model": CHAT, "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}),
        &extra,
    )
}

/// Asserts Anthropic's error shape with `status` and `kind`; the message.
fn anthropic_error(reply: &Reply, status: StatusCode, kind: &str) -> String {
    assert_eq!(reply.status, status, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    body["error"]["message"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_whole_message_has_anthropics_shape_and_usage() {
    let server = Server::new();
    let body = message(json!({"system": "Be brief.", "temperature": 0}));
    let m = server.post("/v1/messages", body).await.ok();
    assert!(m["id"].as_str().unwrap().starts_with("msg_"), "{m}");
    assert_eq!(
        (m["type"].as_str(), m["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(m["model"], CHAT);
    assert_eq!(m["content"], json!([{"type": "text", "text": REPLY}]));
    assert_eq!(m["stop_reason"], "end_turn");
    assert_eq!(m["stop_sequence"], Value::Null);
    // The system prompt is the template's system turn.
    let mut prompt = vec![IM_START];
    prompt.extend(ids("system\nBe brief."));
    prompt.push(IM_END);
    prompt.extend(ids("\n"));
    prompt.extend(chat_ids("user", "Hi"));
    assert_eq!(server.engine.seen()[0].engine.prompt, prompt);
    let usage = json!({"input_tokens": prompt.len(), "output_tokens": REPLY.len()});
    assert_eq!(m["usage"], usage);
}

#[tokio::test]
async fn stop_reasons_max_tokens_and_stop_sequence() {
    let server = Server::new();
    let m = server
        .post("/v1/messages", message(json!({"max_tokens": 3})))
        .await
        .ok();
    assert_eq!(m["content"][0]["text"], &REPLY[..3]);
    assert_eq!(m["stop_reason"], "max_tokens");
    server.engine.set(Mode::Say("Paris|London".into()));
    let body = message(json!({"stop_sequences": ["#", "|"]}));
    let m = server.post("/v1/messages", body).await.ok();
    assert_eq!(m["content"][0]["text"], "Paris");
    assert_eq!(
        (m["stop_reason"].as_str(), m["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some("|"))
    );
    let sent = &server.engine.seen()[1].engine.stop.stop_strings;
    assert_eq!(sent, &["#", "|"]);
}

#[tokio::test]
async fn a_stream_sends_anthropics_events_in_order() {
    let server = Server::new();
    let reply = server
        .post("/v1/messages", message(json!({"stream": true})))
        .await;
    let events = named_events(&reply);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let mut want = vec!["message_start", "ping", "content_block_start"];
    want.extend(std::iter::repeat_n("content_block_delta", REPLY.len()));
    want.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, want);
    let start = &events[0].1["message"];
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["usage"]["input_tokens"], chat_ids("user", "Hi").len());
    assert_eq!(
        events[2].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    let text: String = events
        .iter()
        .filter_map(|(_, e)| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, REPLY);
    let delta = &events[events.len() - 2].1;
    assert_eq!(
        delta["delta"],
        json!({"stop_reason": "end_turn", "stop_sequence": null})
    );
    assert_eq!(delta["usage"]["output_tokens"], REPLY.len());
}

#[tokio::test]
async fn an_engine_error_mid_stream_is_an_error_event() {
    let server = Server::new();
    server.engine.set(Mode::BreakAfter(2));
    let reply = server
        .post("/v1/messages", message(json!({"stream": true})))
        .await;
    let events = named_events(&reply);
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(last["error"]["type"], "api_error");
    assert!(!reply.text().contains("[DONE]"));
}

#[tokio::test]
async fn refusals_are_anthropic_errors_naming_the_field() {
    let server = Server::new();
    let no_max = json!({"model": CHAT, "messages": [{"role": "user", "content": "Hi"}]});
    let reply = server.post("/v1/messages", no_max).await;
    let text = anthropic_error(&reply, StatusCode::BAD_REQUEST, "invalid_request_error");
    assert!(text.contains("max_tokens"), "{text}");
    let reply = server
        .post(
            "/v1/messages",
            message(json!({"thinking": {"type": "enabled", "budget_tokens": 1024}})),
        )
        .await;
    let text = anthropic_error(&reply, StatusCode::BAD_REQUEST, "invalid_request_error");
    assert!(text.contains("thinking"), "{text}");
    let reply = server
        .post("/v1/messages", message(json!({"model": "nope"})))
        .await;
    anthropic_error(&reply, StatusCode::NOT_FOUND, "not_found_error");
    let reply = server.send(raw_post("/v1/messages", "{not json")).await;
    anthropic_error(&reply, StatusCode::BAD_REQUEST, "invalid_request_error");
    let plain = with_header(
        post("/v1/messages", &message(json!({}))),
        "content-type",
        "text/plain",
    );
    let reply = server.send(plain).await;
    let text = anthropic_error(
        &reply,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "invalid_request_error",
    );
    assert!(text.contains("text/plain"), "{text}");
    assert_eq!(server.engine.calls(), 0);
}

#[tokio::test]
async fn a_missing_key_is_an_anthropic_authentication_error() {
    let server = Server::with(|c| c.auth.api_keys.push(api_key("k", "secret")));
    let reply = server.post("/v1/messages", message(json!({}))).await;
    anthropic_error(&reply, StatusCode::UNAUTHORIZED, "authentication_error");
    let keyed = with_header(
        post("/v1/messages", &message(json!({}))),
        "x-api-key",
        "secret",
    );
    assert_eq!(server.send(keyed).await.status, StatusCode::OK);
}
