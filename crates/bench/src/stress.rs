//! `ingot bench stress`: raise the load step by step until the server
//! breaks, and report the highest load it sustained and how it broke.
//!
//! Steps are request rates (`--start-rate`, `+ --step` each step, up to
//! `--max-rate`) or the concurrency limits of `--concurrencies`. A step is
//! one `serve` run of `--num-prompts` prompts, or of `--step-duration`
//! seconds (`serve --duration`). A step **breaks** when more than
//! `--max-error-rate` of its requests fail, or, with `--slo`, when fewer
//! than `--min-slo-attainment` of its requests (failed ones count as
//! missing it) meet the SLO. The ramp stops at the first broken step; the
//! step before it is the maximum sustainable load. The failure mode is the
//! largest class of failures (timeouts, 429s, other errors) when errors
//! broke the step, else latency, naming the SLO bound missed most often.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use crate::compare::num;
use crate::result::{BenchResult, Slo};
use crate::runs::{check_serve_args, create_dir, seconds, write_json};
use crate::serve::{run_once, ServeArgs};
use crate::sweep::Point;
use crate::BenchError;

/// Flags of `ingot bench stress`.
#[derive(Args, Debug, Clone)]
pub struct StressArgs {
    /// Every `serve` flag (its `--slo` sets the bound a step must meet).
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Request rate of the first step, req/s.
    #[arg(long, default_value_t = 1.0)]
    pub start_rate: f64,
    /// Added to the rate at each step, req/s.
    #[arg(long, default_value_t = 1.0)]
    pub step: f64,
    /// Highest rate tried, req/s.
    #[arg(long, default_value_t = 16.0)]
    pub max_rate: f64,
    /// Ramp these concurrency limits instead of the rate (comma-separated).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["start_rate", "step", "max_rate"])]
    pub concurrencies: Vec<usize>,
    /// Seconds per step (default: one run of --num-prompts prompts).
    #[arg(long)]
    pub step_duration: Option<f64>,
    /// Largest fraction of a step's requests that may fail.
    #[arg(long, default_value_t = 0.01)]
    pub max_error_rate: f64,
    /// Smallest fraction of a step's requests that must meet --slo.
    #[arg(long, default_value_t = 0.9)]
    pub min_slo_attainment: f64,
    /// Folder for `stress.json` and one result file per step.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

/// How a step broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Requests timed out.
    Timeouts,
    /// The server refused requests with 429.
    RateLimited,
    /// Other errors: 5xx, transport, protocol.
    Errors,
    /// Requests completed but missed the SLO.
    Latency,
}

/// One step of the ramp.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// The offered load: `rate=…` or `concurrency=…`.
    pub load: String,
    /// The rate, when ramping rates.
    pub rate: Option<f64>,
    /// The concurrency, when ramping concurrency.
    pub concurrency: Option<usize>,
    /// Requests sent.
    pub requests: usize,
    /// Requests that failed.
    pub failed: usize,
    /// Failures by kind (`Summary::errors`).
    pub errors: BTreeMap<String, usize>,
    /// `failed / requests`.
    pub error_rate: f64,
    /// Fraction of requests meeting the SLO (with `--slo`).
    pub slo_attainment: Option<f64>,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Generated tokens per second.
    pub output_tok_s: f64,
    /// TTFT median, ms.
    pub ttft_p50_ms: f64,
    /// TTFT p99, ms.
    pub ttft_p99_ms: f64,
    /// TPOT median, ms.
    pub tpot_p50_ms: f64,
    /// E2E p99, ms.
    pub e2e_p99_ms: f64,
    /// The step held.
    pub passed: bool,
    /// How it broke.
    pub failure: Option<FailureMode>,
    /// Why, in words.
    pub reason: Option<String>,
}

/// The report (`stress.json`).
#[derive(Debug, Clone, Serialize)]
pub struct StressReport {
    /// `rate` or `concurrency`.
    pub ramp: String,
    /// The SLO checked, if any.
    pub slo: Option<Slo>,
    /// Error-rate bound.
    pub max_error_rate: f64,
    /// SLO attainment bound.
    pub min_slo_attainment: f64,
    /// Steps run, in order.
    pub steps: Vec<Step>,
    /// The highest load that held (rate or concurrency), if any did.
    pub max_sustainable: Option<f64>,
    /// How the first broken step broke (`None`: the ramp ended unbroken).
    pub failure: Option<FailureMode>,
    /// Why, in words.
    pub reason: Option<String>,
}

