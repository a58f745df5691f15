//! The policy's choice, as the client sees it (`x-ingot-worker`).

use std::collections::{BTreeMap, BTreeSet};

use axum::http::StatusCode;
use serde_json::json;

use super::harness::{metric, round_robin, with_policy, worker_of, FakeWorker, MODEL};
use crate::metrics as m;

#[tokio::test(start_paused = true)]
async fn round_robin_visits_every_worker_in_turn() {
    let ws = ["rr-a", "rr-b", "rr-c"].map(FakeWorker::ok);
    let r = round_robin(&[&ws[0], &ws[1], &ws[2]], "").await;
    let mut seen = Vec::new();
    for _ in 0..6 {
        let resp = r.chat(false).await;
        assert_eq!(resp.status(), StatusCode::OK);
        seen.push(worker_of(&resp));
    }
    let urls: Vec<_> = ws.iter().map(|w| w.url.clone()).collect();
    assert_eq!(seen, [&urls[..], &urls[..]].concat());
    for w in &ws {
        let labels = [
            ("worker", w.url.as_str()),
            ("policy", "round_robin"),
            ("status", "200"),
        ];
        assert_eq!(metric(m::REQUESTS, &labels), 2.0, "{}", w.url);
    }
}

#[tokio::test(start_paused = true)]
async fn least_outstanding_avoids_a_worker_with_a_stream_in_flight() {
    let (busy, _feed) = FakeWorker::streaming("lo-busy");
    let idle = FakeWorker::ok("lo-idle");
    let r = with_policy("least_outstanding", &[&busy, &idle], "").await;
    let open = r.chat(true).await;
    assert_eq!(worker_of(&open), busy.url, "ties go to the lowest id");
    for _ in 0..3 {
        assert_eq!(worker_of(&r.chat(false).await), idle.url);
    }
    drop(open);
    assert_eq!(
        r.worker_status(&busy.url).await["outstanding"],
        0,
        "a client that leaves releases it"
    );
}

#[tokio::test(start_paused = true)]
async fn prefix_cache_keeps_each_tenant_on_one_worker() {
    let (a, b) = (FakeWorker::ok("pc-a"), FakeWorker::ok("pc-b"));
    let r = with_policy("prefix_cache", &[&a, &b], "").await;
    let mut by_tenant: BTreeMap<char, BTreeSet<String>> = BTreeMap::new();
    for round in 0..3 {
        for tenant in ['A', 'B', 'C', 'D'] {
            let system = format!("You are the assistant of tenant {tenant}. ").repeat(12);
            let messages = json!([{"role": "system", "content": system},
                                  {"role": "user", "content": format!("Question {round}.")}]);
            let body = json!({"model": MODEL, "messages": messages}).to_string();
            let resp = r.post("/v1/chat/completions", body).await;
            by_tenant
                .entry(tenant)
                .or_default()
                .insert(worker_of(&resp));
        }
    }
    assert!(by_tenant.values().all(|ws| ws.len() == 1), "{by_tenant:?}");
    let used: BTreeSet<_> = by_tenant.values().flatten().collect();
    assert_eq!(
        used.len(),
        2,
        "new prefixes spread over the workers: {by_tenant:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn latency_aware_spreads_concurrent_streams() {
    let (a, b) = (
        FakeWorker::open_streams("la-a"),
        FakeWorker::open_streams("la-b"),
    );
    let r = with_policy("latency_aware", &[&a, &b], "").await;
    let mut open = Vec::new();
    for _ in 0..8 {
        open.push(r.chat(true).await);
    }
    let per_worker = |url: &str| open.iter().filter(|resp| worker_of(resp) == url).count();
    // Unmeasured workers count as zero wait; ties go to the fewest in flight.
    assert_eq!((per_worker(&a.url), per_worker(&b.url)), (4, 4));
    let selections = |w: &FakeWorker| metric(m::SELECTIONS, &[("worker", w.url.as_str())]);
    assert_eq!(selections(&a) + selections(&b), 8.0);
}
