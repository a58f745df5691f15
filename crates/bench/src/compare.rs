//! `ingot bench compare BASELINE CANDIDATE`: the regression gate over two
//! `ingot bench serve --out` files.
//!
//! Every row is a metric with the baseline's and the candidate's value and
//! the relative delta. A row **regresses** when its delta is worse than the
//! tolerance *and*, for latency rows, the per-request samples say the
//! difference is real at `--alpha` (tolerance alone would fail on the
//! noise of short runs; significance alone on real but negligible shifts
//! of long ones). Cohen's d of the metric is shown as the effect size.
//!
//! Decisions:
//! - Mean rows: Welch's two-sided t-test (unequal variances) over one
//!   sample per completed request.
//! - p50 and p99 rows: a t-test compares means, and a mean can fall while
//!   the tail grows, so these rows use a seeded cluster bootstrap of the
//!   percentile difference itself (`ingot_stats::bootstrap_quantile_test`,
//!   1000 resamples).
//! - The unit is the request: TTFT, TPOT and E2E have one value per
//!   request; ITL gaps within one request are correlated, so the t-test
//!   takes each request's mean gap and the bootstrap resamples whole
//!   requests with all their gaps.
//! - Throughput (req/s, output tok/s) is one number per run, so the run is
//!   cut into `--throughput-windows` equal time windows and each window's
//!   completions (requests and output tokens, by completion time
//!   `start_s + e2e_s`) per second is one sample; Welch's test over the
//!   windows of both runs decides whether a drop beyond the tolerance is
//!   real. A noisy machine makes the windows vary, so two runs of the same
//!   build do not report a regression on a delta that is noise; a real
//!   drop shows in every window and stays significant. The windows' mean
//!   is the run's throughput (every completion falls in one window).
//!   Per-request token rates are not used in its place: they measure
//!   latency (TPOT), not what the server sustains.
//! - With fewer than two samples on a side (files without `requests`, or
//!   fewer than two windows) the delta alone decides.
//! - Tolerances: throughput `--max-throughput-drop`, TTFT mean/p50
//!   `--max-ttft-increase`, TPOT/ITL/E2E mean/p50 `--max-latency-increase`,
//!   every p99 `--max-p99-increase`; all in percent.

use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use crate::result::{BenchResult, RequestRecord, Stats};
use crate::BenchError;
use ingot_stats::{bootstrap_quantile_test, cohens_d, welch_t_test};

/// Flags of `ingot bench compare`.
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// Baseline result file (`ingot bench serve --out`).
    pub baseline: PathBuf,
    /// Candidate result file.
    pub candidate: PathBuf,
    /// Largest tolerated drop of request and output-token throughput, percent.
    #[arg(long, default_value_t = 5.0)]
    pub max_throughput_drop: f64,
    /// Largest tolerated increase of mean and median TTFT, percent.
    #[arg(long, default_value_t = 10.0)]
    pub max_ttft_increase: f64,
    /// Largest tolerated increase of mean and median TPOT, ITL and E2E, percent.
    #[arg(long, default_value_t = 10.0)]
    pub max_latency_increase: f64,
    /// Largest tolerated increase of any p99 latency, percent.
    #[arg(long, default_value_t = 15.0)]
    pub max_p99_increase: f64,
    /// Significance level of the rows' tests (Welch for means and
    /// throughput windows, bootstrap for percentiles).
    #[arg(long, default_value_t = 0.05)]
    pub alpha: f64,
    /// Equal time windows each run is cut into for the throughput test
    /// (each window's completions per second is one sample); below 2 the
    /// throughput delta alone decides.
    #[arg(long, default_value_t = 10)]
    pub throughput_windows: usize,
    /// Print the comparison as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Which way is better for a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    /// Throughput.
    Higher,
    /// Latency.
    Lower,
}

/// The outcome of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Within tolerance.
    Ok,
    /// Better than the tolerance, significantly.
    Improved,
    /// Worse than the tolerance but not significant: noise.
    NotSignificant,
    /// Worse than the tolerance and significant: fails the gate.
    Regressed,
    /// No completed request on one side.
    NoData,
}

/// The significance test of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Test {
    /// Welch's t-test of the means.
    Welch,
    /// Cluster bootstrap of the percentile.
    Bootstrap,
}