/// The loads of the ramp.
fn ramp(args: &StressArgs) -> Result<Vec<Point>, BenchError> {
    if !args.concurrencies.is_empty() {
        if args.concurrencies.contains(&0) {
            return Err(BenchError::Options(
                "--concurrencies must be positive, got 0".into(),
            ));
        }
        return Ok(args
            .concurrencies
            .iter()
            .map(|c| Point::Concurrency(*c))
            .collect());
    }
    let finite_pos = |v: f64| v.is_finite() && v > 0.0;
    if !(finite_pos(args.start_rate) && finite_pos(args.step) && finite_pos(args.max_rate)) {
        return Err(BenchError::Options(format!(
            "--start-rate, --step and --max-rate must be positive and finite, got {}, {}, {}",
            args.start_rate, args.step, args.max_rate
        )));
    }
    if args.max_rate < args.start_rate {
        return Err(BenchError::Options(format!(
            "--max-rate {} is below --start-rate {}",
            args.max_rate, args.start_rate
        )));
    }
    let n = ((args.max_rate - args.start_rate) / args.step + 1e-9).floor() as usize + 1;
    if n > 1000 {
        return Err(BenchError::Options(format!(
            "the ramp has {n} steps; raise --step or lower --max-rate"
        )));
    }
    Ok((0..n)
        .map(|i| Point::Rate(args.start_rate + args.step * i as f64))
        .collect())
}

/// Judges a step's result against the bounds.
fn judge(point: Point, r: &BenchResult, args: &StressArgs) -> Step {
    let s = &r.summary;
    let requests = s.completed + s.failed;
    let error_rate = if requests == 0 {
        1.0
    } else {
        s.failed as f64 / requests as f64
    };
    let slo = args.serve.slo;
    let slo_attainment = slo.map(|slo| {
        let met = r.requests.iter().filter(|q| slo.met_by(q)).count();
        met as f64 / r.requests.len().max(1) as f64
    });
    let (failure, reason) = if requests == 0 {
        (
            Some(FailureMode::Errors),
            Some("no request was sent".to_string()),
        )
    } else if error_rate > args.max_error_rate {
        let count = |k: &str| s.errors.get(k).copied().unwrap_or(0);
        let (timeouts, limited) = (count("timeout"), count("429"));
        let other = s.failed - timeouts - limited;
        let mode = if timeouts >= limited && timeouts >= other {
            FailureMode::Timeouts
        } else if limited >= other {
            FailureMode::RateLimited
        } else {
            FailureMode::Errors
        };
        let kinds: Vec<String> = s.errors.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        let reason = format!(
            "{} of {requests} requests failed ({:.1}% > {:.1}%; {})",
            s.failed,
            error_rate * 100.0,
            args.max_error_rate * 100.0,
            kinds.join(", ")
        );
        (Some(mode), Some(reason))
    } else {
        match (slo, slo_attainment) {
            (Some(slo), Some(att)) if att < args.min_slo_attainment => (
                Some(FailureMode::Latency),
                Some(format!(
                    "{:.1}% of requests met the SLO (< {:.1}%); {}",
                    att * 100.0,
                    args.min_slo_attainment * 100.0,
                    slo_misses(&slo, r)
                )),
            ),
            _ => (None, None),
        }
    };
    let (rate, concurrency) = point.rate_and_concurrency();
    Step {
        load: point.label(),
        rate,
        concurrency,
        requests,
        failed: s.failed,
        errors: s.errors.clone(),
        error_rate,
        slo_attainment,
        request_throughput: s.request_throughput,
        output_tok_s: s.output_tok_s,
        ttft_p50_ms: s.ttft.median,
        ttft_p99_ms: s.ttft.p99,
        tpot_p50_ms: s.tpot.median,
        e2e_p99_ms: s.e2e.p99,
        passed: failure.is_none(),
        failure,
        reason,
    }
}

/// A step whose server stopped answering.
fn unreachable(point: Point, message: String) -> Step {
    let (rate, concurrency) = point.rate_and_concurrency();
    Step {
        load: point.label(),
        rate,
        concurrency,
        requests: 0,
        failed: 0,
        errors: BTreeMap::new(),
        error_rate: 1.0,
        slo_attainment: None,
        request_throughput: 0.0,
        output_tok_s: 0.0,
        ttft_p50_ms: f64::NAN,
        ttft_p99_ms: f64::NAN,
        tpot_p50_ms: f64::NAN,
        e2e_p99_ms: f64::NAN,
        passed: false,
        failure: Some(FailureMode::Errors),
        reason: Some(format!("the server stopped answering: {message}")),
    }
}

