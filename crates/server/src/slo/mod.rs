//! The SLO policy engine: evaluates every `[[slo]]` on every served model's
//! live latency windows each `remediation.interval`, exports compliance, and
//! (per `remediation.mode`) decides, reports and applies remediation:
//! shedding or delaying the lowest tiers, and steering the step token
//! budget toward a target ITL. docs/slo.md describes the policy.

mod batching;
mod evaluate;
mod metrics;
mod shed;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use ingot_config::{Config, RemediationMode, ShedHow};
use ingot_core::Priority;
use ingot_engine::{EngineControls, Measure};
use serde::Serialize;

pub use batching::{BudgetController, BudgetPolicy};
pub use evaluate::{evaluate, SloStatus};
pub use shed::{LevelChange, ShedLevel, ShedTiming, Verdict};

use crate::ApiError;

/// Rolls back a model's canary (the router's canary controller implements
/// it; installed with [`SloMonitor::set_canary_hook`]). Called once per
/// `remediation.shed.cooldown` while an SLO of the model is breached and
/// `remediation.canary_rollback` is on.
pub trait CanaryRollback: Send + Sync {
    /// Sends `model`'s canary share to 0 because of `reason`; true when a
    /// canary was active and is now rolled back.
    fn roll_back(&self, model: &str, reason: &str) -> bool;
}

/// Events kept for `/admin/slo`.
const EVENTS_KEPT: usize = 100;

/// One remediation decision, applied or (dry run) not.
#[derive(Debug, Clone, Serialize)]
pub struct RemediationEvent {
    /// Unix milliseconds.
    pub at_ms: u64,
    /// The model acted on.
    pub model: String,
    /// `shed`, `delay` or `batching`.
    pub action: &'static str,
    /// `apply`/`undo` (shed, delay) or `down`/`up` (batching).
    pub direction: &'static str,
    /// What changed, in words.
    pub detail: String,
    /// False in dry-run mode: what it would have done.
    pub applied: bool,
}

/// One model's remediation state.
#[derive(Debug)]
struct ModelState {
    shed: ShedLevel,
    budget: BudgetController,
    /// Tiers refused at admission (shed mode, applied).
    refused: Vec<Priority>,
    /// The ITL the batching controller last judged on.
    measured_itl: Option<f64>,
}

impl ModelState {
    fn new(controls: &EngineControls) -> Self {
        Self {
            shed: ShedLevel::default(),
            budget: BudgetController::new(controls.configured_token_budget()),
            refused: Vec::new(),
            measured_itl: None,
        }
    }
}

#[derive(Default)]
struct Monitor {
    engines: HashMap<String, Weak<EngineControls>>,
    models: HashMap<String, ModelState>,
    statuses: Vec<SloStatus>,
    events: VecDeque<RemediationEvent>,
    evaluated_at_ms: Option<u64>,
    mode: RemediationMode,
    canary: Option<Arc<dyn CanaryRollback>>,
    /// When the canary hook was last called, per model.
    canary_called: HashMap<String, Instant>,
}

/// The policy engine's state, shared by the evaluation task, admission and
/// `/admin/slo`.
#[derive(Default)]
pub struct SloMonitor {
    inner: Mutex<Monitor>,
}

impl SloMonitor {
    fn lock(&self) -> std::sync::MutexGuard<'_, Monitor> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Remembers `model`'s engine (called when a request leases it): its
    /// windows are evaluated from now on. A reloaded engine replaces the old.
    pub fn observe(&self, model: &str, controls: &Arc<EngineControls>) {
        let mut m = self.lock();
        let known = m
            .engines
            .get(model)
            .and_then(Weak::upgrade)
            .is_some_and(|c| Arc::ptr_eq(&c, controls));
        if !known {
            m.engines
                .insert(model.to_string(), Arc::downgrade(controls));
            m.models.remove(model);
        }
    }

    /// Installs the canary rollback action.
    pub fn set_canary_hook(&self, hook: Arc<dyn CanaryRollback>) {
        self.lock().canary = Some(hook);
    }

