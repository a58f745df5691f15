//! `ingot bench sweep`: `serve` at several request rates or concurrencies.
//!
//! Every other `serve` flag applies to each point unchanged, except the
//! seed: point i uses seed + i, so each point sends fresh prompts (with the
//! same prompts, a server's prefix cache would serve later points from
//! earlier ones and TTFT would measure cache hits). `--out-dir` receives one result file per
//! point (`rate-2.json`, `concurrency-4.json`; the `serve --out` schema, so
//! `compare` reads them), `summary.md` (a markdown table, rewritten after
//! each point so an interrupted sweep keeps what it measured) and three
//! plots, each as PNG and SVG: `throughput_latency` (output tok/s against
//! TTFT p50/p99 and E2E p50/p99, in load order), `ttft_cdf` and `itl_cdf`
//! (one curve per point).

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;

use crate::compare::num;
use crate::plot::{self, Chart, Series};
use crate::result::BenchResult;
use crate::runs::{base_url, check_serve_args, create_dir, write_json, write_text};
use crate::serve::{run_once, ServeArgs};
use crate::BenchError;

/// Flags of `ingot bench sweep`.
#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    /// Every `serve` flag, applied to each point.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Request rates to sweep (req/s, comma-separated; `inf`: all at once).
    #[arg(long, value_delimiter = ',', conflicts_with = "concurrencies")]
    pub request_rates: Vec<f64>,
    /// Concurrency limits to sweep (comma-separated), at `--request-rate`.
    #[arg(long, value_delimiter = ',')]
    pub concurrencies: Vec<usize>,
    /// Folder for the result files, `summary.md` and the plots.
    #[arg(long)]
    pub out_dir: PathBuf,
}

/// One load level of a sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Point {
    /// A request rate, req/s.
    Rate(f64),
    /// A concurrency limit.
    Concurrency(usize),
}

impl Point {
    /// Label for tables and legends: `rate=2`, `concurrency=4`.
    pub fn label(&self) -> String {
        match self {
            Point::Rate(r) => format!("rate={r}"),
            Point::Concurrency(c) => format!("concurrency={c}"),
        }
    }

    /// The request rate and concurrency limit this point sets.
    pub fn rate_and_concurrency(&self) -> (Option<f64>, Option<usize>) {
        match *self {
            Point::Rate(x) => (Some(x), None),
            Point::Concurrency(c) => (None, Some(c)),
        }
    }

    /// File name of the point's result.
    pub fn file_name(&self) -> String {
        match self {
            Point::Rate(r) => format!("rate-{r}.json"),
            Point::Concurrency(c) => format!("concurrency-{c}.json"),
        }
    }

    /// The `serve` options of this point.
    pub fn apply(&self, serve: &ServeArgs) -> ServeArgs {
        let mut s = serve.clone();
        match *self {
            Point::Rate(r) => s.request_rate = r,
            Point::Concurrency(c) => s.max_concurrency = Some(c),
        }
        s
    }
}

/// The points of the sweep, validated.
fn points(args: &SweepArgs) -> Result<Vec<Point>, BenchError> {
    let points: Vec<Point> = match (&args.request_rates[..], &args.concurrencies[..]) {
        ([], []) => {
            return Err(BenchError::Options(
                "give --request-rates (e.g. 1,2,4) or --concurrencies (e.g. 1,4,16)".into(),
            ))
        }
        (rates, []) => {
            if let Some(r) = rates.iter().find(|r| r.is_nan() || **r <= 0.0) {
                return Err(BenchError::Options(format!(
                    "--request-rates must be positive (or inf), got {r}"
                )));
            }
            rates.iter().map(|r| Point::Rate(*r)).collect()
        }
        ([], concs) => {
            if concs.contains(&0) {
                return Err(BenchError::Options(
                    "--concurrencies must be positive, got 0".into(),
                ));
            }
            concs.iter().map(|c| Point::Concurrency(*c)).collect()
        }
        _ => {
            return Err(BenchError::Options(
                "give --request-rates or --concurrencies, not both".into(),
            ))
        }
    };
    Ok(points)
}

/// The markdown table of a sweep.
pub fn summary_table(results: &[(Point, BenchResult)]) -> String {
    let mut t = String::from(
        "| point | req/s | out tok/s | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) \
         | ITL p50 (ms) | ITL p99 (ms) | E2E p50 (ms) | errors |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for (p, r) in results {
        let s = &r.summary;
        let errors = if s.failed == 0 {
            "0".to_string()
        } else {
            let kinds: Vec<String> = s.errors.iter().map(|(k, n)| format!("{k}: {n}")).collect();
            format!("{} ({})", s.failed, kinds.join(", "))
        };
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.label(),
            num(s.request_throughput),
            num(s.output_tok_s),
            num(s.ttft.median),
            num(s.ttft.p99),
            num(s.tpot.median),
            num(s.itl.median),
            num(s.itl.p99),
            num(s.e2e.median),
            errors
        );
    }
    t
}

