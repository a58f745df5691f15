//! The shared harness: fake workers (in-process axum apps) behind the
//! [`WorkerClient`] seam, and a router built on them from `router.toml`
//! text, its workers admitted by the same health probe as in production.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http_body_util::BodyExt;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tower::ServiceExt;

use crate::client::{ConnectError, SendFuture, WorkerClient, WorkerRequest};
use crate::config::RouterConfig;
use crate::health::probe;
use crate::serve::static_workers;
use crate::state::RouterState;

/// The model requests ask for; every fake worker lists it.
pub const MODEL: &str = "m";
/// Another model every fake worker lists (an experiment arm's model).
pub const OTHER_MODEL: &str = "m2";

/// How a fake worker's process behaves, whatever its handlers say.
const UP: u8 = 0;
/// Connections are refused (a dead process).
const DOWN: u8 = 1;
/// Connections are accepted and never answered (a SIGSTOPped process).
const HUNG: u8 = 2;

/// One fake `ingot serve`: ready, listing [`MODEL`] and [`OTHER_MODEL`], answering every
/// `POST /v1/*` with its handler; reached at `http://NAME`.
#[derive(Clone)]
pub struct FakeWorker {
    /// Its base URL (also its `worker` label in the router).
    pub url: String,
    app: Router,
    posts: Arc<AtomicUsize>,
    mode: Arc<AtomicU8>,
}

impl FakeWorker {
    /// A worker at `http://{name}` whose POSTs get `answer(body)`.
    pub fn new<F, Fut>(name: &str, answer: F) -> Self
    where
        F: Fn(Bytes) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        let posts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&posts);
        let on_post = move |body: Bytes| {
            counted.fetch_add(1, Ordering::SeqCst);
            answer(body)
        };
        let data = [MODEL, OTHER_MODEL].map(|id| json!({"id": id, "object": "model"}));
        let models = json!({"object": "list", "data": data});
        let app = Router::new()
            .route("/ready", get(|| async { "ready" }))
            .route("/v1/models", get(move || async move { Json(models) }))
            .route("/v1/{*path}", post(on_post));
        Self {
            url: format!("http://{name}"),
            app,
            posts,
            mode: Arc::new(AtomicU8::new(UP)),
        }
    }

    /// A worker that answers a chat completion naming itself and echoing
    /// the model it was asked for.
    pub fn ok(name: &str) -> Self {
        let me = format!("http://{name}");
        Self::new(name, move |body| {
            let me = me.clone();
            async move { completion(&me, &body) }
        })
    }

    /// A worker that refuses every request with `status` (503, 429).
    pub fn refusing(name: &str, status: StatusCode) -> Self {
        Self::new(name, move |_| async move {
            let error = json!({"error": {"message": "overloaded", "type": "server_error", "param": null, "code": "overloaded"}});
            (status, Json(error)).into_response()
        })
    }

    /// A worker whose (single) streamed answer is fed by the test through
    /// the returned sender: each `Ok` is one chunk, an `Err` breaks the
    /// stream, dropping the sender ends it.
    pub fn streaming(name: &str) -> (Self, mpsc::UnboundedSender<Result<Bytes, std::io::Error>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let feed = Arc::new(Mutex::new(Some(rx)));
        let worker = Self::new(name, move |_| {
            let rx = feed.lock().expect("feed").take();
            async move {
                let Some(rx) = rx else {
                    return StatusCode::INTERNAL_SERVER_ERROR.into_response();
                };
                let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|chunk| (chunk, rx))
                });
                let sse = [(header::CONTENT_TYPE, "text/event-stream")];
                (sse, Body::from_stream(chunks)).into_response()
            }
        });
        (worker, tx)
    }

    /// A worker whose streams send their head and then nothing, open
    /// until the client leaves (requests in flight that stay in flight).
    pub fn open_streams(name: &str) -> Self {
        Self::new(name, |_| async {
            let silent = futures_util::stream::pending::<Result<Bytes, std::io::Error>>();
            let sse = [(header::CONTENT_TYPE, "text/event-stream")];
            (sse, Body::from_stream(silent)).into_response()
        })
    }

    /// The same worker answering `path` with `route` too.
    pub fn route(mut self, path: &str, route: axum::routing::MethodRouter) -> Self {
        self.app = self.app.route(path, route);
        self
    }

    /// POSTs it received.
    pub fn posts(&self) -> usize {
        self.posts.load(Ordering::SeqCst)
    }

    /// From now on its connections are refused.
    pub fn go_down(&self) {
        self.mode.store(DOWN, Ordering::SeqCst);
    }

    /// From now on it accepts requests and never answers.
    pub fn hang(&self) {
        self.mode.store(HUNG, Ordering::SeqCst);
    }

    /// From now on it answers again.
    pub fn come_back(&self) {
        self.mode.store(UP, Ordering::SeqCst);
    }
}

/// A chat completion from `worker` for the request `body`.
fn completion(worker: &str, body: &[u8]) -> Response {
    let asked: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    Json(json!({
        "object": "chat.completion",
        "model": asked["model"],
        "worker": worker,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    }))
    .into_response()
}

/// The fake transport: a request goes to the fake worker its URI names.
struct FakeClient(HashMap<String, FakeWorker>);

