//! The result file of a run: configuration, per-request samples and a
//! summary. `compare` reads two of these; `sweep` writes one per point.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Why a request failed; [`Summary::errors`] counts failures by it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// A non-2xx HTTP status ([`RequestRecord::status`] holds it).
    Status,
    /// No response: connection refused or reset, DNS, ...
    Transport,
    /// A response that is not an OpenAI SSE stream, or an error event in it.
    Protocol,
    /// No complete response within the per-request timeout.
    Timeout,
    /// Stopped by the user (Ctrl-C) before it finished.
    Cancelled,
}

impl FailureKind {
    /// The key in [`Summary::errors`] (the status code for [`FailureKind::Status`]).
    pub fn key(self, status: Option<u16>) -> String {
        match (self, status) {
            (FailureKind::Status, Some(s)) => s.to_string(),
            (FailureKind::Status, None) => "status".into(),
            (FailureKind::Transport, _) => "transport".into(),
            (FailureKind::Protocol, _) => "protocol".into(),
            (FailureKind::Timeout, _) => "timeout".into(),
            (FailureKind::Cancelled, _) => "cancelled".into(),
        }
    }
}

/// One request as the client saw it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RequestRecord {
    /// Completed with a 200 and a finish reason.
    pub ok: bool,
    /// HTTP status, if a response arrived.
    pub status: Option<u16>,
    /// What went wrong (transport error, non-OpenAI body, error event).
    pub error: Option<String>,
    /// Prompt tokens (as built by the client; the server's usage when given).
    pub prompt_tokens: usize,
    /// Generated tokens (usage when given, else streamed chunks).
    pub output_tokens: usize,
    /// Seconds from the run start to sending the request.
    pub start_s: f64,
    /// Seconds to the first token.
    pub ttft_s: Option<f64>,
    /// Seconds to the last byte.
    pub e2e_s: f64,
    /// Gaps between consecutive token chunks, seconds.
    pub itl_s: Vec<f64>,
    /// Why it failed (None when `ok`, and in files written before this field).
    #[serde(default)]
    pub failure: Option<FailureKind>,
    /// The server's `finish_reason` ("length", "stop", ...).
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Turn within its conversation (0-based; always 0 outside `multiturn`).
    #[serde(default)]
    pub turn: usize,
    /// The response's `x-ingot-cache` header (`hit`, `coalesced`, `miss`,
    /// `bypass`): how ingot's response cache served it. None when absent,
    /// as from other servers.
    #[serde(default)]
    pub cache: Option<String>,
    /// Which run of `ingot bench serve --repeat` it belongs to (0-based;
    /// absent, meaning 0, in single-run files).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub run: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl RequestRecord {
    /// Time per output token after the first, seconds (None with < 2 tokens).
    pub fn tpot_s(&self) -> Option<f64> {
        let ttft = self.ttft_s?;
        (self.output_tokens > 1).then(|| (self.e2e_s - ttft) / (self.output_tokens - 1) as f64)
    }
}

/// Distribution of one metric, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Stats {
    /// Samples.
    pub count: usize,
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation.
    pub std: f64,
    /// 50th percentile.
    pub median: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Stats {
    /// Statistics of samples given in seconds (reported in ms). Percentiles
    /// interpolate linearly between order statistics (numpy's default).
    pub fn from_seconds(samples: impl IntoIterator<Item = f64>) -> Stats {
        let mut v: Vec<f64> = samples
            .into_iter()
            .filter(|x| x.is_finite())
            .map(|s| s * 1e3)
            .collect();
        if v.is_empty() {
            return Stats::default();
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        let pct = |p: f64| ingot_stats::quantile_sorted(&v, p / 100.0);
        Stats {
            count: n,
            mean,
            std: var.sqrt(),
            median: pct(50.0),
            p90: pct(90.0),
            p95: pct(95.0),
            p99: pct(99.0),
            min: v[0],
            max: v[n - 1],
        }
    }
}

/// Service-level objective for goodput: a request counts when it meets all.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Slo {
    /// Largest time to first token, ms.
    pub ttft_ms: Option<f64>,
    /// Largest time per output token, ms.
    pub tpot_ms: Option<f64>,
    /// Largest end-to-end latency, ms.
    pub e2e_ms: Option<f64>,
}

impl Slo {
    /// Whether a completed request meets every set bound.
    pub fn met_by(&self, r: &RequestRecord) -> bool {
        let within = |bound: Option<f64>, value: Option<f64>| match (bound, value) {
            (None, _) => true,
            (Some(b), Some(v)) => v * 1e3 <= b,
            (Some(_), None) => false,
        };
        r.ok && within(self.ttft_ms, r.ttft_s)
            && within(self.tpot_ms, r.tpot_s())
            && within(self.e2e_ms, Some(r.e2e_s))
    }
}