fn summary_md(args: &SweepArgs, results: &[(Point, BenchResult)], plots: bool) -> String {
    let s = &args.serve;
    let mut md = String::from("# ingot bench sweep\n\n");
    let model = results.first().map_or_else(String::new, |(_, r)| {
        format!(", model `{}`", r.server.model)
    });
    let _ = writeln!(
        md,
        "Server {}{model}; {} per point, input {} / output {} tokens, seed {} (+ point index).\n",
        base_url(s),
        match s.duration {
            Some(d) => format!("{d} s"),
            None => format!("{} prompts", s.num_prompts),
        },
        s.input_len,
        s.output_len,
        s.seed
    );
    md.push_str(&summary_table(results));
    if plots {
        md.push_str(
            "\n![throughput vs latency](throughput_latency.png)\n\n\
             ![TTFT CDF](ttft_cdf.png)\n\n![ITL CDF](itl_cdf.png)\n",
        );
    }
    md
}

/// Draws the three plots of a sweep under `dir`.
pub fn write_plots(
    dir: &std::path::Path,
    results: &[(Point, BenchResult)],
) -> Result<(), BenchError> {
    let curve = |label: &str, f: fn(&BenchResult) -> f64| Series {
        label: label.into(),
        points: results
            .iter()
            .map(|(_, r)| (r.summary.output_tok_s, f(r)))
            .collect(),
        markers: true,
    };
    let vs_throughput = |title: &str, series| Chart {
        title: title.into(),
        x_label: "output throughput (tok/s)".into(),
        y_label: "latency (ms)".into(),
        series,
    };
    plot::write(
        &dir.join("throughput_latency"),
        &[
            vs_throughput(
                "TTFT vs throughput",
                vec![
                    curve("TTFT p50", |r| r.summary.ttft.median),
                    curve("TTFT p99", |r| r.summary.ttft.p99),
                ],
            ),
            vs_throughput(
                "E2E latency vs throughput",
                vec![
                    curve("E2E p50", |r| r.summary.e2e.median),
                    curve("E2E p99", |r| r.summary.e2e.p99),
                ],
            ),
        ],
    )?;
    let cdf = |title: &str, x_label: &str, samples: fn(&BenchResult) -> Vec<f64>| Chart {
        title: title.into(),
        x_label: x_label.into(),
        y_label: "fraction of requests".into(),
        series: results
            .iter()
            .map(|(p, r)| Series::cdf(p.label(), &samples(r)))
            .collect(),
    };
    plot::write(
        &dir.join("ttft_cdf"),
        &[cdf("TTFT CDF", "time to first token (ms)", |r| {
            r.requests
                .iter()
                .filter(|q| q.ok)
                .filter_map(|q| q.ttft_s)
                .map(|s| s * 1e3)
                .collect()
        })],
    )?;
    let mut itl = cdf("ITL CDF", "inter-token latency (ms)", |r| {
        r.requests
            .iter()
            .filter(|q| q.ok)
            .flat_map(|q| q.itl_s.iter().map(|s| s * 1e3))
            .collect()
    });
    itl.y_label = "fraction of token gaps".into();
    plot::write(&dir.join("itl_cdf"), &[itl])?;
    Ok(())
}

/// Runs the command; a sweep has no gate, so it returns `Ok(true)`.
pub fn run(args: SweepArgs) -> Result<bool, BenchError> {
    check_serve_args("sweep", &args.serve)?;
    let points = points(&args)?;
    create_dir(&args.out_dir)?;
    let mut results: Vec<(Point, BenchResult)> = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let mut serve = p.apply(&args.serve);
        serve.seed = args.serve.seed.wrapping_add(i as u64);
        if i > 0 {
            // The server is warm after the first point.
            serve.num_warmup = 0;
        }
        eprintln!("sweep point {}/{}: {}", i + 1, points.len(), p.label());
        let r = run_once(&serve, true)?;
        let path = args.out_dir.join(p.file_name());
        write_json(&path, &r)?;
        let partial = r.partial;
        results.push((*p, r));
        write_text(
            &args.out_dir.join("summary.md"),
            &summary_md(&args, &results, false),
        )?;
        if partial {
            eprintln!("sweep interrupted; keeping the points measured so far");
            break;
        }
    }
    write_plots(&args.out_dir, &results)?;
    let md = summary_md(&args, &results, true);
    write_text(&args.out_dir.join("summary.md"), &md)?;
    print!("{}", summary_table(&results));
    println!("wrote {}", args.out_dir.display());
    Ok(true)
}
