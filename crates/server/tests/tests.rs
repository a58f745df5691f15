//! The HTTP behaviour of `ingot serve`, driven in process through the real
//! axum app (`ingot_server::app`) with `tower::ServiceExt::oneshot`: no
//! sockets, no weights. A fake generator stands in for the engine stage and
//! a fake model builder serves fronts (a tiny byte-level tokenizer) and
//! refuses to build, so any test that loads an engine fails.

// Helpers outside #[test] fns unwrap too: this is a test binary.
#![allow(clippy::unwrap_used)]

mod http;
