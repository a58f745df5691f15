//! `ingot bench soak`: hold a fixed load for `--duration` and watch for
//! drift: leaked memory, falling throughput, rising latency.
//!
//! The load is one `serve` run of `--duration` seconds at `--request-rate`
//! and/or `--max-concurrency` (no gaps or drains in between). Its requests
//! are cut into `--window`-second windows of the issuing period: latency
//! (TTFT, TPOT, E2E p50) from the requests started in a window, throughput
//! from the tokens streamed within it (each chunk's arrival is rebuilt
//! from TTFT and the inter-token gaps), so neither the ramp-up nor the
//! drain after the last request skews a window. Meanwhile a thread
//! samples, every `--sample-interval`, the server's `/metrics` (gauges and
//! counters) and its resident memory (`--server-pid`, or the owner of the
//! server's listening port when the server is on this machine).
//!
//! Drift is the least-squares line over time, not the last value minus the
//! first, so one noisy window or one allocator step does not decide: the
//! fitted change from the first to the last window (or sample), in percent
//! and per hour. The gate fails (`Ok(false)`, exit 1) when the fitted
//! output throughput falls by more than `--max-throughput-drop` percent,
//! the fitted TTFT p50 or E2E p50 rises by more than
//! `--max-latency-increase` percent, or the fitted RSS grows by more than
//! `--max-rss-growth-mb`. Trends need at least three windows (samples for
//! RSS); with fewer they are reported but not gated.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use hyper::Uri;
use serde::Serialize;

use crate::compare::num;
use crate::probe::{self, TextGetter};
use crate::result::{BenchResult, RequestRecord, Stats};
use crate::runs::{base_url, check_serve_args, create_dir, seconds, write_json};
use crate::serve::{run_once, ServeArgs};
use crate::BenchError;
use ingot_stats::least_squares;

/// Fewest points a trend is gated on.
const MIN_TREND_POINTS: usize = 3;

/// Flags of `ingot bench soak`.
#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    /// Every `serve` flag: the load held (`--duration` is required).
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Seconds per measurement window of the load.
    #[arg(long, default_value_t = 60.0)]
    pub window: f64,
    /// Seconds between samples of /metrics and the server's memory.
    #[arg(long, default_value_t = 10.0)]
    pub sample_interval: f64,
    /// The server's pid, for its RSS (default: the owner of the port, if local).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Prometheus endpoint (default: /metrics of the base URL's host).
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// Largest tolerated fitted RSS growth over the run, MiB (default: not gated).
    #[arg(long)]
    pub max_rss_growth_mb: Option<f64>,
    /// Largest tolerated fitted drop of output throughput, percent.
    #[arg(long, default_value_t = 10.0)]
    pub max_throughput_drop: f64,
    /// Largest tolerated fitted rise of TTFT p50 and E2E p50, percent.
    #[arg(long, default_value_t = 20.0)]
    pub max_latency_increase: f64,
    /// Folder for `soak.json` and the run's `result.json`.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

/// One sample of the server.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the soak started (windows count from the load's first
    /// measured request, after the model lookup and the warmup).
    pub t_s: f64,
    /// Resident memory, MiB.
    pub rss_mib: Option<f64>,
    /// Gauges and counters of /metrics.
    pub metrics: BTreeMap<String, f64>,
}

/// One window of the load.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    /// Start, seconds from the load's first measured request.
    pub start_s: f64,
    /// End, same clock.
    pub end_s: f64,
    /// Requests started in the window.
    pub requests: usize,
    /// Of those, the ones that failed.
    pub failed: usize,
    /// Requests completed within the window, per second.
    pub request_throughput: f64,
    /// Tokens streamed within the window, per second.
    pub output_tok_s: f64,
    /// TTFT median of the requests started in the window, ms.
    pub ttft_p50_ms: f64,
    /// TPOT median, same requests, ms.
    pub tpot_p50_ms: f64,
    /// E2E median, same requests, ms.
    pub e2e_p50_ms: f64,
}

