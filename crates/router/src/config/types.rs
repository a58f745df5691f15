//! The types of `router.toml`: each section raw (every key optional, its
//! default documented) and resolved (no `Option`s). Only data: the checks
//! are in `validation.rs`, the behaviour in the modules that run on them.

use std::path::PathBuf;

use ingot_config::Duration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::slo::{RouteAwayConfig, RouterSloSection};
use super::split::{CanaryConfig, CanarySection, ExperimentConfig, ExperimentSection};

/// The group of workers not listed in `[[workers.groups]]`.
pub const DEFAULT_GROUP: &str = "default";

/// The policies, as `policy = "..."` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Each worker in turn.
    RoundRobin,
    /// The worker with the fewest requests in flight from this router.
    LeastOutstanding,
    /// Two workers at random, the less loaded of them.
    PowerOfTwo,
    /// The lowest expected wait: measured TTFT average × (requests in flight + 1).
    LatencyAware,
    /// The worker that most likely holds the prompt's prefix in its KV
    /// cache, unless it is much busier than the least loaded.
    PrefixCache,
}

impl PolicyKind {
    /// The `policy` label of metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RoundRobin => "round_robin",
            Self::LeastOutstanding => "least_outstanding",
            Self::PowerOfTwo => "power_of_two",
            Self::LatencyAware => "latency_aware",
            Self::PrefixCache => "prefix_cache",
        }
    }
}

/// `router.toml`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RouterConfig {
    /// Address to listen on. Default "127.0.0.1".
    pub host: Option<String>,
    /// Port to listen on (0: any free port). Default 8080.
    pub port: Option<u16>,
    /// Origins a browser page may call the router from (CORS): `["*"]`
    /// for any, or exact origins (`"https://app.example.com"`). Default
    /// `[]`: off (no CORS headers).
    pub cors_allowed_origins: Vec<String>,
    /// How a worker is chosen for a request. Default "least_outstanding".
    pub policy: Option<PolicyKind>,
    /// The workers.
    pub workers: WorkersSection,
    /// Active health probes.
    pub health: HealthSection,
    /// Retries of requests that have not sent a byte to the client.
    pub retry: RetrySection,
    /// The per-worker circuit breaker.
    pub breaker: BreakerSection,
    /// Worker discovery (`workers.dns`, `workers.file`, `workers.redis`).
    pub discovery: DiscoverySection,
    /// A/B experiments between two worker groups (docs/router.md).
    pub experiments: Vec<ExperimentSection>,
    /// Canary releases of a worker group (docs/router.md).
    pub canary: Vec<CanarySection>,
    /// Shared state in Redis: the instance registry (docs/fleet.md).
    pub redis: ingot_config::RedisSection,
    /// Routing away from workers that breach latency targets (docs/slo.md).
    pub slo: RouterSloSection,
}

/// `[discovery]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoverySection {
    /// Time between resolutions of `workers.dns` and checks of
    /// `workers.file`. Default "5s".
    pub interval: Option<Duration>,
}

/// `[workers]`: static URLs and/or locally supervised `ingot serve` children.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct WorkersSection {
    /// Base URLs of running workers ("http://10.0.0.5:8000").
    pub urls: Vec<String>,
    /// Number of `ingot serve` children to start and supervise. Default 0.
    pub local: Option<usize>,
    /// Arguments of every local child after `serve` (e.g. `["--model", "/m"]`);
    /// the router adds `--host 127.0.0.1 --port 0`.
    pub args: Vec<String>,
    /// The `ingot` binary for local children. Default: this executable.
    pub binary: Option<PathBuf>,
    /// First delay before restarting a child that died; doubles per
    /// consecutive death. Default "500ms".
    pub restart_backoff: Option<Duration>,
    /// Longest delay between restarts. Default "30s".
    pub restart_backoff_max: Option<Duration>,
    /// "name:port" entries resolved every `discovery.interval`; each A/AAAA
    /// address is a worker (a Kubernetes headless Service's name, say).
    pub dns: Vec<String>,
    /// A file of worker base URLs, one per line ('#' comments), re-read
    /// when it changes.
    pub file: Option<PathBuf>,
    /// Named groups of workers (experiments and canaries route to groups);
    /// the workers above form the group "default".
    pub groups: Vec<GroupSection>,
    /// Discover the workers registered in Redis (`[redis]` must be set).
    /// Default false.
    pub redis: Option<bool>,
}

/// `[[workers.groups]]`: a named set of workers.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GroupSection {
    /// Its name (`group` label): `[A-Za-z0-9_.-]+`.
    pub name: String,
    /// Base URLs of running workers.
    pub urls: Vec<String>,
    /// `ingot serve` children of this group to start and supervise. Default 0.
    pub local: Option<usize>,
    /// Their arguments after `serve`. Default: `workers.args`.
    pub args: Option<Vec<String>>,
    /// Their binary. Default: `workers.binary`.
    pub binary: Option<PathBuf>,
}

/// A validated worker group.
#[derive(Clone, Debug)]
pub struct WorkerGroup {
    /// Name.
    pub name: String,
    /// Static URLs, without a trailing slash.
    pub urls: Vec<String>,
    /// Local children (count 0: none).
    pub local: LocalWorkers,
}

