//! The response cache: completed deterministic generations, replayed
//! without touching the engine.
//!
//! Entries are whole choices (tokens with their text and logprobs, and the
//! completion with its usage) keyed by [`RequestKey`]; a hit replays them as
//! the same events the engine would send, so streaming and non-streaming
//! answers are shaped by the endpoint as usual. Only generations that ended
//! by themselves (`stop` or `length`) are stored, by the request that
//! started them (coalesced joiners do not store copies). The store sits
//! behind [`ResponseStore`] so a shared tier (Redis) can be added under it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{self, StreamExt};
use ingot_core::FinishReason;
use ingot_engine::{Completion, GeneratedToken, PromptLogprob, TokenEvent};
use metrics::{counter, gauge};
use moka::notification::RemovalCause;

use super::{
    CacheStatus, EventStream, GenerateError, GenerateRequest, Generation, Generator, RequestKey,
};

/// Bounds of the in-memory store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSettings {
    /// Most entries.
    pub max_entries: u64,
    /// Most bytes (estimated size of the stored choices).
    pub max_bytes: u64,
    /// Entries older than this are gone.
    pub ttl: Duration,
}

/// One completed choice as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedChoice {
    /// The model that generated it (for purging by model).
    pub model: String,
    /// The prompt's logprobs, when they were asked for.
    pub prompt: Option<Vec<PromptLogprob>>,
    /// Every generated token.
    pub tokens: Vec<GeneratedToken>,
    /// How it ended, with the original usage.
    pub completion: Completion,
}

impl CachedChoice {
    /// Estimated heap size, in bytes.
    pub fn size_bytes(&self) -> u64 {
        let per_token = std::mem::size_of::<GeneratedToken>();
        let tokens: usize = self
            .tokens
            .iter()
            .map(|t| per_token + t.text.len() + t.top_logprobs.len() * 8)
            .sum();
        let prompt: usize = self
            .prompt
            .iter()
            .flatten()
            .map(|p| std::mem::size_of::<PromptLogprob>() + p.top_logprobs.len() * 8)
            .sum();
        (std::mem::size_of::<Self>() + self.model.len() + tokens + prompt) as u64
    }

    fn replay(&self) -> EventStream {
        let prompt = self.prompt.clone().map(TokenEvent::Prompt);
        let tokens: Vec<TokenEvent> = prompt
            .into_iter()
            .chain(self.tokens.iter().cloned().map(TokenEvent::Token))
            .collect();
        stream::iter(tokens)
            .chain(stream::once(std::future::ready(TokenEvent::Finished(
                self.completion,
            ))))
            .boxed()
    }
}

/// Entries and bytes held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Entries.
    pub entries: u64,
    /// Bytes (estimated).
    pub bytes: u64,
}

/// Where cached choices live. Async so a networked tier fits behind it.
pub trait ResponseStore: Send + Sync + 'static {
    /// The entry for `key`, if present and fresh.
    fn get(&self, key: RequestKey) -> BoxFuture<'_, Option<Arc<CachedChoice>>>;
    /// Stores an entry (replacing any).
    fn insert(&self, key: RequestKey, value: Arc<CachedChoice>) -> BoxFuture<'_, ()>;
    /// Removes every entry, or those of `model`; returns how many.
    fn purge(&self, model: Option<&str>) -> u64;
    /// Current size.
    fn stats(&self) -> StoreStats;
}

/// The in-process store: moka (TinyLFU admission, LRU eviction, TTL).
pub struct MemoryStore {
    cache: moka::sync::Cache<RequestKey, Arc<CachedChoice>>,
    bytes: Arc<AtomicU64>,
}

impl MemoryStore {
    /// A store bounded by `settings`. Both bounds hold at once: each entry
    /// weighs its size but at least `max_bytes / max_entries`, so the total
    /// weight (≤ max_bytes) also caps the count at max_entries.
    pub fn new(settings: CacheSettings) -> Self {
        let floor = (settings.max_bytes / settings.max_entries.max(1)).max(1);
        let bytes = Arc::new(AtomicU64::new(0));
        let removed = bytes.clone();
        let cache = moka::sync::Cache::builder()
            .max_capacity(settings.max_bytes.max(1))
            .weigher(move |_k: &RequestKey, v: &Arc<CachedChoice>| {
                u32::try_from(v.size_bytes().max(floor)).unwrap_or(u32::MAX)
            })
            .time_to_live(settings.ttl)
            .eviction_listener(move |_k, v: Arc<CachedChoice>, cause| {
                removed.fetch_sub(v.size_bytes(), Ordering::Relaxed);
                if matches!(cause, RemovalCause::Size | RemovalCause::Expired) {
                    counter!("ingot_response_cache_evictions_total").increment(1);
                }
            })
            .build();
        Self { cache, bytes }
    }
}

