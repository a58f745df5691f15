//! Canary releases: a unit goes to the canary group when
//! `bucket("canary:" + name, unit) < share × 100`, so raising the share keeps
//! every unit that was already in (a unit in at 5% stays in at 25%). The
//! controller steps the share up on a schedule while both arms' sliding
//! windows say the canary is healthy, and rolls it back at once (share 0)
//! when its error rate or TTFT/ITL regresses beyond the thresholds. The
//! window restarts at each step, so a step is judged on samples of both
//! arms taken at that share. Requests
//! in flight on the canary finish: a rollback only changes where new
//! requests go.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use ingot_stats::{compare, quantile, Verdict};
use serde::Serialize;

use super::window::{ArmWindow, Outcomes, Sample};
use crate::config::{CanaryConfig, Thresholds, WindowKind};
use crate::metrics as m;
use crate::worker::Latency;

/// Where a canary is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Stepping up while healthy.
    Running,
    /// Holding its share (an operator paused it); still rolled back on a
    /// regression.
    Paused,
    /// Share 0: every request goes to the stable group.
    RolledBack,
    /// Share 100: the canary group is the stable group now.
    Promoted,
}

/// One entry of a canary's event log.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    /// Wall-clock time, ms since the Unix epoch.
    pub at_unix_ms: u64,
    /// Seconds since the router started the canary.
    pub since_start_s: f64,
    /// "start", "step", "pause", "resume", "rollback", "promote" or
    /// "slo_dry_run" (`[slo]` in dry-run mode would have rolled it back).
    pub kind: &'static str,
    /// The canary's share after the event, percent.
    pub share: f64,
    /// Why (rollbacks: "error_rate", "ttft", "itl", "slo", "manual" or the
    /// caller's).
    pub reason: Option<String>,
    /// What the windows held at that moment.
    pub detail: Option<String>,
}

/// A canary operation that cannot be done.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum CanaryError {
    /// No canary has this name.
    #[error("no canary named `{0}`")]
    NotFound(String),
    /// It was rolled back or promoted already.
    #[error("canary `{name}` is already {phase}")]
    Finished {
        /// The canary.
        name: String,
        /// "rolled_back" or "promoted".
        phase: &'static str,
    },
}

struct Run {
    phase: Phase,
    step: usize,
    step_started: Instant,
    windows: [ArmWindow; 2],
    events: Vec<Event>,
    /// A dry-run SLO breach is in the event log and not yet over (one
    /// event per breach, not one per evaluation).
    slo_noted: bool,
}

/// One canary.
pub struct Canary {
    /// Its config.
    pub config: CanaryConfig,
    started: Instant,
    /// The share in basis points (0..=10 000), read per request.
    share_bp: AtomicU32,
    run: Mutex<Run>,
}

/// One arm in a status.
#[derive(Debug, Serialize)]
pub struct ArmStatus {
    /// Worker group.
    pub group: String,
    /// Requests and errors in the window.
    #[serde(flatten)]
    pub outcomes: Outcomes,
    /// TTFT in the window, ms.
    pub ttft_ms: ingot_stats::Summary,
    /// Per-request mean ITL in the window, ms.
    pub itl_ms: ingot_stats::Summary,
    /// End-to-end latency in the window, ms.
    pub e2e_ms: ingot_stats::Summary,
}

/// `GET /admin/canaries` entry.
#[derive(Debug, Serialize)]
pub struct CanaryStatus {
    /// Name.
    pub name: String,
    /// Model (null: every request).
    pub model: Option<String>,
    /// Phase.
    pub phase: Phase,
    /// Current share, percent.
    pub share: f64,
    /// Index into `steps` (running or paused).
    pub step: usize,
    /// The schedule.
    pub steps: Vec<f64>,
    /// The group that serves by default now: the canary group once promoted.
    pub stable_group: String,
    /// The configured canary group.
    pub canary_group: String,
    /// Sliding window, seconds.
    pub window_s: f64,
    /// Stable arm (what it is compared with).
    pub stable: ArmStatus,
    /// Canary arm.
    pub canary: ArmStatus,
    /// Every transition, oldest first.
    pub events: Vec<Event>,
}

fn describe(w: &[ArmWindow; 2]) -> String {
    let line = |name: &str, a: &ArmWindow| {
        let o = a.outcomes();
        let ttft = quantile(&a.ttft(), 0.5).map_or(f64::NAN, |s| s * 1e3);
        format!(
            "{name}: {} requests, error rate {:.3}, TTFT p50 {ttft:.1} ms",
            o.requests, o.error_rate
        )
    };
    format!("{}; {}", line("stable", &w[0]), line("canary", &w[1]))
}

