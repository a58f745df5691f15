//! `ingot bench compare`: the regression gate over `ingot bench serve
//! --out` files, judged on what varies between runs.
//!
//! ```text
//! ingot bench compare BASELINE CANDIDATE
//! ingot bench compare --baseline a1.json a2.json a3.json --candidate b1.json ...
//! ```
//!
//! A file holds one run, or several (`ingot bench serve --repeat N`); each
//! side is every run of its files. Every row is a metric (request and
//! output-token throughput; TTFT, TPOT, ITL and E2E mean, p50 and p99),
//! its value per run, and the relative delta of the two sides' averages.
//!
//! Why runs, not requests or tokens: on a shared machine the same build
//! against the same warm server moves by 10–20 % from one run to the next
//! (background load, frequency, cache state), and every request of a run
//! shares that run's luck. Tests over the requests or tokens of one run
//! each treat them as independent and call that shift significant; the
//! sample that carries the noise is the run.
//!
//! Decisions:
//! - Two or more runs on each side (three or more recommended): a row
//!   **regresses** when its delta is worse than the row's tolerance *and*
//!   Welch's t-test over the per-run values has p < `--alpha` after Holm's
//!   correction over the rows tested: the verdict is "any row regressed",
//!   so the rows are one family of tests, and uncorrected each of the ~14
//!   added its own false alarms (5 of 20 A/A comparisons on a quiet
//!   machine; 0 with the correction: docs/benchmarks.md). The
//!   tolerance is the practical-significance threshold: a smaller delta is
//!   never a regression, however consistent. Welch rather than
//!   Mann–Whitney U: with three runs a side the smallest two-sided U
//!   p-value is 0.1, so U could never decide at 0.05.
//! - One run on a side: noise cannot be told from change, so the test is
//!   skipped and a row regresses only beyond `--single-run-gate` (or its
//!   tolerance, if wider); the output says so.
//! - Tolerances: throughput `--max-throughput-drop`, TTFT mean/p50
//!   `--max-ttft-increase`, TPOT/ITL/E2E mean/p50 `--max-latency-increase`,
//!   every p99 `--max-p99-increase`; all in percent.

use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use crate::result::{BenchResult, RunSummary, Stats, Summary};
use crate::BenchError;
use ingot_stats::{coefficient_of_variation, cohens_d, holm_adjust, welch_t_test};

/// Default `--single-run-gate`, percent: about the 95th percentile of the
/// relative difference between consecutive single runs of one server on
/// the shared 2-core CPU machine under other sessions' builds (41–51 % for
/// throughput, TTFT p50, TPOT mean and E2E p50; ~20 % when it is quiet),
/// docs/benchmarks.md, "bench compare: A/A and real regression (issue 31)".
pub const SINGLE_RUN_GATE_PCT: f64 = 50.0;

/// Flags of `ingot bench compare`.
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// BASELINE CANDIDATE: one result file per side (`ingot bench serve
    /// --out`); or give --baseline and --candidate.
    #[arg(value_name = "FILE", num_args = 0..=2, conflicts_with_all = ["baseline", "candidate"])]
    pub files: Vec<PathBuf>,
    /// Baseline result files; each may hold several runs (`--repeat`).
    #[arg(long, value_name = "FILE", num_args = 1.., requires = "candidate")]
    pub baseline: Vec<PathBuf>,
    /// Candidate result files.
    #[arg(long, value_name = "FILE", num_args = 1.., requires = "baseline")]
    pub candidate: Vec<PathBuf>,
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
    /// With one run on a side: the change, percent, beyond which a row
    /// regresses (one run cannot tell noise from change, so this is wide;
    /// a tolerance above it wins).
    #[arg(long, default_value_t = SINGLE_RUN_GATE_PCT)]
    pub single_run_gate: f64,
    /// Significance level of Welch's test over the per-run values.
    #[arg(long, default_value_t = 0.05)]
    pub alpha: f64,
    /// Print the comparison as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl Default for CompareArgs {
    /// The flags' defaults, no files.
    fn default() -> CompareArgs {
        crate::runs::flag_defaults("compare")
    }
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
    /// Better than the tolerance (and significant, with runs to test).
    Improved,
    /// Worse than the tolerance but not significant, or (one run) not
    /// beyond the single-run gate: indistinguishable from noise.
    NotSignificant,
    /// Worse than the tolerance and significant, or (one run) beyond the
    /// single-run gate: fails the gate.
    Regressed,
    /// No completed request on one side.
    NoData,
}

