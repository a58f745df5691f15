//! The router's config: `router.toml` (raw, every key optional with a
//! documented default) and [`RouterConfig::validate`], which yields the
//! resolved [`ValidRouterConfig`] the router runs on.
//!
//! Same rules as the server's config: unknown keys are errors, times are
//! written the way people say them ("250ms", "5s"), and the JSON schema is
//! generated from these types.

use std::path::{Path, PathBuf};

use ingot_config::Duration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::policy::PolicyKind;
use crate::split::config::{
    check_unique, CanaryConfig, CanarySection, ExperimentConfig, ExperimentSection,
};
use crate::worker::DEFAULT_GROUP;

/// `router.toml`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RouterConfig {
    /// Address to listen on. Default "127.0.0.1".
    pub host: Option<String>,
    /// Port to listen on (0: any free port). Default 8080.
    pub port: Option<u16>,
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
    pub slo: crate::route_away::RouterSloSection,
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
    pub route_away: crate::route_away::RouteAwayConfig,
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

/// A config that cannot run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouterConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for these types.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (it names the key and line).
        message: String,
    },
    /// A value is out of bounds.
    #[error("{key}: {message} (got {value})")]
    Invalid {
        /// The dotted key.
        key: &'static str,
        /// What is expected.
        message: &'static str,
        /// What was given.
        value: String,
    },
}

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

    /// Checks every bound and fills the defaults. `current_exe` is the
    /// default binary of local children.
    pub fn validate(self, current_exe: PathBuf) -> Result<ValidRouterConfig, RouterConfigError> {
        let d = |v: Option<Duration>, default: u64| v.map_or(ms(default), Duration::get);
        let local = self.workers.local.unwrap_or(0);
        let urls: Vec<String> = self
            .workers
            .urls
            .iter()
            .map(|u| u.trim_end_matches('/').to_string())
            .collect();
        for u in &urls {
            if !u.starts_with("http://") {
                return Err(invalid("workers.urls", "an http:// base URL", u));
            }
        }
        let discovery = DiscoveryConfig {
            dns: self.workers.dns.clone(),
            file: self.workers.file.clone(),
            interval: d(self.discovery.interval, 5000),
            redis: self.workers.redis.unwrap_or(false),
        };
        if let Err((key, message)) = self.redis.check() {
            return Err(RouterConfigError::Invalid {
                key,
                message,
                value: "[redis]".into(),
            });
        }
        if discovery.redis && !self.redis.enabled() {
            return Err(invalid("workers.redis", "[redis] url to be set", "true"));
        }
        for entry in &discovery.dns {
            let port = entry.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
            if !matches!(port, Some(Ok(_))) {
                return Err(invalid("workers.dns", "\"name:port\" entries", entry));
            }
        }
        if discovery.interval.is_zero() {
            return Err(invalid("discovery.interval", "non-zero", "0s"));
        }
        let local_workers = LocalWorkers {
            count: local,
            args: self.workers.args.clone(),
            binary: self.workers.binary.clone().unwrap_or(current_exe),
            backoff: d(self.workers.restart_backoff, 500),
            backoff_max: d(self.workers.restart_backoff_max, 30_000),
        };
        let groups = validate_groups(&self.workers.groups, &local_workers)?;
        let grouped = groups
            .iter()
            .any(|g| !g.urls.is_empty() || g.local.count > 0);
        if urls.is_empty() && local == 0 && !discovery.is_enabled() && !grouped {
            return Err(invalid(
                "workers",
                "at least one worker (workers.urls, workers.local, workers.dns, workers.file, workers.redis or workers.groups)",
                "none",
            ));
        }
        if local > 0 && self.workers.args.is_empty() {
            return Err(invalid(
                "workers.args",
                "the `ingot serve` arguments of local workers (at least --model)",
                "[]",
            ));
        }
        let group_names: std::collections::BTreeSet<String> =
            std::iter::once(DEFAULT_GROUP.to_string())
                .chain(groups.iter().map(|g| g.name.clone()))
                .collect();
        let experiments = self
            .experiments
            .into_iter()
            .map(|e| e.validate(&group_names))
            .collect::<Result<Vec<_>, _>>()?;
        let canaries = self
            .canary
            .into_iter()
            .map(|c| c.validate(&group_names))
            .collect::<Result<Vec<_>, _>>()?;
        check_unique(&experiments, &canaries)?;
        let max_attempts = self.retry.max_attempts.unwrap_or(3);
        if max_attempts == 0 {
            return Err(invalid("retry.max_attempts", "at least 1", "0"));
        }
        let budget_ratio = self.retry.budget_ratio.unwrap_or(0.2);
        if !(0.0..=1.0).contains(&budget_ratio) {
            return Err(invalid(
                "retry.budget_ratio",
                "a fraction in [0, 1]",
                budget_ratio,
            ));
        }
        let failure_threshold = self.breaker.failure_threshold.unwrap_or(3);
        if failure_threshold == 0 {
            return Err(invalid("breaker.failure_threshold", "at least 1", "0"));
        }
        let health = HealthConfig {
            interval: d(self.health.interval, 1000),
            timeout: d(self.health.timeout, 1000),
            scraped_load: self.health.scraped_load.unwrap_or(true),
        };
        if health.interval.is_zero() || health.timeout.is_zero() {
            return Err(invalid("health", "non-zero interval and timeout", "0s"));
        }
        let retry = RetryConfig {
            max_attempts,
            backoff: d(self.retry.backoff, 20),
            backoff_max: d(self.retry.backoff_max, 1000),
            first_byte_timeout: d(self.retry.first_byte_timeout, 30_000),
            budget_ratio,
            budget_min: self.retry.budget_min.unwrap_or(10),
            budget_window: d(self.retry.budget_window, 10_000),
        };
        if retry.first_byte_timeout.is_zero() || retry.budget_window.is_zero() {
            return Err(invalid(
                "retry",
                "non-zero first_byte_timeout and budget_window",
                "0s",
            ));
        }
        let route_away = self
            .slo
            .validate()
            .map_err(|(key, message, value)| invalid(key, message, value))?;
        Ok(ValidRouterConfig {
            host: self.host.unwrap_or_else(|| "127.0.0.1".into()),
            port: self.port.unwrap_or(8080),
            policy: self.policy.unwrap_or(PolicyKind::LeastOutstanding),
            urls,
            local: local_workers,
            health,
            retry,
            breaker: BreakerConfig {
                failure_threshold,
                cooldown: d(self.breaker.cooldown, 5000),
            },
            discovery,
            groups,
            experiments,
            canaries,
            redis: self.redis,
            route_away,
        })
    }
}

