//! Ollama's API over the fake engine: NDJSON streams by default, whole
//! answers with `stream: false`, the model endpoints, and `{"error": ...}`
//! errors. `/api/embed` needs an embedding engine: tests/e2e/test_ollama.py.

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::harness::*;
use super::tokenizer::{chat_ids, ids};

fn chat_body(extra: Value) -> Value {
    merged(
        json!({"model": CHAT, "messages": [{"role": "user", "content": "Hi"}]}),
        &extra,
    )
}

/// The lines of an NDJSON body.
fn lines(reply: &Reply) -> Vec<Value> {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.header("content-type"), "application/x-ndjson");
    let text = reply.text();
    assert!(text.ends_with('\n'), "{text:?}");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

/// Asserts `{"error": "..."}` with `status`; returns the message.
fn ollama_error(reply: &Reply, status: StatusCode) -> String {
    assert_eq!(reply.status, status, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body.as_object().unwrap().len(), 1, "{body}");
    body["error"].as_str().unwrap().to_string()
}

fn assert_closing(line: &Value, reason: &str, prompt: usize, eval: usize) {
    assert_eq!(line["done"], true, "{line}");
    assert_eq!(line["done_reason"], reason, "{line}");
    assert_eq!(line["prompt_eval_count"], prompt, "{line}");
    assert_eq!(line["eval_count"], eval, "{line}");
    let total = line["total_duration"].as_u64().unwrap();
    let parts =
        line["prompt_eval_duration"].as_u64().unwrap() + line["eval_duration"].as_u64().unwrap();
    assert!(total > 0 && parts <= total, "{line}");
}

#[tokio::test]
async fn chat_streams_ndjson_by_default() {
    let server = Server::new();
    let reply = server.post("/api/chat", chat_body(json!({}))).await;
    let lines = lines(&reply);
    let (last, rest) = lines.split_last().unwrap();
    assert_eq!(
        rest.len(),
        REPLY.len(),
        "a line per token, then the closing one"
    );
    for line in rest {
        assert_eq!(line["model"], CHAT);
        assert_eq!(line["done"], false);
        assert_eq!(line["message"]["role"], "assistant");
        assert!(line["created_at"].as_str().unwrap().contains('T'), "{line}");
    }
    let text: String = rest
        .iter()
        .map(|l| l["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, REPLY);
    assert_eq!(last["message"]["content"], "");
    assert_closing(last, "stop", chat_ids("user", "Hi").len(), REPLY.len());
}

#[tokio::test]
async fn chat_whole_with_options() {
    let server = Server::new();
    let options =
        json!({"temperature": 0.5, "top_k": 3, "seed": 9, "num_predict": 3, "stop": ["\n"]});
    let body = chat_body(json!({"stream": false, "options": options}));
    let answer = server.post("/api/chat", body).await.ok();
    assert_eq!(
        answer["message"],
        json!({"role": "assistant", "content": &REPLY[..3]})
    );
    assert_closing(&answer, "length", chat_ids("user", "Hi").len(), 3);
    let seen = &server.engine.seen()[0].engine;
    assert_eq!(
        (
            seen.sampling.temperature,
            seen.sampling.top_k,
            seen.sampling.seed
        ),
        (0.5, 3, Some(9))
    );
    assert_eq!(seen.stop.stop_strings, ["\n"]);
}

#[tokio::test]
async fn generate_uses_the_template_unless_raw_or_there_is_none() {
    let server = Server::new();
    let body = json!({"model": CHAT, "prompt": "Hi", "stream": false});
    let answer = server.post("/api/generate", body).await.ok();
    assert_eq!(answer["response"], REPLY);
    assert_eq!(answer["done"], true);
    assert_eq!(
        server.engine.seen()[0].engine.prompt,
        chat_ids("user", "Hi")
    );
    let raw = json!({"model": CHAT, "prompt": "Hi", "raw": true, "stream": false});
    server.post("/api/generate", raw).await.ok();
    assert_eq!(server.engine.seen()[1].engine.prompt, ids("Hi"));
    let plain = json!({"model": PLAIN, "prompt": "Hi"});
    let streamed = lines(&server.post("/api/generate", plain).await);
    let text: String = streamed
        .iter()
        .map(|l| l["response"].as_str().unwrap())
        .collect();
    assert_eq!(text, REPLY);
    assert_eq!(server.engine.seen()[2].engine.prompt, ids("Hi"));
}

#[tokio::test]
async fn tags_show_and_version() {
    let server = Server::new();
    let tags = server.get("/api/tags").await.ok();
    let names: Vec<_> = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, [CHAT, PLAIN, EMBED]);
    let show = server.post("/api/show", json!({"model": CHAT})).await.ok();
    assert_eq!(show["capabilities"], json!(["completion", "tools"]));
    assert!(show["template"].as_str().unwrap().contains("im_start"));
    assert_eq!(show["model_info"]["context_length"], LIMITS.max_context);
    let missing = server.post("/api/show", json!({"model": "nope"})).await;
    assert!(ollama_error(&missing, StatusCode::NOT_FOUND).contains("nope"));
    let version = server.get("/api/version").await.ok();
    assert!(version["version"].is_string());
    server.assert_never_built();
}

#[tokio::test]
async fn errors_are_ollama_shaped() {
    let server = Server::new();
    let bad = chat_body(json!({"options": {"mirostat": 1}}));
    let message = ollama_error(
        &server.post("/api/chat", bad).await,
        StatusCode::BAD_REQUEST,
    );
    assert!(message.contains("options.mirostat"), "{message}");
    let truncate = json!({"model": EMBED, "input": "a", "truncate": true});
    let message = ollama_error(
        &server.post("/api/embed", truncate).await,
        StatusCode::BAD_REQUEST,
    );
    assert!(message.contains("truncate"), "{message}");
    let missing = ollama_error(&server.get("/api/nope").await, StatusCode::NOT_FOUND);
    assert!(missing.contains("/api/nope"), "{missing}");
    server.engine.set(Mode::BreakAfter(2));
    let lines = lines(&server.post("/api/chat", chat_body(json!({}))).await);
    assert_eq!(
        lines.last().unwrap(),
        &json!({"error": "the fake engine broke"})
    );
}
