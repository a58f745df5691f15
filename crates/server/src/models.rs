//! The served models: a registry of engines that handlers lease from.
//!
//! The binary says how to size and build an engine for a model id
//! ([`EngineLoader`]); the registry decides which are resident. A lease
//! keeps its engine loaded while a request uses it: the pipeline's engine
//! layer holds one inside every generation's event stream.

use std::sync::Arc;
use std::time::Duration;

use ingot_engine::EngineHandle;
use ingot_registry::{Loader, Registry, RegistryError};
use ingot_tokenizer::ChatTemplate;

use crate::ApiError;

/// A loaded model: its engine and its compiled chat template.
pub struct ServedModel {
    /// The engine.
    pub engine: EngineHandle,
    /// The chat template, or why there is none.
    template: Result<Arc<ChatTemplate>, String>,
}

impl ServedModel {
    /// Wraps `engine`, compiling its tokenizer's chat template once.
    pub fn new(engine: EngineHandle) -> Self {
        let template = match ChatTemplate::for_tokenizer(engine.tokenizer()) {
            Ok(Some(t)) => Ok(Arc::new(t)),
            Ok(None) => Err("this model has no chat template; use /v1/completions".to_string()),
            Err(e) => Err(format!("the model's chat template is invalid: {e}")),
        };
        Self { engine, template }
    }

    /// The compiled chat template (400 when the model has none).
    pub fn chat_template(&self) -> Result<Arc<ChatTemplate>, ApiError> {
        self.template
            .clone()
            .map_err(|e| ApiError::BadRequest(ingot_protocol::ProtocolError::field("messages", e)))
    }
}

/// Sizes a model before loading it (device bytes).
pub type FootprintFn = Arc<dyn Fn(&str) -> Result<u64, String> + Send + Sync>;
/// Builds a model's engine (slow, blocking).
pub type LoadFn = Arc<dyn Fn(&str) -> Result<EngineHandle, String> + Send + Sync>;
/// Brings a model's files into the page cache; returns the bytes asked for.
pub type PrefetchFn = Arc<dyn Fn(&str) -> Result<u64, String> + Send + Sync>;

/// How the binary sizes and builds engines.
pub struct EngineLoader {
    /// Device bytes of a model once loaded.
    pub footprint: FootprintFn,
    /// Builds its engine.
    pub load: LoadFn,
    /// Reads its files ahead.
    pub prefetch: PrefetchFn,
    /// Put evicted engines to sleep instead of dropping them (the registry
    /// has a host budget for them).
    pub keep_warm: bool,
}

impl Loader for EngineLoader {
    type Model = ServedModel;
    /// A sleeping engine: its device memory given back, its weights in host
    /// memory, its thread, tokenizer, kernels and graphs kept.
    type Warm = ServedModel;

    fn footprint(&self, id: &str) -> Result<u64, String> {
        (self.footprint)(id)
    }

    fn load(&self, id: &str, warm: Option<ServedModel>) -> Result<ServedModel, String> {
        if let Some(model) = warm {
            match model.engine.wake() {
                Ok(()) => return Ok(model),
                Err(e) => {
                    tracing::warn!(model = id, error = %e, "waking failed; loading from the file");
                    self.discard(model);
                }
            }
        }
        (self.load)(id).map(ServedModel::new)
    }

    fn prefetch(&self, id: &str) -> Result<u64, String> {
        (self.prefetch)(id)
    }

    fn unload(&self, id: &str, model: ServedModel) -> Option<(ServedModel, u64)> {
        if self.keep_warm {
            match model.engine.sleep() {
                Ok(bytes) => return Some((model, bytes)),
                Err(e) => tracing::warn!(model = id, error = %e, "cannot sleep; unloading"),
            }
        }
        self.discard(model);
        None
    }

    fn discard(&self, model: ServedModel) {
        // Dropping the last handle stops the engine thread and waits until
        // its runner (and device memory) is released.
        drop(model);
        release_free_heap();
    }
}

/// Hands freed heap memory back to the OS. An unloaded CPU model's weights
/// were allocated by many threads; glibc keeps such memory in its arenas
/// (and raises its mmap threshold after large frees), so without this a
/// server that switches models would keep the freed weights resident.
fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of the allocator's own
    // arenas to the OS; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The registry of served models.
pub type Models = Registry<EngineLoader>;

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        let retry = |d: Duration| ApiError::ModelUnavailable {
            message: e.to_string(),
            retry_after: d,
        };
        match &e {
            RegistryError::Unknown { id, .. } => ApiError::UnknownModel {
                id: id.clone(),
                message: e.to_string(),
            },
            RegistryError::NoRoom { retry_after, .. } => retry(*retry_after),
            RegistryError::TooLarge { .. } => retry(Duration::from_secs(60)),
            RegistryError::LoadTimeout { .. } => retry(Duration::from_secs(5)),
            RegistryError::LoadFailed { .. } => retry(Duration::from_secs(30)),
            RegistryError::InUse { .. } => ApiError::Conflict(e.to_string()),
        }
    }
}
