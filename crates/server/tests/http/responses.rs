//! `/v1/responses` (OpenAI's Responses API) over the fake engine: the
//! response object, `max_output_tokens` cuts, the SSE event sequence,
//! stored responses (retrieve, delete, `store: false`, per key),
//! `previous_response_id` and refused fields. Tool calls are covered by
//! the unit tests (the fake context is too short for a tool preamble) and
//! by tests/e2e/test_responses.py.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{json, Value};

use super::harness::*;
use super::tokenizer::{chat_ids, ids, IM_END, IM_START};

fn create(extra: Value) -> Value {
    merged(json!({"model": CHAT, "input": "Hi"}), &extra)
}

/// The named events of a Responses SSE body, checking that the sequence
/// numbers count from 0.
fn numbered_events(reply: &Reply) -> Vec<(String, Value)> {
    let events = named_events(reply);
    for (i, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], i, "{data}");
    }
    events
}

fn delete(path: &str) -> Request<Body> {
    with_method(get(path), Method::DELETE)
}

#[tokio::test]
async fn a_whole_response_has_openais_shape_and_is_stored() {
    let server = Server::new();
    let body =
        create(json!({"instructions": "Be brief.", "temperature": 0, "metadata": {"k": "v"}}));
    let r = server.post("/v1/responses", body).await.ok();
    let id = r["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("resp_"), "{r}");
    assert_eq!(
        (r["object"].as_str(), r["status"].as_str()),
        (Some("response"), Some("completed"))
    );
    assert_eq!(r["model"], CHAT);
    assert_eq!(r["instructions"], "Be brief.");
    assert_eq!(r["metadata"], json!({"k": "v"}));
    assert_eq!(r["incomplete_details"], Value::Null);
    assert_eq!(r["store"], true);
    let output = r["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{r}");
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[0]["role"], "assistant");
    assert_eq!(output[0]["status"], "completed");
    assert!(output[0]["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        output[0]["content"],
        json!([{"type": "output_text", "text": REPLY, "annotations": [], "logprobs": []}])
    );
    // The instructions are the template's system turn.
    let mut prompt = vec![IM_START];
    prompt.extend(ids("system\nBe brief."));
    prompt.push(IM_END);
    prompt.extend(ids("\n"));
    prompt.extend(chat_ids("user", "Hi"));
    assert_eq!(server.engine.seen()[0].engine.prompt, prompt);
    let usage = &r["usage"];
    assert_eq!(usage["input_tokens"], prompt.len());
    assert_eq!(usage["output_tokens"], REPLY.len());
    assert_eq!(usage["total_tokens"], prompt.len() + REPLY.len());
    // Stored: retrieved as answered, then deleted.
    let path = format!("/v1/responses/{id}");
    assert_eq!(server.get(&path).await.ok(), r);
    let deleted = server.send(delete(&path)).await.ok();
    assert_eq!(
        deleted,
        json!({"id": id, "object": "response", "deleted": true})
    );
    let gone = server.get(&path).await;
    let message = gone.error(StatusCode::NOT_FOUND, "invalid_request_error", None, None);
    assert!(message.contains(&id), "{message}");
    server.send(delete(&path)).await.error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        None,
        None,
    );
}

#[tokio::test]
async fn a_length_cut_is_incomplete() {
    let server = Server::new();
    let r = server
        .post("/v1/responses", create(json!({"max_output_tokens": 3})))
        .await
        .ok();
    assert_eq!(r["status"], "incomplete");
    assert_eq!(
        r["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(r["max_output_tokens"], 3);
    assert_eq!(r["output"][0]["status"], "incomplete");
    assert_eq!(r["output"][0]["content"][0]["text"], &REPLY[..3]);
    assert_eq!(server.engine.seen()[0].engine.stop.max_tokens, 3);
}

#[tokio::test]
async fn a_stream_sends_the_responses_events_in_order() {
    let server = Server::new();
    let reply = server
        .post("/v1/responses", create(json!({"stream": true})))
        .await;
    let events = numbered_events(&reply);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let mut want = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    want.extend(std::iter::repeat_n(
        "response.output_text.delta",
        REPLY.len(),
    ));
    want.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, want);
    let created = &events[0].1["response"];
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["output"], json!([]));
    let id = created["id"].as_str().unwrap();
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, e)| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, REPLY);
    let item_id = events[2].1["item"]["id"].as_str().unwrap();
    assert!(events[4].1["item_id"] == item_id && events[4].1["output_index"] == 0);
    let done = &events[events.len() - 4].1;
    assert_eq!(done["text"], REPLY);
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(completed["id"], id);
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["output"][0]["content"][0]["text"], REPLY);
    assert_eq!(completed["usage"]["output_tokens"], REPLY.len());
    // A streamed response is stored too.
    let stored = server.get(&format!("/v1/responses/{id}")).await.ok();
    assert_eq!(&stored, completed);
}

