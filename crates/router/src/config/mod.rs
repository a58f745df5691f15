//! The router's config: `router.toml` (raw, every key optional with a
//! documented default) and [`RouterConfig::validate`], which yields the
//! resolved [`ValidRouterConfig`] the router runs on.
//!
//! Same rules as the server's config: unknown keys are errors, times are
//! written the way people say them ("250ms", "5s"), and the JSON schema is
//! generated from these types.
//!
//! The rule of this module: every section's *types* live here (`types.rs`,
//! or `<section>.rs` for the larger ones: `split.rs`, `slo.rs`), their
//! *checks* in `validation.rs`, which imports the types and never the other
//! way. The runtime modules (breaker, policy, route_away, split, worker...)
//! import their config from here; nothing here imports a runtime module.
//! A plain enum or constant a section needs (`PolicyKind`,
//! `DEFAULT_GROUP`) lives here and is re-exported where it is used.

mod error;
mod slo;
mod split;
mod types;
mod validation;

use std::path::Path;

pub use error::RouterConfigError;
pub use slo::{RouteAwayConfig, RouteAwayMode, RouterSloSection};
pub use split::{
    Arm, ArmSection, CanaryConfig, CanarySection, ExperimentConfig, ExperimentSection, Thresholds,
    WindowKind,
};
pub use types::*;

impl RouterConfig {
    /// Reads and parses `path`.
    pub fn from_file(path: &Path) -> Result<Self, RouterConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| RouterConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| RouterConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().replace('\n', " "),
        })
    }
}

/// The JSON schema of `router.toml`.
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(RouterConfig)).unwrap_or_default()
}