/// Which SLO bounds completed requests missed, most missed first.
fn slo_misses(slo: &Slo, r: &BenchResult) -> String {
    let ok: Vec<_> = r.requests.iter().filter(|q| q.ok).collect();
    let over = |bound: Option<f64>,
                value: &dyn Fn(&crate::result::RequestRecord) -> Option<f64>| {
        bound.map(|b| {
            let n = ok
                .iter()
                .filter(|q| value(q).is_none_or(|v| v * 1e3 > b))
                .count();
            (n, b)
        })
    };
    let mut misses: Vec<(&str, usize, f64)> = [
        ("ttft", over(slo.ttft_ms, &|q| q.ttft_s)),
        ("tpot", over(slo.tpot_ms, &|q| q.tpot_s())),
        ("e2e", over(slo.e2e_ms, &|q| Some(q.e2e_s))),
    ]
    .into_iter()
    .filter_map(|(name, m)| m.map(|(n, b)| (name, n, b)))
    .collect();
    misses.sort_by_key(|m| std::cmp::Reverse(m.1));
    let parts: Vec<String> = misses
        .iter()
        .map(|(name, n, b)| format!("{name} over {b} ms: {n} of {}", ok.len()))
        .collect();
    parts.join(", ")
}

/// The serve options of one step.
fn step_args(point: Point, args: &StressArgs, first: bool) -> ServeArgs {
    let mut serve = point.apply(&args.serve);
    if !first {
        serve.num_warmup = 0;
    }
    serve.duration = args.step_duration;
    serve
}

fn print_table(report: &StressReport) {
    println!(
        "{:<18} {:>8} {:>9} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}  result",
        "load",
        "req/s",
        "out tok/s",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "E2E p99",
        "errors",
        "SLO met"
    );
    for s in &report.steps {
        let slo = s
            .slo_attainment
            .map_or_else(|| "-".into(), |a| format!("{:.1}%", a * 100.0));
        println!(
            "{:<18} {:>8} {:>9} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}  {}",
            s.load,
            num(s.request_throughput),
            num(s.output_tok_s),
            num(s.ttft_p50_ms),
            num(s.ttft_p99_ms),
            num(s.tpot_p50_ms),
            num(s.e2e_p99_ms),
            format!("{:.1}%", s.error_rate * 100.0),
            slo,
            if s.passed { "ok" } else { "BROKE" }
        );
    }
    let what = if report.ramp == "rate" {
        "request rate (req/s)"
    } else {
        "concurrency"
    };
    match report.max_sustainable {
        Some(m) => println!("max sustainable {what}: {m}"),
        None => println!("max sustainable {what}: none (the first step broke)"),
    }
    match (&report.failure, &report.reason) {
        (Some(f), Some(r)) => println!("failure mode: {f:?}: {r}"),
        _ => println!("failure mode: none; the ramp ended unbroken (raise the maximum)"),
    }
}

