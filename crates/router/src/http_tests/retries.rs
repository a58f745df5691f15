//! Retries before the first byte, and the circuit breaker.

use axum::http::StatusCode;

use super::harness::{metric, round_robin, worker_of, FakeWorker};
use crate::metrics as m;

#[tokio::test(start_paused = true)]
async fn a_503_is_retried_on_another_worker() {
    let bad = FakeWorker::refusing("r503-bad", StatusCode::SERVICE_UNAVAILABLE);
    let good = FakeWorker::ok("r503-good");
    let r = round_robin(&[&bad, &good], "[breaker]\nfailure_threshold = 100\n").await;
    for _ in 0..6 {
        let resp = r.chat(false).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(worker_of(&resp), good.url);
    }
    assert!(
        bad.posts() >= 3,
        "round robin sent requests to the 503 worker first"
    );
    let errors = [("worker", bad.url.as_str()), ("reason", "status_503")];
    assert_eq!(metric(m::ERRORS, &errors), bad.posts() as f64);
    assert!(metric(m::RETRIES, &[("reason", "status_503")]) >= 3.0);
}

#[tokio::test(start_paused = true)]
async fn a_429_is_retried_and_is_not_a_fault() {
    let full = FakeWorker::refusing("r429-full", StatusCode::TOO_MANY_REQUESTS);
    let good = FakeWorker::ok("r429-good");
    let r = round_robin(&[&full, &good], "[breaker]\nfailure_threshold = 1\n").await;
    for _ in 0..4 {
        assert_eq!(worker_of(&r.chat(false).await), good.url);
    }
    assert_eq!(
        full.posts(),
        4,
        "every request tried the full worker first: it stays in rotation"
    );
    let status = r.worker_status(&full.url).await;
    assert_eq!(
        (status["breaker"].as_str(), status["healthy"].as_bool()),
        (Some("closed"), Some(true))
    );
}

#[tokio::test(start_paused = true)]
async fn a_connect_error_is_retried_and_marks_the_worker_down() {
    let dead = FakeWorker::ok("rconn-dead");
    let good = FakeWorker::ok("rconn-good");
    let r = round_robin(&[&dead, &good], "").await;
    dead.go_down();
    assert_eq!(worker_of(&r.chat(false).await), good.url);
    assert_eq!(r.worker_status(&dead.url).await["healthy"], false);
    let errors = [("worker", dead.url.as_str()), ("reason", "connect")];
    assert_eq!(metric(m::ERRORS, &errors), 1.0);
}

#[tokio::test(start_paused = true)]
async fn a_hung_worker_is_given_up_at_the_first_byte_timeout_and_probed_down() {
    let hung = FakeWorker::ok("rhang-hung");
    let good = FakeWorker::ok("rhang-good");
    let r = round_robin(&[&hung, &good], "[retry]\nfirst_byte_timeout = \"2s\"\n").await;
    hung.hang();
    for _ in 0..4 {
        let t0 = tokio::time::Instant::now();
        let resp = r.chat(false).await;
        assert_eq!(worker_of(&resp), good.url);
        // Paused time: only the timeout and backoffs move the clock.
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(4),
            "{:?}",
            t0.elapsed()
        );
    }
    let errors = [("worker", hung.url.as_str()), ("reason", "timeout")];
    assert!(metric(m::ERRORS, &errors) >= 1.0);
    let w = r
        .state
        .workers()
        .into_iter()
        .find(|w| w.url() == hung.url)
        .expect("listed");
    crate::health::probe(&r.state, &w).await;
    assert!(!w.is_healthy(), "the probe times out on a hung worker");
    hung.come_back();
    crate::health::probe(&r.state, &w).await;
    assert!(w.is_healthy(), "the next probe admits it again");
}

#[tokio::test(start_paused = true)]
async fn failures_open_the_breaker_and_keep_the_worker_out() {
    let bad = FakeWorker::refusing("rbrk-bad", StatusCode::SERVICE_UNAVAILABLE);
    let good = FakeWorker::ok("rbrk-good");
    let r = round_robin(
        &[&bad, &good],
        "[breaker]\nfailure_threshold = 2\ncooldown = \"1h\"\n",
    )
    .await;
    for _ in 0..6 {
        assert_eq!(worker_of(&r.chat(false).await), good.url);
    }
    assert_eq!(bad.posts(), 2, "no request after the breaker opened");
    assert_eq!(r.worker_status(&bad.url).await["breaker"], "open");
    assert_eq!(
        metric(m::BREAKER_OPENS, &[("worker", bad.url.as_str())]),
        1.0
    );
}
