//! `/v1/completions`: text and token-id prompts, whole and streamed.

use serde_json::json;

use super::harness::*;
use super::tokenizer::ids;

#[tokio::test]
async fn a_whole_answer_has_the_openai_shape_and_usage() {
    let server = Server::new();
    let reply = server
        .post("/v1/completions", completion(CHAT, json!({})))
        .await;
    let body = reply.ok();
    assert_eq!(reply.cache(), "miss");
    assert!(
        !reply.header("x-request-id").is_empty(),
        "a fresh id is assigned"
    );
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"), "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], CHAT);
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["text"], REPLY);
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": REPLY.len(), "total_tokens": 2 + REPLY.len(),
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    assert_eq!(server.engine.seen()[0].engine.prompt, ids("Hi"));
    server.assert_never_built();
}

#[tokio::test]
async fn the_default_max_tokens_is_sixteen_and_a_model_without_template_serves() {
    let server = Server::new();
    server
        .post("/v1/completions", completion(PLAIN, json!({})))
        .await
        .ok();
    assert_eq!(server.engine.seen()[0].engine.stop.max_tokens, 16);
    assert_eq!(server.engine.seen()[0].model, PLAIN);
}

#[tokio::test]
async fn token_id_prompts_and_lists_of_prompts_are_one_generation_each() {
    let server = Server::new();
    let body = completion(
        CHAT,
        json!({"prompt": [[72, 105], [79, 107, 33]], "max_tokens": 2}),
    );
    let answer = server.post("/v1/completions", body).await.ok();
    let texts: Vec<_> = answer["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["index"].clone(),
                c["text"].clone(),
                c["finish_reason"].clone(),
            )
        })
        .collect();
    assert_eq!(
        texts,
        [
            (json!(0), json!("Pa"), json!("length")),
            (json!(1), json!("Pa"), json!("length"))
        ]
    );
    let prompts: Vec<_> = server
        .engine
        .seen()
        .into_iter()
        .map(|r| r.engine.prompt)
        .collect();
    assert_eq!(prompts, [vec![72, 105], vec![79, 107, 33]]);
    assert_eq!(answer["usage"]["prompt_tokens"], 5);
}

#[tokio::test]
async fn echo_puts_the_prompt_before_the_answer() {
    let server = Server::new();
    let body = completion(CHAT, json!({"echo": true}));
    let answer = server.post("/v1/completions", body).await.ok();
    assert_eq!(answer["choices"][0]["text"], format!("Hi{REPLY}"));
}

#[tokio::test]
async fn a_stream_sends_text_chunks_a_finish_reason_usage_and_done() {
    let server = Server::new();
    let body = completion(
        CHAT,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let chunks = server.post("/v1/completions", body).await.events();
    for c in &chunks {
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["model"], CHAT);
    }
    assert_eq!(streamed_text(&chunks), REPLY);
    assert_eq!(finish_reasons(&chunks), ["stop"]);
    let (usage, rest) = chunks.split_last().unwrap();
    assert_eq!(rest.last().unwrap()["choices"][0]["finish_reason"], "stop");
    assert!(
        rest.iter().all(|c| c["usage"].is_null()),
        "usage only at the end"
    );
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], 2);
    assert_eq!(usage["usage"]["completion_tokens"], REPLY.len());
}

#[tokio::test]
async fn an_engine_error_mid_stream_ends_in_an_error_event_and_done() {
    let server = Server::new();
    server.engine.set(Mode::BreakAfter(1));
    let chunks = server
        .post("/v1/completions", completion(CHAT, json!({"stream": true})))
        .await
        .events();
    assert_eq!(streamed_text(&chunks), &REPLY[..1]);
    assert_eq!(chunks.last().unwrap()["error"]["type"], "internal_error");
}

#[tokio::test]
async fn an_alias_or_no_model_at_all_names_the_default_model() {
    let server = Server::new();
    let aliased = completion(ALIAS, json!({}));
    let answer = server.post("/v1/completions", aliased).await.ok();
    assert_eq!(answer["model"], CHAT);
    let answer = server
        .post("/v1/completions", json!({"prompt": "Hi"}))
        .await
        .ok();
    assert_eq!(answer["model"], CHAT);
    let models: Vec<_> = server.engine.seen().into_iter().map(|r| r.model).collect();
    assert_eq!(models, [CHAT, CHAT]);
}
