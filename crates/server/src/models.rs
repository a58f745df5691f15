//! The served models: a registry of engines that handlers lease from.
//!
//! The binary says how to size and build an engine for a model id
//! ([`EngineLoader`]); the registry decides which are resident. A lease
//! keeps its engine loaded while a request uses it: the pipeline's engine
//! layer holds one inside every generation's event stream.

use std::sync::Arc;
use std::time::Duration;

use ingot_engine::{EmbeddingHandle, EngineHandle};
use ingot_registry::{Loader, Registry, RegistryError};
use ingot_tokenizer::ChatTemplate;

use crate::ApiError;

/// The endpoints a generative model serves.
pub const GENERATIVE_ENDPOINTS: &[&str] = &["/v1/chat/completions", "/v1/completions"];
/// The endpoints an embedding model serves.
pub const EMBEDDING_ENDPOINTS: &[&str] = &["/v1/embeddings"];

/// A loaded model: a generative engine and its compiled chat template, or
/// an embedding engine.
pub struct ServedModel {
    id: String,
    kind: Kind,
}

enum Kind {
    Generative {
        engine: EngineHandle,
        /// The chat template, or why there is none.
        template: Result<Arc<ChatTemplate>, String>,
    },
    Embedding(EmbeddingHandle),
}

impl ServedModel {
    /// Wraps the generative `engine` of model `id`, compiling its
    /// tokenizer's chat template once.
    pub fn new(id: &str, engine: EngineHandle) -> Self {
        let template = match ChatTemplate::for_tokenizer(engine.tokenizer()) {
            Ok(Some(t)) => Ok(Arc::new(t)),
            Ok(None) => Err("this model has no chat template; use /v1/completions".to_string()),
            Err(e) => Err(format!("the model's chat template is invalid: {e}")),
        };
        Self {
            id: id.to_string(),
            kind: Kind::Generative { engine, template },
        }
    }

    /// Wraps the embedding engine of model `id`.
    pub fn embedding(id: &str, engine: EmbeddingHandle) -> Self {
        Self {
            id: id.to_string(),
            kind: Kind::Embedding(engine),
        }
    }

    /// The generative engine; 400 for an embedding model.
    pub fn engine(&self) -> Result<&EngineHandle, ApiError> {
        match &self.kind {
            Kind::Generative { engine, .. } => Ok(engine),
            Kind::Embedding(_) => {
                Err(self.wrong_endpoint("a text generation", EMBEDDING_ENDPOINTS))
            }
        }
    }

    /// The embedding engine; 400 for a generative model.
    pub fn embedder(&self) -> Result<&EmbeddingHandle, ApiError> {
        match &self.kind {
            Kind::Embedding(engine) => Ok(engine),
            Kind::Generative { .. } => {
                Err(self.wrong_endpoint("an embeddings", GENERATIVE_ENDPOINTS))
            }
        }
    }

    /// The endpoints it serves.
    pub fn endpoints(&self) -> &'static [&'static str] {
        match self.kind {
            Kind::Generative { .. } => GENERATIVE_ENDPOINTS,
            Kind::Embedding(_) => EMBEDDING_ENDPOINTS,
        }
    }

    /// Longest input (generative: prompt + output).
    pub fn max_context(&self) -> usize {
        match &self.kind {
            Kind::Generative { engine, .. } => engine.max_context(),
            Kind::Embedding(e) => e.max_tokens(),
        }
    }

    fn wrong_endpoint(&self, request: &str, serves: &[&str]) -> ApiError {
        ApiError::BadRequest(
            ingot_protocol::ProtocolError::field(
                "model",
                format!(
                    "model '{}' does not serve {request} request; it serves {}",
                    self.id,
                    serves.join(", ")
                ),
            )
            .with_code("model_not_supported"),
        )
    }

    /// The compiled chat template (400 when the model has none).
    pub fn chat_template(&self) -> Result<Arc<ChatTemplate>, ApiError> {
        match &self.kind {
            Kind::Generative { template, .. } => template.clone().map_err(|e| {
                ApiError::BadRequest(ingot_protocol::ProtocolError::field("messages", e))
            }),
            Kind::Embedding(_) => Err(self.wrong_endpoint("a chat", EMBEDDING_ENDPOINTS)),
        }
    }

    /// Puts a generative engine to sleep (device memory back, weights kept
    /// on the host); an embedding engine cannot sleep.
    fn sleep(&self) -> Result<u64, String> {
        match &self.kind {
            Kind::Generative { engine, .. } => engine.sleep().map_err(|e| e.to_string()),
            Kind::Embedding(_) => Err("embedding engines do not sleep".into()),
        }
    }

    fn wake(&self) -> Result<(), String> {
        match &self.kind {
            Kind::Generative { engine, .. } => engine.wake().map_err(|e| e.to_string()),
            Kind::Embedding(_) => Ok(()),
        }
    }
}

/// Sizes a model before loading it (device bytes).
pub type FootprintFn = Arc<dyn Fn(&str) -> Result<u64, String> + Send + Sync>;
/// Builds a model's engine (slow, blocking).
pub type LoadFn = Arc<dyn Fn(&str) -> Result<ServedModel, String> + Send + Sync>;
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
            match model.wake() {
                Ok(()) => return Ok(model),
                Err(e) => {
                    tracing::warn!(model = id, error = %e, "waking failed; loading from the file");
                    self.discard(model);
                }
            }
        }
        (self.load)(id)
    }

    fn prefetch(&self, id: &str) -> Result<u64, String> {
        (self.prefetch)(id)
    }

    fn unload(&self, id: &str, model: ServedModel) -> Option<(ServedModel, u64)> {
        if self.keep_warm {
            match model.sleep() {
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
