//! ingot's edge: what every request passes before a handler sees it. API
//! keys (hashed with SHA-256, compared in constant time) and per-key rate
//! limits (requests and tokens per minute with `governor`'s GCRA buckets,
//! concurrent requests with a semaphore), as one axum middleware
//! ([`authenticate`]) over a live-reloadable key table ([`Edge`]); and
//! CORS ([`with_cors`]), shared by the server and the router.
//!
//! Keys never leave this crate: the table holds hashes, and logs, metrics
//! and errors name a key by its configured id.

mod cors;
mod error;
mod header;
mod keys;
mod layer;
mod limit;
mod shared;

pub use cors::with_cors;
pub use error::{EdgeError, Rejection};
pub use header::presented_key;
pub use keys::{hash_key, hash_key_hex, Key, KeyTable, API_KEY_ID};
pub use layer::{authenticate, status_class, Caller, Edge, KEY_REQUESTS, KEY_TOKENS};
pub use limit::{format_reset, Bucket, KeyLimits, Status};