/// How the rows were decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Two or more runs a side: Welch's test over the per-run values.
    Runs,
    /// One run on a side: the delta against the single-run gate.
    SingleRun,
}

/// One metric of the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Name, e.g. `ttft_p99_ms`.
    pub metric: String,
    /// Which way is better.
    pub better: Better,
    /// Baseline value: the average over its runs.
    pub baseline: f64,
    /// Candidate value: the average over its runs.
    pub candidate: f64,
    /// `(candidate - baseline) / baseline`, percent (`None` for a zero baseline).
    pub delta_pct: Option<f64>,
    /// Change in the worse direction beyond which the row can regress,
    /// percent (with one run a side it must also pass the single-run gate).
    pub tolerance_pct: f64,
    /// Welch's two-sided p-value over the per-run values (`None` in
    /// single-run mode).
    pub p_value: Option<f64>,
    /// `p_value` after Holm's correction over the comparison's tested rows;
    /// the verdict compares this one with alpha.
    pub p_holm: Option<f64>,
    /// Cohen's d of the candidate's runs against the baseline's.
    pub cohens_d: Option<f64>,
    /// The baseline's run-to-run coefficient of variation, percent.
    pub baseline_cv_pct: Option<f64>,
    /// Outcome.
    pub verdict: Verdict,
}

/// The whole comparison (`--json` prints it).
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Baseline files.
    pub baseline: Vec<PathBuf>,
    /// Candidate files.
    pub candidate: Vec<PathBuf>,
    /// Runs in the baseline files.
    pub baseline_runs: usize,
    /// Runs in the candidate files.
    pub candidate_runs: usize,
    /// How the rows were decided.
    pub mode: Mode,
    /// The single-run gate, percent, in single-run mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub single_run_gate_pct: Option<f64>,
    /// Significance level.
    pub alpha: f64,
    /// Configuration keys whose values differ between the sides' first files.
    pub config_differences: Vec<String>,
    /// One row per metric.
    pub rows: Vec<Row>,
    /// Some row regressed.
    pub regressed: bool,
    /// The baseline's response-cache hit rate (average over runs), when its
    /// server reported one. Shown, not gated: it is a property of the
    /// workload as much as of the server, and it explains latency rows
    /// that moved.
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

/// One side of the comparison: its files and every run in them.
#[derive(Debug, Clone, Default)]
pub struct Side {
    /// The files, as given.
    pub files: Vec<PathBuf>,
    /// The configuration of the first file.
    pub config: serde_json::Value,
    /// Every run, in file order.
    pub runs: Vec<RunSummary>,
}

impl Side {
    /// Loads `files`; an empty list is an error naming `name`.
    pub fn load(name: &str, files: &[PathBuf]) -> Result<Side, BenchError> {
        let mut side = Side {
            files: files.to_vec(),
            ..Side::default()
        };
        for (i, path) in files.iter().enumerate() {
            let r = load(path)?;
            if i == 0 {
                side.config = r.config.clone();
            }
            side.runs.extend(r.run_summaries());
        }
        if side.runs.is_empty() {
            return Err(BenchError::Options(format!("no {name} result file given")));
        }
        Ok(side)
    }

    /// Builds a side from results in memory (tests, callers with their own files).
    pub fn of(results: &[BenchResult]) -> Side {
        Side {
            files: Vec::new(),
            config: results
                .first()
                .map(|r| r.config.clone())
                .unwrap_or_default(),
            runs: results
                .iter()
                .flat_map(BenchResult::run_summaries)
                .collect(),
        }
    }

    /// The per-run values of `f` where the run measured it.
    fn values(&self, f: impl Fn(&Summary) -> Option<f64>) -> Vec<f64> {
        self.runs
            .iter()
            .filter_map(|r| f(&r.summary))
            .filter(|v| v.is_finite())
            .collect()
    }

    /// The average response-cache hit rate of the runs that report one.
    fn cache_hit_rate(&self) -> Option<f64> {
        ingot_stats::mean(&self.values(|s| s.cache_hit_rate))
    }
}

