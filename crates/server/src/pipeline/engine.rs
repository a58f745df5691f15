//! The innermost stage: leases the requested model from the registry (the
//! one lease of a request, taken only after the cache and the coalescer
//! have had their say) and submits to its engine.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::stream::{self, StreamExt};

use super::{CacheStatus, GenerateError, GenerateRequest, Generation, Generator};
use crate::models::Models;
use crate::slo::SloMonitor;

/// Submits requests to the engine of the model they name, leasing it for
/// as long as the generation's events are read (so it is never evicted
/// under a request).
#[derive(Clone)]
pub struct EngineStage {
    models: Models,
    /// Shown every engine a request reaches (its latency windows).
    slo: Arc<SloMonitor>,
}

impl EngineStage {
    /// A stage over `models`, showing their engines to `slo`.
    pub fn new(models: Models, slo: Arc<SloMonitor>) -> Self {
        Self { models, slo }
    }
}

impl Generator for EngineStage {
    fn generate(
        &self,
        request: GenerateRequest,
    ) -> BoxFuture<'_, Result<Generation, GenerateError>> {
        Box::pin(async move {
            let lease = self.models.acquire(&request.model).await?;
            let engine = lease
                .engine(lease.id())
                .map_err(|e| GenerateError::Unavailable(e.to_string()))?;
            self.slo.observe(lease.id(), engine.controls());
            let status = if request.key.is_some() {
                CacheStatus::Miss
            } else {
                CacheStatus::Bypass
            };
            // A prefix another instance computed comes in before the
            // request is scheduled (bounded by what recomputing costs).
            engine.prefetch_kv(&request.engine.prompt).await;
            let stream = engine.submit(request.engine)?;
            let priority = Some(stream.priority_handle());
            // The stream owns the engine request (dropping it aborts) and
            // the lease.
            let events = stream::unfold((stream, lease), |(mut s, lease)| async move {
                let event = s.next().await?;
                Some((event, (s, lease)))
            })
            .boxed();
            Ok(Generation {
                status,
                events,
                priority,
            })
        })
    }
}
