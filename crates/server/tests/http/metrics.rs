//! The server's series, labelled with the model that served each request.

use std::sync::OnceLock;

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
