//! The OpenAI-compatible HTTP server (axum): routes, validation, SSE,
//! errors in the OpenAI shape, metrics and graceful shutdown. The model
//! runs in the engine thread behind an [`ingot_engine::EngineHandle`];
//! handlers never block on it.

pub mod conn;
mod error;
mod generate;
mod http_metrics;
mod logprobs;
pub mod models;
mod observe;
pub mod openapi;
pub mod pipeline;
mod prepare;
mod reasoning;
pub mod reload;
mod routes;
mod serve;
pub mod slo;
mod state;
mod structured;
mod tools;
mod usage;

pub use conn::ConnLimits;
pub use error::ApiError;
pub use models::{EngineLoader, LoadError, ModelBuilder, ModelFront, Models, ServedModel};
pub use reload::{LogLevelFn, ReloadFn, ReloadReport};
pub use routes::{app, ROUTES};
pub use serve::{serve, ServeConfig, ServeError};
pub use state::{
    AppState, AppStateBuilder, CacheControl, Pipeline, FLAG_COALESCING, FLAG_RESPONSE_CACHE,
};
