//! Traffic splits: A/B experiments and canary releases. Both assign a
//! request's unit (API key, else `user`, else request id) to one of two
//! arms, each a worker group, by the feature-flag hash, so the same unit
//! always gets the same arm; both measure each arm (TTFT, inter-token and
//! end-to-end latency, errors) and compare the arms with `ingot-stats`.

pub mod canary;
pub mod experiment;
pub mod window;

use std::sync::Arc;
use std::time::Instant;

use axum::http::{header, HeaderMap};

use crate::config::{CanaryConfig, ExperimentConfig};
use canary::{Canary, CanaryController};
use experiment::Experiment;
use window::Sample;

/// Every experiment and canary of the router.
#[derive(Default)]
pub struct Splits {
    /// The A/B experiments.
    pub experiments: Vec<Arc<Experiment>>,
    /// The canaries.
    pub canaries: CanaryController,
}

/// The split a request falls under.
#[derive(Clone)]
pub enum Split {
    /// An A/B experiment.
    Experiment(Arc<Experiment>),
    /// A canary (arm 0 stable, arm 1 canary).
    Canary(Arc<Canary>),
}

/// A request's split and arm.
#[derive(Clone)]
pub struct Assignment {
    /// The split.
    pub split: Split,
    /// Its arm: 0 (control/stable) or 1 (treatment/canary).
    pub arm: usize,
}

impl Split {
    /// The `experiment` label: the experiment's id or `canary:NAME`.
    pub fn label(&self) -> String {
        match self {
            Split::Experiment(e) => e.config.id.clone(),
            Split::Canary(c) => c.flag(),
        }
    }

    /// The `arm` label of arm `i`.
    pub fn arm_name(&self, i: usize) -> &str {
        match self {
            Split::Experiment(e) => e.config.arms.get(i).map_or("", |a| a.name.as_str()),
            Split::Canary(_) => {
                if i == 0 {
                    "stable"
                } else {
                    "canary"
                }
            }
        }
    }

    /// The worker group of arm `i`.
    pub fn group(&self, i: usize) -> &str {
        match self {
            Split::Experiment(e) => e.config.arms.get(i).map_or("", |a| a.group.as_str()),
            Split::Canary(c) if i == 0 => &c.config.stable_group,
            Split::Canary(c) => &c.config.canary_group,
        }
    }

    /// The model arm `i` sends instead of the client's, if any.
    pub fn model(&self, i: usize) -> Option<&str> {
        match self {
            Split::Experiment(e) => e.config.arms.get(i).and_then(|a| a.model.as_deref()),
            Split::Canary(_) => None,
        }
    }

    /// Adds a finished request's sample to arm `i`.
    pub fn record(&self, i: usize, at: Instant, sample: Sample) {
        match self {
            Split::Experiment(e) => e.record(i, at, sample),
            Split::Canary(c) => c.record(i, at, sample),
        }
        let (label, arm) = (self.label(), self.arm_name(i).to_string());
        crate::metrics::arm_sample(label, arm, self.group(i).to_string(), &sample);
    }
}

impl Splits {
    /// Every canary's status (`/admin/canaries`, the dashboard).
    pub fn canary_statuses(&self, now: Instant) -> Vec<canary::CanaryStatus> {
        self.canaries.all().iter().map(|c| c.status(now)).collect()
    }

    /// Every experiment's report (`/admin/experiments`, the dashboard).
    pub fn experiment_reports(&self, now: Instant) -> Vec<experiment::ExperimentReport> {
        self.experiments.iter().map(|e| e.report(now)).collect()
    }

    /// The splits of a validated config.
    pub fn new(experiments: Vec<ExperimentConfig>, canaries: Vec<CanaryConfig>) -> Self {
        Self {
            experiments: experiments
                .into_iter()
                .map(|e| Arc::new(Experiment::new(e)))
                .collect(),
            canaries: CanaryController::new(canaries),
        }
    }

    /// The experiment with id `id`.
    pub fn experiment(&self, id: &str) -> Option<&Arc<Experiment>> {
        self.experiments.iter().find(|e| e.config.id == id)
    }

    /// The split and arm of a request for `model` from `unit`: a canary of
    /// the model first, then an experiment (validation allows one split per
    /// model; a split without a model takes the requests no other split
    /// names).
    pub fn assign(&self, model: Option<&str>, unit: &str) -> Option<Assignment> {
        if let Some(c) = self.canaries.for_model(model) {
            let arm = match c.status_phase() {
                canary::Phase::Promoted => 1,
                canary::Phase::RolledBack => 0,
                _ => c.arm_for(unit),
            };
            return Some(Assignment {
                split: Split::Canary(Arc::clone(c)),
                arm,
            });
        }
        let named = self
            .experiments
            .iter()
            .find(|e| model.is_some() && e.config.model.as_deref() == model);
        let e = named.or_else(|| self.experiments.iter().find(|e| e.config.model.is_none()))?;
        Some(Assignment {
            split: Split::Experiment(Arc::clone(e)),
            arm: e.arm_for(unit),
        })
    }

    /// Whether any split is configured.
    pub fn is_empty(&self) -> bool {
        self.experiments.is_empty() && self.canaries.all().is_empty()
    }
}

/// A request's unit, as the front door's feature flags define it: the API
/// key (`Authorization: Bearer KEY`), else the body's `user`, else the
/// `x-request-id` header; a request with none gets a random unit (no
/// stickiness is possible without an identity).
pub fn unit_of(headers: &HeaderMap, user: Option<&str>) -> String {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty());
    if let Some(key) = bearer {
        return key.to_string();
    }
    if let Some(user) = user.filter(|u| !u.is_empty()) {
        return user.to_string();
    }
    if let Some(id) = headers.get("x-request-id").and_then(|v| v.to_str().ok()) {
        return id.to_string();
    }
    format!("anon-{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn the_unit_is_the_key_then_user_then_request_id() {
        let mut h = HeaderMap::new();
        assert!(unit_of(&h, None).starts_with("anon-"));
        h.insert("x-request-id", HeaderValue::from_static("req-1"));
        assert_eq!(unit_of(&h, None), "req-1");
        assert_eq!(unit_of(&h, Some("alice")), "alice");
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer sk-1"),
        );
        assert_eq!(unit_of(&h, Some("alice")), "sk-1");
    }
}