/// Runs the command. Finding the limit is the result, so it returns
/// `Ok(true)` whether or not a step broke.
pub fn run(args: StressArgs) -> Result<bool, BenchError> {
    check_serve_args("stress", &args.serve)?;
    for (flag, v) in [
        ("max-error-rate", args.max_error_rate),
        ("min-slo-attainment", args.min_slo_attainment),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return Err(BenchError::Options(format!(
                "--{flag} must be a fraction in [0, 1], got {v}"
            )));
        }
    }
    if args.serve.duration.is_some() {
        return Err(BenchError::Options(
            "ingot bench stress: give the length of each step as --step-duration".into(),
        ));
    }
    if let Some(d) = args.step_duration {
        seconds("step-duration", d)?;
    }
    let points = ramp(&args)?;
    if let Some(dir) = &args.out_dir {
        create_dir(dir)?;
    }
    let mut report = StressReport {
        ramp: if args.concurrencies.is_empty() {
            "rate"
        } else {
            "concurrency"
        }
        .into(),
        slo: args.serve.slo,
        max_error_rate: args.max_error_rate,
        min_slo_attainment: args.min_slo_attainment,
        steps: Vec::new(),
        max_sustainable: None,
        failure: None,
        reason: None,
    };
    for (i, p) in points.iter().enumerate() {
        eprintln!("stress step {}/{}: {}", i + 1, points.len(), p.label());
        let serve = step_args(*p, &args, i == 0);
        let (step, partial) = match run_once(&serve, true) {
            Ok(r) => {
                if let Some(dir) = &args.out_dir {
                    write_json(&dir.join(format!("step-{}-{}", i + 1, p.file_name())), &r)?;
                }
                (judge(*p, &r, &args), r.partial)
            }
            // A server that went away under load has broken; one that was
            // never reachable is a usage error.
            Err(BenchError::Server(message)) if i > 0 => (unreachable(*p, message), false),
            Err(e) => return Err(e),
        };
        let passed = step.passed;
        if passed {
            report.max_sustainable = Some(match p {
                Point::Rate(x) => *x,
                Point::Concurrency(c) => *c as f64,
            });
        } else {
            report.failure = step.failure;
            report.reason = step.reason.clone();
        }
        report.steps.push(step);
        if !passed || partial {
            break;
        }
    }
    if let Some(dir) = &args.out_dir {
        write_json(&dir.join("stress.json"), &report)?;
    }
    print_table(&report);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::{FailureKind, RequestRecord, Summary};

    fn result(ok: usize, failures: &[(FailureKind, Option<u16>)], ttft_s: f64) -> BenchResult {
        let mut requests: Vec<RequestRecord> = (0..ok)
            .map(|_| RequestRecord {
                ok: true,
                status: Some(200),
                output_tokens: 4,
                ttft_s: Some(ttft_s),
                e2e_s: ttft_s + 0.1,
                ..Default::default()
            })
            .collect();
        requests.extend(failures.iter().map(|(kind, status)| RequestRecord {
            status: *status,
            failure: Some(*kind),
            ..Default::default()
        }));
        BenchResult {
            summary: Summary::of(&requests, 1.0, None),
            requests,
            ..Default::default()
        }
    }

    fn judge_with(r: &BenchResult, slo: Option<Slo>) -> Step {
        with_args(slo, |args| judge(Point::Rate(2.0), r, args))
    }

    fn with_args<T>(slo: Option<Slo>, f: impl Fn(&StressArgs) -> T) -> T {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            stress: StressArgs,
        }
        let mut cli = Cli::try_parse_from(["stress"]).unwrap();
        cli.stress.serve.slo = slo;
        cli.stress.max_error_rate = 0.1;
        f(&cli.stress)
    }

    #[test]
    fn failure_modes() {
        let s = judge_with(&result(20, &[], 0.1), None);
        assert!(s.passed && s.failure.is_none());
        let timeout = (FailureKind::Timeout, None);
        let limited = (FailureKind::Status, Some(429));
        let server = (FailureKind::Status, Some(500));
        let s = judge_with(&result(10, &[timeout, timeout, limited], 0.1), None);
        assert_eq!(s.failure, Some(FailureMode::Timeouts));
        let s = judge_with(&result(10, &[limited, limited, timeout], 0.1), None);
        assert_eq!(s.failure, Some(FailureMode::RateLimited));
        let s = judge_with(&result(10, &[server, server, limited], 0.1), None);
        assert_eq!(s.failure, Some(FailureMode::Errors));
        // One failure in 20 is within 10%.
        assert!(judge_with(&result(19, &[server], 0.1), None).passed);
        let slo = Slo {
            ttft_ms: Some(50.0),
            ..Default::default()
        };
        let s = judge_with(&result(20, &[], 0.1), Some(slo));
        assert_eq!(s.failure, Some(FailureMode::Latency));
        assert_eq!(s.slo_attainment, Some(0.0));
        assert!(s.reason.unwrap().contains("ttft over 50 ms: 20 of 20"));
        assert!(judge_with(&result(20, &[], 0.01), Some(slo)).passed);
    }

    #[test]
    fn ramps() {
        with_args(None, |a| {
            let mut a = a.clone();
            (a.start_rate, a.step, a.max_rate) = (1.0, 1.5, 5.0);
            assert_eq!(
                ramp(&a).unwrap(),
                [Point::Rate(1.0), Point::Rate(2.5), Point::Rate(4.0)]
            );
            a.max_rate = 0.5;
            assert!(ramp(&a).is_err());
            a.concurrencies = vec![1, 4];
            assert_eq!(
                ramp(&a).unwrap(),
                [Point::Concurrency(1), Point::Concurrency(4)]
            );
            a.step_duration = Some(2.0);
            let s = step_args(Point::Concurrency(4), &a, false);
            assert_eq!(
                (s.duration, s.max_concurrency, s.num_warmup),
                (Some(2.0), Some(4), 0)
            );
        });
    }
}