impl Window {
    fn mid_s(&self) -> f64 {
        (self.start_s + self.end_s) / 2.0
    }
}

/// The fitted drift of one quantity.
#[derive(Debug, Clone, Serialize)]
pub struct Drift {
    /// What drifted, with its unit.
    pub metric: String,
    /// Points fitted.
    pub points: usize,
    /// Fitted value at the first point.
    pub start: f64,
    /// Fitted value at the last point.
    pub end: f64,
    /// `end - start`.
    pub change: f64,
    /// `change / start`, percent.
    pub change_pct: Option<f64>,
    /// Slope, units per hour.
    pub per_hour: f64,
    /// Slope relative to `start`, percent per hour.
    pub pct_per_hour: Option<f64>,
    /// The bound (percent, or MiB for RSS) and whether it is a drop.
    pub limit: Option<String>,
    /// Within the bound (or not gated).
    pub passed: bool,
}

/// Bound of a drift.
#[derive(Clone, Copy)]
enum Limit {
    DropPct(f64),
    RisePct(f64),
    RiseAbs(f64),
}

/// Fits `points` (seconds, value) and checks the fitted change.
fn drift(metric: &str, points: &[(f64, f64)], limit: Option<Limit>) -> Option<Drift> {
    let line = least_squares(points)?;
    let (t0, t1) = points
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.0), b.max(p.0))
        });
    let (start, end) = (line.at(t0), line.at(t1));
    let change = end - start;
    let rel = |x: f64| (start.abs() > 0.0).then(|| x / start * 100.0);
    let change_pct = rel(change);
    let gated = points.len() >= MIN_TREND_POINTS;
    let (limit_text, passed) = match limit {
        None => (None, true),
        Some(Limit::DropPct(p)) => (
            Some(format!("-{p}%")),
            !gated || change_pct.is_none_or(|c| c >= -p),
        ),
        Some(Limit::RisePct(p)) => (
            Some(format!("+{p}%")),
            !gated || change_pct.is_none_or(|c| c <= p),
        ),
        Some(Limit::RiseAbs(m)) => (Some(format!("+{m} MiB")), !gated || change <= m),
    };
    Some(Drift {
        metric: metric.into(),
        points: points.len(),
        start,
        end,
        change,
        change_pct,
        per_hour: line.slope * 3600.0,
        pct_per_hour: rel(line.slope * 3600.0),
        limit: limit_text,
        passed,
    })
}

/// First, last, smallest and largest value of a /metrics series.
#[derive(Debug, Clone, Serialize)]
pub struct SeriesRange {
    /// First sample.
    pub first: f64,
    /// Last sample.
    pub last: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

/// The report (`soak.json`).
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    /// Seconds the measured load ran, the drain after `--duration` included.
    pub duration_s: f64,
    /// The server's pid (given, or found by its port) when its memory was
    /// sampled.
    pub server_pid: Option<u32>,
    /// The load's batches.
    pub windows: Vec<Window>,
    /// Server samples.
    pub samples: Vec<Sample>,
    /// Fitted drifts.
    pub drift: Vec<Drift>,
    /// Each /metrics series over the run.
    pub metrics: BTreeMap<String, SeriesRange>,
    /// Requests that failed, all windows.
    pub failed: usize,
    /// Every drift within its bound.
    pub passed: bool,
}

/// Where the sampler looks.
struct Target {
    pid: Option<u32>,
    metrics: Option<Uri>,
    interval: Duration,
}

fn take_sample(
    t0: Instant,
    target: &Target,
    http: Option<&TextGetter>,
    warned: &mut bool,
) -> Sample {
    let metrics = match (http, &target.metrics) {
        (Some(http), Some(uri)) => {
            match http.get(uri, target.interval.min(Duration::from_secs(5))) {
                Ok(text) => probe::parse_prometheus(&text),
                Err(e) => {
                    if !*warned {
                        eprintln!("soak: server metrics unavailable: {e}");
                        *warned = true;
                    }
                    BTreeMap::new()
                }
            }
        }
        _ => BTreeMap::new(),
    };
    Sample {
        t_s: t0.elapsed().as_secs_f64(),
        rss_mib: target.pid.and_then(probe::rss_mib),
        metrics,
    }
}