/// Aggregates of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// Requests that completed.
    pub completed: usize,
    /// Requests that failed.
    pub failed: usize,
    /// Failures by HTTP status ("429", "500") or "transport" / "protocol" /
    /// "timeout" / "cancelled" (see [`FailureKind::key`]).
    pub errors: BTreeMap<String, usize>,
    /// Prompt tokens of the completed requests.
    #[serde(default)]
    pub input_tokens: usize,
    /// Generated tokens of the completed requests.
    #[serde(default)]
    pub output_tokens: usize,
    /// Wall time of the measured part, seconds.
    pub duration_s: f64,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Prompt tokens per second (completed requests).
    pub input_tok_s: f64,
    /// Generated tokens per second.
    pub output_tok_s: f64,
    /// Both.
    pub total_tok_s: f64,
    /// Requests per second meeting the SLO (when one is set).
    pub goodput: Option<f64>,
    /// Time to first token.
    pub ttft: Stats,
    /// Time per output token.
    pub tpot: Stats,
    /// Inter-token latency (every gap).
    pub itl: Stats,
    /// End-to-end latency.
    pub e2e: Stats,
    /// Completed requests by their `x-ingot-cache` header; None when no
    /// completed response carried it (not ingot, or files from before it).
    #[serde(default)]
    pub cache: Option<CacheCounts>,
    /// Cache hits per completed request; None with `cache`. Coalesced
    /// requests are not hits: they waited for an identical request's
    /// generation instead of reading a stored response.
    #[serde(default)]
    pub cache_hit_rate: Option<f64>,
}

/// Completed requests by how ingot's response cache served them.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CacheCounts {
    /// `hit`: answered from a stored response.
    pub hits: usize,
    /// `coalesced`: joined an identical request already generating.
    pub coalesced: usize,
    /// `miss`: generated (and possibly stored).
    pub misses: usize,
    /// `bypass`: the cache was not consulted (e.g. `Cache-Control: no-cache`).
    pub bypass: usize,
    /// Any other value, so that the counts add up if the server adds one.
    #[serde(default)]
    pub other: usize,
}

impl CacheCounts {
    /// Counts the `cache` values of `records`; None when none has one.
    fn of<'a>(records: impl IntoIterator<Item = &'a RequestRecord>) -> Option<CacheCounts> {
        let mut counts: Option<CacheCounts> = None;
        for value in records.into_iter().filter_map(|r| r.cache.as_deref()) {
            let c = counts.get_or_insert_with(CacheCounts::default);
            let slot = match value {
                "hit" => &mut c.hits,
                "coalesced" => &mut c.coalesced,
                "miss" => &mut c.misses,
                "bypass" => &mut c.bypass,
                _ => &mut c.other,
            };
            *slot += 1;
        }
        counts
    }
}

impl Summary {
    /// Summarises records of a run that took `duration_s`.
    pub fn of(records: &[RequestRecord], duration_s: f64, slo: Option<&Slo>) -> Summary {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
        let mut errors = BTreeMap::new();
        for r in records.iter().filter(|r| !r.ok) {
            let key = match r.failure {
                Some(kind) => kind.key(r.status),
                // Records without a kind (older files): status or transport.
                None => r
                    .status
                    .map_or_else(|| "transport".to_string(), |s| s.to_string()),
            };
            *errors.entry(key).or_insert(0) += 1;
        }
        let per_s = |x: f64| {
            if duration_s > 0.0 {
                x / duration_s
            } else {
                0.0
            }
        };
        let cache = CacheCounts::of(ok.iter().copied());
        let input: usize = ok.iter().map(|r| r.prompt_tokens).sum();
        let output: usize = ok.iter().map(|r| r.output_tokens).sum();
        Summary {
            completed: ok.len(),
            failed: records.len() - ok.len(),
            errors,
            input_tokens: input,
            output_tokens: output,
            duration_s,
            request_throughput: per_s(ok.len() as f64),
            input_tok_s: per_s(input as f64),
            output_tok_s: per_s(output as f64),
            total_tok_s: per_s((input + output) as f64),
            goodput: slo.map(|s| per_s(ok.iter().filter(|r| s.met_by(r)).count() as f64)),
            ttft: Stats::from_seconds(ok.iter().filter_map(|r| r.ttft_s)),
            tpot: Stats::from_seconds(ok.iter().filter_map(|r| r.tpot_s())),
            itl: Stats::from_seconds(ok.iter().flat_map(|r| r.itl_s.iter().copied())),
            e2e: Stats::from_seconds(ok.iter().map(|r| r.e2e_s)),
            cache,
            cache_hit_rate: cache.map(|c| c.hits as f64 / ok.len() as f64),
        }
    }
}

/// What was measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerInfo {
    /// Base URL.
    pub base_url: String,
    /// Model name used in requests.
    pub model: String,
    /// `/v1/models` entry or other self-description, as returned.
    pub details: serde_json::Value,
}