/// Why the canary (arm 1) is worse than stable (arm 0), if it is.
pub fn regression(w: &[ArmWindow; 2], t: &Thresholds) -> Option<&'static str> {
    let (stable, canary) = (w[0].outcomes(), w[1].outcomes());
    if canary.requests >= t.min_samples
        && canary.error_rate - stable.error_rate > t.max_error_rate_delta
    {
        return Some("error_rate");
    }
    let latency = [
        ("ttft", w[0].ttft(), w[1].ttft(), t.max_ttft_ratio),
        ("itl", w[0].itl(), w[1].itl(), t.max_itl_ratio),
    ];
    for (name, a, b, max_ratio) in latency {
        if compare(&a, &b, t.significance, t.min_samples).verdict != Verdict::BHigher {
            continue;
        }
        let (Some(qa), Some(qb)) = (quantile(&a, t.quantile), quantile(&b, t.quantile)) else {
            continue;
        };
        if qa > 0.0 && qb / qa > max_ratio {
            return Some(name);
        }
    }
    None
}

impl Canary {
    /// A canary at its first step.
    pub fn new(config: CanaryConfig) -> Self {
        let now = Instant::now();
        let first = config.steps.first().copied().unwrap_or(0.0);
        let canary = Self {
            share_bp: AtomicU32::new(0),
            started: now,
            run: Mutex::new(Run {
                phase: Phase::Running,
                step: 0,
                step_started: now,
                windows: Default::default(),
                events: Vec::new(),
                slo_noted: false,
            }),
            config,
        };
        let mut run = canary.lock();
        canary.transition(&mut run, "start", first, None, None);
        drop(run);
        canary
    }

    fn lock(&self) -> MutexGuard<'_, Run> {
        self.run.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `canary` label and flag name: `canary:` + name.
    pub fn flag(&self) -> String {
        format!("canary:{}", self.config.name)
    }

    /// The current share, percent.
    pub fn share(&self) -> f64 {
        f64::from(self.share_bp.load(Ordering::Relaxed)) / 100.0
    }

    /// 1 (canary) when `unit`'s bucket is below the share, else 0 (stable).
    pub fn arm_for(&self, unit: &str) -> usize {
        let share = self.share_bp.load(Ordering::Relaxed);
        usize::from(ingot_config::bucket(&self.flag(), unit) < share)
    }

    /// Adds a finished request's sample to `arm`.
    pub fn record(&self, arm: usize, at: Instant, sample: Sample) {
        if let Some(w) = self.lock().windows.get_mut(arm) {
            w.record(at, sample);
        }
    }

    /// Sets the share, logs, counts and appends the event (its detail: the
    /// windows, after `note` when given).
    fn transition(
        &self,
        run: &mut Run,
        kind: &'static str,
        share: f64,
        reason: Option<String>,
        note: Option<&str>,
    ) {
        self.share_bp
            .store((share * 100.0).round() as u32, Ordering::Relaxed);
        let name = &self.config.name;
        metrics::gauge!(m::CANARY_SHARE, "canary" => name.clone()).set(share);
        let windows = describe(&run.windows);
        let detail = note.map_or_else(|| windows.clone(), |n| format!("{n}; {windows}"));
        match kind {
            "rollback" => {
                let reason = reason.clone().unwrap_or_default();
                metrics::counter!(m::CANARY_ROLLBACKS, "canary" => name.clone(), "reason" => reason.clone())
                    .increment(1);
                tracing::warn!(canary = %name, %reason, %detail, "canary rolled back");
            }
            "promote" => {
                metrics::counter!(m::CANARY_PROMOTIONS, "canary" => name.clone()).increment(1);
                tracing::info!(canary = %name, %detail, "canary promoted: its group is stable now");
            }
            _ => tracing::info!(canary = %name, kind, share, %detail, "canary"),
        }
        run.events.push(Event {
            at_unix_ms: ingot_web::unix_ms(),
            since_start_s: self.started.elapsed().as_secs_f64(),
            kind,
            share,
            reason,
            detail: Some(detail),
        });
    }

    fn finished(&self, run: &Run) -> Result<(), CanaryError> {
        let phase = match run.phase {
            Phase::RolledBack => "rolled_back",
            Phase::Promoted => "promoted",
            Phase::Running | Phase::Paused => return Ok(()),
        };
        Err(CanaryError::Finished {
            name: self.config.name.clone(),
            phase,
        })
    }

