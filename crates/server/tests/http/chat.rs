//! `/v1/chat/completions`: the answer's shape, whole and streamed.

use axum::http::StatusCode;
use serde_json::json;

use super::harness::*;
use super::tokenizer::chat_ids;

#[tokio::test]
async fn a_whole_answer_has_the_openai_shape_and_usage() {
    let server = Server::new();
    let reply = server
        .send(with_header(
            post("/v1/chat/completions", &chat(CHAT, json!({}))),
            "x-request-id",
            "req-1",
        ))
        .await;
    let body = reply.ok();
    assert_eq!(reply.header("x-request-id"), "req-1");
    // Greedy, so shareable: coalescing is on by default (the cache is not).
    assert_eq!(reply.cache(), "miss");
    assert!(
        body["id"].as_str().unwrap().starts_with("chatcmpl-"),
        "{body}"
    );
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], CHAT);
    assert!(body["created"].as_u64().unwrap() > 0);
    let choice = &body["choices"][0];
    assert_eq!(body["choices"].as_array().unwrap().len(), 1);
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], REPLY);
    assert_eq!(choice["finish_reason"], "stop");
    let prompt = chat_ids("user", "Hi").len();
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": prompt, "completion_tokens": REPLY.len(), "total_tokens": prompt + REPLY.len(),
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    server.assert_never_built();
}

#[tokio::test]
async fn the_engine_gets_the_rendered_template_and_the_sampling_asked() {
    let server = Server::new();
    let body = chat(
        CHAT,
        json!({"max_tokens": 3, "seed": 7, "top_p": 0.5, "stop": ["x"]}),
    );
    let answer = server.post("/v1/chat/completions", body).await.ok();
    assert_eq!(answer["choices"][0]["message"]["content"], &REPLY[..3]);
    assert_eq!(answer["choices"][0]["finish_reason"], "length");
    let seen = server.engine.seen();
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(request.model, CHAT);
    assert_eq!(request.engine.prompt, chat_ids("user", "Hi"));
    assert_eq!(request.engine.stop.max_tokens, 3);
    assert_eq!(request.engine.stop.stop_strings, ["x"]);
    assert_eq!(request.engine.sampling.temperature, 0.0);
    assert_eq!(request.engine.sampling.top_p, 0.5);
    assert_eq!(request.engine.sampling.seed, Some(7));
}

#[tokio::test]
async fn without_max_tokens_a_chat_may_fill_the_context() {
    let server = Server::new();
    server
        .post("/v1/chat/completions", chat(CHAT, json!({})))
        .await
        .ok();
    let prompt = chat_ids("user", "Hi").len();
    assert_eq!(
        server.engine.seen()[0].engine.stop.max_tokens,
        LIMITS.max_context - prompt
    );
}

