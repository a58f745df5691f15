//! The routes besides chat, completions and embeddings: the Responses API
//! (a stored response is asked for on the worker that holds it), the
//! tokenizer's, Anthropic's and Ollama's, all forwarded.

use axum::extract::Path;
use axum::http::{Method, Request, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::{any, get};
use axum::Json;
use serde_json::json;

use super::harness::{json_body, round_robin, worker_of, FakeWorker, TestRouter, MODEL};

/// A worker that answers every POST with a response `resp_<name>` (it
/// holds only that one) and every other route with the path it got.
fn holding(name: &str) -> FakeWorker {
    let me = format!("resp_{name}");
    let held = me.clone();
    let stored = move |Path(id): Path<String>| {
        let held = held.clone();
        async move {
            if id == held {
                Json(json!({"id": id, "object": "response"})).into_response()
            } else {
                let error = json!({"error": {"message": "not found", "type": "invalid_request_error", "param": null, "code": null}});
                (StatusCode::NOT_FOUND, Json(error)).into_response()
            }
        }
    };
    let echo = |uri: Uri| async move { Json(json!({"path": uri.path()})) };
    FakeWorker::new(name, move |_| {
        let me = me.clone();
        async move { Json(json!({"id": me, "object": "response"})).into_response() }
    })
    .route("/v1/responses/{id}", get(stored.clone()).delete(stored))
    .route("/tokenize", any(echo))
    .route("/detokenize", any(echo))
    .route("/tokenizer_info", any(echo))
    .route("/api/{*rest}", any(echo))
}

async fn send(r: &TestRouter, method: Method, path: &str) -> axum::response::Response {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(axum::body::Body::empty())
        .expect("request");
    r.call(req).await
}

#[tokio::test(start_paused = true)]
async fn a_stored_response_is_found_on_the_worker_that_holds_it() {
    let (a, b) = (holding("resp-a"), holding("resp-b"));
    let r = round_robin(&[&a, &b], "").await;
    let first = r
        .post(
            "/v1/responses",
            json!({"model": MODEL, "input": "Hi"}).to_string(),
        )
        .await;
    let holder = worker_of(&first);
    let id = json_body(first).await["id"].as_str().unwrap().to_string();
    assert_eq!(id, format!("resp_{}", holder.trim_start_matches("http://")));
    // Round robin would alternate; a continuation and the stored response
    // itself go to the holder every time.
    for _ in 0..3 {
        let next = json!({"model": MODEL, "input": "More", "previous_response_id": id});
        let resp = r.post("/v1/responses", next.to_string()).await;
        assert_eq!(worker_of(&resp), holder);
        let got = r.get(&format!("/v1/responses/{id}")).await;
        assert_eq!(got.status(), StatusCode::OK);
        assert_eq!(worker_of(&got), holder);
    }
    let deleted = send(&r, Method::DELETE, &format!("/v1/responses/{id}")).await;
    assert_eq!(
        (deleted.status(), worker_of(&deleted)),
        (StatusCode::OK, holder)
    );
    let missing = r.get("/v1/responses/resp_nowhere").await;
    assert_eq!(
        missing.status(),
        StatusCode::NOT_FOUND,
        "the workers' own 404"
    );
    assert_eq!(json_body(missing).await["error"]["message"], "not found");
}

#[tokio::test(start_paused = true)]
async fn tokenizer_anthropic_and_ollama_routes_are_forwarded() {
    let w = holding("surface");
    let r = round_robin(&[&w], "").await;
    for (method, path) in [
        (Method::POST, "/tokenize"),
        (Method::POST, "/detokenize"),
        (Method::GET, "/tokenizer_info?model=m"),
        (Method::POST, "/api/chat"),
        (Method::POST, "/api/generate"),
        (Method::POST, "/api/embed"),
        (Method::POST, "/api/show"),
        (Method::GET, "/api/tags"),
        (Method::GET, "/api/version"),
    ] {
        let req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header("content-type", "application/json");
        let body = if method == Method::POST {
            json!({"model": MODEL}).to_string()
        } else {
            String::new()
        };
        let resp = r.call(req.body(body.into()).expect("request")).await;
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let want = path.split('?').next().unwrap_or(path);
        assert_eq!(json_body(resp).await["path"], want);
    }
    let messages = json!({"model": MODEL, "max_tokens": 4, "messages": []});
    let resp = r.post("/v1/messages", messages.to_string()).await;
    assert_eq!(resp.status(), StatusCode::OK);
}