/// Seed of the bootstrap, fixed so a comparison is reproducible.
const BOOTSTRAP_SEED: u64 = 0x1d_9e37;

/// One metric of the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Name, e.g. `ttft_p99_ms`.
    pub metric: String,
    /// Which way is better.
    pub better: Better,
    /// Baseline value.
    pub baseline: f64,
    /// Candidate value.
    pub candidate: f64,
    /// `(candidate - baseline) / baseline`, percent (`None` for a zero baseline).
    pub delta_pct: Option<f64>,
    /// Tolerated change in the worse direction, percent.
    pub tolerance_pct: f64,
    /// The test behind `p_value`.
    pub test: Option<Test>,
    /// Two-sided p-value over per-request samples.
    pub p_value: Option<f64>,
    /// Cohen's d of candidate against baseline.
    pub cohens_d: Option<f64>,
    /// Outcome.
    pub verdict: Verdict,
}

/// The whole comparison (`--json` prints it).
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Baseline file.
    pub baseline: PathBuf,
    /// Candidate file.
    pub candidate: PathBuf,
    /// Significance level.
    pub alpha: f64,
    /// Configuration keys whose values differ between the runs.
    pub config_differences: Vec<String>,
    /// One row per metric.
    pub rows: Vec<Row>,
    /// Some row regressed.
    pub regressed: bool,
    /// The baseline's response-cache hit rate, when its server reported one.
    /// Shown, not gated: it is a property of the workload as much as of
    /// the server, and it explains latency rows that moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_cache_hit_rate: Option<f64>,
    /// The candidate's response-cache hit rate, when reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidate_cache_hit_rate: Option<f64>,
}

/// Reads and parses a result file.
pub fn load(path: &Path) -> Result<BenchResult, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| BenchError::BadResult {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// The latency metrics with per-request samples.
#[derive(Clone, Copy)]
enum Latency {
    Ttft,
    Tpot,
    Itl,
    E2e,
}

impl Latency {
    fn name(self) -> &'static str {
        match self {
            Latency::Ttft => "ttft",
            Latency::Tpot => "tpot",
            Latency::Itl => "itl",
            Latency::E2e => "e2e",
        }
    }

    fn stats(self, r: &BenchResult) -> &Stats {
        match self {
            Latency::Ttft => &r.summary.ttft,
            Latency::Tpot => &r.summary.tpot,
            Latency::Itl => &r.summary.itl,
            Latency::E2e => &r.summary.e2e,
        }
    }

    /// The values of each completed request, in ms: one, or every ITL gap.
    fn clusters(self, r: &BenchResult) -> Vec<Vec<f64>> {
        let ms = |s: f64| s * 1e3;
        r.requests
            .iter()
            .filter(|q| q.ok)
            .map(|q| match self {
                Latency::Itl => q.itl_s.iter().copied().map(ms).collect(),
                Latency::Ttft => q.ttft_s.map(ms).into_iter().collect(),
                Latency::Tpot => q.tpot_s().map(ms).into_iter().collect(),
                Latency::E2e => vec![ms(q.e2e_s)],
            })
            .map(|v: Vec<f64>| v.into_iter().filter(|x| x.is_finite()).collect::<Vec<_>>())
            .filter(|v| !v.is_empty())
            .collect()
    }

    /// One sample per completed request, in ms.
    fn samples(self, r: &BenchResult) -> Vec<f64> {
        let one = |q: &RequestRecord| match self {
            Latency::Ttft => q.ttft_s,
            Latency::Tpot => q.tpot_s(),
            Latency::Itl => {
                (!q.itl_s.is_empty()).then(|| q.itl_s.iter().sum::<f64>() / q.itl_s.len() as f64)
            }
            Latency::E2e => Some(q.e2e_s),
        };
        r.requests
            .iter()
            .filter(|q| q.ok)
            .filter_map(one)
            .filter(|x| x.is_finite())
            .map(|s| s * 1e3)
            .collect()
    }
}

/// The throughput metrics, sampled per time window.
#[derive(Clone, Copy)]
enum Rate {
    Requests,
    OutputTokens,
}