    /// Share to 0 now, recording `reason`.
    pub fn rollback(&self, reason: &str) -> Result<(), CanaryError> {
        self.rollback_noted(reason, None)
    }

    /// Share to 0 now, recording `reason` and `note` (what was measured).
    pub fn rollback_noted(&self, reason: &str, note: Option<&str>) -> Result<(), CanaryError> {
        let mut run = self.lock();
        self.finished(&run)?;
        run.phase = Phase::RolledBack;
        self.transition(&mut run, "rollback", 0.0, Some(reason.to_string()), note);
        Ok(())
    }

    /// Records (once per breach) that `[slo]` in dry-run mode would roll
    /// the canary back: an `slo_dry_run` event, the share unchanged. True
    /// when this call recorded it.
    pub fn note_slo_dry_run(&self, note: &str) -> bool {
        let mut run = self.lock();
        if run.slo_noted || self.finished(&run).is_err() {
            return false;
        }
        run.slo_noted = true;
        let share = self.share();
        self.transition(
            &mut run,
            "slo_dry_run",
            share,
            Some("slo".into()),
            Some(note),
        );
        true
    }

    /// The breach a dry run noted is over: the next one is noted again.
    pub fn clear_slo_note(&self) {
        self.lock().slo_noted = false;
    }

    /// Each arm's window (pruned at `now`) as the SLO sees a worker: mean
    /// TTFT and mean per-request ITL, seconds, and the TTFT sample count.
    pub fn arm_latencies(&self, now: Instant) -> [Latency; 2] {
        let mut run = self.lock();
        for w in run.windows.iter_mut() {
            w.prune(now, WindowKind::Sliding(self.config.window));
        }
        let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        [&run.windows[0], &run.windows[1]].map(|w| {
            let ttft = w.ttft();
            Latency {
                samples: u32::try_from(ttft.len()).unwrap_or(u32::MAX),
                ttft: mean(ttft),
                itl: mean(w.itl()),
            }
        })
    }

    /// Share to 100 for good: the canary group becomes stable.
    pub fn promote(&self, reason: &str) -> Result<(), CanaryError> {
        let mut run = self.lock();
        self.finished(&run)?;
        run.phase = Phase::Promoted;
        self.transition(&mut run, "promote", 100.0, Some(reason.to_string()), None);
        Ok(())
    }

    /// Holds (`true`) or releases (`false`) the current share.
    pub fn pause(&self, paused: bool) -> Result<(), CanaryError> {
        let mut run = self.lock();
        self.finished(&run)?;
        let share = self.share();
        if paused && run.phase == Phase::Running {
            run.phase = Phase::Paused;
            self.transition(&mut run, "pause", share, Some("manual".into()), None);
        } else if !paused && run.phase == Phase::Paused {
            run.phase = Phase::Running;
            run.step_started = Instant::now();
            self.transition(&mut run, "resume", share, Some("manual".into()), None);
        }
        Ok(())
    }

    /// One evaluation at `now`: roll back on a regression, else step up (or
    /// promote after the last step) once the step has lasted its time with
    /// enough canary requests.
    pub fn evaluate(&self, now: Instant) {
        let mut run = self.lock();
        if !matches!(run.phase, Phase::Running | Phase::Paused) {
            return;
        }
        for w in run.windows.iter_mut() {
            w.prune(now, WindowKind::Sliding(self.config.window));
        }
        if let Some(reason) = regression(&run.windows, &self.config.thresholds) {
            run.phase = Phase::RolledBack;
            self.transition(&mut run, "rollback", 0.0, Some(reason.into()), None);
            return;
        }
        let due = now.saturating_duration_since(run.step_started) >= self.config.step_duration;
        let seen = run.windows[1].outcomes().requests >= self.config.thresholds.min_samples;
        if run.phase != Phase::Running || !due || !seen {
            return;
        }
        match self.config.steps.get(run.step + 1).copied() {
            Some(next) => {
                run.step += 1;
                run.step_started = now;
                self.transition(&mut run, "step", next, None, None);
                // Each step is judged on its own samples: both arms measured
                // over the same period at the same share (a larger share
                // batches more and is slower; at 100% stable gets nothing).
                for w in run.windows.iter_mut() {
                    w.clear();
                }
            }
            None => {
                run.phase = Phase::Promoted;
                self.transition(
                    &mut run,
                    "promote",
                    100.0,
                    Some("healthy at every step".into()),
                    None,
                );
            }
        }
    }

    /// Its phase now.
    pub fn status_phase(&self) -> Phase {
        self.lock().phase
    }

