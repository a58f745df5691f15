//! Workers as plain data: where a worker is, whether it may take requests
//! (health, drain, breaker), its load as the router sees it, and its models.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::breaker::{Breaker, BreakerState};
use crate::config::BreakerConfig;
pub use crate::config::DEFAULT_GROUP;

/// A worker's index in the router's worker list (stable for its life).
pub type WorkerId = usize;

/// One `ingot serve` instance behind the router.
#[derive(Debug)]
pub struct Worker {
    /// Its index.
    pub id: WorkerId,
    /// The `worker` label of its metrics: its URL for a static worker,
    /// `local-N` for a supervised child (whose port changes on restart).
    pub label: String,
    /// Whether the router started it (and may restart it).
    pub local: bool,
    /// Whether discovery (`workers.dns`/`workers.file`) found it, so it is
    /// removed when discovery no longer lists it.
    pub discovered: bool,
    /// Its worker group (`[[workers.groups]]`; [`DEFAULT_GROUP`] for
    /// `workers.urls`, `workers.local` and discovered workers).
    pub group: String,
    url: RwLock<String>,
    healthy: AtomicBool,
    draining: AtomicBool,
    removed: AtomicBool,
    outstanding: AtomicUsize,
    pid: AtomicU32,
    restarts: AtomicU32,
    models: RwLock<Vec<Value>>,
    breaker: Mutex<Breaker>,
    latency: Mutex<Latency>,
    load: Mutex<WorkerLoad>,
    route_away: Mutex<RouteAwayState>,
}

/// A worker's own view of its load, scraped from its `/metrics` at each
/// health probe (summed over its models).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct WorkerLoad {
    /// `ingot_num_requests_running`.
    pub running: f64,
    /// `ingot_num_requests_waiting`.
    pub waiting: f64,
    /// `ingot_kv_cache_usage_perc` (the largest over its models, 0..1).
    pub kv_usage: f64,
    /// Requests queued or running there that are not this router's (other
    /// routers'): running + waiting − this router's in flight at the
    /// scrape, at least 0; 0 when `health.scraped_load` is off.
    pub others: f64,
}

impl WorkerLoad {
    /// Reads the three gauges from Prometheus text; `None` when none is there.
    pub fn parse(text: &str) -> Option<Self> {
        let mut load = Self::default();
        let mut seen = false;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or("");
            let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
                continue;
            };
            match name {
                "ingot_num_requests_running" => load.running += value,
                "ingot_num_requests_waiting" => load.waiting += value,
                "ingot_kv_cache_usage_perc" => load.kv_usage = load.kv_usage.max(value),
                _ => continue,
            }
            seen = true;
        }
        seen.then_some(load)
    }
}

/// Weight of the newest sample in the latency averages: about the last ten
/// requests count, so a worker that slows down is noticed within seconds.
const EWMA_ALPHA: f64 = 0.2;

/// Latencies the router measured on a worker's responses (exponentially
/// weighted moving averages, seconds; `None` before the first sample).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Latency {
    /// Request sent → first body byte (time to first token for a stream).
    pub ttft: Option<f64>,
    /// Between body chunks of a stream (inter-token latency).
    pub itl: Option<f64>,
    /// Responses measured (time-to-first-byte samples) since the last
    /// reset: `[slo]` judges a worker only after `min_samples`.
    pub samples: u32,
}

fn ewma(old: Option<f64>, sample: f64) -> Option<f64> {
    Some(old.map_or(sample, |o| o + EWMA_ALPHA * (sample - o)))
}

impl Worker {
    /// A worker at `url` (empty until a local child is listening), not yet
    /// healthy: the first successful probe admits it.
    pub fn new(
        id: WorkerId,
        label: String,
        url: String,
        local: bool,
        breaker: BreakerConfig,
    ) -> Self {
        Self {
            id,
            label,
            local,
            discovered: false,
            group: DEFAULT_GROUP.to_string(),
            url: RwLock::new(url),
            healthy: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            removed: AtomicBool::new(false),
            outstanding: AtomicUsize::new(0),
            pid: AtomicU32::new(0),
            restarts: AtomicU32::new(0),
            models: RwLock::new(Vec::new()),
            breaker: Mutex::new(Breaker::new(breaker)),
            latency: Mutex::new(Latency::default()),
            load: Mutex::new(WorkerLoad::default()),
            route_away: Mutex::new(RouteAwayState::default()),
        }
    }

