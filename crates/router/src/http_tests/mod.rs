//! The router's HTTP behaviour, driven through [`crate::app`] with fake
//! workers behind the [`crate::client::WorkerClient`] seam: no sockets, no
//! processes, time paused (a hung worker costs no wall time).

mod harness;

mod admin;
mod api_surface;
mod cors;
mod errors;
mod policy;
mod retries;
mod splits;
mod streaming;
