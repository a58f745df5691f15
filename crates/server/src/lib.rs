//! The OpenAI-compatible HTTP server (axum): routes, validation, SSE,
//! errors in the OpenAI shape, metrics and graceful shutdown. The model
//! runs in the engine thread behind an [`ingot_engine::EngineHandle`];
//! handlers never block on it.

mod error;
mod generate;
mod logprobs;
mod routes;
mod serve;
mod state;

pub use error::ApiError;
pub use routes::app;
pub use serve::{serve, ServeConfig, ServeError};
pub use state::AppState;