#[tokio::test]
async fn a_cut_stream_ends_incomplete() {
    let server = Server::new();
    let body = create(json!({"stream": true, "max_output_tokens": 2}));
    let events = numbered_events(&server.post("/v1/responses", body).await);
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "response.incomplete");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
}

#[tokio::test]
async fn an_engine_failure_mid_stream_is_an_error_then_failed() {
    let server = Server::new();
    server.engine.set(Mode::BreakAfter(2));
    let events = named_events(
        &server
            .post("/v1/responses", create(json!({"stream": true})))
            .await,
    );
    let names: Vec<&str> = events
        .iter()
        .rev()
        .take(2)
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(names, ["response.failed", "error"]);
    let failed = &events.last().unwrap().1["response"];
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"]["code"], "server_error");
}

#[tokio::test]
async fn previous_response_id_continues_the_conversation() {
    let server = Server::new();
    let first = server
        .post(
            "/v1/responses",
            create(json!({"instructions": "Old rules."})),
        )
        .await
        .ok();
    let body = json!({"model": CHAT, "previous_response_id": first["id"], "input": [{"role": "user", "content": [{"type": "input_text", "text": "Again"}]}]});
    let second = server.post("/v1/responses", body).await.ok();
    assert_eq!(second["previous_response_id"], first["id"]);
    // The earlier turns, then the new input; the old instructions are not
    // carried over (as OpenAI does).
    let turn = |role: &str, text: &str| {
        let mut t = vec![IM_START];
        t.extend(ids(&format!("{role}\n{text}")));
        t.push(IM_END);
        t.extend(ids("\n"));
        t
    };
    let mut prompt = turn("user", "Hi");
    prompt.extend(turn("assistant", REPLY));
    prompt.extend(chat_ids("user", "Again"));
    assert_eq!(server.engine.seen()[1].engine.prompt, prompt);
    let unknown = json!({"model": CHAT, "previous_response_id": "resp_nope", "input": "x"});
    server.post("/v1/responses", unknown).await.error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("previous_response_id"),
        Some("previous_response_not_found"),
    );
}

#[tokio::test]
async fn store_false_is_not_kept() {
    let server = Server::new();
    let r = server
        .post("/v1/responses", create(json!({"store": false})))
        .await
        .ok();
    assert_eq!(r["store"], false);
    let id = r["id"].as_str().unwrap();
    server.get(&format!("/v1/responses/{id}")).await.error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        None,
        None,
    );
    let next = json!({"model": CHAT, "previous_response_id": id, "input": "x"});
    assert_eq!(
        server.post("/v1/responses", next).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn a_key_sees_only_its_own_responses() {
    let server = Server::with(|c| {
        c.auth.api_keys = vec![api_key("a", "sk-a-SECRET"), api_key("b", "sk-b-SECRET")]
    });
    let as_key = |request: Request<Body>, key: &str| {
        with_header(request, "authorization", &format!("Bearer {key}"))
    };
    let made = server
        .send(as_key(
            post("/v1/responses", &create(json!({}))),
            "sk-a-SECRET",
        ))
        .await
        .ok();
    let path = format!("/v1/responses/{}", made["id"].as_str().unwrap());
    assert_eq!(
        server.send(as_key(get(&path), "sk-a-SECRET")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        server.send(as_key(get(&path), "sk-b-SECRET")).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        server
            .send(as_key(delete(&path), "sk-b-SECRET"))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn json_schema_text_format_constrains_the_answer() {
    let server = Server::new();
    let schema =
        json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]});
    let body = create(
        json!({"text": {"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": true}}}),
    );
    let r = server.post("/v1/responses", body).await.ok();
    assert_eq!(r["text"]["format"]["type"], "json_schema");
    assert!(server.engine.seen()[0].engine.grammar.is_some());
}

#[tokio::test]
async fn fields_it_cannot_honour_are_refused_by_name() {
    let server = Server::new();
    for (extra, param) in [
        (json!({"background": true}), "background"),
        (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
        (
            json!({"include": ["reasoning.encrypted_content"]}),
            "include",
        ),
        (json!({"reasoning": {"effort": "high"}}), "reasoning.effort"),
        (json!({"truncation": "auto"}), "truncation"),
        (json!({"conversation": "conv_1"}), "conversation"),
        (json!({"frobnicate": 1}), "frobnicate"),
        (json!({"max_output_tokens": 0}), "max_output_tokens"),
    ] {
        let message = server
            .post("/v1/responses", create(extra.clone()))
            .await
            .invalid(Some(param));
        assert!(message.contains(param), "{extra}: {message}");
    }
    assert_eq!(
        server.engine.calls(),
        0,
        "nothing refused reaches the engine"
    );
    let stream = server.get("/v1/responses/resp_x?stream=true").await;
    stream.invalid(Some("stream"));
}
