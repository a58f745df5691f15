//! `[slo]` of router.toml: routing away from workers that breach latency
//! targets (the behaviour: `crate::route_away`).

use std::time::Duration;

use ingot_config::Duration as ConfigDuration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What `[slo]` does with a breach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RouteAwayMode {
    /// No evaluation (the default: routing is unchanged).
    #[default]
    Off,
    /// Evaluate, log and count what would be done; route as if off.
    DryRun,
    /// Route away from breaching workers.
    On,
}

/// `[slo]` of router.toml.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RouterSloSection {
    /// "off" (default), "dry_run" or "on".
    pub mode: Option<RouteAwayMode>,
    /// A worker whose time-to-first-byte average is over this breaches.
    pub ttft_target: Option<ConfigDuration>,
    /// A worker whose inter-token latency average is over this breaches.
    pub itl_target: Option<ConfigDuration>,
    /// Probation ends when every average is under this share of its
    /// target. Default 0.8.
    pub exit_ratio: Option<f64>,
    /// Responses a worker must have answered (since it was last judged)
    /// before its averages count: one slow first answer is not a breach.
    /// Default 5.
    pub min_samples: Option<u32>,
    /// First time out of rotation. Default "10s".
    pub hold: Option<ConfigDuration>,
    /// Longest time out of rotation (the hold doubles per relapse).
    /// Default "120s".
    pub hold_max: Option<ConfigDuration>,
    /// Roll back a canary whose group breaches the targets while its
    /// stable group meets them (`crate::canary_slo`). Default false.
    pub canary_rollback: Option<bool>,
}

/// The resolved `[slo]`.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteAwayConfig {
    /// The mode.
    pub mode: RouteAwayMode,
    /// TTFT target, seconds.
    pub ttft: Option<f64>,
    /// ITL target, seconds.
    pub itl: Option<f64>,
    /// Probation ends under `exit_ratio` × target.
    pub exit_ratio: f64,
    /// Samples before a worker is judged.
    pub min_samples: u32,
    /// First hold.
    pub hold: Duration,
    /// Longest hold.
    pub hold_max: Duration,
    /// Roll back canaries that breach while stable meets the targets.
    pub canary_rollback: bool,
}

impl Default for RouteAwayConfig {
    fn default() -> Self {
        Self {
            mode: RouteAwayMode::Off,
            ttft: None,
            itl: None,
            exit_ratio: 0.8,
            min_samples: 5,
            hold: Duration::from_secs(10),
            hold_max: Duration::from_secs(120),
            canary_rollback: false,
        }
    }
}
