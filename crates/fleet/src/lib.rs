//! ingot's fleet state in Redis (docs/fleet.md): the instance registry
//! ([`registry`]), a shared tier for the response cache ([`Fleet::get_bytes`],
//! [`Fleet::set_bytes`]) and per-key rate limits that hold across instances
//! ([`rate`]), the router's prefix index ([`prefix`]) and shared KV cache
//! pages ([`kv`]).
//!
//! Redis is an optimisation here, never a dependency of a request: every
//! command has a short timeout, and after a failure [`Fleet`] answers
//! [`FleetError::Unavailable`] at once for `retry_after` (a circuit
//! breaker), so callers fall back to their local state without waiting on a
//! dead server. `ingot_redis_up` and `ingot_redis_errors_total{op}` show it;
//! the connections reconnect by themselves and sharing resumes.

mod client;
pub mod kv;
pub mod prefix;
pub mod rate;
pub mod registry;

pub use client::{Fleet, FleetError, FleetSettings};
pub use rate::{RateDecision, RATE_SCRIPT};
pub use registry::{Heartbeat, Instance, Role};

/// `ingot_redis_up`: 1 while Redis answers, 0 while requests use local state.
pub const REDIS_UP: &str = "ingot_redis_up";
/// `ingot_redis_errors_total{op}`: failed or timed-out commands.
pub const REDIS_ERRORS: &str = "ingot_redis_errors_total";
