//! Shared server state: the served models (a registry of engines), the
//! generation pipeline, the live runtime config (flags, cache bounds), the
//! default model's name, the drain flag and the in-flight counter used by
//! graceful shutdown. Built once its parts exist ([`AppStateBuilder`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use ingot_config::{Config, Loaded};
use metrics::counter;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::Notify;

use crate::models::Models;
use crate::pipeline::{
    CacheSettings, Coalescer, EngineStage, Generator, MemoryStore, ResponseCache, ResponseStore,
    Sharing, TwoTierStore,
};
use crate::reload::{LogLevelFn, ReloadFn};
use crate::slo::SloMonitor;
use crate::{ApiError, ServeError};

/// The generator stack every generating endpoint goes through, in its one
/// order: the response cache, then coalescing, then the engine stage (the
/// one place a model is leased).
pub type Pipeline = ResponseCache<Coalescer<Arc<dyn Generator>>>;

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
    models: Models,
    /// The preloaded models are in: `/ready` is 200.
    ready: AtomicBool,
    pipeline: Pipeline,
    runtime: RwLock<Arc<Loaded>>,
    reload: Option<ReloadFn>,
    log_level: Option<LogLevelFn>,
    /// The model a request without `model` gets (the first configured).
    model_name: String,
    created: u64,
    /// When the state was built: the preloaded models' load starts then.
    started: std::time::Instant,
    /// Set when shutdown begins: when the drain ends at the latest.
    drain_ends: std::sync::OnceLock<std::time::Instant>,
    inflight: AtomicUsize,
    idle: Notify,
    /// Turns true when open streams must end now (the drain's deadline).
    close_streams: tokio::sync::watch::Sender<bool>,
    metrics: Option<PrometheusHandle>,
    /// API keys and their limits (auth off when none are configured).
    edge: ingot_edge::Edge,
    /// Shared state in Redis, when `[redis]` is configured.
    fleet: Option<ingot_fleet::Fleet>,
    /// Ids of the embedding models (the rest are generative).
    embedding_models: Vec<String>,
    /// SLO evaluation and remediation (the engine stage shows it engines).
    slo: Arc<SloMonitor>,
    /// Stored responses of `/v1/responses`.
    responses: crate::routes::responses::ResponseStore,
}

/// The parts of an [`AppState`]; `build` assembles the pipeline.
pub struct AppStateBuilder {
    model_name: String,
    runtime: Loaded,
    models: Models,
    metrics: Option<PrometheusHandle>,
    reload: Option<ReloadFn>,
    log_level: Option<LogLevelFn>,
    fleet: Option<ingot_fleet::Fleet>,
    embedding_models: Vec<String>,
    engine_stage: Option<Arc<dyn Generator>>,
}

impl AppStateBuilder {
    /// Exports metrics through `handle`.
    pub fn metrics(mut self, handle: Option<PrometheusHandle>) -> Self {
        self.metrics = handle;
        self
    }

    /// Enables live reload: `reload` loads the config again, `log_level`
    /// swaps the log filter.
    pub fn reload(mut self, reload: Option<ReloadFn>, log_level: Option<LogLevelFn>) -> Self {
        self.reload = reload;
        self.log_level = log_level;
        self
    }

    /// Shares state through `fleet`: the response cache gets its Redis tier
    /// (`redis.share_cache`), the API keys' limits hold across instances
    /// (`redis.share_rate_limits`).
    pub fn fleet(mut self, fleet: Option<ingot_fleet::Fleet>) -> Self {
        self.fleet = fleet;
        self
    }

    /// Says which models are embedding models.
    pub fn embedding_models(mut self, ids: Vec<String>) -> Self {
        self.embedding_models = ids;
        self
    }

    /// Replaces the engine stage under the cache and coalescer (tests drive
    /// the HTTP layer over a fake generator this way).
    pub fn engine_stage(mut self, stage: Arc<dyn Generator>) -> Self {
        self.engine_stage = Some(stage);
        self
    }

    /// The state, with its pipeline assembled: response cache, coalescer,
    /// engine stage. Fails when the configured API keys cannot be loaded.
    pub fn build(self) -> Result<AppState, ServeError> {
        let config = &self.runtime.config;
        let edge = ingot_edge::Edge::default();
        edge.reload(&config.auth)
            .map_err(|e| ServeError::Auth(e.to_string()))?;
        if let Some(fleet) = self.fleet.as_ref() {
            if config.redis.share_rate_limits {
                edge.share_limits(fleet.clone());
            }
        }
        let slo = Arc::new(SloMonitor::default());
        let engine_stage = self
            .engine_stage
            .unwrap_or_else(|| Arc::new(EngineStage::new(self.models.clone(), slo.clone())));
        let coalescer = Coalescer::new(engine_stage, config.engine.stall_timeout.get());
        let store = store_for(config, self.fleet.as_ref());
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(AppState {
            inner: Arc::new(Inner {
                models: self.models,
                ready: AtomicBool::new(false),
                pipeline: ResponseCache::new(coalescer, store),
                runtime: RwLock::new(Arc::new(self.runtime)),
                reload: self.reload,
                log_level: self.log_level,
                model_name: self.model_name,
                created,
                started: std::time::Instant::now(),
                drain_ends: std::sync::OnceLock::new(),
                inflight: AtomicUsize::new(0),
                idle: Notify::new(),
                close_streams: tokio::sync::watch::Sender::new(false),
                metrics: self.metrics,
                edge,
                fleet: self.fleet,
                embedding_models: self.embedding_models,
                slo,
                responses: Default::default(),
            }),
        })
    }
}

