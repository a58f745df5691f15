//! `ingot bench compare` (being written).

use clap::Args;

use crate::BenchError;

/// Flags of `ingot bench compare`.
#[derive(Args, Debug)]
pub struct CompareArgs {}

/// Runs the command; `Ok(false)` when its gate failed.
pub fn run(_args: CompareArgs) -> Result<bool, BenchError> {
    Err(BenchError::Options(
        "ingot bench compare is not built yet".into(),
    ))
}