/// Checks `[[workers.groups]]`: unique valid names, http URLs, arguments
/// for local children (inherited from `workers` when not given).
fn validate_groups(
    sections: &[GroupSection],
    base: &LocalWorkers,
) -> Result<Vec<WorkerGroup>, RouterConfigError> {
    let mut groups: Vec<WorkerGroup> = Vec::new();
    for g in sections {
        let valid_name = !g.name.is_empty()
            && g.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !valid_name {
            return Err(invalid(
                "workers.groups.name",
                "a name of [A-Za-z0-9_.-]",
                &g.name,
            ));
        }
        if g.name == DEFAULT_GROUP || groups.iter().any(|o| o.name == g.name) {
            return Err(invalid(
                "workers.groups.name",
                "a unique name other than \"default\"",
                &g.name,
            ));
        }
        let urls: Vec<String> = g
            .urls
            .iter()
            .map(|u| u.trim_end_matches('/').to_string())
            .collect();
        if let Some(u) = urls.iter().find(|u| !u.starts_with("http://")) {
            return Err(invalid("workers.groups.urls", "an http:// base URL", u));
        }
        let local = LocalWorkers {
            count: g.local.unwrap_or(0),
            args: g.args.clone().unwrap_or_else(|| base.args.clone()),
            binary: g.binary.clone().unwrap_or_else(|| base.binary.clone()),
            ..base.clone()
        };
        if local.count > 0 && local.args.is_empty() {
            return Err(invalid(
                "workers.groups.args",
                "the `ingot serve` arguments of the group's local workers",
                "[]",
            ));
        }
        groups.push(WorkerGroup {
            name: g.name.clone(),
            urls,
            local,
        });
    }
    Ok(groups)
}

/// The JSON schema of `router.toml`.
pub fn schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(RouterConfig)).unwrap_or_default()
}

fn ms(v: u64) -> std::time::Duration {
    std::time::Duration::from_millis(v)
}