    /// Refuses a request of `tier` for `model` while shedding covers it:
    /// 503 with Retry-After.
    pub fn admit(
        &self,
        model: &str,
        tier: Priority,
        retry_after: Duration,
    ) -> Result<(), ApiError> {
        let m = self.lock();
        let shed = m
            .models
            .get(model)
            .is_some_and(|s| s.refused.contains(&tier));
        if shed {
            return Err(ApiError::Shed {
                message: format!(
                    "'{}' requests to {model} are shed while a more urgent tier misses its SLO; retry later",
                    tier.as_str()
                ),
                retry_after,
            });
        }
        Ok(())
    }

    /// One evaluation: judge every SLO, export it, decide and (per mode)
    /// apply remediation.
    pub fn tick(&self, config: &Config, now: Instant) {
        let mut m = self.lock();
        m.engines.retain(|_, w| w.strong_count() > 0);
        let engines: Vec<(String, Arc<EngineControls>)> = m
            .engines
            .iter()
            .filter_map(|(name, w)| Some((name.clone(), w.upgrade()?)))
            .collect();
        m.models
            .retain(|name, _| engines.iter().any(|(n, _)| n == name));
        let statuses = evaluate_all(config, &engines);
        metrics::export_statuses(&statuses);
        m.statuses = statuses;
        m.evaluated_at_ms = Some(ingot_web::unix_ms());
        let mode = config.remediation.mode;
        if mode != m.mode {
            // Leaving `on` (or entering it) starts from nothing applied.
            release_all(&mut m, &engines);
            m.mode = mode;
        }
        if mode == RemediationMode::Off {
            return;
        }
        for (name, controls) in &engines {
            let mut events = remediate(&mut m, config, name, controls, now);
            events.extend(canary_step(&mut m, config, name, now));
            for e in events {
                record_event(&mut m, e, mode);
            }
        }
    }

    /// `GET /admin/slo`'s body.
    pub fn report(&self, config: &Config) -> serde_json::Value {
        let m = self.lock();
        let models: serde_json::Map<String, serde_json::Value> = m
            .models
            .iter()
            .map(|(name, s)| (name.clone(), model_report(config, name, s, &m.engines)))
            .collect();
        serde_json::json!({
            "mode": config.remediation.mode.as_str(),
            "evaluated_at_ms": m.evaluated_at_ms,
            "slos": m.statuses,
            "remediation": models,
            "events": m.events,
        })
    }
}

/// Every SLO on every model it applies to, over its own window.
fn evaluate_all(config: &Config, engines: &[(String, Arc<EngineControls>)]) -> Vec<SloStatus> {
    let mut out = Vec::new();
    for (name, controls) in engines {
        for spec in config.slo.iter().filter(|s| evaluate::applies_to(s, name)) {
            out.push(evaluate(spec, name, controls, spec.window.get()));
        }
    }
    out
}

/// Shed tiers in configuration order, least urgent first.
fn shed_tiers(config: &Config) -> Vec<Priority> {
    config
        .remediation
        .shed
        .tiers
        .iter()
        .filter_map(|t| t.parse().ok())
        .collect()
}

/// One model's decisions this tick; applies them in `on` mode.
fn remediate(
    m: &mut Monitor,
    config: &Config,
    name: &str,
    controls: &Arc<EngineControls>,
    now: Instant,
) -> Vec<RemediationEvent> {
    let apply = config.remediation.mode == RemediationMode::On;
    let state = m
        .models
        .entry(name.to_string())
        .or_insert_with(|| ModelState::new(controls));
    let mut events = Vec::new();
    if config.remediation.shed.enabled {
        events.extend(shed_step(config, name, controls, state, now, apply));
    }
    if config.remediation.batching.enabled {
        events.extend(batching_step(config, name, controls, state, now, apply));
    }
    events
}

