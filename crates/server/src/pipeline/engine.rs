//! The innermost layer: submits to the requested model's engine.

use std::sync::{Arc, OnceLock};

use futures_util::future::BoxFuture;
use futures_util::stream::{self, StreamExt};

use super::{CacheStatus, GenerateError, GenerateRequest, Generation, Generator};
use crate::models::Models;

/// Submits requests to the engine of the model they name, leasing it for
/// as long as the generation's events are read (so it is never evicted
/// under a request).
#[derive(Clone)]
pub struct EngineGenerator {
    models: Arc<OnceLock<Models>>,
}

impl EngineGenerator {
    /// A generator over the registry `models` will hold once installed.
    pub fn new(models: Arc<OnceLock<Models>>) -> Self {
        Self { models }
    }
}

impl Generator for EngineGenerator {
    fn generate(
        &self,
        request: GenerateRequest,
    ) -> BoxFuture<'_, Result<Generation, GenerateError>> {
        Box::pin(async move {
            let models = self
                .models
                .get()
                .ok_or_else(|| GenerateError::Unavailable("the server is starting".into()))?;
            let lease = models
                .acquire(&request.model)
                .await
                .map_err(|e| GenerateError::Unavailable(e.to_string()))?;
            let status = if request.key.is_some() {
                CacheStatus::Miss
            } else {
                CacheStatus::Bypass
            };
            let stream = lease
                .engine()
                .map_err(|e| GenerateError::Unavailable(e.to_string()))?
                .submit(request.engine)?;
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