#[tokio::test]
async fn n_choices_are_n_generations_with_consecutive_seeds() {
    let server = Server::new();
    let body = chat(CHAT, json!({"n": 2, "temperature": 0.7, "seed": 10}));
    let answer = server.post("/v1/chat/completions", body).await.ok();
    let indexes: Vec<_> = answer["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, [0, 1]);
    let seeds: Vec<_> = server
        .engine
        .seen()
        .iter()
        .map(|r| r.engine.sampling.seed)
        .collect();
    assert_eq!(seeds, [Some(10), Some(11)]);
    assert_eq!(answer["usage"]["completion_tokens"], 2 * REPLY.len());
}

#[tokio::test]
async fn a_stream_opens_with_the_role_and_ends_with_finish_usage_and_done() {
    let server = Server::new();
    let body = chat(
        CHAT,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let reply = server.post("/v1/chat/completions", body).await;
    let chunks = reply.events();
    assert_eq!(reply.header("cache-control"), "no-cache");
    assert_eq!(reply.cache(), "miss");
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    for c in &chunks {
        assert_eq!(c["id"], id, "one id for every chunk");
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["model"], CHAT);
        assert!(c["created"].is_u64(), "{c}");
    }
    assert_eq!(finish_reasons(&chunks), ["stop"]);
    let first = &chunks[0]["choices"][0];
    assert_eq!(first["delta"], json!({"role": "assistant", "content": ""}));
    assert_eq!(streamed_text(&chunks), REPLY);
    let (usage, rest) = chunks.split_last().unwrap();
    let finish = rest.last().unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert!(
        rest.iter().all(|c| c["usage"].is_null()),
        "usage only at the end"
    );
    assert_eq!(usage["choices"], json!([]));
    let prompt = chat_ids("user", "Hi").len();
    assert_eq!(usage["usage"]["prompt_tokens"], prompt);
    assert_eq!(usage["usage"]["completion_tokens"], REPLY.len());
}

#[tokio::test]
async fn continuous_usage_stats_put_the_usage_so_far_in_every_chunk() {
    let server = Server::new();
    let options = json!({"include_usage": true, "continuous_usage_stats": true});
    for (path, body) in [
        (
            "/v1/chat/completions",
            chat(CHAT, json!({"stream": true, "stream_options": options})),
        ),
        (
            "/v1/completions",
            completion(CHAT, json!({"stream": true, "stream_options": options})),
        ),
    ] {
        let chunks = server.post(path, body).await.events();
        let completions: Vec<u64> = chunks
            .iter()
            .map(|c| {
                c["usage"]["completion_tokens"]
                    .as_u64()
                    .expect("usage in every chunk")
            })
            .collect();
        assert!(
            completions.windows(2).all(|w| w[0] <= w[1]),
            "{path}: {completions:?}"
        );
        let prompt = &chunks[0]["usage"]["prompt_tokens"];
        assert!(prompt.as_u64().is_some_and(|p| p > 0), "{path}");
        assert!(chunks
            .iter()
            .all(|c| &c["usage"]["prompt_tokens"] == prompt));
        let last = chunks.last().unwrap();
        assert_eq!(
            last["choices"],
            json!([]),
            "{path}: the closing usage chunk"
        );
        assert_eq!(last["usage"]["completion_tokens"], REPLY.len(), "{path}");
    }
}

#[tokio::test]
async fn a_stream_without_include_usage_has_no_usage_chunk() {
    let server = Server::new();
    let body = chat(CHAT, json!({"stream": true}));
    let chunks = server.post("/v1/chat/completions", body).await.events();
    // The role chunk, one per token, the finish chunk.
    assert_eq!(chunks.len(), 1 + REPLY.len() + 1);
    assert!(
        chunks.iter().all(|c| c.get("usage").is_none()),
        "{chunks:?}"
    );
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
}

#[tokio::test]
async fn an_engine_error_mid_stream_ends_in_an_error_event_and_done() {
    let server = Server::new();
    server.engine.set(Mode::BreakAfter(2));
    let chunks = server
        .post("/v1/chat/completions", chat(CHAT, json!({"stream": true})))
        .await
        .events();
    assert_eq!(streamed_text(&chunks), &REPLY[..2]);
    let error = &chunks.last().unwrap()["error"];
    assert_eq!(error["message"], "the fake engine broke");
    assert_eq!(error["type"], "internal_error");
    assert!(chunks
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));
}

#[tokio::test]
async fn an_engine_error_without_streaming_is_a_500_that_hides_the_detail() {
    let server = Server::new();
    server.engine.set(Mode::BreakAfter(2));
    let reply = server
        .post("/v1/chat/completions", chat(CHAT, json!({})))
        .await;
    let message = reply.error(
        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
        "internal_error",
        None,
        None,
    );
    assert_eq!(message, "internal error");
}

#[tokio::test]
async fn a_required_tool_whose_parameters_refer_to_their_defs_compiles() {
    let server = Server::new();
    // pydantic's shape: `$ref`s into the parameters' own `$defs`.
    let params = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}},
        "$defs": {"x": {"type": "string"}}, "required": ["a"]});
    let tool = json!({"type": "function", "function": {"name": "f", "parameters": params}});
    let body = chat(
        CHAT,
        json!({"max_tokens": 8, "tools": [tool], "tool_choice": "required"}),
    );
    // The grammar is compiled before the prompt is measured: the refusal
    // is the fake model's short context (the tool preamble overflows it),
    // not the grammar.
    let reply = server.post("/v1/chat/completions", body).await;
    reply.error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        Some("messages"),
        Some("context_length_exceeded"),
    );
}
