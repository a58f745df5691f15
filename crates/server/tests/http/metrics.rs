//! The server's series: labelled with the model that served each request,
//! and a request for no endpoint no model's refusal.

use std::sync::OnceLock;

use axum::http::StatusCode;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::json;

use super::harness::*;

/// The process's recorder, installed once with the default model as its
/// global `model` label, as `ingot serve` installs it. Other tests of this
/// binary record into it too: the checks look only at their own labels.
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .add_global_label("model", CHAT)
            .install_recorder()
            .unwrap()
    })
}

/// The sample lines of `series` in `text`.
fn samples<'a>(text: &'a str, series: &str) -> Vec<&'a str> {
    let start = format!("{series}{{");
    text.lines().filter(|l| l.starts_with(&start)).collect()
}

#[tokio::test]
async fn embedding_traffic_is_booked_under_the_embedding_model() {
    let metrics = recorder();
    let server = Server::new();
    let body = json!({"model": EMBED, "input": [[1, 2, 3], [1]]});
    let reply = server.post("/v1/embeddings", body).await.ok();
    assert_eq!(reply["data"][0]["embedding"], json!([3.0, 3.0, 3.0, 3.0]));
    let text = metrics.render();
    let embed = format!("model=\"{EMBED}\"");
    let default = format!("model=\"{CHAT}\"");
    let answered = |l: &&str| l.contains("route=\"/v1/embeddings\"") && l.contains("2xx");
    let http = samples(&text, "ingot_http_requests_total");
    assert!(
        http.iter().any(|l| answered(l) && l.contains(&embed)),
        "{text}"
    );
    assert!(
        !http.iter().any(|l| answered(l) && l.contains(&default)),
        "{text}"
    );
    let tokens = samples(&text, "ingot_embedding_tokens_total");
    assert!(tokens.iter().any(|l| l.contains(&embed)), "{text}");
    assert!(!tokens.iter().any(|l| l.contains(&default)), "{text}");
    for series in [
        "ingot_embedding_tokens_total",
        "ingot_embedding_batch_seconds",
    ] {
        assert!(
            text.contains(&format!("# HELP {series} ")),
            "no HELP for {series}:\n{text}"
        );
    }
}

#[tokio::test]
async fn a_path_no_endpoint_serves_is_no_rejection_of_a_model() {
    // This thread's own recorder: the single-threaded test runtime answers
    // on it, and other tests' refusals cannot reach it.
    let local = PrometheusBuilder::new()
        .add_global_label("model", CHAT)
        .build_recorder();
    let handle = local.handle();
    let server = Server::new();
    {
        let _on_this_thread = metrics::set_default_local_recorder(&local);
        assert_eq!(
            server.get("/no/such/route").await.status,
            StatusCode::NOT_FOUND
        );
        let unknown = server.post("/v1/completions", completion("nope", json!({})));
        assert_eq!(unknown.await.status, StatusCode::NOT_FOUND);
    }
    let text = handle.render();
    let other = samples(&text, "ingot_http_requests_total");
    assert!(
        other
            .iter()
            .any(|l| l.contains("route=\"other\"") && l.contains("4xx")),
        "{text}"
    );
    // The unknown model is a refusal; the unknown path is not.
    let refused = samples(&text, "ingot_rejections_total");
    assert_eq!(refused.len(), 1, "{text}");
    assert!(refused[0].contains("reason=\"not_found\""), "{text}");
    assert!(refused[0].ends_with(" 1"), "{text}");
}

#[tokio::test]
async fn generation_traffic_is_booked_under_the_model_that_served_it() {
    let metrics = recorder();
    let server = Server::new();
    let reply = server.post("/v1/completions", completion(PLAIN, json!({})));
    assert_eq!(reply.await.status, StatusCode::OK);
    let streamed = server.post(
        "/v1/completions",
        completion(PLAIN, json!({"stream": true})),
    );
    assert_eq!(streamed.await.status, StatusCode::OK);
    let text = metrics.render();
    let plain = format!("model=\"{PLAIN}\"");
    let booked: Vec<f64> = samples(&text, "ingot_http_requests_total")
        .into_iter()
        .filter(|l| l.contains("route=\"/v1/completions\"") && l.contains("2xx"))
        .filter(|l| l.contains(&plain))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    // Other tests of this binary may add to the series: at least these two.
    assert!(matches!(booked[..], [n] if n >= 2.0), "{booked:?}\n{text}");
}
