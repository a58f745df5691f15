//! Shared server state: the engine (once loaded), the generation pipeline,
//! the live runtime config (flags, cache bounds), the served name, the
//! drain flag and the in-flight counter used by graceful shutdown.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use ingot_config::{Config, Loaded};
use ingot_engine::EngineHandle;
use ingot_tokenizer::ChatTemplate;
use metrics::counter;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::Notify;

use crate::pipeline::{
    CacheSettings, Coalescer, EngineGenerator, MemoryStore, ResponseCache, Sharing,
};
use crate::reload::{LogLevelFn, ReloadFn};
use crate::ApiError;

/// The generator stack every endpoint goes through.
pub type Pipeline = ResponseCache<Coalescer<EngineGenerator>>;

/// Feature flag: identical in-flight deterministic requests share one
/// generation.
pub const FLAG_COALESCING: &str = "coalescing";
/// Feature flag: completed deterministic answers are stored and replayed.
pub const FLAG_RESPONSE_CACHE: &str = "response_cache";

/// State shared by every handler. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Arc<OnceLock<EngineHandle>>,
    pipeline: Pipeline,
    runtime: RwLock<Arc<Loaded>>,
    reload: OnceLock<ReloadFn>,
    log_level: OnceLock<LogLevelFn>,
    /// The model's chat template, compiled once (or why there is none).
    template: OnceLock<Result<Arc<ChatTemplate>, String>>,
    model_name: String,
    created: u64,
    draining: AtomicBool,
    inflight: AtomicUsize,
    idle: Notify,
    metrics: Option<PrometheusHandle>,
    /// API keys and their limits (auth off until loaded).
    edge: ingot_edge::Edge,
}