/// The shed/delay level's evidence: a breach on samples since the last
/// change, else clear (under the exit threshold over the whole window) or
/// hold.
fn shed_verdict(
    config: &Config,
    name: &str,
    controls: &EngineControls,
    since_change: Option<Duration>,
) -> Verdict {
    let covered = shed_tiers(config);
    let shed = &config.remediation.shed;
    let triggering = config.slo.iter().filter(|s| {
        evaluate::applies_to(s, name)
            && s.tier
                .parse::<Priority>()
                .map_or(true, |t| !covered.contains(&t))
    });
    let mut clear = true;
    for spec in triggering {
        let window = spec.window.get();
        let recent = since_change.map_or(window, |d| d.min(window));
        if evaluate(spec, name, controls, recent).breached() {
            return Verdict::Breached;
        }
        clear &= evaluate(spec, name, controls, window).clear(shed.exit_ratio, spec.min_samples);
    }
    if clear {
        Verdict::Clear
    } else {
        Verdict::Hold
    }
}

fn shed_step(
    config: &Config,
    name: &str,
    controls: &EngineControls,
    state: &mut ModelState,
    now: Instant,
    apply: bool,
) -> Option<RemediationEvent> {
    let shed = &config.remediation.shed;
    let tiers = shed_tiers(config);
    let since = state
        .shed
        .last_change()
        .map(|t| now.saturating_duration_since(t));
    let verdict = shed_verdict(config, name, controls, since);
    let timing = ShedTiming {
        cooldown: shed.cooldown.get(),
        exit_after: shed.exit_after.get(),
    };
    let change = state.shed.decide(verdict, tiers.len(), timing, now)?;
    let level = state.shed.level().min(tiers.len());
    let covered = &tiers[..level];
    if apply {
        controls.set_held(covered);
        state.refused = match shed.how {
            ShedHow::Shed => covered.to_vec(),
            ShedHow::Delay => Vec::new(),
        };
    }
    let names: Vec<&str> = covered.iter().map(|p| p.as_str()).collect();
    let (direction, detail) = match change {
        LevelChange::Raise(_) => (
            "apply",
            format!("level {level}: {} {names:?}", shed.how.as_str()),
        ),
        LevelChange::Lower(_) => ("undo", format!("level {level}: now covers {names:?}")),
    };
    Some(event(name, shed.how.as_str(), direction, detail, apply))
}

fn batching_step(
    config: &Config,
    name: &str,
    controls: &EngineControls,
    state: &mut ModelState,
    now: Instant,
    apply: bool,
) -> Option<RemediationEvent> {
    let b = &config.remediation.batching;
    let policy = BudgetPolicy {
        target: b.target_itl.get().as_secs_f64(),
        band: b.band,
        min: b.min_tokens,
        max: b
            .max_tokens
            .unwrap_or(controls.configured_token_budget())
            .max(b.min_tokens),
        cooldown: b.cooldown.get(),
    };
    let since = state.budget.last_change().map_or(b.window.get(), |t| {
        now.saturating_duration_since(t).min(b.window.get())
    });
    let mut itl = controls.recent(&Priority::ALL, Measure::Itl, since);
    let measured = ingot_core::window::quantile(&mut itl, b.quantile);
    state.measured_itl = measured;
    let measured = measured.filter(|_| itl.len() >= b.min_samples);
    let before = state.budget.budget();
    let after = state.budget.step(measured, policy, now)?;
    if apply {
        controls.set_token_budget(after);
    }
    metrics::budget(
        name,
        if apply {
            after
        } else {
            controls.token_budget()
        },
    );
    let direction = if after < before { "down" } else { "up" };
    let detail = format!(
        "step token budget {before} -> {after} (ITL p{} {:.1} ms, target {:.1} ms)",
        b.quantile * 100.0,
        measured.unwrap_or(0.0) * 1e3,
        policy.target * 1e3
    );
    Some(event(name, "batching", direction, detail, apply))
}

