//! Integration tests of ingot-stats, in one test binary (one link instead
//! of two): the A/A property, and the statistics against scipy
//! (`suite/reference/`).

// Helpers outside #[test] fns unwrap too: this is a test binary.
#![allow(clippy::unwrap_used)]

#[path = "suite/aa.rs"]
mod aa;
#[path = "suite/scipy.rs"]
mod scipy;
