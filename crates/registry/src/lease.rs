//! A request's hold on a loaded model.

use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// Keeps a model loaded while it lives (the registry never evicts a model
/// with leases out) and marks it used when dropped, so the least recently
/// used model is the one idle longest.
pub struct Lease<M> {
    model: Arc<M>,
    id: Arc<str>,
    last_used: Arc<Mutex<Instant>>,
}

impl<M> Lease<M> {
    pub(crate) fn new(model: Arc<M>, id: Arc<str>, last_used: Arc<Mutex<Instant>>) -> Self {
        Self {
            model,
            id,
            last_used,
        }
    }

    /// The model's id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl<M> Deref for Lease<M> {
    type Target = M;

    fn deref(&self) -> &M {
        &self.model
    }
}

impl<M> Drop for Lease<M> {
    fn drop(&mut self) {
        *self
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }
}
