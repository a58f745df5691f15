//! `ingot bench sweep` (being written).

use clap::Args;

use crate::BenchError;

/// Flags of `ingot bench sweep`.
#[derive(Args, Debug)]
pub struct SweepArgs {}

/// Runs the command; `Ok(false)` when its gate failed.
pub fn run(_args: SweepArgs) -> Result<bool, BenchError> {
    Err(BenchError::Options(
        "ingot bench sweep is not built yet".into(),
    ))
}
