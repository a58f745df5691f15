//! The live values of the process's counters and gauges, kept beside the
//! Prometheus recorder: every `metrics::counter!`/`gauge!` update goes to
//! both (a fan-out recorder), and the dashboard reads them here by name
//! and label. Histograms go to Prometheus only; the dashboard's latency
//! percentiles come from the engines' own sample windows.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};
use metrics_util::layers::FanoutBuilder;
use metrics_util::registry::{AtomicStorage, Registry};

/// Counters and gauges by key (name and labels).
pub struct Tally {
    registry: Registry<Key, AtomicStorage>,
}

/// The process's tally: filled once [`install_metrics`] has installed
/// the recorders; empty (every read 0) before.
pub fn tally() -> &'static Tally {
    static TALLY: OnceLock<Tally> = OnceLock::new();
    TALLY.get_or_init(Tally::new)
}

/// Why the recorders were not installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The Prometheus settings were refused.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// A recorder is installed already (once per process).
    #[error("a metrics recorder is installed already")]
    Installed,
}

/// Builds `prometheus`'s recorder and installs it with the process's
/// [`tally`] beside it. Errors when a recorder is installed already.
pub fn install_metrics(
    prometheus: Result<PrometheusBuilder, BuildError>,
) -> Result<PrometheusHandle, InstallError> {
    let recorder = prometheus?.build_recorder();
    let handle = recorder.handle();
    let fanout = FanoutBuilder::default()
        .add_recorder(recorder)
        .add_recorder(TallyRecorder(tally()))
        .build();
    metrics::set_global_recorder(fanout).map_err(|_| InstallError::Installed)?;
    Ok(handle)
}

impl Tally {
    fn new() -> Self {
        Self {
            registry: Registry::atomic(),
        }
    }

    /// Sum of counter `name` over the series whose labels include every
    /// `(label, value)` of `filter`.
    pub fn counter(&self, name: &str, filter: &[(&str, &str)]) -> u64 {
        let mut sum = 0;
        self.registry.visit_counters(|key, c| {
            if key.name() == name && matches(key, filter) {
                sum += c.load(Ordering::Relaxed);
            }
        });
        sum
    }

    /// Counter `name` summed by the value of `label` (series without it
    /// are left out), for series matching `filter`.
    pub fn counter_by(
        &self,
        name: &str,
        label: &str,
        filter: &[(&str, &str)],
    ) -> BTreeMap<String, u64> {
        let mut by = BTreeMap::new();
        self.registry.visit_counters(|key, c| {
            if key.name() != name || !matches(key, filter) {
                return;
            }
            if let Some(l) = key.labels().find(|l| l.key() == label) {
                *by.entry(l.value().to_string()).or_default() += c.load(Ordering::Relaxed);
            }
        });
        by
    }

    /// Sum of gauge `name` over the series matching `filter`.
    pub fn gauge(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        let mut sum = 0.0;
        self.registry.visit_gauges(|key, g| {
            if key.name() == name && matches(key, filter) {
                sum += f64::from_bits(g.load(Ordering::Relaxed));
            }
        });
        sum
    }
}

fn matches(key: &Key, filter: &[(&str, &str)]) -> bool {
    filter
        .iter()
        .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
}

/// [`Tally`] as a recorder (the fan-out owns one by reference).
struct TallyRecorder(&'static Tally);

impl Recorder for TallyRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .registry
            .get_or_create_counter(key, |c| Counter::from_arc(Arc::clone(c)))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .registry
            .get_or_create_gauge(key, |g| Gauge::from_arc(Arc::clone(g)))
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_gauges_read_by_name_and_label() {
        let tally = Box::leak(Box::new(Tally::new()));
        let recorder = TallyRecorder(tally);
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!("hits", "reason" => "a", "model" => "m").increment(2);
            metrics::counter!("hits", "reason" => "b", "model" => "m").increment(3);
            metrics::counter!("hits", "reason" => "b", "model" => "n").increment(5);
            metrics::counter!("other").increment(7);
            metrics::gauge!("load", "model" => "m").set(1.5);
            metrics::gauge!("load", "model" => "n").set(2.0);
            metrics::histogram!("lat").record(1.0);
        });
        assert_eq!(tally.counter("hits", &[]), 10);
        assert_eq!(tally.counter("hits", &[("model", "m")]), 5);
        assert_eq!(tally.counter("missing", &[]), 0);
        let by = tally.counter_by("hits", "reason", &[("model", "m")]);
        assert_eq!(
            by.into_iter().collect::<Vec<_>>(),
            [("a".into(), 2), ("b".into(), 3)]
        );
        assert_eq!(tally.gauge("load", &[]), 3.5);
        assert_eq!(tally.gauge("load", &[("model", "n")]), 2.0);
    }
}
