//! OpenAI wire types: requests parsed and validated into `Valid*` values,
//! responses and stream chunks serialised byte-compatible with the OpenAI
//! API. No I/O; one module per endpoint.

pub mod anthropic;
pub mod chat;
pub mod completions;
pub mod embeddings;
mod error;
pub mod fields;
pub mod models;
pub mod ollama;
mod parse;
pub mod responses;
pub mod sampling;
pub mod structured;
pub mod tokenize;
pub mod tools;
pub mod usage;

pub use error::ProtocolError;
pub use parse::{body_json, parse_json};
