//! A server in process: the real app over the fakes, requests through
//! `oneshot`, and the checks every test repeats (the OpenAI error shape,
//! SSE framing).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::response::Response;
use axum::Router;
use ingot_config::{ApiKeyEntry, Config, FlagSpec, Layers};
use ingot_registry::{Budget, ModelSpec, ModelState, Registry};
use ingot_server::{AppState, EngineLoader};
use serde_json::{json, Value};
use tower::ServiceExt;

pub use super::fake::{FakeBuilder, FakeEngine, Mode, CHAT, EMBED, LIMITS, PLAIN, REPLY, THINKER};

/// Another name of [`CHAT`].
pub const ALIAS: &str = "chat-alias";

/// The body limit of every test server.
pub const MAX_BODY: usize = 4096;

/// The app over a fake engine stage and a registry that cannot build.
pub struct Server {
    app: Router,
    pub state: AppState,
    pub engine: Arc<FakeEngine>,
    pub builder: Arc<FakeBuilder>,
}

impl Server {
    /// A ready server under the default config.
    pub fn new() -> Self {
        Self::with(|_| {})
    }

    /// A ready server under the default config changed by `edit`.
    pub fn with(edit: impl FnOnce(&mut Config)) -> Self {
        let server = Self::starting(edit);
        server.state.set_ready();
        server
    }

    /// A ready server configured by environment variables `vars`.
    pub fn with_env(vars: &[(&str, &str)]) -> Self {
        let env = vars.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        let layers = Layers {
            env: env.collect(),
            ..Layers::default()
        };
        let server = Self::build(&layers, |_| {}, &[]);
        server.state.set_ready();
        server
    }

    /// A server still loading its models (`/ready` 503).
    pub fn starting(edit: impl FnOnce(&mut Config)) -> Self {
        Self::build(&Layers::default(), edit, &[])
    }

    /// A ready server that also serves [`THINKER`].
    pub fn thinker() -> Self {
        let server = Self::build(&Layers::default(), |_| {}, &[THINKER]);
        server.state.set_ready();
        server
    }

    fn build(layers: &Layers, edit: impl FnOnce(&mut Config), extra: &[&str]) -> Self {
        let mut runtime = ingot_config::load(layers).unwrap();
        edit(&mut runtime.config);
        let builder = Arc::new(FakeBuilder::new());
        let chat = ModelSpec {
            aliases: vec![ALIAS.into()],
            ..ModelSpec::new(CHAT)
        };
        let mut specs = vec![chat, ModelSpec::new(PLAIN), ModelSpec::new(EMBED)];
        specs.extend(extra.iter().map(|id| ModelSpec::new(*id)));
        let budget = Budget {
            device_bytes: 1 << 30,
            host_bytes: 0,
            load_wait: Duration::from_secs(5),
        };
        let models = Registry::new(EngineLoader::new(builder.clone(), false), specs, budget);
        let engine = Arc::new(FakeEngine::new());
        let state = AppState::builder(CHAT.into(), runtime, models)
            .embedding_models(vec![EMBED.into()])
            .engine_stage(engine.clone())
            .build()
            .unwrap();
        let app = ingot_server::app(state.clone(), MAX_BODY);
        Self {
            app,
            state,
            engine,
            builder,
        }
    }

    /// The response head (its body still streaming).
    pub async fn head(&self, request: Request<Body>) -> Response {
        self.app.clone().oneshot(request).await.unwrap()
    }

    /// The whole response.
    pub async fn send(&self, request: Request<Body>) -> Reply {
        Reply::read(self.head(request).await).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Reply {
        self.send(post(path, &body)).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(get(path)).await
    }

    /// No engine was ever built or loaded: every answer came from the
    /// front and the fake engine stage.
    pub fn assert_never_built(&self) {
        assert_eq!(self.builder.builds(), 0, "a model was built");
        for s in self.state.models().status() {
            assert_eq!(s.state, ModelState::Unloaded, "{} was loaded", s.id);
        }
    }
}

/// Turns the response cache on (coalescing is on by default).
pub fn response_cache(config: &mut Config) {
    config.flags.insert(
        ingot_server::FLAG_RESPONSE_CACHE.into(),
        FlagSpec {
            enabled: true,
            ..FlagSpec::default()
        },
    );
}

/// An API key entry named `id` for secret `key`, allowed every model.
pub fn api_key(id: &str, key: &str) -> ApiKeyEntry {
    ApiKeyEntry {
        id: id.into(),
        sha256: ingot_edge::hash_key_hex(key),
        tenant: None,
        models: vec!["*".into()],
        max_priority: None,
        admin: false,
        requests_per_minute: None,
        tokens_per_minute: None,
        max_concurrent: None,
        request_timeout: None,
        first_token_timeout: None,
    }
}

pub fn post(path: &str, body: &Value) -> Request<Body> {
    raw_post(path, body.to_string())
}

pub fn raw_post(path: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.into())
        .unwrap()
}

