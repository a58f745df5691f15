//! SLO remediation in the router: roll back a canary whose group breaches
//! the `[slo]` targets while its stable group meets them
//! (`[slo] canary_rollback = true`).
//!
//! The canary controller rolls back on its own comparison of the two arms
//! (Welch and a quantile ratio); this is the absolute check beside it: the
//! canary arm's mean TTFT or ITL over the canary's sliding window is over
//! `ttft_target` / `itl_target`. Only a breach the stable arm does not
//! share counts (stable measured, with `min_samples`, under every target):
//! when both arms breach, the fleet is overloaded and rolling back would
//! not help. Each arm needs `min_samples` in the window, the same bar as a
//! worker's route-away. A rollback is final for that canary run, so it
//! cannot flap; in `dry_run` the breach is logged, counted and added to the
//! canary's event log once per breach, and the share is left as it is.

use std::time::Instant;

use metrics::counter;

use crate::config::{RouteAwayConfig, RouteAwayMode};
use crate::metrics::CANARY_SLO_ACTIONS;
use crate::split::canary::{Canary, CanaryController, Phase};
use crate::worker::Latency;

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |s| format!("{:.0} ms", s * 1e3))
}

fn line(arm: &str, l: Latency) -> String {
    format!(
        "{arm} mean TTFT {} ITL {} (n {})",
        ms(l.ttft),
        ms(l.itl),
        l.samples
    )
}

/// Why the canary arm should be rolled back, if it should: it breaches a
/// target while the stable arm meets every one.
pub fn judge(config: &RouteAwayConfig, [stable, canary]: [Latency; 2]) -> Option<String> {
    if !config.breaches(canary) || !config.meets(stable) {
        return None;
    }
    Some(format!(
        "SLO (TTFT target {}, ITL target {}) breached by the canary group, met by stable: {}; {}",
        ms(config.ttft),
        ms(config.itl),
        line("canary", canary),
        line("stable", stable)
    ))
}

/// Judges every running or paused canary at `now` and acts per the mode.
pub fn evaluate(config: &RouteAwayConfig, canaries: &CanaryController, now: Instant) {
    if config.mode == RouteAwayMode::Off || !config.canary_rollback {
        return;
    }
    for c in canaries.all() {
        if !matches!(c.status_phase(), Phase::Running | Phase::Paused) {
            continue;
        }
        match judge(config, c.arm_latencies(now)) {
            Some(why) => act(config.mode, c, &why),
            None => c.clear_slo_note(),
        }
    }
}

