//! The request pipeline under both OpenAI endpoints: a canonical
//! [`GenerateRequest`] goes down a stack of [`Generator`]s and a stream of
//! engine events comes back.
//!
//! ```text
//! endpoint ─► ResponseCache ─► Coalescer ─► EngineStage ─► engine
//! ```
//!
//! Each layer wraps the next and knows nothing of HTTP: the response cache
//! answers deterministic requests it has seen complete, the coalescer lets
//! identical in-flight requests share one generation, the engine stage
//! leases the model (the request's one registry visit) and submits. What a layer may do with a request is decided above the stack
//! (feature flags, `Cache-Control`) and carried in [`Sharing`].

mod cache;
mod coalesce;
mod engine;
mod key;
mod shared;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use ingot_engine::{EngineRequest, PriorityHandle, SubmitError, TokenEvent};

pub use cache::{
    CacheSettings, CachedChoice, MemoryStore, ResponseCache, ResponseStore, StoreStats,
};
pub use coalesce::Coalescer;
pub use engine::EngineStage;
pub use key::{is_deterministic, request_key, RequestKey};
pub use shared::{TwoTierStore, SHARED_LOOKUPS};

/// Events of one generation; dropping the stream gives it up (the engine
/// request is aborted once nobody else shares it).
pub type EventStream = BoxStream<'static, TokenEvent>;

/// Where an answer came from, as the `x-ingot-cache` header reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    /// Replayed from the response cache; the engine was not touched.
    Hit,
    /// Joined an identical generation already in flight.
    Coalesced,
    /// A new generation that others may share.
    Miss,
    /// Not shareable (sampled without a seed, opted out, flags off).
    Bypass,
}

impl CacheStatus {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "hit",
            CacheStatus::Coalesced => "coalesced",
            CacheStatus::Miss => "miss",
            CacheStatus::Bypass => "bypass",
        }
    }

    /// The status of a response made of several choices: the one that
    /// cost the most (a miss, then a coalesced join, then a hit).
    pub fn combine(self, other: CacheStatus) -> CacheStatus {
        fn cost(s: CacheStatus) -> u8 {
            match s {
                CacheStatus::Bypass => 0,
                CacheStatus::Hit => 1,
                CacheStatus::Coalesced => 2,
                CacheStatus::Miss => 3,
            }
        }
        if cost(other) > cost(self) {
            other
        } else {
            self
        }
    }
}

/// What the layers may do with one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sharing {
    /// Join an identical generation in flight.
    pub coalesce: bool,
    /// Answer from the response cache.
    pub lookup: bool,
    /// Store the answer in the response cache.
    pub store: bool,
}

impl Sharing {
    /// Nothing shared.
    pub const NONE: Sharing = Sharing {
        coalesce: false,
        lookup: false,
        store: false,
    };

    fn any(self) -> bool {
        self.coalesce || self.lookup || self.store
    }
}

/// One generation (one choice of one prompt), in canonical form.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// The served model's id.
    pub model: String,
    /// Tokens, sampling, stop rules and tier.
    pub engine: EngineRequest,
    /// Set only for deterministic requests that may be shared.
    pub key: Option<RequestKey>,
    /// What the layers may do.
    pub sharing: Sharing,
}

impl GenerateRequest {
    /// A request for `model`; `tenant` scopes its key. Requests that are not
    /// deterministic get no key and share nothing.
    pub fn new(
        model: String,
        tenant: Option<&str>,
        engine: EngineRequest,
        sharing: Sharing,
    ) -> Self {
        let key = (sharing.any() && is_deterministic(&engine))
            .then(|| request_key(tenant, &model, &engine));
        Self {
            model,
            engine,
            sharing: if key.is_some() {
                sharing
            } else {
                Sharing::NONE
            },
            key,
        }
    }
}

/// A generation started by a [`Generator`].
pub struct Generation {
    /// Where its events come from.
    pub status: CacheStatus,
    /// The events: tokens, then `Finished` or `Error`.
    pub events: EventStream,
    /// Moves the underlying engine request to another tier, when there is
    /// one (a cache hit has none).
    pub priority: Option<PriorityHandle>,
}

/// Why a generation did not start.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GenerateError {
    /// The engine refused it (queue full, too long, invalid).
    #[error(transparent)]
    Rejected(#[from] SubmitError),
    /// The model cannot be had (unknown, no room, failed to load).
    #[error(transparent)]
    Model(#[from] ingot_registry::RegistryError),
    /// No engine can take it now (loading, shutting down).
    #[error("{0}")]
    Unavailable(String),
}

/// Submits a canonical request and returns its events. Layers wrap one
/// another; the innermost one talks to an engine.
pub trait Generator: Send + Sync + 'static {
    /// Starts (or joins, or replays) a generation.
    fn generate(
        &self,
        request: GenerateRequest,
    ) -> BoxFuture<'_, Result<Generation, GenerateError>>;
}

/// A stage chosen at run time (the engine, or a fake in tests).
impl Generator for std::sync::Arc<dyn Generator> {
    fn generate(
        &self,
        request: GenerateRequest,
    ) -> BoxFuture<'_, Result<Generation, GenerateError>> {
        (**self).generate(request)
    }
}

#[cfg(test)]
mod tests;
