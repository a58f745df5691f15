//! Shared server state: the served models (a registry of engines), the
//! generation pipeline, the live runtime config (flags, cache bounds), the
//! default model's name, the drain flag and the in-flight counter used by
//! graceful shutdown.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use ingot_config::{Config, Loaded};
use ingot_registry::Lease;
use metrics::counter;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::Notify;

use crate::models::{Models, ServedModel};
use crate::pipeline::{
    CacheSettings, Coalescer, EngineGenerator, MemoryStore, ResponseCache, ResponseStore, Sharing,
    TwoTierStore,
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
    /// Set once the listener is up; models load on demand from then on.
    models: Arc<OnceLock<Models>>,
    /// The preloaded models are in: `/ready` is 200.
    ready: AtomicBool,
    pipeline: Pipeline,
    runtime: RwLock<Arc<Loaded>>,
    reload: OnceLock<ReloadFn>,
    log_level: OnceLock<LogLevelFn>,
    /// The model a request without `model` gets (the first configured).
    model_name: String,
    /// Context lengths of the models loaded so far (for `/v1/models`).
    max_model_len: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    created: u64,
    draining: AtomicBool,
    inflight: AtomicUsize,
    idle: Notify,
    metrics: Option<PrometheusHandle>,
    /// API keys and their limits (auth off until loaded).
    edge: ingot_edge::Edge,
    /// Shared state in Redis, when `[redis]` is configured.
    fleet: OnceLock<ingot_fleet::Fleet>,
    /// Ids of the embedding models (the rest are generative).
    embedding_models: OnceLock<Vec<String>>,
    /// SLO evaluation and remediation.
    slo: crate::slo::SloMonitor,
}

impl AppState {
    /// State for a server whose default model is `model_name`, under
    /// `runtime`.
    pub fn new(model_name: String, runtime: Loaded, metrics: Option<PrometheusHandle>) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let models = Arc::new(OnceLock::new());
        let config = &runtime.config;
        let coalescer = Coalescer::new(
            EngineGenerator::new(models.clone()),
            config.engine.stall_timeout.get(),
        );
        let store = Arc::new(MemoryStore::new(cache_settings(config)));
        Self {
            inner: Arc::new(Inner {
                models,
                ready: AtomicBool::new(false),
                pipeline: ResponseCache::new(coalescer, store),
                runtime: RwLock::new(Arc::new(runtime)),
                reload: OnceLock::new(),
                log_level: OnceLock::new(),
                model_name,
                max_model_len: Default::default(),
                created,
                draining: AtomicBool::new(false),
                inflight: AtomicUsize::new(0),
                idle: Notify::new(),
                metrics,
                edge: ingot_edge::Edge::default(),
                fleet: OnceLock::new(),
                embedding_models: OnceLock::new(),
                slo: crate::slo::SloMonitor::default(),
            }),
        }
    }

    /// Installs the registry: from now on models load on demand.
    pub fn set_models(&self, models: Models) {
        let _ = self.inner.models.set(models);
    }

    /// Says which configured models are embedding models (once, at start).
    pub fn set_embedding_models(&self, ids: Vec<String>) {
        let _ = self.inner.embedding_models.set(ids);
    }

    /// The endpoints model `id` serves, known before it loads.
    pub fn endpoints(&self, id: &str) -> &'static [&'static str] {
        let embedding = self
            .inner
            .embedding_models
            .get()
            .is_some_and(|ids| ids.iter().any(|i| i == id));
        if embedding {
            crate::models::EMBEDDING_ENDPOINTS
        } else {
            crate::models::GENERATIVE_ENDPOINTS
        }
    }

    /// The registry, once installed.
    pub fn models(&self) -> Option<&Models> {
        self.inner.models.get()
    }

    /// The context length of model `id`, once it has been loaded.
    pub fn max_model_len(&self, id: &str) -> Option<usize> {
        lock(&self.inner.max_model_len).get(id).copied()
    }

    /// The preloaded models are in; `/ready` turns 200.
    pub fn set_ready(&self) {
        self.inner.ready.store(true, Ordering::SeqCst);
    }

    /// Whether `/ready` is 200: preloading done and not draining.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::SeqCst) && !self.is_draining()
    }

    /// A lease on the model `requested` names (the default model when
    /// absent), loading it if need be; 503 while starting or draining, 404
    /// for a name no model has.
    pub async fn model(&self, requested: Option<&str>) -> Result<Lease<ServedModel>, ApiError> {
        if self.is_draining() {
            return Err(ApiError::Unavailable("the server is shutting down".into()));
        }
        let models = self
            .models()
            .ok_or_else(|| ApiError::Unavailable("the server is starting".into()))?;
        if !self.inner.ready.load(Ordering::SeqCst) {
            return Err(ApiError::Unavailable("the model is still loading".into()));
        }
        let name = requested.unwrap_or(&self.inner.model_name);
        models.note_request(name);
        let lease = models.acquire(name).await?;
        let mut lens = lock(&self.inner.max_model_len);
        // Known after a model's first request: no key allocated per request.
        if !lens.contains_key(lease.id()) {
            lens.insert(lease.id().to_string(), lease.max_context());
        }
        drop(lens);
        if let Ok(engine) = lease.engine() {
            self.inner.slo.observe(lease.id(), engine.controls());
        }
        Ok(lease)
    }

    /// Shares state through `fleet` from now on: the response cache gets
    /// its Redis tier (`redis.share_cache`), the API keys' limits hold
    /// across instances (`redis.share_rate_limits`).
    pub fn set_fleet(&self, fleet: ingot_fleet::Fleet) {
        let config = self.runtime().config.clone();
        if config.redis.share_rate_limits {
            self.inner.edge.share_limits(fleet.clone());
        }
        if self.inner.fleet.set(fleet).is_ok() && config.redis.share_cache {
            self.inner.pipeline.replace_store(self.store_for(&config));
        }
    }

    /// The shared-state client, when configured.
    pub fn fleet(&self) -> Option<&ingot_fleet::Fleet> {
        self.inner.fleet.get()
    }

    /// The response store `config` asks for: local, or local then Redis.
    fn store_for(&self, config: &Config) -> Arc<dyn ResponseStore> {
        let local = MemoryStore::new(cache_settings(config));
        match self.inner.fleet.get() {
            Some(fleet) if config.redis.share_cache => Arc::new(TwoTierStore::new(
                local,
                fleet.clone(),
                config.cache.ttl.get(),
            )),
            _ => Arc::new(local),
        }
    }

    /// The API keys and their limits (the router's auth layer reads them).
    pub fn edge(&self) -> &ingot_edge::Edge {
        &self.inner.edge
    }

    /// The SLO policy engine.
    pub fn slo(&self) -> &crate::slo::SloMonitor {
        &self.inner.slo
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
            self.inner
                .pipeline
                .replace_store(self.store_for(&runtime.config));
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

    /// The default model's name.
    pub fn model_name(&self) -> &str {
        &self.inner.model_name
    }

    /// Load time, Unix seconds.
    pub fn created(&self) -> u64 {
        self.inner.created
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

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
