//! `ingot bench serve` (being written).

use clap::Args;

use crate::BenchError;

/// Flags of `ingot bench serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {}

/// Runs the command; `Ok(false)` when its gate failed.
pub fn run(_args: ServeArgs) -> Result<bool, BenchError> {
    Err(BenchError::Options(
        "ingot bench serve is not built yet".into(),
    ))
}