pub(crate) fn invalid(
    key: &'static str,
    message: &'static str,
    value: impl std::fmt::Display,
) -> RouterConfigError {
    RouterConfigError::Invalid {
        key,
        message,
        value: value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ValidRouterConfig, RouterConfigError> {
        let raw: RouterConfig = toml::from_str(text).map_err(|e| RouterConfigError::Parse {
            path: "t".into(),
            message: e.to_string(),
        })?;
        raw.validate("/bin/ingot".into())
    }

    #[test]
    fn defaults_fill_a_minimal_file() {
        let c = parse("[workers]\nurls = [\"http://127.0.0.1:9/\"]\n").unwrap();
        assert_eq!(c.urls, ["http://127.0.0.1:9"]);
        assert_eq!(c.port, 8080);
        assert_eq!(c.policy, PolicyKind::LeastOutstanding);
        assert_eq!(c.retry.max_attempts, 3);
        assert_eq!(c.breaker.cooldown, ms(5000));
        assert_eq!(c.local.binary, PathBuf::from("/bin/ingot"));
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        let e = parse("[workers]\nurl = []\n").unwrap_err().to_string();
        assert!(e.contains("unknown field `url`"), "{e}");
        let e = parse("[workers]\nurls = [\"http://a\"]\n[retry]\nmax_attempts = 0\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("retry.max_attempts"), "{e}");
        let e = parse("").unwrap_err().to_string();
        assert!(e.contains("at least one worker"), "{e}");
        let e = parse("[workers]\nlocal = 2\n").unwrap_err().to_string();
        assert!(e.contains("workers.args"), "{e}");
        let e = parse("policy = \"random\"\n[workers]\nurls = [\"http://a\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown variant"), "{e}");
    }

    #[test]
    fn durations_read_as_people_write_them() {
        let c =
            parse("[workers]\nurls = [\"http://a\"]\n[health]\ninterval = \"250ms\"\n").unwrap();
        assert_eq!(c.health.interval, ms(250));
    }

    #[test]
    fn groups_experiments_and_canaries_validate() {
        let base = "[[workers.groups]]\nname = \"stable\"\nurls = [\"http://a/\"]\n\
            [[workers.groups]]\nname = \"canary\"\nlocal = 1\nargs = [\"--model\", \"/m\"]\n";
        let c = parse(&format!(
            "{base}[[canary]]\nname = \"c1\"\nstable_group = \"stable\"\ncanary_group = \"canary\"\n\
             steps = [10, 100]\nwindow = \"30s\"\n\
             [[experiments]]\nid = \"e1\"\nmodel = \"m2\"\nsplit_percent = 20\n\
             arms = [{{name = \"a\", group = \"stable\"}}, {{name = \"b\", group = \"canary\"}}]\n"
        ))
        .unwrap();
        assert_eq!(c.groups.len(), 2);
        assert_eq!(c.groups[0].urls, ["http://a"]);
        assert_eq!(c.groups[1].local.count, 1);
        assert_eq!(c.canaries[0].steps, [10.0, 100.0]);
        assert_eq!(c.canaries[0].window, std::time::Duration::from_secs(30));
        assert_eq!(c.canaries[0].thresholds.min_samples, 20);
        assert_eq!(c.experiments[0].split_percent, 20.0);
        let bad = [
            ("[[canary]]\nname = \"c\"\nstable_group = \"stable\"\ncanary_group = \"nope\"\n", "canary.canary_group"),
            ("[[canary]]\nname = \"c\"\nstable_group = \"stable\"\ncanary_group = \"canary\"\nsteps = [50, 25, 100]\n", "canary.steps"),
            ("[[canary]]\nname = \"c\"\nstable_group = \"stable\"\ncanary_group = \"canary\"\nsteps = [5, 50]\n", "canary.steps"),
            ("[[experiments]]\nid = \"e\"\narms = [{name = \"a\", group = \"stable\"}]\n", "experiments.arms"),
            ("[[experiments]]\nid = \"e\"\nsignificance = 1.0\narms = [{name = \"a\", group = \"stable\"}, {name = \"b\", group = \"canary\"}]\n", "experiments.significance"),
            ("[[experiments]]\nid = \"e\"\narms = [{name = \"a\", group = \"stable\"}, {name = \"b\", group = \"canary\"}]\n\
              [[canary]]\nname = \"c\"\nstable_group = \"stable\"\ncanary_group = \"canary\"\n", "at most one experiment or canary per model"),
        ];
        for (extra, want) in bad {
            let e = parse(&format!("{base}{extra}")).unwrap_err().to_string();
            assert!(e.contains(want), "{extra}: {e}");
        }
        let e = parse("[[workers.groups]]\nname = \"default\"\nurls = [\"http://a\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("workers.groups.name"), "{e}");
    }

    #[test]
    fn discovery_alone_is_enough_and_dns_entries_need_a_port() {
        let c = parse("[workers]\ndns = [\"ingot-workers:8000\"]\n").unwrap();
        assert_eq!(c.discovery.dns, ["ingot-workers:8000"]);
        assert_eq!(c.discovery.interval, ms(5000));
        assert!(c.urls.is_empty());
        let c = parse("[workers]\nfile = \"/etc/w\"\n[discovery]\ninterval = \"1s\"\n").unwrap();
        assert_eq!(c.discovery.file, Some(PathBuf::from("/etc/w")));
        let e = parse("[workers]\ndns = [\"ingot-workers\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("workers.dns"), "{e}");
    }

    #[test]
    fn redis_discovery_needs_a_redis_url() {
        let e = parse("[workers]\nredis = true\n").unwrap_err().to_string();
        assert!(e.contains("workers.redis"), "{e}");
        let c =
            parse("[workers]\nredis = true\n[redis]\nurl = \"redis://127.0.0.1:6379\"\n").unwrap();
        assert!(c.discovery.redis && c.discovery.is_enabled());
        assert_eq!(c.redis.namespace, "ingot");
        let e = parse("[workers]\nredis = true\n[redis]\nurl = \"http://x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("redis.url"), "{e}");
    }
}
