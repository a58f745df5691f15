//! The served models: a registry of engines, and each model's front.
//!
//! The binary says how to open, size and build a model ([`ModelBuilder`]);
//! the registry decides which are resident. What a request needs before
//! the engine (tokenizer, chat template, limits, grammar compiler) is the
//! model's [`ModelFront`], built once and kept while engines come and go,
//! so a request answered without the engine never loads or wakes it. The
//! pipeline's engine stage is the one place that leases an engine.

use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use ingot_config::ReasoningParser;
use ingot_engine::{
    EmbeddingHandle, EngineHandle, EngineWatch, GrammarCompiler, GrammarError, RequestLimits,
};
use ingot_registry::{Loader, Registry, RegistryError};
use ingot_tokenizer::{ChatTemplate, Tokenizer};

use crate::ApiError;

/// The endpoints a generative model serves.
pub const GENERATIVE_ENDPOINTS: &[&str] = &["/v1/chat/completions", "/v1/completions"];
/// The endpoints an embedding model serves.
pub const EMBEDDING_ENDPOINTS: &[&str] = &["/v1/embeddings"];

/// What requests need of a model before its engine: built from the
/// model's files without its weights.
pub struct ModelFront {
    id: String,
    kind: FrontKind,
}

enum FrontKind {
    Generative {
        tokenizer: Arc<Tokenizer>,
        /// The chat template, or why there is none.
        template: Result<Arc<ChatTemplate>, String>,
        /// Indexed on first use (tens of milliseconds for a large vocabulary).
        grammars: OnceLock<Result<Arc<GrammarCompiler>, GrammarError>>,
        /// The model's bounds: estimated from its files until an engine
        /// has loaded, then the engine's own (which also know its KV pool).
        limits: RwLock<RequestLimits>,
        /// Where its reasoning goes.
        reasoning_parser: ReasoningParser,
        /// Its engine's counters and windows, once one has loaded.
        watch: RwLock<EngineWatch>,
    },
    Embedding,
}

impl ModelFront {
    /// The front of generative model `id`: `tokenizer` (shared with its
    /// engine), its chat template compiled once, and `limits` as read from
    /// the model's files.
    pub fn generative(id: &str, tokenizer: Arc<Tokenizer>, limits: RequestLimits) -> Self {
        let template = match ChatTemplate::for_tokenizer(&tokenizer) {
            Ok(Some(t)) => Ok(Arc::new(t)),
            Ok(None) => Err("this model has no chat template; use /v1/completions".to_string()),
            Err(e) => Err(format!("the model's chat template is invalid: {e}")),
        };
        Self {
            id: id.to_string(),
            kind: FrontKind::Generative {
                tokenizer,
                template,
                grammars: OnceLock::new(),
                limits: RwLock::new(limits),
                reasoning_parser: ReasoningParser::None,
                watch: RwLock::default(),
            },
        }
    }

    /// This front with its answers' reasoning split out by `parser`.
    pub fn with_reasoning_parser(mut self, parser: ReasoningParser) -> Self {
        if let FrontKind::Generative {
            reasoning_parser, ..
        } = &mut self.kind
        {
            *reasoning_parser = parser;
        }
        self
    }

    /// Whether its answers' `<think>…</think>` is split from the content.
    pub fn splits_reasoning(&self) -> bool {
        matches!(
            self.kind,
            FrontKind::Generative {
                reasoning_parser: ReasoningParser::Qwen3 | ReasoningParser::DeepseekR1,
                ..
            }
        )
    }

    /// The front of embedding model `id` (its engine tokenizes itself).
    pub fn embedding(id: &str) -> Self {
        Self {
            id: id.to_string(),
            kind: FrontKind::Embedding,
        }
    }

