//! Many models in one server.
//!
//! A [`Registry`] holds every configured model in one of three states
//! (unloaded, loading, loaded) and lends loaded ones to requests through
//! [`Lease`]s. A request for an unloaded model loads it while the request
//! waits (bounded); making room under the device budget evicts the least
//! recently used loaded model that is neither pinned nor leased; a model
//! with requests in flight is never evicted under them. When nothing can
//! make room the request gets [`RegistryError::NoRoom`] (a 503 with
//! Retry-After at the HTTP edge), never an out-of-memory crash.
//!
//! Evicted models may leave a warm host copy (within a host budget, LRU),
//! which the next load starts from. Idle models unload after their idle
//! timeout; pinned ones never do. Models asked for often lately that hold
//! no warm copy are prefetched into host memory ([`Prefetch`]). Loading
//! itself is the [`Loader`]'s job: the registry only decides what is
//! resident.

mod error;
mod lease;
mod loader;
mod metrics;
mod registry;
mod spec;

pub use error::RegistryError;
pub use lease::Lease;
pub use loader::{describe, Loader};
pub use registry::{ModelState, ModelStatus, Registry};
pub use spec::{Budget, ModelSpec, Prefetch};

#[cfg(test)]
mod tests;