impl ResponseStore for MemoryStore {
    fn get(&self, key: RequestKey) -> BoxFuture<'_, Option<Arc<CachedChoice>>> {
        Box::pin(std::future::ready(self.cache.get(&key)))
    }

    fn insert(&self, key: RequestKey, value: Arc<CachedChoice>) -> BoxFuture<'_, ()> {
        self.bytes.fetch_add(value.size_bytes(), Ordering::Relaxed);
        self.cache.insert(key, value);
        Box::pin(std::future::ready(()))
    }

    fn purge(&self, model: Option<&str>) -> u64 {
        let mut n = 0;
        for (k, v) in self.cache.iter() {
            if model.is_none_or(|m| v.model == m) {
                self.cache.invalidate(&*k);
                n += 1;
            }
        }
        self.cache.run_pending_tasks();
        n
    }

    fn stats(&self) -> StoreStats {
        self.cache.run_pending_tasks();
        StoreStats {
            entries: self.cache.entry_count(),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

/// The response-cache layer over `G`.
pub struct ResponseCache<G> {
    inner: G,
    store: RwLock<Arc<dyn ResponseStore>>,
}

impl<G: Generator> ResponseCache<G> {
    /// Wraps `inner` with `store`.
    pub fn new(inner: G, store: Arc<dyn ResponseStore>) -> Self {
        counter!("ingot_response_cache_hits_total").increment(0);
        counter!("ingot_response_cache_misses_total").increment(0);
        counter!("ingot_response_cache_evictions_total").increment(0);
        Self {
            inner,
            store: RwLock::new(store),
        }
    }

    /// The wrapped generator.
    pub fn inner(&self) -> &G {
        &self.inner
    }

    fn store(&self) -> Arc<dyn ResponseStore> {
        self.store
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Swaps the store (new bounds); entries of the old one are dropped.
    pub fn replace_store(&self, store: Arc<dyn ResponseStore>) {
        *self
            .store
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = store;
    }

    /// Removes every entry, or those of `model`.
    pub fn purge(&self, model: Option<&str>) -> u64 {
        let n = self.store().purge(model);
        self.publish();
        n
    }

    /// Publishes entries and bytes as gauges.
    pub fn publish(&self) -> StoreStats {
        let stats = self.store().stats();
        gauge!("ingot_response_cache_entries").set(stats.entries as f64);
        gauge!("ingot_response_cache_bytes").set(stats.bytes as f64);
        stats
    }

    async fn cached(&self, request: GenerateRequest) -> Result<Generation, GenerateError> {
        let Some(key) = request.key else {
            return self.inner.generate(request).await;
        };
        let store = self.store();
        if request.sharing.lookup {
            if let Some(hit) = store.get(key).await {
                counter!("ingot_response_cache_hits_total").increment(1);
                return Ok(Generation {
                    status: CacheStatus::Hit,
                    events: hit.replay(),
                    priority: None,
                });
            }
            counter!("ingot_response_cache_misses_total").increment(1);
        }
        let keep = request.sharing.store;
        let model = request.model.clone();
        let mut generation = self.inner.generate(request).await?;
        if keep && generation.status == CacheStatus::Miss {
            generation.events = record(generation.events, store, key, model);
        }
        Ok(generation)
    }
}

impl<G: Generator> Generator for ResponseCache<G> {
    fn generate(
        &self,
        request: GenerateRequest,
    ) -> BoxFuture<'_, Result<Generation, GenerateError>> {
        Box::pin(self.cached(request))
    }
}

/// Passes events through and stores the choice once it ends by itself.
fn record(
    events: EventStream,
    store: Arc<dyn ResponseStore>,
    key: RequestKey,
    model: String,
) -> EventStream {
    let state = (events, (None, Vec::new()), Some((store, model)));
    stream::unfold(
        state,
        move |(mut events, (mut prompt, mut tokens), mut sink)| async move {
            let event = events.next().await?;
            match &event {
                TokenEvent::Prompt(p) => prompt = Some(p.clone()),
                TokenEvent::Token(t) => tokens.push(t.clone()),
                TokenEvent::Finished(c) if c.reason != FinishReason::Abort => {
                    if let Some((store, model)) = sink.take() {
                        let choice = CachedChoice {
                            model,
                            prompt: prompt.take(),
                            tokens: std::mem::take(&mut tokens),
                            completion: *c,
                        };
                        store.insert(key, Arc::new(choice)).await;
                    }
                }
                _ => sink = None,
            }
            Some((event, (events, (prompt, tokens), sink)))
        },
    )
    .boxed()
}