impl WorkerClient for FakeClient {
    fn send(&self, req: WorkerRequest) -> SendFuture<'_> {
        let base = req.uri().authority().map(|a| format!("http://{a}"));
        let worker = base.and_then(|b| self.0.get(&b)).cloned();
        Box::pin(async move {
            let worker = worker.ok_or_else(|| ConnectError("no such host".into()))?;
            match worker.mode.load(Ordering::SeqCst) {
                DOWN => return Err(ConnectError("connection refused".into())),
                HUNG => std::future::pending::<()>().await,
                _ => {}
            }
            let resp = worker.app.oneshot(req).await;
            Ok(resp.unwrap_or_else(|never| match never {}))
        })
    }
}

/// A router in front of fake workers, called in process.
pub struct TestRouter {
    /// Its shared state.
    pub state: Arc<RouterState>,
    app: Router,
}

/// A round-robin router in front of `workers` (`workers.urls`), with more
/// `router.toml` after the `[workers]` table.
pub async fn round_robin(workers: &[&FakeWorker], more: &str) -> TestRouter {
    with_policy("round_robin", workers, more).await
}

/// The same with `policy`.
pub async fn with_policy(policy: &str, workers: &[&FakeWorker], more: &str) -> TestRouter {
    let urls: Vec<_> = workers.iter().map(|w| w.url.as_str()).collect();
    let config = format!("policy = \"{policy}\"\n[workers]\nurls = {urls:?}\n{more}");
    start(&config, workers).await
}

/// A router configured by `config`, the fake `workers` reachable; every
/// worker is probed once, as the health task would.
pub async fn start(config: &str, workers: &[&FakeWorker]) -> TestRouter {
    let raw: RouterConfig = toml::from_str(config).expect("router.toml");
    let config = raw.validate("/bin/ingot".into()).expect("a valid config");
    let listed = static_workers(&config);
    let restarts = listed.iter().map(|_| None).collect();
    let client = FakeClient(
        workers
            .iter()
            .map(|w| (w.url.clone(), (*w).clone()))
            .collect(),
    );
    let state = RouterState::with_client(config, listed, restarts, metrics(), Box::new(client));
    let state = Arc::new(state);
    for w in state.workers() {
        probe(&state, &w).await;
    }
    TestRouter {
        app: crate::app(Arc::clone(&state)),
        state,
    }
}

impl TestRouter {
    /// Sends `req` to the router; fails the test when no response head
    /// comes within a minute (of paused time: only a hang trips it).
    pub async fn call(&self, req: Request<Body>) -> Response {
        let resp = tokio::time::timeout(Duration::from_secs(60), self.app.clone().oneshot(req));
        let resp = resp
            .await
            .expect("a response head (is the router buffering?)");
        resp.unwrap_or_else(|never| match never {})
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Response {
        self.call(Request::get(path).body(Body::empty()).expect("request"))
            .await
    }

    /// `POST path` with `body`.
    pub async fn post(&self, path: &str, body: impl Into<Body>) -> Response {
        let req = Request::post(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.into())
            .expect("request");
        self.call(req).await
    }

    /// A chat completion request for [`MODEL`] (`stream` as given).
    pub async fn chat(&self, stream: bool) -> Response {
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "stream": stream});
        self.post("/v1/chat/completions", body.to_string()).await
    }

    /// `/admin/workers`' entry of the worker at `url`.
    pub async fn worker_status(&self, url: &str) -> Value {
        let all = json_body(self.get("/admin/workers").await).await;
        let found = all["workers"]
            .as_array()
            .and_then(|ws| ws.iter().find(|w| w["url"].as_str() == Some(url)).cloned());
        found.unwrap_or_else(|| panic!("no worker {url} in {all}"))
    }
}

/// A response header as text.
pub fn header_of<'a>(resp: &'a Response, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

/// The worker that answered (`x-ingot-worker`).
pub fn worker_of(resp: &Response) -> String {
    header_of(resp, crate::WORKER_HEADER)
        .expect("an x-ingot-worker header")
        .to_string()
}

/// The whole body as JSON.
pub async fn json_body(resp: Response) -> Value {
    let bytes = body_bytes(resp).await;
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}: {bytes:?}"))
}

/// The whole body.
pub async fn body_bytes(resp: Response) -> Bytes {
    let collected = resp.into_body().collect().await.expect("a body");
    collected.to_bytes()
}

/// Asserts an OpenAI-shaped error: `status`, and a body
/// `{"error": {"message", "type", "param": null, "code"}}` with `code`.
pub async fn assert_error(resp: Response, status: StatusCode, code: Option<&str>) -> Value {
    assert_eq!(resp.status(), status);
    let body = json_body(resp).await;
    let error = &body["error"];
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(
        error["type"].is_string() && error["param"].is_null(),
        "{body}"
    );
    assert_eq!(error["code"], json!(code), "{body}");
    body
}

/// The next data frame of `body`, failing when none comes within a second
/// (of paused time: only an answer that never comes trips it).
pub async fn next_chunk(body: &mut Body) -> Option<Bytes> {
    let frame = tokio::time::timeout(Duration::from_secs(1), body.frame())
        .await
        .expect("a chunk in time (is the router buffering?)")?;
    Some(frame.expect("a frame").into_data().expect("a data frame"))
}

/// The router's Prometheus handle (one recorder per test process; tests
/// read series labelled with their own workers, so they do not interfere).
fn metrics() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE.get_or_init(crate::metrics::install).clone()
}

/// The sum of the series `name` whose labels include every `labels` pair.
pub fn metric(name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = metrics().expect("the test recorder").render();
    let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| wanted.iter().all(|w| l.contains(w.as_str())))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
