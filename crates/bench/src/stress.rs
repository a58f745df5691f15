//! `ingot bench stress` (being written).

use clap::Args;

use crate::BenchError;

/// Flags of `ingot bench stress`.
#[derive(Args, Debug)]
pub struct StressArgs {}

/// Runs the command; `Ok(false)` when its gate failed.
pub fn run(_args: StressArgs) -> Result<bool, BenchError> {
    Err(BenchError::Options(
        "ingot bench stress is not built yet".into(),
    ))
}