/// Samples until `stop` fires or its sender is dropped, then once more.
fn sampler_task(t0: Instant, target: Target, stop: mpsc::Receiver<()>) -> Vec<Sample> {
    let http = TextGetter::new()
        .map_err(|e| eprintln!("soak: cannot sample /metrics: {e}"))
        .ok();
    let mut warned = false;
    let mut samples = Vec::new();
    let mut next = Instant::now();
    loop {
        samples.push(take_sample(t0, &target, http.as_ref(), &mut warned));
        next += target.interval;
        match stop.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            _ => break,
        }
    }
    samples.push(take_sample(t0, &target, http.as_ref(), &mut warned));
    samples
}

/// The server's pid: given, or found by its port when the server is local.
fn resolve_pid(args: &SoakArgs) -> Result<Option<u32>, BenchError> {
    if let Some(pid) = args.server_pid {
        if probe::rss_mib(pid).is_none() {
            return Err(BenchError::Options(format!(
                "--server-pid {pid}: cannot read /proc/{pid}/status"
            )));
        }
        return Ok(Some(pid));
    }
    let found = base_url(&args.serve).parse::<Uri>().ok().and_then(|u| {
        let host = u.host()?;
        let port = u.port_u16().unwrap_or(if u.scheme_str() == Some("https") {
            443
        } else {
            80
        });
        probe::is_local_host(host)
            .then(|| probe::find_listener_pid(port))
            .flatten()
    });
    if found.is_none() && args.max_rss_growth_mb.is_some() {
        return Err(BenchError::Options(
            "--max-rss-growth-mb needs the server's memory: pass --server-pid".into(),
        ));
    }
    Ok(found)
}

/// Cuts the issuing period `[0, period)` of a run into windows of about
/// `width` seconds (equal widths, at least one).
fn windows(r: &BenchResult, period: f64, width: f64) -> Vec<Window> {
    let n = ((period / width).round() as usize).max(1);
    let width = period / n as f64;
    let ok: Vec<&RequestRecord> = r.requests.iter().filter(|q| q.ok).collect();
    // Arrival time of every streamed chunk, weighted so a request's chunks
    // add up to its output tokens (a chunk may carry several tokens).
    let mut chunks: Vec<(f64, f64)> = Vec::new();
    for q in &ok {
        let Some(ttft) = q.ttft_s else { continue };
        let weight = q.output_tokens as f64 / (q.itl_s.len() + 1) as f64;
        let mut t = q.start_s + ttft;
        chunks.push((t, weight));
        for gap in &q.itl_s {
            t += gap;
            chunks.push((t, weight));
        }
    }
    (0..n)
        .map(|i| {
            let (a, b) = (i as f64 * width, (i + 1) as f64 * width);
            let inside = |t: f64| t >= a && t < b;
            let started: Vec<&RequestRecord> =
                r.requests.iter().filter(|q| inside(q.start_s)).collect();
            let done: Vec<&&RequestRecord> = started.iter().filter(|q| q.ok).collect();
            let finished = ok.iter().filter(|q| inside(q.start_s + q.e2e_s)).count();
            let tokens: f64 = chunks.iter().filter(|c| inside(c.0)).map(|c| c.1).sum();
            Window {
                start_s: a,
                end_s: b,
                requests: started.len(),
                failed: started.len() - done.len(),
                request_throughput: finished as f64 / width,
                output_tok_s: tokens / width,
                ttft_p50_ms: Stats::from_seconds(done.iter().filter_map(|q| q.ttft_s)).median,
                tpot_p50_ms: Stats::from_seconds(done.iter().filter_map(|q| q.tpot_s())).median,
                e2e_p50_ms: Stats::from_seconds(done.iter().map(|q| q.e2e_s)).median,
            }
        })
        .collect()
}

