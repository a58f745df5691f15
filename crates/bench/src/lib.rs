//! `ingot bench serve | sweep | stress | soak | compare`: a load generator
//! for any OpenAI-compatible server (ingot, llama.cpp, vLLM, SGLang), its
//! statistics and regression gate. No dependency on the engine: it talks
//! HTTP only, so every server is measured by the same client.
//!
//! Each subcommand is a module with its clap `Args` and a `run` that
//! returns `Ok(true)` on success, `Ok(false)` when the run completed but
//! failed its gate (regression, thresholds): the binary exits 1 then.

pub mod client;
pub mod compare;
pub mod dataset;
mod error;
mod load;
pub mod plot;
pub mod probe;
pub mod result;
mod runs;
pub mod serve;
pub mod soak;
pub mod stress;
pub mod sweep;

pub use error::BenchError;
