//! Errors the router answers itself, in the OpenAI shape.

use axum::http::StatusCode;

use super::harness::{assert_error, header_of, round_robin, FakeWorker};

#[tokio::test(start_paused = true)]
async fn a_body_that_is_not_a_json_object_is_a_400() {
    let a = FakeWorker::ok("bad-json-a");
    let r = round_robin(&[&a], "").await;
    for body in ["{not json", "[1, 2]"] {
        let resp = r.post("/v1/chat/completions", body).await;
        assert_error(resp, StatusCode::BAD_REQUEST, Some("invalid_request")).await;
    }
    assert_eq!(a.posts(), 0, "a bad request never reaches a worker");
}

#[tokio::test(start_paused = true)]
async fn a_model_no_worker_lists_is_a_404_model_not_found() {
    let a = FakeWorker::ok("no-model-a");
    let r = round_robin(&[&a], "").await;
    let body = serde_json::json!({"model": "nope", "messages": []}).to_string();
    let resp = r.post("/v1/chat/completions", body).await;
    assert_error(resp, StatusCode::NOT_FOUND, Some("model_not_found")).await;
}

#[tokio::test(start_paused = true)]
async fn unknown_routes_and_methods_are_openai_errors() {
    let a = FakeWorker::ok("route-a");
    let r = round_robin(&[&a], "").await;
    assert_error(
        r.get("/v1/nope").await,
        StatusCode::NOT_FOUND,
        Some("not_found"),
    )
    .await;
    let resp = r.get("/v1/chat/completions").await;
    assert_error(
        resp,
        StatusCode::METHOD_NOT_ALLOWED,
        Some("method_not_allowed"),
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn no_healthy_worker_is_a_503_with_retry_after() {
    let a = FakeWorker::ok("none-a");
    a.go_down();
    let r = round_robin(&[&a], "").await;
    let resp = r.chat(false).await;
    // The worker is down: after its next health probe (1 s at the least).
    let probe = r.state.config.health.interval.as_millis().div_ceil(1000);
    let interval = probe.clamp(1, 60).to_string();
    assert_eq!(header_of(&resp, "retry-after"), Some(interval.as_str()));
    assert_error(
        resp,
        StatusCode::SERVICE_UNAVAILABLE,
        Some("no_worker_available"),
    )
    .await;
    assert_eq!(
        r.get("/ready").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test(start_paused = true)]
async fn workers_that_all_fail_to_connect_are_a_503_naming_the_last_failure() {
    let (a, b) = (FakeWorker::ok("down-a"), FakeWorker::ok("down-b"));
    let r = round_robin(&[&a, &b], "").await;
    a.go_down();
    b.go_down();
    let resp = r.chat(false).await;
    let body = assert_error(
        resp,
        StatusCode::SERVICE_UNAVAILABLE,
        Some("no_worker_available"),
    )
    .await;
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("last attempt: connect"), "{message}");
}

#[tokio::test(start_paused = true)]
async fn when_every_worker_refuses_the_last_refusal_is_returned_as_is() {
    let a = FakeWorker::refusing("refuse-a", StatusCode::SERVICE_UNAVAILABLE);
    let b = FakeWorker::refusing("refuse-b", StatusCode::TOO_MANY_REQUESTS);
    let r = round_robin(&[&a, &b], "").await;
    let resp = r.chat(false).await;
    assert_eq!((a.posts(), b.posts()), (1, 1), "each worker tried once");
    let body = assert_error(resp, StatusCode::TOO_MANY_REQUESTS, Some("overloaded")).await;
    assert_eq!(
        body["error"]["message"], "overloaded",
        "the worker's own body"
    );
}
