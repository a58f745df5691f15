//! The HTTP behaviour of `ingot serve`, driven in process through the real
//! axum app (`ingot_server::app`) with `tower::ServiceExt::oneshot`: no
//! sockets, no weights. A fake generator stands in for the engine stage and
//! a fake model builder serves fronts (a tiny byte-level tokenizer) and
//! refuses to build a generative engine, so any test that loads one fails;
//! the embedding model runs a real embedding engine over a fake encoder.

// Helpers outside #[test] fns unwrap too: this is a test binary.
#![allow(clippy::unwrap_used)]

mod http;
