//! A reasoning model (Qwen3's real tokenizer and chat template, the qwen3
//! reasoning parser) whose scripted engine answers `<think>…</think>` and
//! then the answer: chat and Responses, whole and streamed, return the
//! reasoning apart; `enable_thinking: false` closes the block in the
//! prompt; a response_format keeps the answer whole. (An answer that starts
//! inside the block, after a template that opened it, is the splitter's
//! unit test.)

use serde_json::{json, Value};

use super::harness::*;

const THOUGHT: &str = "The user says hi.\nI should greet them back.";
const ANSWER: &str = "Hello! How can I help?";

/// What Qwen3 writes with thinking on.
fn said() -> String {
    format!("<think>\n{THOUGHT}\n</think>\n\n{ANSWER}")
}

fn server() -> Server {
    let server = Server::thinker();
    server.engine.set(Mode::Say(said()));
    server
}

/// `ids` as text, by the Qwen3 tokenizer.
async fn decoded(server: &Server, ids: &[u32]) -> String {
    let (_, front) = server.state.models().front(THINKER).await.unwrap();
    front.tokenizer().unwrap().decode(ids, false).unwrap()
}

fn ask(extra: Value) -> Value {
    chat(THINKER, merged(json!({"max_tokens": 200}), &extra))
}

#[tokio::test]
async fn chat_returns_the_reasoning_apart() {
    let server = server();
    let body = server
        .post("/v1/chat/completions", ask(json!({})))
        .await
        .ok();
    let message = &body["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], THOUGHT, "{body}");
    assert_eq!(message["content"], ANSWER, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    // Thinking on: the template leaves the tag to the model.
    let prompt = server.engine.seen()[0].engine.prompt.clone();
    let text = decoded(&server, &prompt).await;
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text:?}");
}

#[tokio::test]
async fn a_stream_sends_reasoning_deltas_then_content_deltas() {
    let server = server();
    let body = ask(json!({"stream": true, "logprobs": true}));
    let events = server.post("/v1/chat/completions", body).await.events();
    let (mut reasoning, mut content) = (String::new(), String::new());
    let mut order = Vec::new();
    let mut logprobs = 0;
    for e in &events {
        let Some(choice) = e["choices"].get(0) else {
            continue;
        };
        let delta = &choice["delta"];
        if let Some(t) = delta["reasoning_content"].as_str() {
            assert!(delta.get("content").is_none(), "{e}");
            reasoning.push_str(t);
            order.push('r');
        }
        if let Some(t) = delta["content"].as_str() {
            content.push_str(t);
            if !t.is_empty() {
                order.push('c');
            }
        }
        logprobs += choice["logprobs"]["content"].as_array().map_or(0, Vec::len);
    }
    assert_eq!(reasoning, THOUGHT);
    assert_eq!(content, ANSWER);
    let first_content = order.iter().position(|&c| c == 'c').unwrap();
    assert!(
        order[first_content..].iter().all(|&c| c == 'c'),
        "{order:?}"
    );
    // Every token's logprob is sent, the held-back tag tokens' too.
    assert_eq!(logprobs, said().len());
}

#[tokio::test]
async fn thinking_off_closes_the_block_in_the_prompt() {
    let server = Server::thinker();
    server.engine.set(Mode::Say(ANSWER.into()));
    let body = ask(json!({"chat_template_kwargs": {"enable_thinking": false}}));
    let reply = server.post("/v1/chat/completions", body).await.ok();
    let message = &reply["choices"][0]["message"];
    assert_eq!(message["content"], ANSWER);
    assert!(message.get("reasoning_content").is_none(), "{reply}");
    let text = decoded(&server, &server.engine.seen()[0].engine.prompt).await;
    assert!(text.ends_with("<think>\n\n</think>\n\n"), "{text:?}");
}

#[tokio::test]
async fn an_answer_cut_while_thinking_is_all_reasoning() {
    let server = server();
    let reply = server
        .post("/v1/chat/completions", ask(json!({"max_tokens": 20})))
        .await
        .ok();
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["message"]["content"], Value::Null, "{reply}");
    assert_eq!(choice["message"]["reasoning_content"], &said()[8..20]);
}

