//! End-to-end tests of `ingot bench compare | sweep | stress | soak`: the
//! real binary, on fabricated result files and against a real `ingot
//! serve` of the test model (tiny prompts: the CPU server does ~40 tok/s).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ingot_bench::result::{BenchResult, RequestRecord, Summary};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

fn ingot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the ingot binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// A run of `n` requests: TTFT ~ N(100, 10) ms, 4 tokens 25 ms apart
/// (± 2 ms), over `duration` seconds.
fn fabricated(seed: u64, n: usize, duration: f64) -> BenchResult {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Sum of 12 uniforms - 6: a standard normal, near enough.
    let mut normal = move || (0..12).map(|_| rng.random::<f64>()).sum::<f64>() - 6.0;
    let requests: Vec<RequestRecord> = (0..n)
        .map(|i| {
            let ttft = (100.0 + 10.0 * normal()) / 1e3;
            let itl: Vec<f64> = (0..3).map(|_| (25.0 + 2.0 * normal()) / 1e3).collect();
            RequestRecord {
                ok: true,
                status: Some(200),
                prompt_tokens: 16,
                output_tokens: 4,
                start_s: i as f64 * duration / n as f64,
                ttft_s: Some(ttft),
                e2e_s: ttft + itl.iter().sum::<f64>(),
                itl_s: itl,
                ..Default::default()
            }
        })
        .collect();
    BenchResult {
        config: serde_json::json!({"input_len": 16, "output_len": 4}),
        summary: Summary::of(&requests, duration, None),
        requests,
        ..Default::default()
    }
}

/// The row of `metric` in `ingot bench compare --json` output.
fn metric_row<'a>(j: &'a Value, metric: &str) -> &'a Value {
    j["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["metric"] == metric)
        .unwrap()
}

fn write_result(dir: &Path, name: &str, r: &BenchResult) -> String {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec(r).unwrap()).unwrap();
    path.display().to_string()
}