impl Rate {
    /// Completions per second in each of `n` equal windows of the run (by
    /// completion time); empty without per-request records or with fewer
    /// than two windows.
    fn windows(self, r: &BenchResult, n: usize) -> Vec<f64> {
        let duration = r.summary.duration_s;
        let measured = duration.is_finite() && duration > 0.0;
        if n < 2 || !measured || r.requests.is_empty() {
            return Vec::new();
        }
        let width = duration / n as f64;
        let mut counts = vec![0.0; n];
        for q in r.requests.iter().filter(|q| q.ok) {
            let done = q.start_s + q.e2e_s;
            if !done.is_finite() {
                continue;
            }
            // A completion at the very end belongs to the last window.
            let i = ((done / width).floor().max(0.0) as usize).min(n - 1);
            counts[i] += match self {
                Rate::Requests => 1.0,
                Rate::OutputTokens => q.output_tokens as f64,
            };
        }
        counts.into_iter().map(|c| c / width).collect()
    }
}

/// Tolerances and the significance level, validated.
struct Gate {
    throughput: f64,
    ttft: f64,
    latency: f64,
    p99: f64,
    alpha: f64,
}

impl Gate {
    fn from_args(args: &CompareArgs) -> Result<Gate, BenchError> {
        for (name, v) in [
            ("max-throughput-drop", args.max_throughput_drop),
            ("max-ttft-increase", args.max_ttft_increase),
            ("max-latency-increase", args.max_latency_increase),
            ("max-p99-increase", args.max_p99_increase),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(BenchError::Options(format!(
                    "--{name} must be a non-negative percentage, got {v}"
                )));
            }
        }
        if !(args.alpha > 0.0 && args.alpha < 1.0) {
            return Err(BenchError::Options(format!(
                "--alpha must be in (0, 1), got {}",
                args.alpha
            )));
        }
        Ok(Gate {
            throughput: args.max_throughput_drop,
            ttft: args.max_ttft_increase,
            latency: args.max_latency_increase,
            p99: args.max_p99_increase,
            alpha: args.alpha,
        })
    }
}

/// A row's verdict from its values, tolerance and test.
fn verdict(row: &Row, alpha: f64) -> Verdict {
    // Change in the worse direction, percent; a zero baseline counts as an
    // unbounded change whichever way the candidate moved.
    let worse = match row.delta_pct {
        Some(d) => match row.better {
            Better::Higher => -d,
            Better::Lower => d,
        },
        None => {
            let up = row.candidate > row.baseline;
            if up == (row.better == Better::Lower) {
                f64::INFINITY
            } else {
                f64::NEG_INFINITY
            }
        }
    };
    let significant = row.p_value.is_none_or(|p| p < alpha);
    if worse > row.tolerance_pct {
        if significant {
            Verdict::Regressed
        } else {
            Verdict::NotSignificant
        }
    } else if -worse > row.tolerance_pct && significant {
        Verdict::Improved
    } else {
        Verdict::Ok
    }
}

fn delta_pct(baseline: f64, candidate: f64) -> Option<f64> {
    if baseline == 0.0 {
        (candidate == 0.0).then_some(0.0)
    } else {
        Some((candidate - baseline) / baseline * 100.0)
    }
}

/// Top-level configuration keys whose values differ (the output path and
/// the free-text label aside).
fn config_differences(a: &serde_json::Value, b: &serde_json::Value) -> Vec<String> {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return if a == b {
            Vec::new()
        } else {
            vec!["config".into()]
        };
    };
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| !matches!(k.as_str(), "out" | "label") && a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

