//! End-to-end tests of the `ingot` binary on the real test model, in one
//! test binary (one link instead of four): the CLI, its chat at a terminal,
//! `ingot bench serve` against a real `ingot serve`, `ingot bench
//! compare | sweep | stress | soak`, and `ingot serve ORG/NAME` against a
//! fake Hub.

// Helpers outside #[test] fns unwrap too: this is a test binary.
#![allow(clippy::unwrap_used)]

#[path = "suite/bench_serve.rs"]
mod bench_serve;
#[path = "suite/bench_tools.rs"]
mod bench_tools;
#[path = "suite/chat_repl.rs"]
mod chat_repl;
#[path = "suite/cli.rs"]
mod cli;
#[path = "suite/hub.rs"]
mod hub;
// The binary's Hub module, for its unit tests (the binary itself builds no
// test harness); its items serve `ingot serve` there, not these tests.
#[allow(dead_code)]
#[path = "../src/hub.rs"]
mod hub_unit;