#[test]
fn compare_passes_same_distribution_and_fails_a_throughput_drop() {
    let dir = tempfile::tempdir().unwrap();
    let a = write_result(dir.path(), "a.json", &fabricated(1, 200, 20.0));
    let b = write_result(dir.path(), "b.json", &fabricated(2, 200, 20.0));
    let o = ingot(&["bench", "compare", &a, &b]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("no regression"), "{}", stdout(&o));
    for metric in [
        "request_throughput",
        "ttft_p99_ms",
        "itl_mean_ms",
        "e2e_p50_ms",
    ] {
        assert!(stdout(&o).contains(metric), "{}", stdout(&o));
    }

    // The same requests served 30% slower in aggregate: throughput alone.
    // They arrive over the longer run, so every throughput window shows
    // the drop (the test is over windows, not the summary alone).
    let slow = fabricated(2, 200, 20.0 / 0.7);
    let c = write_result(dir.path(), "slow.json", &slow);
    // One run a side: 30% is within the default single-run gate (50%) ...
    let o = ingot(&["bench", "compare", &a, &c]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("worse, within noise"), "{}", stdout(&o));
    // ... and beyond a narrower one.
    let o = ingot(&["bench", "compare", &a, &c, "--single-run-gate", "25"]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("REGRESSION in request_throughput, output_tok_s"),
        "{out}"
    );
    assert!(!out.contains("error:"), "{out}");

    // A looser tolerance lets it through; --json is machine-readable.
    let o = ingot(&[
        "bench",
        "compare",
        &a,
        &c,
        "--max-throughput-drop",
        "35",
        "--single-run-gate",
        "25",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let j: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["regressed"], false);
    let row = &j["rows"][0];
    assert_eq!(row["metric"], "request_throughput");
    assert!(
        (row["delta_pct"].as_f64().unwrap() + 30.0).abs() < 1e-6,
        "{row}"
    );
    // One run a side: no test, the wide gate (or a wider tolerance).
    assert_eq!(j["mode"], "single_run");
    assert_eq!(row["tolerance_pct"], 35.0);
    let ttft = metric_row(&j, "ttft_mean_ms");
    assert_eq!(ttft["p_value"], Value::Null);
    assert_eq!(ttft["tolerance_pct"], 10.0);
    assert_eq!(j["single_run_gate_pct"], 25.0);
}

/// `fabricated` runs with TTFT scaled by `ttft_scale`, `n` files from `seed`.
fn fabricated_files(dir: &Path, name: &str, seed: u64, n: u64, ttft_scale: f64) -> Vec<String> {
    (0..n)
        .map(|i| {
            let mut r = fabricated(seed + i, 100, 10.0);
            for q in &mut r.requests {
                q.ttft_s = q.ttft_s.map(|t| t * ttft_scale);
            }
            r.summary = Summary::of(&r.requests, 10.0, None);
            write_result(dir, &format!("{name}{i}.json"), &r)
        })
        .collect()
}

#[test]
fn compare_tests_between_runs_of_several_files() {
    let dir = tempfile::tempdir().unwrap();
    let a = fabricated_files(dir.path(), "a", 10, 3, 1.0);
    let b = fabricated_files(dir.path(), "b", 20, 3, 1.0);
    let slow = fabricated_files(dir.path(), "slow", 30, 3, 1.3);
    fn side(flag: &str, files: &[String]) -> Vec<String> {
        std::iter::once(flag.to_string())
            .chain(files.iter().cloned())
            .collect()
    }
    let argv = |base: &[String], cand: &[String]| -> Vec<String> {
        ["bench", "compare"]
            .into_iter()
            .map(String::from)
            .chain(side("--baseline", base))
            .chain(side("--candidate", cand))
            .collect()
    };
    let run = |v: Vec<String>| ingot(&v.iter().map(String::as_str).collect::<Vec<_>>());
    let o = run(argv(&a, &b));
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("(3 run(s))"), "{out}");
    assert!(out.contains("no regression (3 vs 3 runs"), "{out}");
    assert!(!out.contains("cannot separate noise"), "{out}");

    // +30% TTFT in every run: the runs' means differ beyond the tolerance
    // and beyond their run-to-run spread.
    let o = run(argv(&a, &slow));
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("REGRESSION in ttft_mean_ms, ttft_p50_ms, ttft_p99_ms"),
        "{}",
        stdout(&o)
    );

    // One file holding the three runs (`--repeat 3`) reads as three runs.
    let mut many = fabricated(10, 100, 10.0);
    many.runs = a
        .iter()
        .map(|p| {
            let r: BenchResult = serde_json::from_value(read_json(Path::new(p))).unwrap();
            r.run_summaries().remove(0)
        })
        .collect();
    let many = write_result(dir.path(), "many.json", &many);
    let mut v = argv(&[many], &slow);
    v.push("--json".into());
    let o = run(v);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let j: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (j["mode"].as_str(), j["baseline_runs"].as_u64()),
        (Some("runs"), Some(3))
    );
    let ttft = metric_row(&j, "ttft_mean_ms");
    assert!(ttft["p_value"].as_f64().unwrap() < 0.05, "{ttft}");
}

