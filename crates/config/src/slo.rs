//! Service-level objectives (`[[slo]]`) and the remediation policy that acts
//! on them (`[remediation]`). docs/slo.md describes the behaviour.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::units::Duration;

/// What an SLO measures.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum SloMetric {
    /// Time to first token, from arrival at the engine.
    #[default]
    Ttft,
    /// Time between two tokens of one request.
    Itl,
    /// Arrival to last token.
    E2e,
    /// Share of finished requests the engine failed.
    ErrorRate,
}

impl SloMetric {
    /// The config spelling (also the `metric` part of default SLO names).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ttft => "ttft",
            Self::Itl => "itl",
            Self::E2e => "e2e",
            Self::ErrorRate => "error_rate",
        }
    }

    /// Latency metrics take a duration target and a quantile.
    pub fn is_latency(self) -> bool {
        self != Self::ErrorRate
    }
}

/// An SLO's bound: a duration for latencies (`"500ms"`), a ratio in [0, 1]
/// for the error rate (`0.01`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq)]
#[serde(untagged)]
pub enum SloTarget {
    /// A ratio (a plain number).
    Ratio(f64),
    /// A duration (a string such as `"500ms"`).
    Duration(Duration),
}

impl Default for SloTarget {
    fn default() -> Self {
        Self::Duration(Duration::from_millis(500))
    }
}

impl SloTarget {
    /// The bound in the unit the measured value has (seconds or a ratio).
    pub fn value(self) -> f64 {
        match self {
            Self::Ratio(r) => r,
            Self::Duration(d) => d.get().as_secs_f64(),
        }
    }
}

/// One objective: `metric` at `quantile` over the last `window` stays at or
/// under `target`, for requests of `model` (`*`: each model) in `tier`
/// (`*`: every tier).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SloSpec {
    /// The `slo` label (default `<metric>_p<quantile×100>_<tier>`).
    pub name: Option<String>,
    /// A served model name, or `*` for each model.
    pub model: String,
    /// A priority tier (`critical` … `background`) or `*`.
    pub tier: String,
    /// `ttft`, `itl`, `e2e` or `error_rate`.
    pub metric: SloMetric,
    /// The quantile compared with the target, in (0, 1] (latency metrics).
    pub quantile: f64,
    /// A duration for latencies, a ratio in [0, 1] for `error_rate`.
    pub target: SloTarget,
    /// The sliding window the quantile or ratio is computed over.
    pub window: Duration,
    /// Fewer samples in the window than this: not judged (counts as met).
    #[schemars(range(min = 1))]
    pub min_samples: usize,
}

impl Default for SloSpec {
    fn default() -> Self {
        Self {
            name: None,
            model: "*".to_string(),
            tier: "*".to_string(),
            metric: SloMetric::Ttft,
            quantile: 0.95,
            target: SloTarget::default(),
            window: Duration::from_secs(30),
            min_samples: 10,
        }
    }
}

impl SloSpec {
    /// The `slo` label: `name`, else derived from metric, quantile and tier.
    pub fn label(&self) -> String {
        if let Some(n) = &self.name {
            return n.clone();
        }
        let tier = if self.tier == "*" { "all" } else { &self.tier };
        if self.metric.is_latency() {
            let pct = self.quantile * 100.0;
            format!("{}_p{}_{tier}", self.metric.as_str(), trim_number(pct))
        } else {
            format!("{}_{tier}", self.metric.as_str())
        }
    }
}

/// `95`, `99.9`: no trailing zeros.
fn trim_number(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Whether remediation acts.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RemediationMode {
    /// SLOs are evaluated and exported; nothing is decided.
    #[default]
    Off,
    /// Decisions are made, logged, counted and reported, never applied.
    DryRun,
    /// Decisions are applied.
    On,
}

impl RemediationMode {
    /// The config spelling (the `mode` label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::DryRun => "dry_run",
            Self::On => "on",
        }
    }
}