pub fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

/// `request` with header `name: value`.
pub fn with_header(mut request: Request<Body>, name: &'static str, value: &str) -> Request<Body> {
    request.headers_mut().insert(name, value.parse().unwrap());
    request
}

/// `request` with `method` instead.
pub fn with_method(mut request: Request<Body>, method: Method) -> Request<Body> {
    *request.method_mut() = method;
    request
}

/// A one-turn chat request for `model`, greedy, with `extra` fields.
pub fn chat(model: &str, extra: Value) -> Value {
    merged(
        json!({"model": model, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}),
        &extra,
    )
}

/// A text completion request for `model`, greedy, with `extra` fields.
pub fn completion(model: &str, extra: Value) -> Value {
    merged(
        json!({"model": model, "prompt": "Hi", "temperature": 0}),
        &extra,
    )
}

/// `base` with the fields of `extra` set.
pub fn merged(mut base: Value, extra: &Value) -> Value {
    if let Value::Object(fields) = extra {
        for (k, v) in fields {
            base[k] = v.clone();
        }
    }
    base
}

/// A whole response.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub async fn read(response: Response) -> Self {
        let (parts, body) = response.into_parts();
        Self {
            status: parts.status,
            headers: parts.headers,
            body: axum::body::to_bytes(body, usize::MAX).await.unwrap(),
        }
    }

    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// Header `name`; panics when absent.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers))
            .to_str()
            .unwrap()
    }

    /// A 200 with a JSON body.
    pub fn ok(&self) -> Value {
        assert_eq!(self.status, StatusCode::OK, "{}", self.text());
        self.json()
    }

    /// `x-ingot-cache`.
    pub fn cache(&self) -> &str {
        self.header("x-ingot-cache")
    }

    /// Asserts `status` and the OpenAI error shape with exactly these
    /// `type`, `param` and `code`; returns the message.
    pub fn error(
        &self,
        status: StatusCode,
        kind: &str,
        param: Option<&str>,
        code: Option<&str>,
    ) -> String {
        assert_eq!(self.status, status, "{}", self.text());
        let body = self.json();
        let error = body["error"]
            .as_object()
            .unwrap_or_else(|| panic!("{body}"));
        let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["code", "message", "param", "type"], "{body}");
        assert_eq!(error["type"], kind, "{body}");
        assert_eq!(error["param"], json!(param), "{body}");
        assert_eq!(error["code"], json!(code), "{body}");
        error["message"].as_str().unwrap().to_string()
    }

    /// A 400 `invalid_request_error` naming `param` (no code).
    pub fn invalid(&self, param: Option<&str>) -> String {
        self.error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            param,
            None,
        )
    }

    /// The JSON events of an SSE body, checking its framing: 200,
    /// `text/event-stream`, `data: <json>\n\n` events and one final
    /// `data: [DONE]\n\n`.
    pub fn events(&self) -> Vec<Value> {
        assert_eq!(self.status, StatusCode::OK, "{}", self.text());
        assert_eq!(self.header("content-type"), "text/event-stream");
        let text = self.text();
        let body = text
            .strip_suffix("data: [DONE]\n\n")
            .unwrap_or_else(|| panic!("no final [DONE]: {text:?}"));
        assert!(body.ends_with("\n\n"), "{text:?}");
        body.split_terminator("\n\n")
            .map(|event| {
                let data = event
                    .strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("not a data event: {event:?}"));
                assert!(!data.contains('\n'), "one line per event: {data:?}");
                serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data:?}"))
            })
            .collect()
    }
}

/// The `(event name, data)` pairs of an SSE body of named events
/// (Anthropic's, the Responses API's; no `[DONE]`), checking that each
/// event's name is its `type`.
pub fn named_events(reply: &Reply) -> Vec<(String, Value)> {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.header("content-type"), "text/event-stream");
    reply
        .text()
        .split_terminator("\n\n")
        .map(|event| {
            let (name, data) = event
                .strip_prefix("event: ")
                .and_then(|e| e.split_once("\ndata: "))
                .unwrap_or_else(|| panic!("not a named event: {event:?}"));
            let data: Value = serde_json::from_str(data).unwrap();
            assert_eq!(data["type"], name, "the name is the type");
            (name.to_string(), data)
        })
        .collect()
}

/// Every finish reason sent, in order.
pub fn finish_reasons(chunks: &[Value]) -> Vec<String> {
    chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["finish_reason"].as_str().map(String::from))
        .collect()
}

/// The streamed text of chat chunks (`delta.content`) or completion chunks
/// (`text`).
pub fn streamed_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| {
            c["delta"]["content"]
                .as_str()
                .or(c["text"].as_str())
                .map(String::from)
        })
        .collect()
}
