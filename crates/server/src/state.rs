//! Shared server state: the engine (once loaded), the served name, the
//! drain flag and the in-flight counter used by graceful shutdown.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use ingot_engine::EngineHandle;
use ingot_tokenizer::ChatTemplate;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::Notify;

use crate::ApiError;

/// State shared by every handler. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    engine: OnceLock<EngineHandle>,
    /// The model's chat template, compiled once (or why there is none).
    template: OnceLock<Result<Arc<ChatTemplate>, String>>,
    model_name: String,
    created: u64,
    draining: AtomicBool,
    inflight: AtomicUsize,
    idle: Notify,
    metrics: Option<PrometheusHandle>,
}

impl AppState {
    /// State for a server that will serve `model_name`.
    pub fn new(model_name: String, metrics: Option<PrometheusHandle>) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            inner: Arc::new(Inner {
                engine: OnceLock::new(),
                template: OnceLock::new(),
                model_name,
                created,
                draining: AtomicBool::new(false),
                inflight: AtomicUsize::new(0),
                idle: Notify::new(),
                metrics,
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
        self.inner
            .metrics
            .as_ref()
            .map(|h| h.render())
            .unwrap_or_default()
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