    /// The same worker in group `group`.
    pub fn with_group(mut self, group: &str) -> Self {
        self.group = group.to_string();
        self
    }

    /// Its base URL ("" while a local child is starting).
    pub fn url(&self) -> String {
        self.url.read().map(|u| u.clone()).unwrap_or_default()
    }

    /// A local child came up at `url` with `pid`.
    pub fn set_started(&self, url: String, pid: u32) {
        if let Ok(mut u) = self.url.write() {
            *u = url;
        }
        self.pid.store(pid, Ordering::Relaxed);
    }

    /// A local child exited.
    pub fn set_exited(&self) {
        self.healthy.store(false, Ordering::Relaxed);
        self.pid.store(0, Ordering::Relaxed);
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// The child's pid (0 for static workers and while down).
    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::Relaxed)
    }

    /// Times the supervisor has seen its child exit.
    pub fn restarts(&self) -> u32 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Whether its last probe succeeded (and no error since).
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Sets health (probes; passive on connect errors).
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    /// Whether it is being drained (no new requests).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Starts or ends a drain.
    pub fn set_draining(&self, draining: bool) {
        self.draining.store(draining, Ordering::Relaxed);
    }

    /// Requests the router has in flight on it.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Its models, as entries of its `/v1/models`.
    pub fn models(&self) -> Vec<Value> {
        self.models.read().map(|m| m.clone()).unwrap_or_default()
    }

    /// Replaces its model list.
    pub fn set_models(&self, models: Vec<Value>) {
        if let Ok(mut m) = self.models.write() {
            *m = models;
        }
    }

    /// Whether it serves `model` (any model when the request names none).
    pub fn serves(&self, model: Option<&str>) -> bool {
        let Some(model) = model else { return true };
        self.models
            .read()
            .map(|m| {
                m.iter()
                    .any(|e| e.get("id").and_then(Value::as_str) == Some(model))
            })
            .unwrap_or(false)
    }

    /// Whether discovery no longer lists it (it is drained: in-flight
    /// requests finish, no new ones come).
    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Relaxed)
    }

    /// Discovery dropped (true) or listed it again (false).
    pub fn set_removed(&self, removed: bool) {
        self.removed.store(removed, Ordering::Relaxed);
    }

    /// Whether a new request may go to it now.
    pub fn is_available(&self, now: Instant) -> bool {
        self.is_healthy() && !self.is_draining() && !self.is_removed() && self.breaker().allows(now)
    }

    /// The load the balancing policies compare: this router's requests in
    /// flight (exact, immediate) plus the other routers' requests seen at
    /// the last scrape, so several routers in front of the same workers
    /// balance instead of each seeing only its own share.
    pub fn queue_depth(&self) -> f64 {
        self.outstanding() as f64 + self.load().others
    }

    /// Its breaker.
    pub fn breaker(&self) -> MutexGuard<'_, Breaker> {
        // A poisoned breaker is still a valid state machine.
        self.breaker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its breaker state at `now`.
    pub fn breaker_state(&self, now: Instant) -> BreakerState {
        self.breaker().state(now)
    }

    /// Its load at the last probe.
    pub fn load(&self) -> WorkerLoad {
        *self.load.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a scraped load; `count_others` derives the other routers'
    /// share from it (`health.scraped_load`).
    pub fn set_load(&self, mut load: WorkerLoad, count_others: bool) {
        load.others = if count_others {
            (load.running + load.waiting - self.outstanding() as f64).max(0.0)
        } else {
            0.0
        };
        *self.load.lock().unwrap_or_else(|p| p.into_inner()) = load;
    }

    /// Its measured latencies.
    pub fn latency(&self) -> Latency {
        *self.latency.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its route-away state (`[slo]`).
    pub fn route_away_state(&self) -> RouteAwayState {
        *self.route_away.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `step` to its route-away state (`[slo]`), under its lock.
    pub fn update_route_away<T>(&self, step: impl FnOnce(&mut RouteAwayState) -> T) -> T {
        step(&mut self.route_away.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Clears its latency averages (fresh samples judge it again).
    pub fn reset_latency(&self) {
        *self.latency.lock().unwrap_or_else(|p| p.into_inner()) = Latency::default();
    }

    /// Adds a time-to-first-byte sample (seconds).
    pub fn record_ttft(&self, seconds: f64) {
        let mut l = self.latency.lock().unwrap_or_else(|p| p.into_inner());
        l.ttft = ewma(l.ttft, seconds);
        l.samples = l.samples.saturating_add(1);
    }

    /// Adds an inter-chunk sample (seconds).
    pub fn record_itl(&self, seconds: f64) {
        let mut l = self.latency.lock().unwrap_or_else(|p| p.into_inner());
        l.itl = ewma(l.itl, seconds);
    }

    /// Counts one request in flight until the guard drops.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(self))
    }
}

/// A worker's route-away state (`[slo]`, `crate::route_away`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RouteAwayState {
    /// Out of rotation until then.
    pub until: Option<Instant>,
    /// Re-admitted after a hold, not yet measured healthy.
    pub probation: bool,
    /// The hold of the next exclusion (zero: the configured first hold).
    pub next_hold: Duration,
}

/// One request in flight on a worker (RAII: dropping it, on completion or on
/// client disconnect, releases it).
#[derive(Debug)]
pub struct InFlight(Arc<Worker>);

impl InFlight {
    /// The worker.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.0
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_is_read_from_the_servers_metrics() {
        let text = "# HELP ingot_num_requests_running x\n\
            ingot_num_requests_running{model=\"a\"} 3\n\
            ingot_num_requests_running{model=\"b\"} 1\n\
            ingot_num_requests_waiting{model=\"a\"} 2\n\
            ingot_kv_cache_usage_perc{model=\"a\"} 0.25\n\
            ingot_kv_cache_usage_perc{model=\"b\"} 0.5\n\
            ingot_num_requests_running_total 99\n";
        let load = WorkerLoad::parse(text).unwrap();
        assert_eq!(
            load,
            WorkerLoad {
                running: 4.0,
                waiting: 2.0,
                kv_usage: 0.5,
                others: 0.0,
            }
        );
        assert_eq!(WorkerLoad::parse("other 1\n"), None);
    }

    #[test]
    fn latency_averages_move_a_fifth_of_the_way_per_sample() {
        let cfg = BreakerConfig {
            failure_threshold: 1,
            cooldown: std::time::Duration::from_secs(1),
        };
        let w = Worker::new(0, "w".into(), String::new(), false, cfg);
        assert_eq!(w.latency(), Latency::default());
        w.record_ttft(1.0);
        w.record_ttft(2.0);
        w.record_itl(0.5);
        let l = w.latency();
        assert!((l.ttft.unwrap() - 1.2).abs() < 1e-12);
        assert_eq!(l.itl, Some(0.5));
    }

    #[test]
    fn queue_depth_adds_other_routers_requests_to_its_own() {
        let cfg = BreakerConfig {
            failure_threshold: 1,
            cooldown: std::time::Duration::from_secs(1),
        };
        let w = Arc::new(Worker::new(0, "w".into(), String::new(), false, cfg));
        let _mine: Vec<_> = (0..2).map(|_| w.begin()).collect();
        let scraped = WorkerLoad {
            running: 4.0,
            waiting: 3.0,
            ..WorkerLoad::default()
        };
        w.set_load(scraped, true);
        // 7 at the worker, 2 of them ours: 5 from elsewhere.
        assert_eq!(w.load().others, 5.0);
        assert_eq!(w.queue_depth(), 7.0);
        w.set_load(scraped, false);
        assert_eq!(w.queue_depth(), 2.0);
        // Fewer at the worker than ours (a stale scrape) never goes negative.
        w.set_load(WorkerLoad::default(), true);
        assert_eq!(w.queue_depth(), 2.0);
    }
}