impl AppState {
    /// The parts of a server whose default model is `model_name`, serving
    /// `models` under `runtime`.
    pub fn builder(model_name: String, runtime: Loaded, models: Models) -> AppStateBuilder {
        AppStateBuilder {
            model_name,
            runtime,
            models,
            metrics: None,
            reload: None,
            log_level: None,
            fleet: None,
            embedding_models: Vec::new(),
            engine_stage: None,
        }
    }

    /// The endpoints model `id` serves, known before it loads.
    pub fn endpoints(&self, id: &str) -> &'static [&'static str] {
        if self.inner.embedding_models.iter().any(|i| i == id) {
            crate::models::EMBEDDING_ENDPOINTS
        } else {
            crate::models::GENERATIVE_ENDPOINTS
        }
    }

    /// Stored responses of `/v1/responses` (`store: true`).
    pub(crate) fn responses(&self) -> &crate::routes::responses::ResponseStore {
        &self.inner.responses
    }

    /// The registry of served models.
    pub fn models(&self) -> &Models {
        &self.inner.models
    }

    /// The context length of model `id`, once its front has been built.
    pub fn max_model_len(&self, id: &str) -> Option<usize> {
        self.inner
            .models
            .built_front(id)
            .and_then(|f| f.max_context())
    }

    /// The preloaded models are in; `/ready` turns 200.
    pub fn set_ready(&self) {
        self.inner.ready.store(true, Ordering::SeqCst);
    }

    /// Whether `/ready` is 200: preloading done and not draining.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::SeqCst) && !self.is_draining()
    }

    /// Whether model requests are taken now: 503 while the preloaded
    /// models load or the server drains. Checked once per request.
    pub fn check_serving(&self) -> Result<(), ApiError> {
        if let Some(e) = self.shutting_down() {
            return Err(e);
        }
        if !self.inner.ready.load(Ordering::SeqCst) {
            return Err(self.still_loading());
        }
        Ok(())
    }

    /// The refusal of a request while the preloaded models load: retry
    /// after about as long as the load has taken so far (a load half done
    /// needs as long again; 1 to 60 s), not a constant every client would
    /// hammer on together.
    pub fn still_loading(&self) -> ApiError {
        let elapsed = self.inner.started.elapsed();
        ApiError::Loading {
            retry_after: elapsed.clamp(
                std::time::Duration::from_secs(1),
                std::time::Duration::from_secs(60),
            ),
        }
    }

    /// The shared-state client, when configured.
    pub fn fleet(&self) -> Option<&ingot_fleet::Fleet> {
        self.inner.fleet.as_ref()
    }

    /// The API keys and their limits (the router's auth layer reads them).
    pub fn edge(&self) -> &ingot_edge::Edge {
        &self.inner.edge
    }

    /// The SLO policy engine.
    pub fn slo(&self) -> &SloMonitor {
        &self.inner.slo
    }

    /// The generation pipeline (response cache, coalescing, engine stage).
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

    pub(crate) fn reloader(&self) -> Option<&ReloadFn> {
        self.inner.reload.as_ref()
    }

    pub(crate) fn log_level_setter(&self) -> Option<&LogLevelFn> {
        self.inner.log_level.as_ref()
    }

    /// Installs a reloaded config; rebuilds the response cache when its
    /// bounds changed (its entries are dropped).
    pub fn set_runtime(&self, runtime: Loaded) {
        let old = self.runtime();
        if cache_settings(&old.config) != cache_settings(&runtime.config) {
            self.inner
                .pipeline
                .replace_store(store_for(&runtime.config, self.fleet()));
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

    /// Stops taking new generation requests; the drain lasts at most
    /// `server.shutdown_timeout` from now.
    pub fn start_draining(&self) {
        let timeout = self.runtime().config.server.shutdown_timeout.get();
        let _ = self
            .inner
            .drain_ends
            .set(std::time::Instant::now() + timeout);
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.inner.drain_ends.get().is_some()
    }

    /// The refusal of a request while draining, `None` before: its
    /// Retry-After is the longest the drain can still take plus the second
    /// open connections get to close, for a client that retries against
    /// the restarted server (or another one, behind a balancer).
    pub fn shutting_down(&self) -> Option<ApiError> {
        let ends = *self.inner.drain_ends.get()?;
        let left = ends.saturating_duration_since(std::time::Instant::now());
        Some(ApiError::ShuttingDown {
            retry_after: left + std::time::Duration::from_secs(1),
        })
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

    /// Ends every open stream now: each sends an error event and its
    /// terminator and cancels its generations (the shutdown timeout passed).
    pub fn close_streams(&self) {
        self.inner.close_streams.send_replace(true);
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

/// The response store `config` asks for: local, or local then Redis.
fn store_for(config: &Config, fleet: Option<&ingot_fleet::Fleet>) -> Arc<dyn ResponseStore> {
    let local = MemoryStore::new(cache_settings(config));
    match fleet {
        Some(fleet) if config.redis.share_cache => Arc::new(TwoTierStore::new(
            local,
            fleet.clone(),
            config.cache.ttl.get(),
        )),
        _ => Arc::new(local),
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

impl InflightGuard {
    /// Turns true when the request's stream must end now (see
    /// [`AppState::close_streams`]).
    pub fn closing(&self) -> tokio::sync::watch::Receiver<bool> {
        self.state.inner.close_streams.subscribe()
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if self.state.inner.inflight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.state.inner.idle.notify_waiters();
        }
    }
}
