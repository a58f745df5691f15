//! The checks of `router.toml`: each section's bounds, resolved into the
//! `Valid*`/`*Config` types with the defaults filled in.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration as StdDuration;

use ingot_config::Duration;

use super::error::{invalid, RouterConfigError};
use super::slo::{RouteAwayConfig, RouteAwayMode, RouterSloSection};
use super::split::{
    Arm, ArmSection, CanaryConfig, CanarySection, ExperimentConfig, ExperimentSection, Thresholds,
    WindowKind,
};
use super::types::{
    BreakerConfig, DiscoveryConfig, GroupSection, HealthConfig, LocalWorkers, PolicyKind,
    RetryConfig, RouterConfig, ValidRouterConfig, WorkerGroup, DEFAULT_GROUP,
};

impl RouterConfig {
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
        if let Some((expected, got)) = ingot_config::cors_origins_error(&self.cors_allowed_origins)
        {
            return Err(invalid("cors_allowed_origins", expected, got));
        }
        let route_away = self
            .slo
            .validate()
            .map_err(|(key, message, value)| invalid(key, message, value))?;
        Ok(ValidRouterConfig {
            host: self.host.unwrap_or_else(|| "127.0.0.1".into()),
            port: self.port.unwrap_or(8080),
            cors_allowed_origins: self.cors_allowed_origins,
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

fn ms(v: u64) -> std::time::Duration {
    std::time::Duration::from_millis(v)
}

/// `window = "cumulative"` or a duration ("60s").
fn parse_window(
    key: &'static str,
    text: Option<&str>,
    default: WindowKind,
) -> Result<WindowKind, RouterConfigError> {
    match text {
        None => Ok(default),
        Some("cumulative") => Ok(WindowKind::Cumulative),
        Some(t) => match humantime_duration(t) {
            Some(d) if !d.is_zero() => Ok(WindowKind::Sliding(d)),
            _ => Err(invalid(
                key,
                "\"cumulative\" or a non-zero duration (\"60s\")",
                t,
            )),
        },
    }
}

fn humantime_duration(text: &str) -> Option<StdDuration> {
    text.parse::<Duration>().ok().map(Duration::get)
}

fn check_name(key: &'static str, name: &str) -> Result<(), RouterConfigError> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(invalid(key, "a non-empty name of [A-Za-z0-9_.-]", name))
    }
}

fn check_group(
    key: &'static str,
    group: &str,
    groups: &BTreeSet<String>,
) -> Result<(), RouterConfigError> {
    if groups.contains(group) {
        Ok(())
    } else {
        Err(invalid(
            key,
            "a group of workers.groups (or \"default\")",
            group,
        ))
    }
}

fn fraction(key: &'static str, v: f64, lo_open: bool) -> Result<f64, RouterConfigError> {
    let ok = if lo_open {
        v > 0.0 && v < 1.0
    } else {
        (0.0..=1.0).contains(&v)
    };
    if ok {
        Ok(v)
    } else {
        Err(invalid(key, "a fraction in (0, 1)", v))
    }
}

impl ExperimentSection {
    /// Checks it against the known `groups`.
    pub fn validate(
        self,
        groups: &BTreeSet<String>,
    ) -> Result<ExperimentConfig, RouterConfigError> {
        check_name("experiments.id", &self.id)?;
        let [a, b]: [ArmSection; 2] = self.arms.try_into().map_err(|v: Vec<ArmSection>| {
            invalid("experiments.arms", "exactly two arms", v.len())
        })?;
        let arms = [a, b].map(|s| Arm {
            name: s.name,
            group: s.group,
            model: s.model,
        });
        for arm in &arms {
            check_name("experiments.arms.name", &arm.name)?;
            check_group("experiments.arms.group", &arm.group, groups)?;
        }
        if arms[0].name == arms[1].name {
            return Err(invalid(
                "experiments.arms.name",
                "two different names",
                &arms[0].name,
            ));
        }
        if arms[0].group == arms[1].group && arms[0].model == arms[1].model {
            return Err(invalid(
                "experiments.arms",
                "arms that differ in group or model",
                &arms[0].group,
            ));
        }
        let split_percent = self.split_percent.unwrap_or(50.0);
        if !(0.0..=100.0).contains(&split_percent) {
            return Err(invalid(
                "experiments.split_percent",
                "a percent in [0, 100]",
                split_percent,
            ));
        }
        let min_samples = self.min_samples.unwrap_or(30);
        if min_samples < 2 {
            return Err(invalid(
                "experiments.min_samples",
                "at least 2",
                min_samples,
            ));
        }
        Ok(ExperimentConfig {
            id: self.id,
            model: self.model,
            arms,
            split_percent,
            significance: fraction(
                "experiments.significance",
                self.significance.unwrap_or(0.05),
                true,
            )?,
            min_samples,
            window: parse_window(
                "experiments.window",
                self.window.as_deref(),
                WindowKind::Cumulative,
            )?,
        })
    }
}

impl CanarySection {
    /// Checks it against the known `groups`.
    pub fn validate(self, groups: &BTreeSet<String>) -> Result<CanaryConfig, RouterConfigError> {
        check_name("canary.name", &self.name)?;
        check_group("canary.stable_group", &self.stable_group, groups)?;
        check_group("canary.canary_group", &self.canary_group, groups)?;
        if self.stable_group == self.canary_group {
            return Err(invalid(
                "canary.canary_group",
                "a group other than stable_group",
                &self.canary_group,
            ));
        }
        let steps = self.steps.unwrap_or_else(|| vec![5.0, 25.0, 50.0, 100.0]);
        let increasing = steps.windows(2).all(|w| w[0] < w[1]);
        if steps.is_empty() || !increasing || steps[0] <= 0.0 || steps.last() != Some(&100.0) {
            return Err(invalid(
                "canary.steps",
                "increasing percents above 0, the last 100",
                format!("{steps:?}"),
            ));
        }
        let d = |v: Option<Duration>, default_s: u64| {
            v.map_or(StdDuration::from_secs(default_s), Duration::get)
        };
        let (step_duration, window, eval_interval) = (
            d(self.step_duration, 60),
            d(self.window, 60),
            d(self.eval_interval, 1),
        );
        if step_duration.is_zero() || window.is_zero() || eval_interval.is_zero() {
            return Err(invalid(
                "canary",
                "non-zero step_duration, window and eval_interval",
                "0s",
            ));
        }
        let min_samples = self.min_samples.unwrap_or(20);
        if min_samples < 2 {
            return Err(invalid("canary.min_samples", "at least 2", min_samples));
        }
        let ratio = |key: &'static str, v: Option<f64>| match v.unwrap_or(1.5) {
            r if r >= 1.0 && r.is_finite() => Ok(r),
            r => Err(invalid(key, "a ratio of at least 1", r)),
        };
        let thresholds = Thresholds {
            max_error_rate_delta: fraction(
                "canary.max_error_rate_delta",
                self.max_error_rate_delta.unwrap_or(0.05),
                false,
            )?,
            quantile: fraction("canary.quantile", self.quantile.unwrap_or(0.95), false)?,
            max_ttft_ratio: ratio("canary.max_ttft_ratio", self.max_ttft_ratio)?,
            max_itl_ratio: ratio("canary.max_itl_ratio", self.max_itl_ratio)?,
            significance: fraction(
                "canary.significance",
                self.significance.unwrap_or(0.01),
                true,
            )?,
            min_samples,
        };
        Ok(CanaryConfig {
            name: self.name,
            model: self.model,
            stable_group: self.stable_group,
            canary_group: self.canary_group,
            steps,
            step_duration,
            window,
            eval_interval,
            thresholds,
        })
    }
}

/// At most one split (experiment or canary) per model, and unique names.
fn check_unique(
    experiments: &[ExperimentConfig],
    canaries: &[CanaryConfig],
) -> Result<(), RouterConfigError> {
    let mut models = BTreeSet::new();
    let mut names = BTreeSet::new();
    let all = experiments
        .iter()
        .map(|e| (&e.model, format!("experiment {}", e.id), e.id.clone()))
        .chain(canaries.iter().map(|c| {
            (
                &c.model,
                format!("canary {}", c.name),
                format!("canary:{}", c.name),
            )
        }));
    for (model, what, name) in all {
        if !names.insert(name) {
            return Err(invalid("experiments/canary", "unique ids and names", what));
        }
        if !models.insert(model.clone()) {
            return Err(invalid(
                "experiments/canary",
                "at most one experiment or canary per model",
                format!("{what} on {}", model.as_deref().unwrap_or("every model")),
            ));
        }
    }
    Ok(())
}

impl RouterSloSection {
    /// Checks the bounds; `Err((key, expected, value))` names the key.
    pub fn validate(&self) -> Result<RouteAwayConfig, (&'static str, &'static str, String)> {
        let base = RouteAwayConfig::default();
        let secs = |d: Option<Duration>| d.map(|d| d.get().as_secs_f64());
        let config = RouteAwayConfig {
            mode: self.mode.unwrap_or(base.mode),
            ttft: secs(self.ttft_target),
            itl: secs(self.itl_target),
            exit_ratio: self.exit_ratio.unwrap_or(base.exit_ratio),
            min_samples: self.min_samples.unwrap_or(base.min_samples),
            hold: self.hold.map_or(base.hold, Duration::get),
            hold_max: self.hold_max.map_or(base.hold_max, Duration::get),
            canary_rollback: self.canary_rollback.unwrap_or(base.canary_rollback),
        };
        for (key, target) in [
            ("slo.ttft_target", config.ttft),
            ("slo.itl_target", config.itl),
        ] {
            if target.is_some_and(|t| t <= 0.0) {
                return Err((key, "a positive duration", "0s".into()));
            }
        }
        if !(config.exit_ratio > 0.0 && config.exit_ratio <= 1.0) {
            return Err(("slo.exit_ratio", "in (0, 1]", config.exit_ratio.to_string()));
        }
        if config.min_samples == 0 {
            return Err(("slo.min_samples", "at least 1", "0".into()));
        }
        if config.hold.is_zero() {
            return Err(("slo.hold", "a positive duration", "0s".into()));
        }
        if config.hold_max < config.hold {
            return Err((
                "slo.hold_max",
                "at least slo.hold",
                format!("{:?}", config.hold_max),
            ));
        }
        if config.mode != RouteAwayMode::Off && config.ttft.is_none() && config.itl.is_none() {
            return Err((
                "slo.mode",
                "slo.ttft_target or slo.itl_target to be set",
                format!("{:?}", config.mode),
            ));
        }
        Ok(config)
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

    #[test]
    fn validation_names_the_key() {
        let bad = |s: RouterSloSection| s.validate().expect_err("invalid").0;
        let on = || RouterSloSection {
            mode: Some(RouteAwayMode::On),
            ttft_target: Some("1s".parse().expect("duration")),
            ..RouterSloSection::default()
        };
        assert_eq!(
            bad(RouterSloSection {
                mode: Some(RouteAwayMode::On),
                ..RouterSloSection::default()
            }),
            "slo.mode"
        );
        assert_eq!(
            bad(RouterSloSection {
                exit_ratio: Some(1.5),
                ..on()
            }),
            "slo.exit_ratio"
        );
        assert_eq!(
            bad(RouterSloSection {
                hold: Some("20s".parse().expect("duration")),
                hold_max: Some("10s".parse().expect("duration")),
                ..on()
            }),
            "slo.hold_max"
        );
        let ok = on().validate().expect("valid");
        assert_eq!(ok.ttft, Some(1.0));
        assert!(!ok.canary_rollback, "off unless asked for");
        let rollback = RouterSloSection {
            canary_rollback: Some(true),
            ..on()
        };
        assert!(rollback.validate().expect("valid").canary_rollback);
        assert_eq!(
            RouterSloSection::default().validate(),
            Ok(RouteAwayConfig::default())
        );
    }
}
