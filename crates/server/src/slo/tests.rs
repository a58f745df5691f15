use std::sync::Arc;
use std::time::{Duration, Instant};

use ingot_config::{Config, RemediationMode, SloMetric, SloSpec, SloTarget};
use ingot_core::Priority;
use ingot_engine::{EngineControls, Measure};

use super::SloMonitor;

fn high_ttft_slo() -> SloSpec {
    SloSpec {
        tier: "high".into(),
        metric: SloMetric::Ttft,
        quantile: 0.9,
        target: SloTarget::Duration(ingot_config::Duration::from_millis(500)),
        window: ingot_config::Duration::from_secs(5),
        min_samples: 5,
        ..SloSpec::default()
    }
}

fn config(mode: RemediationMode) -> Config {
    let mut c = Config {
        slo: vec![high_ttft_slo()],
        ..Config::default()
    };
    c.remediation.mode = mode;
    c.remediation.shed.cooldown = ingot_config::Duration::from_secs(0);
    c
}

fn record(c: &EngineControls, tier: Priority, secs: f64, n: usize) {
    for _ in 0..n {
        c.record(tier, Measure::Ttft, secs, Instant::now());
    }
}

fn engine() -> Arc<EngineControls> {
    Arc::new(EngineControls::new(512, 64))
}

#[test]
fn breach_sheds_lowest_tier_first_when_on() {
    let (m, c) = (SloMonitor::default(), engine());
    m.observe("m", &c);
    record(&c, Priority::High, 0.9, 10);
    let cfg = config(RemediationMode::On);
    m.tick(&cfg, Instant::now());
    assert!(c.is_held(Priority::Background) && !c.is_held(Priority::Low));
    let shed = m.admit("m", Priority::Background, Duration::from_secs(5));
    assert!(matches!(shed, Err(crate::ApiError::Shed { .. })));
    assert!(m.admit("m", Priority::High, Duration::from_secs(5)).is_ok());
    // Still breached on new samples: the next tier follows.
    record(&c, Priority::High, 0.9, 10);
    m.tick(&cfg, Instant::now());
    assert!(c.is_held(Priority::Low));
    let report = m.report(&cfg);
    assert_eq!(report["slos"][0]["met"], false);
    assert_eq!(report["remediation"]["m"]["shed"]["level"], 2);
}

#[test]
fn dry_run_reports_without_acting() {
    let (m, c) = (SloMonitor::default(), engine());
    m.observe("m", &c);
    record(&c, Priority::High, 0.9, 10);
    let cfg = config(RemediationMode::DryRun);
    m.tick(&cfg, Instant::now());
    assert!(!c.is_held(Priority::Background));
    assert!(m
        .admit("m", Priority::Background, Duration::from_secs(5))
        .is_ok());
    let report = m.report(&cfg);
    assert_eq!(report["events"][0]["applied"], false);
    assert_eq!(report["events"][0]["action"], "shed");
    assert_eq!(report["remediation"]["m"]["shed"]["tiers"][0], "background");
}

#[test]
fn low_tier_samples_do_not_trigger_and_off_mode_releases() {
    let (m, c) = (SloMonitor::default(), engine());
    m.observe("m", &c);
    record(&c, Priority::Low, 5.0, 20);
    m.tick(&config(RemediationMode::On), Instant::now());
    assert!(
        !c.is_held(Priority::Background),
        "a low-tier breach is not a high one"
    );
    record(&c, Priority::High, 0.9, 10);
    m.tick(&config(RemediationMode::On), Instant::now());
    assert!(c.is_held(Priority::Background));
    m.tick(&config(RemediationMode::Off), Instant::now());
    assert!(!c.is_held(Priority::Background), "turning it off undoes it");
}

#[test]
fn batching_lowers_the_engine_budget() {
    let (m, c) = (SloMonitor::default(), engine());
    m.observe("m", &c);
    for _ in 0..50 {
        c.record(Priority::Normal, Measure::Itl, 0.100, Instant::now());
    }
    let mut cfg = config(RemediationMode::On);
    cfg.remediation.batching.enabled = true;
    cfg.remediation.batching.target_itl = ingot_config::Duration::from_millis(50);
    m.tick(&cfg, Instant::now());
    assert_eq!(c.token_budget(), 256);
    assert_eq!(c.max_num_seqs(), 64);
}

struct Recorder(std::sync::Mutex<Vec<String>>);

impl super::CanaryRollback for Recorder {
    fn roll_back(&self, model: &str, _reason: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(model.to_string());
        true
    }
}

#[test]
fn canary_hook_is_called_once_per_cooldown_on_breach() {
    let (m, c) = (SloMonitor::default(), engine());
    let hook = Arc::new(Recorder(Default::default()));
    m.set_canary_hook(hook.clone());
    m.observe("m", &c);
    record(&c, Priority::High, 0.9, 10);
    let mut cfg = config(RemediationMode::On);
    cfg.remediation.canary_rollback = true;
    cfg.remediation.shed.cooldown = ingot_config::Duration::from_secs(60);
    let now = Instant::now();
    m.tick(&cfg, now);
    m.tick(&cfg, now + Duration::from_secs(1));
    let calls = hook
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    assert_eq!(calls, vec!["m".to_string()]);
    let report = m.report(&cfg);
    let events = report["events"].as_array().cloned().unwrap_or_default();
    assert!(events.iter().any(|e| e["action"] == "canary_rollback"));
}