impl AppState {
    /// State for a server that will serve `model_name` under `runtime`.
    pub fn new(model_name: String, runtime: Loaded, metrics: Option<PrometheusHandle>) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let engine = Arc::new(OnceLock::new());
        let config = &runtime.config;
        let coalescer = Coalescer::new(
            EngineGenerator::new(engine.clone()),
            config.engine.stall_timeout.get(),
        );
        let store = Arc::new(MemoryStore::new(cache_settings(config)));
        Self {
            inner: Arc::new(Inner {
                engine,
                pipeline: ResponseCache::new(coalescer, store),
                runtime: RwLock::new(Arc::new(runtime)),
                reload: OnceLock::new(),
                log_level: OnceLock::new(),
                template: OnceLock::new(),
                model_name,
                created,
                draining: AtomicBool::new(false),
                inflight: AtomicUsize::new(0),
                idle: Notify::new(),
                metrics,
                edge: ingot_edge::Edge::default(),
            }),
        }
    }

    /// Marks the model loaded; `/ready` turns 200.
    pub fn set_engine(&self, engine: EngineHandle) {
        let template = match ChatTemplate::for_tokenizer(engine.tokenizer()) {
            Ok(Some(t)) => Ok(Arc::new(t)),
            Ok(None) => Err("this model has no chat template; use /v1/completions".to_string()),
            Err(e) => Err(format!("the model's chat template is invalid: {e}")),
        };
        let _ = self.inner.template.set(template);
        let _ = self.inner.engine.set(engine);
    }

    /// The compiled chat template.
    pub fn chat_template(&self) -> Result<Arc<ChatTemplate>, ApiError> {
        match self.inner.template.get() {
            Some(Ok(t)) => Ok(t.clone()),
            Some(Err(e)) => Err(ApiError::BadRequest(ingot_protocol::ProtocolError::field(
                "messages",
                e.clone(),
            ))),
            None => Err(ApiError::Unavailable("the model is still loading".into())),
        }
    }

    /// The engine, or 503 while loading or draining.
    pub fn engine(&self) -> Result<&EngineHandle, ApiError> {
        if self.is_draining() {
            return Err(ApiError::Unavailable("the server is shutting down".into()));
        }
        self.inner
            .engine
            .get()
            .ok_or_else(|| ApiError::Unavailable("the model is still loading".into()))
    }

    /// The engine regardless of draining (for read-only endpoints).
    pub fn loaded_engine(&self) -> Option<&EngineHandle> {
        self.inner.engine.get()
    }

    /// The API keys and their limits (the router's auth layer reads them).
    pub fn edge(&self) -> &ingot_edge::Edge {
        &self.inner.edge
    }

    /// The generation pipeline (response cache, coalescing, engine).
    pub fn pipeline(&self) -> &Pipeline {
        &self.inner.pipeline
    }

    /// The effective runtime config and where each value came from.
    pub fn runtime(&self) -> Arc<Loaded> {
        self.inner
            .runtime
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Enables live reload: `reload` loads the config again, `log_level`
    /// swaps the log filter.
    pub fn set_reload(&self, reload: Option<ReloadFn>, log_level: Option<LogLevelFn>) {
        if let Some(r) = reload {
            let _ = self.inner.reload.set(r);
        }
        if let Some(l) = log_level {
            let _ = self.inner.log_level.set(l);
        }
    }

    pub(crate) fn reloader(&self) -> Option<&ReloadFn> {
        self.inner.reload.get()
    }

    pub(crate) fn log_level_setter(&self) -> Option<&LogLevelFn> {
        self.inner.log_level.get()
    }

    /// Installs a reloaded config; rebuilds the response cache when its
    /// bounds changed (its entries are dropped).
    pub fn set_runtime(&self, runtime: Loaded) {
        let old = self.runtime();
        if cache_settings(&old.config) != cache_settings(&runtime.config) {
            let store = Arc::new(MemoryStore::new(cache_settings(&runtime.config)));
            self.inner.pipeline.replace_store(store);
        }
        *self
            .inner
            .runtime
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(runtime);
    }

    /// Decides feature flag `name` for `unit` (API key, else `user`, else
    /// the request id) and counts the decision.
    pub fn flag(&self, name: &'static str, unit: &str) -> bool {
        let on = self.runtime().config.flag(name, unit);
        let result = if on { "on" } else { "off" };
        counter!("ingot_flag_decisions_total", "flag" => name, "result" => result).increment(1);
        on
    }

    /// What a request's generations may share: the flags for its unit,
    /// narrowed by the client's `Cache-Control`.
    pub fn sharing(&self, unit: &str, control: CacheControl) -> Sharing {
        if control == CacheControl::NoStore {
            return Sharing::NONE;
        }
        let cache = self.flag(FLAG_RESPONSE_CACHE, unit);
        let fresh = control == CacheControl::NoCache;
        Sharing {
            coalesce: !fresh && self.flag(FLAG_COALESCING, unit),
            lookup: cache && !fresh,
            store: cache,
        }
    }

    /// The served model name.
    pub fn model_name(&self) -> &str {
        &self.inner.model_name
    }

    /// Load time, Unix seconds.
    pub fn created(&self) -> u64 {
        self.inner.created
    }

    /// 404 unless `requested` is absent or names the served model.
    pub fn check_model(&self, requested: Option<&str>) -> Result<(), ApiError> {
        match requested {
            Some(name) if name != self.inner.model_name => {
                Err(ApiError::ModelNotFound(name.to_string()))
            }
            _ => Ok(()),
        }
    }

    /// Stops taking new generation requests.
    pub fn start_draining(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::SeqCst)
    }

    /// Counts a generation request until the guard drops.
    pub fn track(&self) -> InflightGuard {
        self.inner.inflight.fetch_add(1, Ordering::SeqCst);
        InflightGuard {
            state: self.clone(),
        }
    }

    /// Generation requests in flight (including open streams).
    pub fn inflight(&self) -> usize {
        self.inner.inflight.load(Ordering::SeqCst)
    }

    /// Resolves when no generation request is in flight.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.inner.idle.notified();
            if self.inflight() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Prometheus text of every metric.
    pub fn render_metrics(&self) -> String {
        self.inner.pipeline.publish();
        self.inner
            .metrics
            .as_ref()
            .map(|h| h.render())
            .unwrap_or_default()
    }
}

/// The bounds of the response cache in `config`.
fn cache_settings(config: &Config) -> CacheSettings {
    CacheSettings {
        max_entries: config.cache.max_entries,
        max_bytes: config.cache.max_bytes.bytes(),
        ttl: config.cache.ttl.get(),
    }
}

/// What a request's `Cache-Control` asks of the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheControl {
    /// Share as the flags allow.
    #[default]
    Default,
    /// `no-cache`: a fresh generation (no stored or in-flight answer); its
    /// answer may still be stored.
    NoCache,
    /// `no-store`: nothing shared or stored.
    NoStore,
}

impl CacheControl {
    /// Parses a `Cache-Control` header value (directives are
    /// case-insensitive and comma-separated).
    pub fn parse(value: Option<&str>) -> Self {
        let Some(value) = value else {
            return Self::Default;
        };
        let has = |d: &str| {
            value
                .split(',')
                .any(|part| part.trim().eq_ignore_ascii_case(d))
        };
        if has("no-store") {
            Self::NoStore
        } else if has("no-cache") {
            Self::NoCache
        } else {
            Self::Default
        }
    }
}

/// Held by a generation request (moved into its stream when streaming).
pub struct InflightGuard {
    state: AppState,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if self.state.inner.inflight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.state.inner.idle.notify_waiters();
        }
    }
}