/// One run of `ingot bench serve --repeat N`: what `ingot bench compare`
/// tests between runs.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunSummary {
    /// The seed of its prompts and arrivals.
    pub seed: u64,
    /// Unix seconds at its start.
    pub started_unix: u64,
    /// It ended early (Ctrl-C).
    pub partial: bool,
    /// Its aggregates.
    pub summary: Summary,
}

/// The file `ingot bench serve --out` writes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BenchResult {
    /// Every option of the run (dataset, arrival, seed, SLO, ...).
    pub config: serde_json::Value,
    /// `git rev-parse HEAD` of the client's checkout, when known.
    pub git_commit: Option<String>,
    /// The server measured.
    pub server: ServerInfo,
    /// Unix seconds at the start.
    pub started_unix: u64,
    /// The run ended early (Ctrl-C); results are partial.
    pub partial: bool,
    /// Aggregates.
    pub summary: Summary,
    /// Per-request samples (warmup excluded); with `runs`, every run's,
    /// each tagged with its [`RequestRecord::run`].
    pub requests: Vec<RequestRecord>,
    /// Each run's own summary when the file holds `--repeat N` > 1 runs
    /// (`summary` then pools them all); absent in single-run files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<RunSummary>,
}

impl BenchResult {
    /// The runs the file holds: its `runs`, or the whole file as one run.
    pub fn run_summaries(&self) -> Vec<RunSummary> {
        if !self.runs.is_empty() {
            return self.runs.clone();
        }
        vec![RunSummary {
            seed: self.config["seed"].as_u64().unwrap_or(0),
            started_unix: self.started_unix,
            partial: self.partial,
            summary: self.summary.clone(),
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let s = Stats::from_seconds((1..=10).map(|i| i as f64 / 1e3));
        assert_eq!(s.count, 10);
        assert!((s.median - 5.5).abs() < 1e-9);
        assert!((s.p90 - 9.1).abs() < 1e-9);
        assert!((s.mean - 5.5).abs() < 1e-9);
        assert!((s.std - 3.0276503540974917).abs() < 1e-9);
    }

    #[test]
    fn summary_counts_errors_and_goodput() {
        let ok = |ttft| RequestRecord {
            ok: true,
            status: Some(200),
            prompt_tokens: 10,
            output_tokens: 5,
            ttft_s: Some(ttft),
            e2e_s: 1.0,
            ..Default::default()
        };
        let failed = RequestRecord {
            status: Some(429),
            ..Default::default()
        };
        let slo = Slo {
            ttft_ms: Some(200.0),
            ..Default::default()
        };
        let s = Summary::of(&[ok(0.1), ok(0.3), failed], 2.0, Some(&slo));
        assert_eq!((s.completed, s.failed), (2, 1));
        assert_eq!(s.errors["429"], 1);
        assert_eq!(s.goodput, Some(0.5));
        assert_eq!(s.output_tok_s, 5.0);
        assert!((s.tpot.mean - 200.0).abs() < 1e-6); // (1.0 - 0.2 avg) / 4
        assert_eq!((s.cache, s.cache_hit_rate), (None, None));
    }

    #[test]
    fn summary_counts_completed_requests_by_cache_header() {
        let done = |cache: Option<&str>| RequestRecord {
            ok: true,
            status: Some(200),
            cache: cache.map(str::to_string),
            ..Default::default()
        };
        let records = [
            done(Some("hit")),
            done(Some("hit")),
            done(Some("coalesced")),
            done(Some("miss")),
            done(Some("bypass")),
            done(Some("stale")),
            done(None),
            done(Some("hit")),
            // Failed requests count in neither the counts nor the rate.
            RequestRecord {
                status: Some(500),
                cache: Some("miss".into()),
                ..Default::default()
            },
        ];
        let s = Summary::of(&records, 1.0, None);
        let want = CacheCounts {
            hits: 3,
            coalesced: 1,
            misses: 1,
            bypass: 1,
            other: 1,
        };
        assert_eq!(s.cache, Some(want));
        assert_eq!(s.cache_hit_rate, Some(3.0 / 8.0));
    }

    #[test]
    fn files_from_before_the_cache_fields_load() {
        let mut v = serde_json::to_value(BenchResult {
            summary: Summary::of(&[RequestRecord::default()], 1.0, None),
            requests: vec![RequestRecord::default()],
            ..Default::default()
        })
        .unwrap();
        for (obj, key) in [("summary", "cache"), ("summary", "cache_hit_rate")] {
            v[obj].as_object_mut().unwrap().remove(key).unwrap();
        }
        v["requests"][0]
            .as_object_mut()
            .unwrap()
            .remove("cache")
            .unwrap();
        let r: BenchResult = serde_json::from_value(v).unwrap();
        assert_eq!(
            (r.summary.cache, r.requests[0].cache.as_deref()),
            (None, None)
        );
    }
}
