//! Why a model could not be had.

use std::time::Duration;

/// A registry refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// No configured model has this id or alias.
    #[error("the model '{id}' does not exist; available: {}", available.join(", "))]
    Unknown {
        /// What was asked for.
        id: String,
        /// Every configured id.
        available: Vec<String>,
    },
    /// The model does not fit the device budget even with everything else
    /// evicted.
    #[error("the model '{id}' needs {needed} bytes but the device budget is {budget} bytes")]
    TooLarge {
        /// The model.
        id: String,
        /// Its footprint.
        needed: u64,
        /// The budget.
        budget: u64,
    },
    /// It would fit, but the models holding the memory are pinned or busy.
    #[error("no room to load '{id}': {needed} bytes needed, {free} free, and every loaded model is pinned or serving requests; retry later")]
    NoRoom {
        /// The model.
        id: String,
        /// Its footprint.
        needed: u64,
        /// Free bytes under the budget.
        free: u64,
        /// When a retry may find room.
        retry_after: Duration,
    },
    /// Loading failed.
    #[error("loading '{id}' failed: {message}")]
    LoadFailed {
        /// The model.
        id: String,
        /// The loader's error.
        message: String,
    },
    /// The load took longer than a request may wait.
    #[error("'{id}' is still loading after {waited:?}; retry later")]
    LoadTimeout {
        /// The model.
        id: String,
        /// How long the request waited.
        waited: Duration,
    },
    /// An admin unload of a model with requests in flight.
    #[error("'{id}' has {in_flight} requests in flight")]
    InUse {
        /// The model.
        id: String,
        /// Requests holding it.
        in_flight: usize,
    },
}