/// What happens to the tiers the shedding action covers.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ShedHow {
    /// New requests of a covered tier get 503 with Retry-After; ones already
    /// queued or running are held (not stepped) until the level is undone.
    #[default]
    Shed,
    /// Requests of a covered tier are held in the queue (admitted, not
    /// stepped) until the level is undone; none is refused.
    Delay,
}

impl ShedHow {
    /// The config spelling (the `action` label is `shed` or `delay`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shed => "shed",
            Self::Delay => "delay",
        }
    }
}

/// The SLO policy engine: when SLOs are evaluated and what it may do.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RemediationSection {
    /// `off` (default: evaluate and export only), `dry_run` (decide and
    /// report, never act) or `on`.
    pub mode: RemediationMode,
    /// How often the SLOs are evaluated.
    pub interval: Duration,
    /// Shed or delay the least urgent tiers while a more urgent tier's SLO
    /// is breached.
    pub shed: ShedSection,
    /// Steer the engine's step token budget toward a target inter-token
    /// latency.
    pub batching: BatchingSection,
    /// Roll back the model's canary (through the installed hook) while one
    /// of its SLOs is breached.
    pub canary_rollback: bool,
}

impl Default for RemediationSection {
    fn default() -> Self {
        Self {
            mode: RemediationMode::Off,
            interval: Duration::from_millis(500),
            shed: ShedSection::default(),
            batching: BatchingSection::default(),
            canary_rollback: false,
        }
    }
}

/// Shedding or delaying the lowest tiers, one tier per level.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ShedSection {
    /// Take part in remediation.
    pub enabled: bool,
    /// `shed` (503 for new requests, hold queued ones) or `delay` (hold).
    pub how: ShedHow,
    /// The tiers it covers, least urgent first: level 1 covers the first,
    /// level 2 the first two, and so on.
    pub tiers: Vec<String>,
    /// A breach of any SLO of a tier not covered here raises the level; the
    /// measured value must be at most `exit_ratio × target` …
    pub exit_ratio: f64,
    /// … for this long before a level is undone.
    pub exit_after: Duration,
    /// Least time between two level changes (either way).
    pub cooldown: Duration,
    /// The Retry-After of a shed request.
    pub retry_after: Duration,
}

impl Default for ShedSection {
    fn default() -> Self {
        Self {
            enabled: true,
            how: ShedHow::Shed,
            tiers: vec!["background".to_string(), "low".to_string()],
            exit_ratio: 0.8,
            exit_after: Duration::from_secs(10),
            cooldown: Duration::from_secs(2),
            retry_after: Duration::from_secs(5),
        }
    }
}

/// Adaptive batching: the step token budget follows the measured ITL.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct BatchingSection {
    /// Take part in remediation.
    pub enabled: bool,
    /// The inter-token latency to steer toward.
    pub target_itl: Duration,
    /// Which ITL quantile is steered, in (0, 1].
    pub quantile: f64,
    /// The window the ITL quantile is computed over.
    pub window: Duration,
    /// No change while the measured ITL is within this share of the target
    /// (the hysteresis band), in [0, 1).
    pub band: f64,
    /// Smallest budget (tokens per step); at least `engine.block_size`.
    pub min_tokens: usize,
    /// Largest budget (default: `scheduler.max_num_batched_tokens`).
    pub max_tokens: Option<usize>,
    /// Least time between two budget changes.
    pub cooldown: Duration,
    /// Fewer ITL samples in the window than this: no change.
    #[schemars(range(min = 1))]
    pub min_samples: usize,
}

impl Default for BatchingSection {
    fn default() -> Self {
        Self {
            enabled: false,
            target_itl: Duration::from_millis(50),
            quantile: 0.5,
            window: Duration::from_secs(3),
            band: 0.1,
            min_tokens: 16,
            max_tokens: None,
            cooldown: Duration::from_millis(500),
            min_samples: 20,
        }
    }
}