#[tokio::test]
async fn a_response_format_keeps_the_answer_whole() {
    let server = server();
    let body = ask(json!({"response_format": {"type": "json_object"}}));
    let reply = server.post("/v1/chat/completions", body).await.ok();
    let message = &reply["choices"][0]["message"];
    assert_eq!(message["content"], said());
    assert!(message.get("reasoning_content").is_none(), "{reply}");
}

#[tokio::test]
async fn other_models_keep_their_tags() {
    let server = Server::thinker();
    let said = "<think>\nHm.\n</think>\n\nHi";
    server.engine.set(Mode::Say(said.into()));
    let body = chat(CHAT, json!({"max_tokens": 40}));
    let reply = server.post("/v1/chat/completions", body).await.ok();
    assert_eq!(reply["choices"][0]["message"]["content"], said);
}

#[tokio::test]
async fn responses_put_the_reasoning_in_a_reasoning_item() {
    let server = server();
    let body = json!({"model": THINKER, "input": "Hi", "max_output_tokens": 200});
    let r = server.post("/v1/responses", body).await.ok();
    let output = r["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{r}");
    assert_eq!(output[0]["type"], "reasoning");
    assert!(output[0]["id"].as_str().unwrap().starts_with("rs_"));
    assert_eq!(output[0]["summary"], json!([]));
    assert_eq!(
        output[0]["content"],
        json!([{"type": "reasoning_text", "text": THOUGHT}])
    );
    assert_eq!(output[1]["type"], "message");
    assert_eq!(output[1]["content"][0]["text"], ANSWER);
    // The stored conversation carries the reasoning to the next turn,
    // where Qwen3's template drops it (before the last user turn).
    let next = json!({"model": THINKER, "input": "And you?", "previous_response_id": r["id"]});
    server.post("/v1/responses", next).await.ok();
    let text = decoded(&server, &server.engine.seen()[1].engine.prompt).await;
    assert!(
        text.contains(&format!("<|im_start|>assistant\n{ANSWER}<|im_end|>")),
        "{text:?}"
    );
}

#[tokio::test]
async fn a_reasoning_item_sent_back_as_input_is_read() {
    let server = server();
    let body = json!({"model": THINKER, "max_output_tokens": 200, "input": [
        {"type": "message", "role": "user", "content": "Hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Greet."}]},
        {"type": "message", "role": "assistant", "content": "Hello!"},
        {"type": "message", "role": "user", "content": "Again"}
    ]});
    server.post("/v1/responses", body).await.ok();
    let body = json!({"model": THINKER, "input": [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"}
    ]});
    server
        .post("/v1/responses", body)
        .await
        .invalid(Some("input[0].encrypted_content"));
}

#[tokio::test]
async fn a_responses_stream_sends_the_reasoning_item_first() {
    let server = server();
    let body = json!({"model": THINKER, "input": "Hi", "stream": true, "max_output_tokens": 200});
    let reply = server.post("/v1/responses", body).await;
    let events = named_events(&reply);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let first = |name: &str| names.iter().position(|n| *n == name).unwrap();
    assert_eq!(events[2].1["item"]["type"], "reasoning", "{names:?}");
    assert!(first("response.reasoning_text.done") < first("response.output_text.delta"));
    let reasoning: String = events
        .iter()
        .filter(|(n, _)| n == "response.reasoning_text.delta")
        .map(|(_, e)| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(reasoning, THOUGHT);
    let done = &events[first("response.reasoning_text.done")].1;
    assert_eq!(done["text"], THOUGHT);
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(completed["output"][0]["type"], "reasoning");
    assert_eq!(completed["output"][0]["content"][0]["text"], THOUGHT);
    assert_eq!(completed["output"][1]["content"][0]["text"], ANSWER);
}