/// Compares two results; pure, so tests call it on fabricated files.
pub fn compare(
    base: &BenchResult,
    cand: &BenchResult,
    args: &CompareArgs,
) -> Result<Comparison, BenchError> {
    let gate = Gate::from_args(args)?;
    let mut rows = Vec::new();
    let mut push = |metric: String, better, b: f64, c: f64, tol, test: Option<(Test, f64)>, d| {
        let mut row = Row {
            metric,
            better,
            baseline: b,
            candidate: c,
            delta_pct: delta_pct(b, c),
            tolerance_pct: tol,
            test: test.map(|t| t.0),
            p_value: test.map(|t| t.1),
            cohens_d: d,
            verdict: Verdict::Ok,
        };
        row.verdict = verdict(&row, gate.alpha);
        rows.push(row);
    };
    let (bs, cs) = (&base.summary, &cand.summary);
    for (metric, b, c, rate) in [
        (
            "request_throughput",
            bs.request_throughput,
            cs.request_throughput,
            Rate::Requests,
        ),
        (
            "output_tok_s",
            bs.output_tok_s,
            cs.output_tok_s,
            Rate::OutputTokens,
        ),
    ] {
        let (wa, wb) = (
            rate.windows(base, args.throughput_windows),
            rate.windows(cand, args.throughput_windows),
        );
        let test = welch_t_test(&wa, &wb).map(|w| (Test::Welch, w.p));
        let d = cohens_d(&wa, &wb);
        push(
            metric.into(),
            Better::Higher,
            b,
            c,
            gate.throughput,
            test,
            d,
        );
    }
    let mut no_data = Vec::new();
    for m in [Latency::Ttft, Latency::Tpot, Latency::Itl, Latency::E2e] {
        let (sa, sb) = (m.samples(base), m.samples(cand));
        let (ca, cb) = (m.clusters(base), m.clusters(cand));
        let welch = welch_t_test(&sa, &sb).map(|w| (Test::Welch, w.p));
        let boot = |q: f64| {
            bootstrap_quantile_test(&ca, &cb, q, BOOTSTRAP_SEED).map(|p| (Test::Bootstrap, p))
        };
        let d = cohens_d(&sa, &sb);
        let (b, c) = (m.stats(base), m.stats(cand));
        let mid_tol = match m {
            Latency::Ttft => gate.ttft,
            _ => gate.latency,
        };
        for (label, tol, value, q) in [
            ("mean", mid_tol, (b.mean, c.mean), None),
            ("p50", mid_tol, (b.median, c.median), Some(0.5)),
            ("p99", gate.p99, (b.p99, c.p99), Some(0.99)),
        ] {
            let metric = format!("{}_{label}_ms", m.name());
            if b.count == 0 || c.count == 0 {
                no_data.push(metric);
                continue;
            }
            let test = match q {
                None => welch,
                Some(q) => boot(q),
            };
            push(metric, Better::Lower, value.0, value.1, tol, test, d);
        }
    }
    rows.extend(no_data.into_iter().map(|metric| Row {
        metric,
        better: Better::Lower,
        baseline: f64::NAN,
        candidate: f64::NAN,
        delta_pct: None,
        tolerance_pct: 0.0,
        test: None,
        p_value: None,
        cohens_d: None,
        verdict: Verdict::NoData,
    }));
    Ok(Comparison {
        baseline: args.baseline.clone(),
        candidate: args.candidate.clone(),
        alpha: gate.alpha,
        config_differences: config_differences(&base.config, &cand.config),
        regressed: rows.iter().any(|r| r.verdict == Verdict::Regressed),
        rows,
        baseline_cache_hit_rate: bs.cache_hit_rate,
        candidate_cache_hit_rate: cs.cache_hit_rate,
    })
}