    /// The group that serves by default: the canary group once promoted.
    pub fn stable_group(&self) -> &str {
        if self.lock().phase == Phase::Promoted {
            &self.config.canary_group
        } else {
            &self.config.stable_group
        }
    }

    /// Its state for the admin API.
    pub fn status(&self, now: Instant) -> CanaryStatus {
        let stable_group = self.stable_group().to_string();
        let mut run = self.lock();
        for w in run.windows.iter_mut() {
            w.prune(now, WindowKind::Sliding(self.config.window));
        }
        let arm = |i: usize, group: &str| {
            let [ttft_ms, itl_ms, e2e_ms] = run.windows[i].summaries_ms();
            ArmStatus {
                group: group.to_string(),
                outcomes: run.windows[i].outcomes(),
                ttft_ms,
                itl_ms,
                e2e_ms,
            }
        };
        let c = &self.config;
        CanaryStatus {
            name: c.name.clone(),
            model: c.model.clone(),
            phase: run.phase,
            share: self.share(),
            step: run.step,
            steps: c.steps.clone(),
            stable_group,
            canary_group: c.canary_group.clone(),
            window_s: c.window.as_secs_f64(),
            stable: arm(0, &c.stable_group),
            canary: arm(1, &c.canary_group),
            events: run.events.clone(),
        }
    }
}

/// Every canary, by name: the admin API's and the SLO engine's handle.
#[derive(Default)]
pub struct CanaryController {
    canaries: Vec<Arc<Canary>>,
}

impl CanaryController {
    /// Controls `canaries`.
    pub fn new(configs: Vec<CanaryConfig>) -> Self {
        Self {
            canaries: configs
                .into_iter()
                .map(|c| Arc::new(Canary::new(c)))
                .collect(),
        }
    }

    /// Every canary.
    pub fn all(&self) -> &[Arc<Canary>] {
        &self.canaries
    }

    /// The canary named `name`.
    pub fn get(&self, name: &str) -> Result<&Arc<Canary>, CanaryError> {
        self.canaries
            .iter()
            .find(|c| c.config.name == name)
            .ok_or_else(|| CanaryError::NotFound(name.to_string()))
    }

    /// The canary of `model` (named by a canary's `model`, else the one
    /// without a model), if any.
    pub fn for_model(&self, model: Option<&str>) -> Option<&Arc<Canary>> {
        self.canaries
            .iter()
            .find(|c| model.is_some() && c.config.model.as_deref() == model)
            .or_else(|| self.canaries.iter().find(|c| c.config.model.is_none()))
    }

    /// Rolls back the canary named `name`, or the canary of the model
    /// `name` (share to 0 at once, `reason` recorded in the log, the
    /// `ingot_canary_rollbacks_total{reason}` counter and the event log).
    /// For operators (`POST /admin/canaries/{name}/rollback`) and for
    /// remediation (an SLO breach).
    pub fn rollback(&self, name_or_model: &str, reason: &str) -> Result<CanaryStatus, CanaryError> {
        let c = self.get(name_or_model).or_else(|e| {
            self.for_model(Some(name_or_model))
                .filter(|c| c.config.model.is_some())
                .ok_or(e)
        })?;
        c.rollback(reason)?;
        Ok(c.status(Instant::now()))
    }

    /// Evaluates every canary (the controller task calls it each tick).
    pub fn evaluate(&self, now: Instant) {
        for c in &self.canaries {
            c.evaluate(now);
        }
    }