    /// The model's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The endpoints it serves.
    pub fn endpoints(&self) -> &'static [&'static str] {
        match self.kind {
            FrontKind::Generative { .. } => GENERATIVE_ENDPOINTS,
            FrontKind::Embedding => EMBEDDING_ENDPOINTS,
        }
    }

    /// The tokenizer; 400 for an embedding model.
    pub fn tokenizer(&self) -> Result<&Arc<Tokenizer>, ApiError> {
        match &self.kind {
            FrontKind::Generative { tokenizer, .. } => Ok(tokenizer),
            FrontKind::Embedding => {
                Err(self.wrong_endpoint("a text generation", EMBEDDING_ENDPOINTS))
            }
        }
    }

    /// The compiled chat template (400 when the model has none).
    pub fn chat_template(&self) -> Result<Arc<ChatTemplate>, ApiError> {
        match &self.kind {
            FrontKind::Generative { template, .. } => template.clone().map_err(|e| {
                ApiError::BadRequest(ingot_protocol::ProtocolError::field("messages", e))
            }),
            FrontKind::Embedding => Err(self.wrong_endpoint("a chat", EMBEDDING_ENDPOINTS)),
        }
    }

    /// What a request must fit (generative models).
    pub fn limits(&self) -> Result<RequestLimits, ApiError> {
        match &self.kind {
            FrontKind::Generative { limits, .. } => {
                Ok(*limits.read().unwrap_or_else(PoisonError::into_inner))
            }
            FrontKind::Embedding => {
                Err(self.wrong_endpoint("a text generation", EMBEDDING_ENDPOINTS))
            }
        }
    }

    /// The longest context, as known now (`None` for an embedding model).
    pub fn max_context(&self) -> Option<usize> {
        self.limits().ok().map(|l| l.max_context)
    }

    /// Takes the limits of a freshly loaded engine.
    fn learn_limits(&self, engine: &EngineHandle) {
        if let FrontKind::Generative { limits, watch, .. } = &self.kind {
            *limits.write().unwrap_or_else(PoisonError::into_inner) = engine.limits();
            *watch.write().unwrap_or_else(PoisonError::into_inner) = engine.watch();
        }
    }

    /// The counters and windows of the engine last loaded for this model
    /// (gone once it is unloaded; none for an embedding model).
    pub fn engine_watch(&self) -> EngineWatch {
        match &self.kind {
            FrontKind::Generative { watch, .. } => {
                watch.read().unwrap_or_else(PoisonError::into_inner).clone()
            }
            FrontKind::Embedding => EngineWatch::default(),
        }
    }

    /// Compiles grammars for this model's vocabulary. Blocking on first use
    /// (it indexes the vocabulary): call it off the async runtime.
    pub fn grammar_compiler(&self) -> Result<Arc<GrammarCompiler>, ApiError> {
        let FrontKind::Generative {
            tokenizer,
            grammars,
            ..
        } = &self.kind
        else {
            return Err(self.wrong_endpoint("a text generation", EMBEDDING_ENDPOINTS));
        };
        grammars
            .get_or_init(|| GrammarCompiler::new(tokenizer.clone()).map(Arc::new))
            .clone()
            .map_err(|e| ApiError::Internal(e.to_string()))
    }

    fn wrong_endpoint(&self, request: &str, serves: &[&str]) -> ApiError {
        wrong_endpoint(&self.id, request, serves)
    }
}

/// 400: model `id` serves `serves`, not `request`.
fn wrong_endpoint(id: &str, request: &str, serves: &[&str]) -> ApiError {
    ApiError::BadRequest(
        ingot_protocol::ProtocolError::field(
            "model",
            format!(
                "model '{id}' does not serve {request} request; it serves {}",
                serves.join(", ")
            ),
        )
        .with_code("model_not_supported"),
    )
}

/// A loaded model: a generative engine or an embedding engine.
pub enum ServedModel {
    /// Text generation.
    Generative(EngineHandle),
    /// Embeddings.
    Embedding(EmbeddingHandle),
}

impl ServedModel {
    /// The generative engine; 400 for an embedding model.
    pub fn engine(&self, id: &str) -> Result<&EngineHandle, ApiError> {
        match self {
            ServedModel::Generative(engine) => Ok(engine),
            ServedModel::Embedding(_) => {
                Err(wrong_endpoint(id, "a text generation", EMBEDDING_ENDPOINTS))
            }
        }
    }

