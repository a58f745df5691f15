//! `ingot-router`: `ingot route`, one OpenAI-compatible endpoint in front of
//! many `ingot serve` workers. Workers are plain data (URL, health, load,
//! models); policies choose among them; failed attempts are retried
//! elsewhere before the first byte reaches the client; a circuit breaker
//! per worker keeps a failing one out; local workers are supervised and can
//! be restarted one by one without failing a request.
//!
//! It never depends on the engine: it speaks HTTP to workers.

mod app;
pub mod breaker;
pub mod canary_slo;
pub mod client;
pub mod config;
mod discovery;
mod error;
mod health;
#[cfg(test)]
mod http_tests;
mod live;
pub mod metrics;
pub mod policy;
mod proxy;
pub mod retry;
pub mod route_away;
mod serve;
pub mod split;
mod state;
mod supervisor;
pub mod worker;

pub use app::app;
pub use config::{schema, RouterConfig, RouterConfigError, ValidRouterConfig};
pub use error::RouteError;
pub use proxy::WORKER_HEADER;
pub use serve::{serve, ServeError};
pub use state::RouterState;