fn act(mode: RouteAwayMode, c: &Canary, why: &str) {
    let name = c.config.name.clone();
    let acted = match mode {
        RouteAwayMode::On => {
            let done = c.rollback_noted("slo", Some(why)).is_ok();
            if done {
                tracing::warn!(canary = %name, %why, "SLO breached on the canary group: rolled back");
            }
            done
        }
        RouteAwayMode::DryRun => {
            let noted = c.note_slo_dry_run(why);
            if noted {
                tracing::warn!(canary = %name, %why, "dry run, would: roll back the canary");
            }
            noted
        }
        RouteAwayMode::Off => false,
    };
    if acted {
        let mode = if mode == RouteAwayMode::On {
            "on"
        } else {
            "dry_run"
        };
        counter!(CANARY_SLO_ACTIONS, "canary" => name, "mode" => mode).increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CanaryConfig, Thresholds};
    use crate::split::window::Sample;
    use std::time::Duration;

    fn slo(mode: RouteAwayMode) -> RouteAwayConfig {
        RouteAwayConfig {
            mode,
            ttft: Some(0.5),
            itl: None,
            canary_rollback: true,
            ..RouteAwayConfig::default()
        }
    }

    fn latency(ttft: f64, samples: u32) -> Latency {
        Latency {
            ttft: Some(ttft),
            itl: None,
            samples,
        }
    }

    fn controller() -> CanaryController {
        CanaryController::new(vec![CanaryConfig {
            name: "c".into(),
            model: None,
            stable_group: "stable".into(),
            canary_group: "canary".into(),
            steps: vec![50.0, 100.0],
            step_duration: Duration::from_secs(60),
            window: Duration::from_secs(30),
            eval_interval: Duration::from_secs(1),
            // The controller's own comparison never fires here: only the
            // SLO can roll back.
            thresholds: Thresholds {
                max_error_rate_delta: 1.0,
                quantile: 0.5,
                max_ttft_ratio: 1e9,
                max_itl_ratio: 1e9,
                significance: 0.01,
                min_samples: 10,
            },
        }])
    }

    fn feed(c: &Canary, arm: usize, at: Instant, n: usize, ttft: f64) {
        for _ in 0..n {
            let sample = Sample {
                ttft_s: Some(ttft),
                itl_s: Some(0.02),
                e2e_s: Some(ttft + 0.2),
                ok: true,
            };
            c.record(arm, at, sample);
        }
    }

    #[test]
    fn only_a_breach_that_stable_does_not_share_is_the_canarys() {
        let c = slo(RouteAwayMode::On);
        let why = judge(&c, [latency(0.2, 5), latency(0.9, 5)]);
        assert!(why.is_some_and(|w| w.contains("canary mean TTFT 900 ms")));
        // Both breach: overload, not the canary.
        assert_eq!(judge(&c, [latency(0.6, 5), latency(0.9, 5)]), None);
        // Too few samples on either arm: not judged.
        assert_eq!(judge(&c, [latency(0.2, 4), latency(0.9, 5)]), None);
        assert_eq!(judge(&c, [latency(0.2, 5), latency(0.9, 4)]), None);
        // Under the target: nothing.
        assert_eq!(judge(&c, [latency(0.2, 5), latency(0.4, 5)]), None);
    }

    #[test]
    fn a_breaching_canary_is_rolled_back_with_reason_slo() {
        let ctl = controller();
        let c = &ctl.all()[0];
        let now = Instant::now();
        feed(c, 0, now, 8, 0.1);
        feed(c, 1, now, 8, 1.2);
        evaluate(&slo(RouteAwayMode::On), &ctl, now);
        let s = c.status(now);
        assert_eq!((s.phase, s.share), (Phase::RolledBack, 0.0));
        let last = s.events.last().expect("an event");
        assert_eq!(
            (last.kind, last.reason.as_deref()),
            ("rollback", Some("slo"))
        );
        assert!(last
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("breached")));
        assert!((0..100).all(|i| c.arm_for(&format!("u{i}")) == 0));
    }

    #[test]
    fn off_or_not_enabled_does_nothing() {
        let ctl = controller();
        let c = &ctl.all()[0];
        let now = Instant::now();
        feed(c, 0, now, 8, 0.1);
        feed(c, 1, now, 8, 1.2);
        let disabled = RouteAwayConfig {
            canary_rollback: false,
            ..slo(RouteAwayMode::On)
        };
        evaluate(&disabled, &ctl, now);
        evaluate(&slo(RouteAwayMode::Off), &ctl, now);
        assert_eq!(c.status(now).phase, Phase::Running);
        assert_eq!(c.status(now).events.len(), 1, "only the start");
    }

    #[test]
    fn dry_run_reports_once_per_breach_and_keeps_the_share() {
        let ctl = controller();
        let c = &ctl.all()[0];
        let dry = slo(RouteAwayMode::DryRun);
        let t0 = Instant::now();
        feed(c, 0, t0, 8, 0.1);
        feed(c, 1, t0, 8, 1.2);
        evaluate(&dry, &ctl, t0);
        evaluate(&dry, &ctl, t0 + Duration::from_secs(1));
        let s = c.status(t0 + Duration::from_secs(1));
        assert_eq!((s.phase, s.share), (Phase::Running, 50.0));
        let kinds: Vec<_> = s.events.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["start", "slo_dry_run"]);
        // The window forgets the breach; a new breach is reported again.
        let later = t0 + Duration::from_secs(40);
        evaluate(&dry, &ctl, later);
        feed(c, 0, later, 8, 0.1);
        feed(c, 1, later, 8, 1.2);
        evaluate(&dry, &ctl, later);
        let kinds: Vec<_> = c.status(later).events.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["start", "slo_dry_run", "slo_dry_run"]);
        assert_eq!(c.share(), 50.0);
    }
}