/// The baseline and candidate files the flags name.
fn file_lists(args: &CompareArgs) -> Result<(Vec<PathBuf>, Vec<PathBuf>), BenchError> {
    match (args.files.as_slice(), args.baseline.is_empty()) {
        ([], false) => Ok((args.baseline.clone(), args.candidate.clone())),
        ([a, b], true) => Ok((vec![a.clone()], vec![b.clone()])),
        _ => Err(BenchError::Options(
            "give BASELINE CANDIDATE, or --baseline FILE... --candidate FILE...".into(),
        )),
    }
}

/// A latency's statistics in a run summary.
type StatsOf = fn(&Summary) -> &Stats;

/// The metrics, one per row.
#[derive(Clone, Copy)]
enum Metric {
    Throughput(&'static str, fn(&Summary) -> f64),
    Latency(&'static str, StatsOf, Percentile),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Percentile {
    Mean,
    P50,
    P99,
}

impl Metric {
    fn all() -> Vec<Metric> {
        let mut all = vec![
            Metric::Throughput("request_throughput", |s| s.request_throughput),
            Metric::Throughput("output_tok_s", |s| s.output_tok_s),
        ];
        let latencies: [(&'static str, StatsOf); 4] = [
            ("ttft", |s| &s.ttft),
            ("tpot", |s| &s.tpot),
            ("itl", |s| &s.itl),
            ("e2e", |s| &s.e2e),
        ];
        for (name, stats) in latencies {
            for p in [Percentile::Mean, Percentile::P50, Percentile::P99] {
                all.push(Metric::Latency(name, stats, p));
            }
        }
        all
    }

    fn name(self) -> String {
        match self {
            Metric::Throughput(name, _) => name.into(),
            Metric::Latency(name, _, p) => {
                let p = match p {
                    Percentile::Mean => "mean",
                    Percentile::P50 => "p50",
                    Percentile::P99 => "p99",
                };
                format!("{name}_{p}_ms")
            }
        }
    }

    fn better(self) -> Better {
        match self {
            Metric::Throughput(..) => Better::Higher,
            Metric::Latency(..) => Better::Lower,
        }
    }

    /// The run's value; `None` when it measured no such sample.
    fn value(self, s: &Summary) -> Option<f64> {
        match self {
            Metric::Throughput(_, f) => Some(f(s)),
            Metric::Latency(_, stats, p) => {
                let st = stats(s);
                (st.count > 0).then_some(match p {
                    Percentile::Mean => st.mean,
                    Percentile::P50 => st.median,
                    Percentile::P99 => st.p99,
                })
            }
        }
    }

    fn tolerance(self, gate: &Gate) -> f64 {
        match self {
            Metric::Throughput(..) => gate.throughput,
            Metric::Latency(_, _, Percentile::P99) => gate.p99,
            Metric::Latency("ttft", ..) => gate.ttft,
            Metric::Latency(..) => gate.latency,
        }
    }
}

/// Tolerances and the significance level, validated.
struct Gate {
    throughput: f64,
    ttft: f64,
    latency: f64,
    p99: f64,
    single_run: f64,
    alpha: f64,
}

impl Gate {
    fn from_args(args: &CompareArgs) -> Result<Gate, BenchError> {
        for (name, v) in [
            ("max-throughput-drop", args.max_throughput_drop),
            ("max-ttft-increase", args.max_ttft_increase),
            ("max-latency-increase", args.max_latency_increase),
            ("max-p99-increase", args.max_p99_increase),
            ("single-run-gate", args.single_run_gate),
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
            single_run: args.single_run_gate,
            alpha: args.alpha,
        })
    }
}

/// Change in the worse direction, percent; a zero baseline counts as an
/// unbounded change whichever way the candidate moved.
fn worse_pct(row: &Row) -> f64 {
    match row.delta_pct {
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
    }
}

/// A row's verdict: beyond its tolerance and beyond noise, which is
/// Holm-corrected Welch p < alpha with runs to test, or with one run (`single_run_gate`)
/// a change beyond that gate.
fn verdict(row: &Row, alpha: f64, single_run_gate: Option<f64>) -> Verdict {
    let worse = worse_pct(row);
    let beyond_noise = |change: f64| match single_run_gate {
        Some(gate) => change > gate,
        None => row.p_holm.is_none_or(|p| p < alpha),
    };
    if worse > row.tolerance_pct {
        if beyond_noise(worse) {
            Verdict::Regressed
        } else {
            Verdict::NotSignificant
        }
    } else if -worse > row.tolerance_pct && beyond_noise(-worse) {
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

/// One metric's row, its verdict still to decide (`decide`); `None` when
/// a side has no run that measured it.
fn row(metric: Metric, base: &Side, cand: &Side, gate: &Gate, mode: Mode) -> Option<Row> {
    let (a, b) = (
        base.values(|s| metric.value(s)),
        cand.values(|s| metric.value(s)),
    );
    let (ma, mb) = (ingot_stats::mean(&a)?, ingot_stats::mean(&b)?);
    let p_value = match mode {
        Mode::Runs => welch_t_test(&a, &b).map(|w| w.p),
        Mode::SingleRun => None,
    };
    Some(Row {
        metric: metric.name(),
        better: metric.better(),
        baseline: ma,
        candidate: mb,
        delta_pct: delta_pct(ma, mb),
        tolerance_pct: metric.tolerance(gate),
        p_value,
        p_holm: None,
        cohens_d: cohens_d(&a, &b),
        baseline_cv_pct: coefficient_of_variation(&a).map(|cv| cv * 100.0),
        verdict: Verdict::Ok,
    })
}

fn no_data(metric: Metric) -> Row {
    Row {
        metric: metric.name(),
        better: metric.better(),
        baseline: f64::NAN,
        candidate: f64::NAN,
        delta_pct: None,
        tolerance_pct: 0.0,
        p_value: None,
        p_holm: None,
        cohens_d: None,
        baseline_cv_pct: None,
        verdict: Verdict::NoData,
    }
}

/// Top-level configuration keys whose values differ (the output path, the
/// free-text label and the number of runs aside).
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
        .filter(|k| !matches!(k.as_str(), "out" | "label" | "repeat") && a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

/// Holm-corrects the rows' p-values as one family and sets each verdict.
fn decide(rows: &mut [Row], gate: &Gate, mode: Mode) {
    let tested: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].p_value.is_some())
        .collect();
    let p: Vec<f64> = tested.iter().filter_map(|&i| rows[i].p_value).collect();
    for (&i, adjusted) in tested.iter().zip(holm_adjust(&p)) {
        rows[i].p_holm = Some(adjusted);
    }
    let single_run_gate = (mode == Mode::SingleRun).then_some(gate.single_run);
    for row in rows {
        row.verdict = verdict(row, gate.alpha, single_run_gate);
    }
}

/// Compares two sides; pure, so tests call it on fabricated runs.
pub fn compare(base: &Side, cand: &Side, args: &CompareArgs) -> Result<Comparison, BenchError> {
    let gate = Gate::from_args(args)?;
    let mode = if base.runs.len() >= 2 && cand.runs.len() >= 2 {
        Mode::Runs
    } else {
        Mode::SingleRun
    };
    let (mut rows, mut missing): (Vec<Row>, Vec<Row>) = (Vec::new(), Vec::new());
    for m in Metric::all() {
        match row(m, base, cand, &gate, mode) {
            Some(r) => rows.push(r),
            None => missing.push(no_data(m)),
        }
    }
    decide(&mut rows, &gate, mode);
    rows.extend(missing);
    Ok(Comparison {
        baseline: base.files.clone(),
        candidate: cand.files.clone(),
        baseline_runs: base.runs.len(),
        candidate_runs: cand.runs.len(),
        mode,
        single_run_gate_pct: (mode == Mode::SingleRun).then_some(gate.single_run),
        alpha: gate.alpha,
        config_differences: config_differences(&base.config, &cand.config),
        regressed: rows.iter().any(|r| r.verdict == Verdict::Regressed),
        rows,
        baseline_cache_hit_rate: base.cache_hit_rate(),
        candidate_cache_hit_rate: cand.cache_hit_rate(),
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

/// The lines above the table: files, run counts, how it decides, caveats.
fn print_notes(c: &Comparison, base: &Side, cand: &Side) {
    let files = |f: &[PathBuf]| {
        f.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "baseline:  {} ({} run(s))",
        files(&c.baseline),
        c.baseline_runs
    );
    println!(
        "candidate: {} ({} run(s))",
        files(&c.candidate),
        c.candidate_runs
    );
    match (c.mode, c.single_run_gate_pct) {
        (Mode::SingleRun, Some(gate)) => println!(
            "note: one run on a side cannot separate noise from change (single runs of \
             one server differ by 20-50% on a shared machine); gating only on deltas \
             beyond {}% (--single-run-gate). Use `ingot bench serve --repeat 3` or \
             more on both sides for a test between runs.",
            num(gate)
        ),
        (Mode::Runs, _) if c.baseline_runs.min(c.candidate_runs) < 3 => {
            println!("note: 2 runs on a side make a weak test; 3 or more are recommended")
        }
        _ => {}
    }
    if !c.config_differences.is_empty() {
        println!(
            "note: the runs differ in {}",
            c.config_differences.join(", ")
        );
    }
    for (name, side) in [("baseline", base), ("candidate", cand)] {
        let partial = side.runs.iter().filter(|r| r.partial).count();
        if partial > 0 {
            println!("note: {partial} {name} run(s) were interrupted; their results are partial");
        }
        let failed: usize = side.runs.iter().map(|r| r.summary.failed).sum();
        if failed > 0 {
            let done: usize = side.runs.iter().map(|r| r.summary.completed).sum();
            println!(
                "note: the {name} runs had {failed} failed request(s) of {}",
                failed + done
            );
        }
    }
    if let Some(line) = cache_hit_rates(c) {
        println!("{line}");
    }
}

fn print_table(c: &Comparison, base: &Side, cand: &Side) {
    print_notes(c, base, cand);
    println!(
        "{:<20} {:>11} {:>11} {:>9} {:>9} {:>8} {:>8} {:>9}  verdict",
        "metric", "baseline", "candidate", "delta", "p (Holm)", "run cv", "d", "tolerance"
    );
    for r in &c.rows {
        let pct = |v: Option<f64>, sign: bool| match v {
            None => "-".into(),
            Some(v) if sign => format!("{v:+.1}%"),
            Some(v) => format!("{v:.1}%"),
        };
        let p = match r.p_holm {
            None => "-".into(),
            Some(p) if p < 0.001 => "<0.001".into(),
            Some(p) => format!("{p:.3}"),
        };
        let d = r
            .cohens_d
            .map_or_else(|| "-".into(), |d| format!("{d:+.2}"));
        let tol = match (r.verdict, r.better) {
            (Verdict::NoData, _) => "-".into(),
            (_, Better::Higher) => format!("-{:.1}%", r.tolerance_pct),
            (_, Better::Lower) => format!("+{:.1}%", r.tolerance_pct),
        };
        let verdict = match (r.verdict, c.mode) {
            (Verdict::Ok, _) => "ok",
            (Verdict::Improved, _) => "improved",
            (Verdict::NotSignificant, Mode::Runs) => "worse, not significant",
            (Verdict::NotSignificant, Mode::SingleRun) => "worse, within noise",
            (Verdict::Regressed, _) => "REGRESSED",
            (Verdict::NoData, _) => "no data",
        };
        println!(
            "{:<20} {:>11} {:>11} {:>9} {:>9} {:>8} {:>8} {:>9}  {verdict}",
            r.metric,
            num(r.baseline),
            num(r.candidate),
            pct(r.delta_pct, true),
            p,
            pct(r.baseline_cv_pct, false),
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
    match (failed.is_empty(), c.mode) {
        (true, Mode::Runs) => println!(
            "result: no regression ({} vs {} runs, alpha {})",
            c.baseline_runs, c.candidate_runs, c.alpha
        ),
        (true, Mode::SingleRun) => println!("result: no regression beyond the single-run gate"),
        (false, _) => println!("result: REGRESSION in {}", failed.join(", ")),
    }
}

/// "cache hit rate: baseline 37.5%, candidate -" when either side has one.
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
    let (base_files, cand_files) = file_lists(&args)?;
    let base = Side::load("baseline", &base_files)?;
    let cand = Side::load("candidate", &cand_files)?;
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
mod tests;