    /// The embedding engine; 400 for a generative model.
    pub fn embedder(&self, id: &str) -> Result<&EmbeddingHandle, ApiError> {
        match self {
            ServedModel::Embedding(engine) => Ok(engine),
            ServedModel::Generative(_) => {
                Err(wrong_endpoint(id, "an embeddings", GENERATIVE_ENDPOINTS))
            }
        }
    }

    /// Puts a generative engine to sleep (device memory back, weights kept
    /// on the host); an embedding engine cannot sleep.
    fn sleep(&self) -> Result<u64, String> {
        match self {
            ServedModel::Generative(engine) => engine.sleep(),
            ServedModel::Embedding(_) => Err("embedding engines do not sleep".into()),
        }
    }

    fn wake(&self) -> Result<(), String> {
        match self {
            ServedModel::Generative(engine) => engine.wake(),
            ServedModel::Embedding(_) => Ok(()),
        }
    }
}

/// Why a model could not be opened, sized or built: the builder's own
/// error with its causes (rendered once, by the registry, for the API).
#[derive(Debug)]
pub struct LoadError(Box<dyn std::error::Error + Send + Sync>);

impl LoadError {
    /// Wraps `error` (an `anyhow::Error` converts, causes kept).
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self(error.into())
    }
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// How the binary opens, sizes and builds a model (blocking calls, run on
/// the registry's blocking threads). Each configured model's path and
/// settings are the builder's to know.
pub trait ModelBuilder: Send + Sync + 'static {
    /// The model's front: tokenizer, template and limits, no weights.
    fn front(&self, id: &str) -> Result<ModelFront, LoadError>;
    /// Device bytes the model takes once loaded.
    fn footprint(&self, id: &str) -> Result<u64, LoadError>;
    /// Builds its engine over `front`'s tokenizer.
    fn build(&self, id: &str, front: &ModelFront) -> Result<ServedModel, LoadError>;
    /// Reads its files into the page cache; returns the bytes read.
    fn prefetch(&self, id: &str) -> Result<u64, LoadError>;
}

/// The registry's loader: a [`ModelBuilder`], plus putting evicted engines
/// to sleep when the registry keeps warm copies.
pub struct EngineLoader {
    builder: Arc<dyn ModelBuilder>,
    keep_warm: bool,
}

impl EngineLoader {
    /// Loads through `builder`; `keep_warm` puts evicted engines to sleep
    /// instead of dropping them (the registry has a host budget for them).
    pub fn new(builder: Arc<dyn ModelBuilder>, keep_warm: bool) -> Self {
        Self { builder, keep_warm }
    }
}

impl Loader for EngineLoader {
    type Front = ModelFront;
    type Model = ServedModel;
    /// A sleeping engine: its device memory given back, its weights in host
    /// memory, its thread, tokenizer, kernels and graphs kept.
    type Warm = ServedModel;
    type Error = LoadError;

    fn front(&self, id: &str) -> Result<ModelFront, LoadError> {
        self.builder.front(id)
    }

    fn footprint(&self, id: &str) -> Result<u64, LoadError> {
        self.builder.footprint(id)
    }

    fn load(
        &self,
        id: &str,
        front: &ModelFront,
        warm: Option<ServedModel>,
    ) -> Result<ServedModel, LoadError> {
        let model = match warm.map(|m| (m.wake(), m)) {
            Some((Ok(()), model)) => model,
            Some((Err(e), model)) => {
                tracing::warn!(model = id, error = %e, "waking failed; loading from the file");
                self.discard(model);
                self.builder.build(id, front)?
            }
            None => self.builder.build(id, front)?,
        };
        if let ServedModel::Generative(engine) = &model {
            front.learn_limits(engine);
        }
        Ok(model)
    }

    fn prefetch(&self, id: &str) -> Result<u64, LoadError> {
        self.builder.prefetch(id)
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