#[test]
fn compare_of_single_runs_fails_a_latency_regression_beyond_the_wide_gate() {
    let dir = tempfile::tempdir().unwrap();
    let a = write_result(dir.path(), "a.json", &fabricated(1, 100, 10.0));
    let mut worse = fabricated(2, 100, 10.0);
    for q in &mut worse.requests {
        q.ttft_s = q.ttft_s.map(|t| t * 1.6);
    }
    worse.summary = Summary::of(&worse.requests, 10.0, None);
    let b = write_result(dir.path(), "b.json", &worse);
    let o = ingot(&["bench", "compare", &a, &b]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("REGRESSION in ttft_mean_ms, ttft_p50_ms, ttft_p99_ms"),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("cannot separate noise from change"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn compare_reports_bad_files_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let a = write_result(dir.path(), "a.json", &fabricated(1, 10, 1.0));
    let missing = dir.path().join("missing.json").display().to_string();
    let o = ingot(&["bench", "compare", &a, &missing]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.starts_with("error: ") && err.contains("missing.json"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"summary": 3}"#).unwrap();
    let o = ingot(&["bench", "compare", &bad.display().to_string(), &a]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("bad.json") && err.contains("invalid result file"),
        "{err}"
    );

    let o = ingot(&["bench", "compare", &a, &a, "--alpha", "2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--alpha"), "{}", stderr(&o));

    let o = ingot(&["bench", "compare", &a]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--baseline FILE"), "{}", stderr(&o));
}

/// `ingot serve` of the test model on a free port; killed on drop.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start() -> Server {
        let model = ingot_testkit::smollm2_gguf().display().to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_ingot"))
            .args([
                "serve",
                "--model",
                &model,
                "--port",
                "0",
                "--max-num-seqs",
                "4",
            ])
            .env("INGOT_THREADS", "2")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("the server prints its address")
                .unwrap();
            if let Some(addr) = line.strip_prefix("listening on ") {
                break addr.trim().to_string();
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let server = Server { child, url };
        let start = Instant::now();
        while server.get_status("/ready") != Some(200) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "server not ready"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn get_status(&self, path: &str) -> Option<u16> {
        let addr = self.url.strip_prefix("http://")?;
        let mut s = TcpStream::connect(addr).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
        let mut head = String::new();
        s.read_to_string(&mut head).ok()?;
        head.split_whitespace().nth(1)?.parse().ok()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Checks a PNG's signature and its IHDR size.
fn assert_png(path: &Path, size: (u32, u32)) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().unwrap());
    assert_eq!((be(16), be(20)), size, "{}", path.display());
}

fn assert_svg(path: &Path, text: &str) {
    let svg = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        svg.contains("<svg") && svg.trim_end().ends_with("</svg>"),
        "{}",
        path.display()
    );
    assert!(svg.contains(text), "{} lacks {text:?}", path.display());
}

/// One server for every scenario, run one after another (parallel load
/// would distort each other's numbers on a 2-core machine).
#[test]
fn bench_tools_against_a_real_server() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    let path = |name: &str| d(name).display().to_string();
    let workload = [
        "--base-url",
        &server.url,
        "--input-len",
        "16",
        "--output-len",
        "4",
        "--ignore-eos",
    ];
    let run = |extra: &[&str]| {
        let started = Instant::now();
        let o = ingot(&[&["bench"], extra, &workload[..]].concat());
        eprintln!(
            "{:?}: {:.1} s",
            &extra[..2],
            started.elapsed().as_secs_f64()
        );
        o
    };

    // sweep: two concurrency points, result files, table, plots.
    let o = run(&[
        "sweep",
        "--concurrencies",
        "1,4",
        "--num-prompts",
        "4",
        "--out-dir",
        &path("sweep"),
    ]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    for point in ["concurrency-1.json", "concurrency-4.json"] {
        let r = read_json(&d("sweep").join(point));
        assert_eq!(r["summary"]["completed"], 4, "{point}");
        assert_eq!(r["summary"]["failed"], 0, "{point}");
    }
    let md = std::fs::read_to_string(d("sweep").join("summary.md")).unwrap();
    assert!(
        md.contains("| point | req/s | out tok/s | TTFT p50 (ms) |"),
        "{md}"
    );
    assert!(
        md.contains("| concurrency=1 |") && md.contains("| concurrency=4 |"),
        "{md}"
    );
    assert_png(&d("sweep").join("throughput_latency.png"), (1280, 480));
    assert_png(&d("sweep").join("ttft_cdf.png"), (640, 480));
    assert_png(&d("sweep").join("itl_cdf.png"), (640, 480));
    assert_svg(&d("sweep").join("throughput_latency.svg"), "TTFT p99");
    assert_svg(&d("sweep").join("ttft_cdf.svg"), "concurrency=4");
    assert_svg(&d("sweep").join("itl_cdf.svg"), "inter-token latency");

    // serve twice, two runs each, same options: compare passes. The
    // tolerances are wide: this machine is shared with builds, and two
    // runs a side make a weak test; the defaults are checked on fabricated
    // files above.
    for name in ["a.json", "b.json"] {
        let o = run(&[
            "serve",
            "--num-prompts",
            "4",
            "--repeat",
            "2",
            "--max-concurrency",
            "4",
            "--num-warmup",
            "2",
            "--out",
            &path(name),
        ]);
        assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
        let r = read_json(&d(name));
        let runs = r["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 2, "{r}");
        assert_eq!(
            (runs[0]["seed"].as_u64(), runs[1]["seed"].as_u64()),
            (Some(0), Some(1))
        );
        assert_eq!(r["summary"]["completed"], 8);
        assert_eq!(r["requests"][7]["run"], 1);
    }
    let o = ingot(&[
        "bench",
        "compare",
        &path("a.json"),
        &path("b.json"),
        "--max-throughput-drop",
        "60",
        "--max-ttft-increase",
        "300",
        "--max-latency-increase",
        "300",
        "--max-p99-increase",
        "500",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));

    // stress: two concurrency steps that hold (no SLO, no errors).
    let o = run(&[
        "stress",
        "--concurrencies",
        "1,2",
        "--step-duration",
        "1",
        "--out-dir",
        &path("stress"),
    ]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let r = read_json(&d("stress").join("stress.json"));
    assert_eq!(r["ramp"], "concurrency");
    assert_eq!(r["steps"].as_array().unwrap().len(), 2, "{r}");
    assert_eq!(r["max_sustainable"], 2.0, "{r}");
    assert_eq!(r["failure"], Value::Null);
    assert!(
        stdout(&o).contains("max sustainable concurrency: 2"),
        "{}",
        stdout(&o)
    );
    // ... and an SLO no server meets breaks the first step on latency.
    let o = run(&[
        "stress",
        "--start-rate",
        "4",
        "--max-rate",
        "8",
        "--num-prompts",
        "2",
        "--slo",
        "ttft=0.01",
        "--out-dir",
        &path("stress2"),
    ]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let r = read_json(&d("stress2").join("stress.json"));
    assert_eq!(r["steps"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["max_sustainable"], Value::Null);
    assert_eq!(r["failure"], "latency");
    assert!(
        r["reason"].as_str().unwrap().contains("ttft over 0.01 ms"),
        "{r}"
    );

    // soak: 3 s in 1 s windows, /metrics and RSS sampled (pid by port).
    let o = run(&[
        "soak",
        "--duration",
        "3",
        "--window",
        "1",
        "--sample-interval",
        "0.5",
        "--max-concurrency",
        "2",
        "--max-throughput-drop",
        "100",
        "--max-latency-increase",
        "1000",
        "--max-rss-growth-mb",
        "1024",
        "--out-dir",
        &path("soak"),
    ]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let r = read_json(&d("soak").join("soak.json"));
    assert_eq!(r["passed"], true);
    assert_eq!(r["server_pid"], server.child.id());
    assert_eq!(r["windows"].as_array().unwrap().len(), 3, "{r}");
    let samples = r["samples"].as_array().unwrap();
    assert!(samples.len() >= 4, "{}", samples.len());
    assert!(samples
        .iter()
        .all(|s| s["rss_mib"].as_f64().unwrap() > 10.0));
    // Keys are whole series: the name and its labels (`model` on every one).
    let running = samples[0]["metrics"].as_object().and_then(|m| {
        m.iter()
            .find(|(k, _)| k.starts_with("ingot_num_requests_running"))
    });
    assert!(
        running.is_some_and(|(_, v)| v.is_number()),
        "{}",
        samples[0]
    );
    let drifts: Vec<&str> = r["drift"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["metric"].as_str().unwrap())
        .collect();
    assert!(
        drifts.contains(&"output tok/s") && drifts.contains(&"RSS (MiB)"),
        "{drifts:?}"
    );
    assert!(
        read_json(&d("soak").join("result.json"))["summary"]["completed"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(stdout(&o).contains("result: PASS"), "{}", stdout(&o));
}

/// Options the drivers reject before touching a server.
#[test]
fn drivers_reject_bad_options() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().display().to_string();
    let cases: [(&[&str], &str); 5] = [
        (&["sweep", "--out-dir", &dir], "--request-rates"),
        (
            &["sweep", "--concurrencies", "0,2", "--out-dir", &dir],
            "--concurrencies",
        ),
        (
            &["stress", "--start-rate", "4", "--max-rate", "2"],
            "--max-rate",
        ),
        (&["soak", "--max-concurrency", "2"], "--duration"),
        (
            &[
                "sweep",
                "--request-rates",
                "1",
                "--out-dir",
                &dir,
                "--out",
                "x.json",
            ],
            "--out-dir",
        ),
    ];
    for (args, needle) in cases {
        let o = ingot(&[&["bench"], args].concat());
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = stderr(&o);
        assert!(
            err.starts_with("error: ") && err.contains(needle),
            "{args:?}: {err}"
        );
    }
}