    /// The shortest evaluation interval (the controller's tick).
    pub fn tick(&self) -> Option<std::time::Duration> {
        self.canaries.iter().map(|c| c.config.eval_interval).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn config(steps: Vec<f64>) -> CanaryConfig {
        CanaryConfig {
            name: "c".into(),
            model: None,
            stable_group: "stable".into(),
            canary_group: "canary".into(),
            steps,
            step_duration: Duration::from_secs(10),
            window: Duration::from_secs(30),
            eval_interval: Duration::from_secs(1),
            thresholds: Thresholds {
                max_error_rate_delta: 0.05,
                quantile: 0.95,
                max_ttft_ratio: 1.5,
                max_itl_ratio: 1.5,
                significance: 0.01,
                min_samples: 10,
            },
        }
    }

    fn feed(c: &Canary, arm: usize, at: Instant, n: usize, ttft: f64, ok: bool) {
        for i in 0..n {
            let jitter = (i % 7) as f64 * 0.002;
            let sample = Sample {
                ttft_s: Some(ttft + jitter),
                itl_s: Some(0.02 + jitter / 10.0),
                e2e_s: Some(ttft + 0.2),
                ok,
            };
            c.record(arm, at, sample);
        }
    }

    #[test]
    fn raising_the_share_keeps_every_unit_that_was_in() {
        let c = Canary::new(config(vec![5.0, 25.0, 50.0, 100.0]));
        let units: Vec<String> = (0..2000).map(|i| format!("user-{i}")).collect();
        let in_at = |c: &Canary| {
            units
                .iter()
                .filter(|u| c.arm_for(u) == 1)
                .cloned()
                .collect::<Vec<_>>()
        };
        let at5 = in_at(&c);
        c.share_bp.store(2500, Ordering::Relaxed);
        let at25 = in_at(&c);
        assert!(at5.iter().all(|u| at25.contains(u)));
        // About the share: 5% and 25% of 2000 units, within a few points.
        assert!((60..=140).contains(&at5.len()), "{}", at5.len());
        assert!((420..=580).contains(&at25.len()), "{}", at25.len());
    }

    #[test]
    fn a_healthy_canary_steps_up_and_is_promoted() {
        let c = Canary::new(config(vec![25.0, 50.0, 100.0]));
        let t0 = Instant::now();
        let mut now = t0;
        for expected in [25.0, 50.0, 100.0] {
            assert_eq!(c.share(), expected);
            // Not yet due: no step.
            feed(&c, 0, now, 30, 0.1, true);
            feed(&c, 1, now, 30, 0.1, true);
            c.evaluate(now + Duration::from_secs(5));
            assert_eq!(c.share(), expected);
            now += Duration::from_secs(11);
            c.evaluate(now);
        }
        let s = c.status(now);
        assert_eq!(s.phase, Phase::Promoted);
        assert_eq!(s.share, 100.0);
        assert_eq!(s.stable_group, "canary");
        let kinds: Vec<_> = s.events.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["start", "step", "step", "promote"]);
        assert!(c.rollback("late").is_err());
    }

    #[test]
    fn a_slow_canary_is_rolled_back_at_once() {
        let c = Canary::new(config(vec![25.0, 100.0]));
        let now = Instant::now();
        feed(&c, 0, now, 40, 0.1, true);
        feed(&c, 1, now, 9, 0.4, true);
        c.evaluate(now);
        assert_eq!(c.status(now).phase, Phase::Running, "below min_samples");
        feed(&c, 1, now, 5, 0.4, true);
        c.evaluate(now);
        let s = c.status(now);
        assert_eq!((s.phase, s.share), (Phase::RolledBack, 0.0));
        assert_eq!(s.events.last().unwrap().reason.as_deref(), Some("ttft"));
        assert!((0..100).all(|i| c.arm_for(&format!("u{i}")) == 0));
    }

    #[test]
    fn a_failing_canary_is_rolled_back_and_noise_is_not() {
        let c = Canary::new(config(vec![25.0, 100.0]));
        let now = Instant::now();
        feed(&c, 0, now, 40, 0.1, true);
        // Same latency, a little slower at random: within the ratio.
        feed(&c, 1, now, 20, 0.11, true);
        c.evaluate(now);
        assert_eq!(c.status(now).phase, Phase::Running);
        feed(&c, 1, now, 5, 0.1, false);
        c.evaluate(now);
        let s = c.status(now);
        assert_eq!(s.phase, Phase::RolledBack);
        assert_eq!(
            s.events.last().unwrap().reason.as_deref(),
            Some("error_rate")
        );
    }

    #[test]
    fn the_controller_rolls_back_by_name_or_model_and_pauses() {
        let mut with_model = config(vec![50.0, 100.0]);
        with_model.name = "m".into();
        with_model.model = Some("smol".into());
        let ctl = CanaryController::new(vec![config(vec![50.0, 100.0]), with_model]);
        assert_eq!(ctl.for_model(Some("smol")).unwrap().config.name, "m");
        assert_eq!(ctl.for_model(Some("other")).unwrap().config.name, "c");
        let c = ctl.get("c").unwrap();
        c.pause(true).unwrap();
        c.evaluate(Instant::now() + Duration::from_secs(60));
        assert_eq!(c.share(), 50.0);
        let s = ctl.rollback("smol", "slo_ttft").unwrap();
        assert_eq!((s.name.as_str(), s.phase), ("m", Phase::RolledBack));
        assert_eq!(s.events.last().unwrap().reason.as_deref(), Some("slo_ttft"));
        assert_eq!(
            ctl.rollback("nope", "x").unwrap_err(),
            CanaryError::NotFound("nope".into())
        );
        assert!(matches!(
            ctl.rollback("m", "again"),
            Err(CanaryError::Finished { .. })
        ));
    }
}
