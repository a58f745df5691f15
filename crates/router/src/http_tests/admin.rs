//! The router's own endpoints: health, readiness, models, drain.

use std::collections::BTreeSet;

use axum::http::StatusCode;

use super::harness::{
    assert_error, json_body, round_robin, worker_of, FakeWorker, MODEL, OTHER_MODEL,
};

#[tokio::test(start_paused = true)]
async fn health_ready_and_the_union_of_models() {
    let (a, b) = (FakeWorker::ok("adm-a"), FakeWorker::ok("adm-b"));
    let r = round_robin(&[&a, &b], "").await;
    assert_eq!(r.get("/health").await.status(), StatusCode::OK);
    let ready = json_body(r.get("/ready").await).await;
    assert_eq!(
        (ready["healthy_workers"].as_u64(), ready["workers"].as_u64()),
        (Some(2), Some(2))
    );
    let models = json_body(r.get("/v1/models").await).await;
    let ids: Vec<_> = models["data"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| &m["id"])
        .collect();
    assert_eq!(ids, [MODEL, OTHER_MODEL], "one entry per model id");
}

#[tokio::test(start_paused = true)]
async fn a_drained_worker_gets_no_new_requests_until_undrained() {
    let (a, b) = (FakeWorker::ok("drain-a"), FakeWorker::ok("drain-b"));
    let r = round_robin(&[&a, &b], "").await;
    let drained = json_body(r.post("/admin/workers/0/drain", "").await).await;
    assert_eq!(drained["draining"], true);
    for _ in 0..4 {
        assert_eq!(worker_of(&r.chat(false).await), b.url);
    }
    assert_eq!(
        r.post("/admin/workers/0/undrain", "").await.status(),
        StatusCode::OK
    );
    let mut seen = BTreeSet::new();
    for _ in 0..4 {
        seen.insert(worker_of(&r.chat(false).await));
    }
    assert_eq!(seen, BTreeSet::from([a.url.clone(), b.url.clone()]));
    let missing = r.post("/admin/workers/9/drain", "").await;
    assert_error(missing, StatusCode::NOT_FOUND, None).await;
}

#[tokio::test(start_paused = true)]
async fn the_page_and_its_live_figures_of_each_worker() {
    let (a, b) = (FakeWorker::ok("live-a"), FakeWorker::ok("live-b"));
    let r = round_robin(&[&a, &b], "").await;
    let page = r.get("/").await;
    assert_eq!(page.status(), StatusCode::OK);
    let live = json_body(r.get("/ui/live").await).await;
    assert_eq!(live["kind"], "router");
    let workers = live["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2, "{live}");
    assert!(
        workers
            .iter()
            .all(|w| w["healthy"] == true && w["breaker"] == "closed"),
        "{live}"
    );
    assert_eq!(live["policy"], "round_robin");
}