/// Calls the canary hook while an SLO of `name` is breached (at most once
/// per cool-down); in dry-run mode only reports it would.
fn canary_step(
    m: &mut Monitor,
    config: &Config,
    name: &str,
    now: Instant,
) -> Option<RemediationEvent> {
    if !config.remediation.canary_rollback {
        return None;
    }
    let hook = m.canary.clone()?;
    let breached = m
        .statuses
        .iter()
        .find(|s| s.model == name && s.breached())?;
    let reason = format!(
        "SLO {} breached: {:.4} over {:.4}",
        breached.slo,
        breached.measured.unwrap_or(0.0),
        breached.target
    );
    let cooldown = config.remediation.shed.cooldown.get();
    let last = m.canary_called.get(name).copied();
    if last.is_some_and(|t| now.saturating_duration_since(t) < cooldown) {
        return None;
    }
    m.canary_called.insert(name.to_string(), now);
    let apply = config.remediation.mode == RemediationMode::On;
    if apply && !hook.roll_back(name, &reason) {
        return None;
    }
    Some(event(name, "canary_rollback", "apply", reason, apply))
}

fn event(
    model: &str,
    action: &'static str,
    direction: &'static str,
    detail: String,
    applied: bool,
) -> RemediationEvent {
    RemediationEvent {
        at_ms: ingot_web::unix_ms(),
        model: model.to_string(),
        action,
        direction,
        detail,
        applied,
    }
}

/// Logs, counts and keeps one decision.
fn record_event(m: &mut Monitor, e: RemediationEvent, mode: RemediationMode) {
    tracing::warn!(
        model = %e.model,
        action = e.action,
        direction = e.direction,
        mode = mode.as_str(),
        applied = e.applied,
        "{}{}",
        if e.applied { "" } else { "dry run, would: " },
        e.detail
    );
    metrics::action(&e, mode);
    if let Some(s) = m.models.get(&e.model) {
        let shed_level = s.shed.level();
        let batching = s.budget.last_change().is_some()
            && s.budget.budget() < configured_budget(m, &e.model).unwrap_or(usize::MAX);
        metrics::active(&e.model, shed_level, batching);
    }
    if m.events.len() == EVENTS_KEPT {
        m.events.pop_front();
    }
    m.events.push_back(e);
}

fn configured_budget(m: &Monitor, model: &str) -> Option<usize> {
    let c = m.engines.get(model)?.upgrade()?;
    Some(c.configured_token_budget())
}

/// Undoes everything applied (the mode changed): tiers released, budgets
/// back to the configured ones, controllers reset.
fn release_all(m: &mut Monitor, engines: &[(String, Arc<EngineControls>)]) {
    for (name, controls) in engines {
        controls.set_held(&[]);
        controls.set_token_budget(controls.configured_token_budget());
        metrics::active(name, 0, false);
        metrics::budget(name, controls.configured_token_budget());
    }
    m.models.clear();
}

fn model_report(
    config: &Config,
    name: &str,
    s: &ModelState,
    engines: &HashMap<String, Weak<EngineControls>>,
) -> serde_json::Value {
    let tiers = shed_tiers(config);
    let covered: Vec<&str> = tiers[..s.shed.level().min(tiers.len())]
        .iter()
        .map(|p| p.as_str())
        .collect();
    let controls = engines.get(name).and_then(Weak::upgrade);
    serde_json::json!({
        "shed": {
            "how": config.remediation.shed.how.as_str(),
            "level": s.shed.level(),
            "tiers": covered,
            "refused": s.refused.iter().map(|p| p.as_str()).collect::<Vec<_>>(),
        },
        "batching": {
            "decided_token_budget": s.budget.budget(),
            "token_budget": controls.as_ref().map(|c| c.token_budget()),
            "configured_token_budget": controls.as_ref().map(|c| c.configured_token_budget()),
            "max_num_seqs": controls.as_ref().map(|c| c.max_num_seqs()),
            "measured_itl": s.measured_itl,
            "target_itl": config.remediation.batching.target_itl.get().as_secs_f64(),
        },
    })
}

/// Evaluates every `remediation.interval` (re-read each time, so a reload
/// applies) until the process ends.
pub async fn run(state: crate::AppState) {
    metrics::describe();
    loop {
        let config = state.runtime();
        tokio::time::sleep(config.config.remediation.interval.get()).await;
        state.slo().tick(&state.runtime().config, Instant::now());
    }
}

#[cfg(test)]
mod tests;