/// Drifts and the verdict of a finished soak.
fn analyse(args: &SoakArgs, windows: &[Window], samples: &[Sample]) -> (Vec<Drift>, bool) {
    let over = |f: fn(&Window) -> f64| -> Vec<(f64, f64)> {
        windows
            .iter()
            .filter(|w| w.requests > w.failed)
            .map(|w| (w.mid_s(), f(w)))
            .collect()
    };
    let rss: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| s.rss_mib.map(|m| (s.t_s, m)))
        .collect();
    // Throughput counts failed windows too: a dead server's rate is 0.
    let throughput: Vec<(f64, f64)> = windows
        .iter()
        .map(|w| (w.mid_s(), w.output_tok_s))
        .collect();
    let drifts: Vec<Drift> = [
        drift(
            "output tok/s",
            &throughput,
            Some(Limit::DropPct(args.max_throughput_drop)),
        ),
        drift(
            "TTFT p50 (ms)",
            &over(|w| w.ttft_p50_ms),
            Some(Limit::RisePct(args.max_latency_increase)),
        ),
        drift(
            "E2E p50 (ms)",
            &over(|w| w.e2e_p50_ms),
            Some(Limit::RisePct(args.max_latency_increase)),
        ),
        drift("TPOT p50 (ms)", &over(|w| w.tpot_p50_ms), None),
        drift(
            "RSS (MiB)",
            &rss,
            args.max_rss_growth_mb.map(Limit::RiseAbs),
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    let passed = drifts.iter().all(|d| d.passed);
    (drifts, passed)
}

fn series_ranges(samples: &[Sample]) -> BTreeMap<String, SeriesRange> {
    let mut out: BTreeMap<String, SeriesRange> = BTreeMap::new();
    for s in samples {
        for (k, &v) in &s.metrics {
            out.entry(k.clone())
                .and_modify(|r| {
                    r.last = v;
                    r.min = r.min.min(v);
                    r.max = r.max.max(v);
                })
                .or_insert(SeriesRange {
                    first: v,
                    last: v,
                    min: v,
                    max: v,
                });
        }
    }
    out
}

fn print_report(r: &SoakReport) {
    println!(
        "{:>6} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>7}",
        "window",
        "start s",
        "end s",
        "req/s",
        "out tok/s",
        "TTFT p50",
        "TPOT p50",
        "E2E p50",
        "failed"
    );
    for (i, w) in r.windows.iter().enumerate() {
        println!(
            "{:>6} {:>8.1} {:>8.1} {:>8} {:>10} {:>10} {:>10} {:>10} {:>7}",
            i + 1,
            w.start_s,
            w.end_s,
            num(w.request_throughput),
            num(w.output_tok_s),
            num(w.ttft_p50_ms),
            num(w.tpot_p50_ms),
            num(w.e2e_p50_ms),
            w.failed
        );
    }
    println!(
        "{:<14} {:>6} {:>10} {:>10} {:>10} {:>8} {:>10} {:>10}  result",
        "drift (fitted)", "points", "start", "end", "change", "change", "per hour", "limit"
    );
    for d in &r.drift {
        let pct = |p: Option<f64>| p.map_or_else(|| "-".into(), |p| format!("{p:+.1}%"));
        let result = if !d.passed {
            "FAILED"
        } else if d.limit.is_some() && d.points < MIN_TREND_POINTS {
            "too few points to gate"
        } else {
            "ok"
        };
        println!(
            "{:<14} {:>6} {:>10} {:>10} {:>10} {:>8} {:>10} {:>10}  {result}",
            d.metric,
            d.points,
            num(d.start),
            num(d.end),
            format!("{}{}", if d.change > 0.0 { "+" } else { "" }, num(d.change)),
            pct(d.change_pct),
            format!(
                "{}{}",
                if d.per_hour > 0.0 { "+" } else { "" },
                num(d.per_hour)
            ),
            d.limit.as_deref().unwrap_or("-"),
        );
    }
    if !r.metrics.is_empty() {
        println!("server metrics (first -> last, min..max):");
        for (k, s) in &r.metrics {
            println!(
                "  {k}: {} -> {} ({}..{})",
                num(s.first),
                num(s.last),
                num(s.min),
                num(s.max)
            );
        }
    }
    match r.server_pid {
        Some(pid) => println!("server pid: {pid}"),
        None => println!("server memory not sampled (pass --server-pid)"),
    }
    println!(
        "result: {} ({} windows over {:.1} s, {} failed requests)",
        if r.passed { "PASS" } else { "FAIL" },
        r.windows.len(),
        r.duration_s,
        r.failed
    );
}

/// Runs the command; `Ok(false)` when a drift exceeds its bound.
pub fn run(args: SoakArgs) -> Result<bool, BenchError> {
    check_serve_args("soak", &args.serve)?;
    let Some(duration) = args.serve.duration else {
        return Err(BenchError::Options(
            "ingot bench soak needs --duration SECONDS (with --max-concurrency or a finite --request-rate)"
                .into(),
        ));
    };
    let duration = seconds("duration", duration)?;
    let width = seconds("window", args.window)?;
    let interval = seconds("sample-interval", args.sample_interval)?;
    for (flag, v) in [
        ("max-throughput-drop", args.max_throughput_drop),
        ("max-latency-increase", args.max_latency_increase),
        ("max-rss-growth-mb", args.max_rss_growth_mb.unwrap_or(0.0)),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(BenchError::Options(format!(
                "--{flag} must be non-negative, got {v}"
            )));
        }
    }
    let metrics = match &args.metrics_url {
        Some(u) => u
            .parse::<Uri>()
            .map_err(|e| BenchError::Options(format!("invalid --metrics-url {u:?}: {e}")))?,
        None => probe::metrics_url(&base_url(&args.serve)).map_err(BenchError::Options)?,
    };
    let pid = resolve_pid(&args)?;
    if let Some(dir) = &args.out_dir {
        create_dir(dir)?;
    }
    let t0 = Instant::now();
    let (stop_tx, stop_rx) = mpsc::channel();
    let target = Target {
        pid,
        metrics: Some(metrics),
        interval,
    };
    let sampler = std::thread::Builder::new()
        .name("soak-sampler".into())
        .spawn(move || sampler_task(t0, target, stop_rx))
        .map_err(|e| BenchError::Options(format!("cannot start the sampler thread: {e}")))?;
    let result = run_once(&args.serve, true);
    let _ = stop_tx.send(());
    let samples = sampler.join().unwrap_or_default();
    let result = result?;
    // The issuing period: the whole --duration, or up to the interruption.
    let period = if result.partial {
        result.summary.duration_s.min(duration.as_secs_f64())
    } else {
        duration.as_secs_f64()
    };
    let windows = windows(&result, period, width.as_secs_f64());
    let (drift, passed) = analyse(&args, &windows, &samples);
    let report = SoakReport {
        duration_s: result.summary.duration_s,
        server_pid: pid,
        failed: result.summary.failed,
        metrics: series_ranges(&samples),
        windows,
        samples,
        drift,
        passed,
    };
    if let Some(dir) = &args.out_dir {
        write_json(&dir.join("soak.json"), &report)?;
        write_json(&dir.join("result.json"), &result)?;
    }
    print_report(&report);
    Ok(passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(i: usize, tok_s: f64, ttft: f64) -> Window {
        Window {
            start_s: i as f64 * 10.0,
            end_s: i as f64 * 10.0 + 10.0,
            requests: 10,
            failed: 0,
            request_throughput: tok_s / 4.0,
            output_tok_s: tok_s,
            ttft_p50_ms: ttft,
            tpot_p50_ms: 25.0,
            e2e_p50_ms: ttft + 75.0,
        }
    }

    fn args() -> SoakArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            soak: SoakArgs,
        }
        Cli::try_parse_from(["soak", "--duration", "1"])
            .unwrap()
            .soak
    }

    #[test]
    fn steady_load_passes() {
        let windows: Vec<Window> = (0..5).map(|i| w(i, 40.0 + (i % 2) as f64, 100.0)).collect();
        let (drift, passed) = analyse(&args(), &windows, &[]);
        assert!(passed, "{drift:#?}");
        assert_eq!(drift.len(), 4); // no RSS samples
    }

    #[test]
    fn falling_throughput_and_rising_latency_fail() {
        let windows: Vec<Window> = (0..5).map(|i| w(i, 40.0 - 4.0 * i as f64, 100.0)).collect();
        let (drift, passed) = analyse(&args(), &windows, &[]);
        assert!(!passed);
        let d = drift.iter().find(|d| d.metric == "output tok/s").unwrap();
        assert!((d.change_pct.unwrap() + 40.0).abs() < 1e-9, "{d:?}");
        assert!(!d.passed);

        let windows: Vec<Window> = (0..5)
            .map(|i| w(i, 40.0, 100.0 + 10.0 * i as f64))
            .collect();
        let (drift, passed) = analyse(&args(), &windows, &[]);
        assert!(!passed);
        assert!(
            !drift
                .iter()
                .find(|d| d.metric == "TTFT p50 (ms)")
                .unwrap()
                .passed
        );
        // Two windows are reported, not gated.
        let (_, passed) = analyse(&args(), &windows[..2], &[]);
        assert!(passed);
    }

    #[test]
    fn rss_growth_is_fitted_and_gated() {
        let samples: Vec<Sample> = (0..7)
            .map(|i| Sample {
                t_s: i as f64 * 600.0,
                rss_mib: Some(500.0 + 10.0 * i as f64),
                metrics: BTreeMap::from([("g".to_string(), i as f64)]),
            })
            .collect();
        let mut a = args();
        a.max_rss_growth_mb = Some(100.0);
        let (drift, passed) = analyse(&a, &[], &samples);
        let d = drift.iter().find(|d| d.metric == "RSS (MiB)").unwrap();
        assert!((d.change - 60.0).abs() < 1e-9 && (d.per_hour - 60.0).abs() < 1e-9);
        assert!(passed);
        a.max_rss_growth_mb = Some(50.0);
        assert!(!analyse(&a, &[], &samples).1);
        let r = series_ranges(&samples);
        assert_eq!((r["g"].first, r["g"].last, r["g"].max), (0.0, 6.0, 6.0));
    }

    #[test]
    fn windows_count_streamed_tokens_not_the_drain() {
        // A request every 0.5 s over 10 s: TTFT 0.15 s, 4 tokens 0.1 s apart.
        let requests: Vec<RequestRecord> = (0..20)
            .map(|i| RequestRecord {
                ok: true,
                output_tokens: 4,
                start_s: i as f64 * 0.5,
                ttft_s: Some(0.15),
                itl_s: vec![0.1; 3],
                e2e_s: 0.45,
                ..Default::default()
            })
            .collect();
        let r = BenchResult {
            requests,
            ..Default::default()
        };
        let w = windows(&r, 10.0, 2.4); // rounds to 4 windows of 2.5 s
        assert_eq!(w.len(), 4);
        assert_eq!((w[0].start_s, w[3].end_s), (0.0, 10.0));
        for x in &w {
            assert_eq!(x.requests, 5);
            assert!((x.output_tok_s - 8.0).abs() < 1e-9, "{x:?}");
            assert!((x.ttft_p50_ms - 150.0).abs() < 1e-9);
            assert!((x.tpot_p50_ms - 100.0).abs() < 1e-9);
            assert!((x.request_throughput - 2.0).abs() < 1e-9);
        }
    }
}