/// A number with about four significant digits.
pub(crate) fn num(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

fn print_table(c: &Comparison, base: &BenchResult, cand: &BenchResult) {
    println!("baseline:  {}", c.baseline.display());
    println!("candidate: {}", c.candidate.display());
    if !c.config_differences.is_empty() {
        println!(
            "note: the runs differ in {}",
            c.config_differences.join(", ")
        );
    }
    for (name, r) in [("baseline", base), ("candidate", cand)] {
        if r.partial {
            println!("note: the {name} run was interrupted; its results are partial");
        }
        if r.summary.failed > 0 {
            println!(
                "note: the {name} run had {} failed request(s) of {}",
                r.summary.failed,
                r.summary.failed + r.summary.completed
            );
        }
    }
    if let Some(line) = cache_hit_rates(c) {
        println!("{line}");
    }
    println!(
        "{:<20} {:>11} {:>11} {:>9} {:>9} {:>6} {:>8} {:>9}  verdict",
        "metric", "baseline", "candidate", "delta", "p-value", "test", "d", "tolerance"
    );
    for r in &c.rows {
        let delta = r
            .delta_pct
            .map_or_else(|| "-".into(), |d| format!("{d:+.1}%"));
        let p = match r.p_value {
            None => "-".into(),
            Some(p) if p < 0.001 => "<0.001".into(),
            Some(p) => format!("{p:.3}"),
        };
        let d = r
            .cohens_d
            .map_or_else(|| "-".into(), |d| format!("{d:+.2}"));
        let test_name = match r.test {
            None => "-",
            Some(Test::Welch) => "welch",
            Some(Test::Bootstrap) => "boot",
        };
        let tol = match (r.verdict, r.better) {
            (Verdict::NoData, _) => "-".into(),
            (_, Better::Higher) => format!("-{:.1}%", r.tolerance_pct),
            (_, Better::Lower) => format!("+{:.1}%", r.tolerance_pct),
        };
        let verdict = match r.verdict {
            Verdict::Ok => "ok",
            Verdict::Improved => "improved",
            Verdict::NotSignificant => "worse, not significant",
            Verdict::Regressed => "REGRESSED",
            Verdict::NoData => "no data",
        };
        println!(
            "{:<20} {:>11} {:>11} {:>9} {:>9} {:>6} {:>8} {:>9}  {verdict}",
            r.metric,
            num(r.baseline),
            num(r.candidate),
            delta,
            p,
            test_name,
            d,
            tol
        );
    }
    let failed: Vec<&str> = c
        .rows
        .iter()
        .filter(|r| r.verdict == Verdict::Regressed)
        .map(|r| r.metric.as_str())
        .collect();
    if failed.is_empty() {
        println!("result: no regression (alpha {})", c.alpha);
    } else {
        println!("result: REGRESSION in {}", failed.join(", "));
    }
}

/// "cache hit rate: baseline 37.5%, candidate -" when either run has one.
fn cache_hit_rates(c: &Comparison) -> Option<String> {
    let (b, cand) = (c.baseline_cache_hit_rate, c.candidate_cache_hit_rate);
    if b.is_none() && cand.is_none() {
        return None;
    }
    let pct = |r: Option<f64>| r.map_or_else(|| "-".into(), |r| format!("{:.1}%", r * 100.0));
    Some(format!(
        "cache hit rate: baseline {}, candidate {}",
        pct(b),
        pct(cand)
    ))
}

/// Runs the command; `Ok(false)` on a regression.
pub fn run(args: CompareArgs) -> Result<bool, BenchError> {
    let base = load(&args.baseline)?;
    let cand = load(&args.candidate)?;
    let c = compare(&base, &cand, &args)?;
    if args.json {
        let text = serde_json::to_string_pretty(&c)
            .map_err(|e| BenchError::Options(format!("cannot print the comparison: {e}")))?;
        println!("{text}");
    } else {
        print_table(&c, &base, &cand);
    }
    Ok(!c.regressed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::Summary;

    fn args() -> CompareArgs {
        CompareArgs {
            baseline: "a.json".into(),
            candidate: "b.json".into(),
            max_throughput_drop: 5.0,
            max_ttft_increase: 10.0,
            max_latency_increase: 10.0,
            max_p99_increase: 15.0,
            alpha: 0.05,
            throughput_windows: 10,
            json: false,
        }
    }

    /// A run of `n` requests whose TTFT is `ttft` ms plus a deterministic
    /// spread, started evenly over `duration` s.
    fn run_of(n: usize, ttft_ms: f64, duration: f64) -> BenchResult {
        let requests: Vec<RequestRecord> = (0..n)
            .map(|i| {
                let jitter = ((i * 7919) % 13) as f64 - 6.0; // -6..6
                let ttft = (ttft_ms + jitter) / 1e3;
                RequestRecord {
                    ok: true,
                    status: Some(200),
                    prompt_tokens: 16,
                    output_tokens: 4,
                    start_s: i as f64 * (duration - 0.2) / n as f64,
                    ttft_s: Some(ttft),
                    e2e_s: ttft + 0.075 + jitter / 1e4,
                    itl_s: vec![0.025 + jitter / 1e4; 3],
                    ..Default::default()
                }
            })
            .collect();
        BenchResult {
            summary: Summary::of(&requests, duration, None),
            requests,
            ..Default::default()
        }
    }

    fn verdict_of(c: &Comparison, metric: &str) -> Verdict {
        c.rows.iter().find(|r| r.metric == metric).unwrap().verdict
    }

    #[test]
    fn same_run_passes() {
        let a = run_of(50, 100.0, 10.0);
        let c = compare(&a, &a, &args()).unwrap();
        assert!(!c.regressed);
        assert!(c.rows.iter().all(|r| r.verdict == Verdict::Ok), "{c:#?}");
    }

    /// A run whose window `i` completes `counts[i]` requests of 4 tokens,
    /// 1 s per window: how a noisy machine looks to the throughput test.
    fn run_with_window_counts(counts: &[usize]) -> BenchResult {
        let mut requests = Vec::new();
        for (w, &c) in counts.iter().enumerate() {
            for j in 0..c {
                let start = w as f64 + j as f64 / (c as f64 + 1.0);
                requests.push(RequestRecord {
                    ok: true,
                    status: Some(200),
                    prompt_tokens: 16,
                    output_tokens: 4,
                    start_s: start,
                    ttft_s: Some(0.1 + (j % 5) as f64 * 0.002),
                    e2e_s: 0.01,
                    itl_s: vec![0.002; 3],
                    ..Default::default()
                });
            }
        }
        BenchResult {
            summary: Summary::of(&requests, counts.len() as f64, None),
            requests,
            ..Default::default()
        }
    }

    #[test]
    fn same_build_on_a_noisy_machine_is_not_a_throughput_regression() {
        // Two runs of one build, the machine busy with other work in
        // different seconds of each: the second is 8.8% slower overall,
        // beyond the 5% tolerance, but its windows vary as much as the
        // difference.
        let a = run_with_window_counts(&[20, 28, 12, 26, 14, 22, 30, 10, 24, 18]);
        let b = run_with_window_counts(&[16, 25, 11, 27, 13, 17, 29, 9, 22, 17]);
        let c = compare(&a, &b, &args()).unwrap();
        let row = c
            .rows
            .iter()
            .find(|r| r.metric == "request_throughput")
            .unwrap();
        assert!(row.delta_pct.unwrap() < -5.0, "{row:?}");
        assert!(row.p_value.unwrap() > 0.05, "{row:?}");
        assert_eq!(row.verdict, Verdict::NotSignificant);
        assert_eq!(verdict_of(&c, "output_tok_s"), Verdict::NotSignificant);
        assert!(!c.regressed, "{c:#?}");
        // Without windows the delta alone decides, and it would fail.
        let mut one = args();
        one.throughput_windows = 1;
        let c = compare(&a, &b, &one).unwrap();
        assert_eq!(verdict_of(&c, "request_throughput"), Verdict::Regressed);
        // A real 30% drop shows in every window and fails the gate.
        let slow = run_with_window_counts(&[14, 20, 8, 18, 10, 15, 21, 7, 17, 13]);
        let c = compare(&a, &slow, &args()).unwrap();
        assert_eq!(verdict_of(&c, "request_throughput"), Verdict::Regressed);
        assert!(c.regressed);
    }

    #[test]
    fn throughput_windows_average_to_the_runs_throughput() {
        let a = run_with_window_counts(&[20, 28, 12, 26, 14, 22, 30, 10, 24, 18]);
        let w = Rate::Requests.windows(&a, 10);
        assert_eq!(w.len(), 10);
        let mean = w.iter().sum::<f64>() / 10.0;
        assert!((mean - a.summary.request_throughput).abs() < 1e-9);
        assert!(Rate::Requests.windows(&a, 1).is_empty());
    }

    #[test]
    fn throughput_drop_is_gated_by_delta_and_windows() {
        let a = run_of(50, 100.0, 10.0);
        let b = run_of(50, 100.0, 10.0 / 0.7); // 30% fewer req/s
        let c = compare(&a, &b, &args()).unwrap();
        assert!(c.regressed);
        assert_eq!(verdict_of(&c, "request_throughput"), Verdict::Regressed);
        assert_eq!(verdict_of(&c, "output_tok_s"), Verdict::Regressed);
        assert_eq!(verdict_of(&c, "ttft_mean_ms"), Verdict::Ok);
        // A 4% drop is within the default tolerance.
        let b = run_of(50, 100.0, 10.0 / 0.96);
        assert!(!compare(&a, &b, &args()).unwrap().regressed);
    }

    #[test]
    fn latency_needs_tolerance_and_significance() {
        let a = run_of(50, 100.0, 10.0);
        // +30 ms on 100 ms with a spread of ±6 ms: large and significant.
        let b = run_of(50, 130.0, 10.0);
        let c = compare(&a, &b, &args()).unwrap();
        assert_eq!(verdict_of(&c, "ttft_mean_ms"), Verdict::Regressed);
        assert_eq!(verdict_of(&c, "ttft_p50_ms"), Verdict::Regressed);
        assert!(c.regressed);
        // The same shift with 2 samples per side is not significant.
        let (a2, b2) = (run_of(2, 100.0, 10.0), run_of(2, 130.0, 10.0));
        let mut a2 = a2;
        a2.requests[1].ttft_s = Some(0.030);
        a2.summary = Summary::of(&a2.requests, 10.0, None);
        let c = compare(&a2, &b2, &args()).unwrap();
        let row = c.rows.iter().find(|r| r.metric == "ttft_mean_ms").unwrap();
        assert!(row.p_value.unwrap() > 0.05, "{row:?}");
        assert_eq!(row.verdict, Verdict::NotSignificant);
        // A faster candidate is an improvement, not a regression.
        let c = compare(&b, &a, &args()).unwrap();
        assert_eq!(verdict_of(&c, "ttft_mean_ms"), Verdict::Improved);
        assert!(!c.regressed);
    }

    #[test]
    fn files_without_samples_use_the_delta() {
        let a = run_of(50, 100.0, 10.0);
        let mut b = run_of(50, 130.0, 10.0);
        b.requests.clear();
        let c = compare(&a, &b, &args()).unwrap();
        let row = c.rows.iter().find(|r| r.metric == "ttft_mean_ms").unwrap();
        assert_eq!((row.p_value, row.verdict), (None, Verdict::Regressed));
    }

    #[test]
    fn no_completed_requests_is_no_data_and_a_throughput_regression() {
        let a = run_of(50, 100.0, 10.0);
        let b = BenchResult {
            summary: Summary::of(&[RequestRecord::default()], 10.0, None),
            requests: vec![RequestRecord::default()],
            ..Default::default()
        };
        let c = compare(&a, &b, &args()).unwrap();
        assert_eq!(verdict_of(&c, "ttft_p99_ms"), Verdict::NoData);
        assert_eq!(verdict_of(&c, "request_throughput"), Verdict::Regressed);
    }

    #[test]
    fn bad_options_and_config_differences() {
        let a = run_of(3, 100.0, 1.0);
        let mut bad = args();
        bad.alpha = 1.5;
        assert!(compare(&a, &a, &bad).is_err());
        bad = args();
        bad.max_p99_increase = -1.0;
        assert!(compare(&a, &a, &bad).is_err());
        let x = serde_json::json!({"input_len": 16, "out": "a", "seed": 1});
        let y = serde_json::json!({"input_len": 32, "out": "b", "seed": 1, "new": true});
        assert_eq!(config_differences(&x, &y), ["input_len", "new"]);
    }

    #[test]
    fn cache_hit_rates_show_when_either_run_has_one() {
        let a = run_of(4, 100.0, 1.0);
        let c = compare(&a, &a, &args()).unwrap();
        assert_eq!(cache_hit_rates(&c), None);
        assert!(serde_json::to_value(&c)
            .unwrap()
            .get("baseline_cache_hit_rate")
            .is_none());
        let mut b = a.clone();
        for (i, q) in b.requests.iter_mut().enumerate() {
            q.cache = Some(if i == 0 { "hit" } else { "miss" }.into());
        }
        b.summary = Summary::of(&b.requests, 1.0, None);
        let c = compare(&a, &b, &args()).unwrap();
        assert_eq!(c.candidate_cache_hit_rate, Some(0.25));
        assert_eq!(
            cache_hit_rates(&c).as_deref(),
            Some("cache hit rate: baseline -, candidate 25.0%")
        );
    }
}
