//! `ingot bench soak` (being written).

use clap::Args;

use crate::BenchError;

/// Flags of `ingot bench soak`.
#[derive(Args, Debug)]
pub struct SoakArgs {}

/// Runs the command; `Ok(false)` when its gate failed.
pub fn run(_args: SoakArgs) -> Result<bool, BenchError> {
    Err(BenchError::Options(
        "ingot bench soak is not built yet".into(),
    ))
}
