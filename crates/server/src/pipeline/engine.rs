//! The innermost layer: submits to the engine.

use std::sync::{Arc, OnceLock};

use futures_util::future::BoxFuture;
use futures_util::stream::{self, StreamExt};
use ingot_engine::EngineHandle;

use super::{CacheStatus, GenerateError, GenerateRequest, Generation, Generator};

/// Submits requests to the engine once it has loaded.
#[derive(Clone)]
pub struct EngineGenerator {
    engine: Arc<OnceLock<EngineHandle>>,
}

impl EngineGenerator {
    /// A generator over the engine that `engine` will hold once loaded.
    pub fn new(engine: Arc<OnceLock<EngineHandle>>) -> Self {
        Self { engine }
    }
}

impl Generator for EngineGenerator {
    fn generate(
        &self,
        request: GenerateRequest,
    ) -> BoxFuture<'_, Result<Generation, GenerateError>> {
        Box::pin(async move {
            let engine = self
                .engine
                .get()
                .ok_or_else(|| GenerateError::Unavailable("the model is still loading".into()))?;
            let status = if request.key.is_some() {
                CacheStatus::Miss
            } else {
                CacheStatus::Bypass
            };
            let stream = engine.submit(request.engine)?;
            let priority = Some(stream.priority_handle());
            // The stream owns the engine request: dropping it aborts.
            let events = stream::unfold(stream, |mut s| async move {
                let event = s.next().await?;
                Some((event, s))
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