/// `[health]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HealthSection {
    /// Time between probes of each worker's `/ready`. Default "1s".
    pub interval: Option<Duration>,
    /// A probe slower than this fails. Default "1s".
    pub timeout: Option<Duration>,
    /// Whether the load-based policies add the queue depth scraped from a
    /// worker's `/metrics` that is not this router's own (other routers'
    /// requests) to its in-flight count. Default true.
    pub scraped_load: Option<bool>,
}

/// `[retry]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySection {
    /// Tries per request, the first included. Default 3.
    pub max_attempts: Option<u32>,
    /// Backoff before the first retry; doubles per retry, with full jitter.
    /// Default "20ms".
    pub backoff: Option<Duration>,
    /// Longest backoff. Default "1s".
    pub backoff_max: Option<Duration>,
    /// A worker that has not answered with headers within this time is given
    /// up on (a hung worker) and the request is retried elsewhere. Default "30s".
    pub first_byte_timeout: Option<Duration>,
    /// Retries may be at most this fraction of requests over `budget_window`
    /// (plus `budget_min`), so retries cannot amplify an outage. Default 0.2.
    pub budget_ratio: Option<f64>,
    /// Retries always allowed per window. Default 10.
    pub budget_min: Option<u32>,
    /// The window of the retry budget. Default "10s".
    pub budget_window: Option<Duration>,
}

/// `[breaker]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerSection {
    /// Consecutive failures that open a worker's breaker. Default 3.
    pub failure_threshold: Option<u32>,
    /// How long an open breaker refuses requests before one trial
    /// (half-open). Default "5s".
    pub cooldown: Option<Duration>,
}

/// The resolved config: no `Option`s, every bound checked.
#[derive(Clone, Debug)]
pub struct ValidRouterConfig {
    /// Listen address.
    pub host: String,
    /// Listen port.
    pub port: u16,
    /// CORS origins (empty: off).
    pub cors_allowed_origins: Vec<String>,
    /// The policy.
    pub policy: PolicyKind,
    /// Static worker URLs, without a trailing slash.
    pub urls: Vec<String>,
    /// Local children.
    pub local: LocalWorkers,
    /// Health probes.
    pub health: HealthConfig,
    /// Retries.
    pub retry: RetryConfig,
    /// Breaker.
    pub breaker: BreakerConfig,
    /// Discovered workers.
    pub discovery: DiscoveryConfig,
    /// Named worker groups (the unnamed workers are group "default").
    pub groups: Vec<WorkerGroup>,
    /// A/B experiments.
    pub experiments: Vec<ExperimentConfig>,
    /// Canaries.
    pub canaries: Vec<CanaryConfig>,
    /// `[redis]` (the router registers itself when `url` is set).
    pub redis: ingot_config::RedisSection,
    /// `[slo]`: route-away remediation.
    pub route_away: RouteAwayConfig,
}

/// Worker discovery.
#[derive(Clone, Debug, Default)]
pub struct DiscoveryConfig {
    /// "name:port" entries to resolve.
    pub dns: Vec<String>,
    /// The file of worker URLs.
    pub file: Option<PathBuf>,
    /// Between resolutions / file checks.
    pub interval: std::time::Duration,
    /// The workers registered in Redis.
    pub redis: bool,
}

impl DiscoveryConfig {
    /// Whether any discovery source is configured.
    pub fn is_enabled(&self) -> bool {
        !self.dns.is_empty() || self.file.is_some() || self.redis
    }
}

/// Local children.
#[derive(Clone, Debug)]
pub struct LocalWorkers {
    /// How many.
    pub count: usize,
    /// Their arguments after `serve`.
    pub args: Vec<String>,
    /// The binary.
    pub binary: PathBuf,
    /// First restart delay.
    pub backoff: std::time::Duration,
    /// Longest restart delay.
    pub backoff_max: std::time::Duration,
}

/// Health probes.
#[derive(Clone, Copy, Debug)]
pub struct HealthConfig {
    /// Between probes.
    pub interval: std::time::Duration,
    /// Per probe.
    pub timeout: std::time::Duration,
    /// Policies count other routers' requests scraped from `/metrics`.
    pub scraped_load: bool,
}

/// Retries.
#[derive(Clone, Copy, Debug)]
pub struct RetryConfig {
    /// Tries per request (≥ 1).
    pub max_attempts: u32,
    /// First backoff.
    pub backoff: std::time::Duration,
    /// Longest backoff.
    pub backoff_max: std::time::Duration,
    /// Deadline for a worker's response headers.
    pub first_byte_timeout: std::time::Duration,
    /// Budget ratio in [0, 1].
    pub budget_ratio: f64,
    /// Retries always allowed per window.
    pub budget_min: u32,
    /// Budget window.
    pub budget_window: std::time::Duration,
}

/// Breaker.
#[derive(Clone, Copy, Debug)]
pub struct BreakerConfig {
    /// Consecutive failures that open it (≥ 1).
    pub failure_threshold: u32,
    /// Open → half-open after this.
    pub cooldown: std::time::Duration,
}
