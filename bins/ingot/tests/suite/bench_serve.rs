//! End-to-end tests of `ingot bench serve` against a real `ingot serve` on
//! the test model (the client's own overhead is measured in
//! `crates/bench/src/load.rs` against a local SSE responder).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn model() -> String {
    ingot_testkit::smollm2_gguf().display().to_string()
}

/// `ingot serve` on a free port; killed on drop.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status of `GET path`, if the server answers.
pub(crate) fn http_status(url: &str, path: &str) -> Option<u16> {
    let addr = url.strip_prefix("http://")?;
    let mut s = TcpStream::connect(addr).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    reply.split_whitespace().nth(1)?.parse().ok()
}

fn start_server() -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["serve", "--model", &model(), "--port", "0"])
        .args(["--max-num-seqs", "4"])
        .env("INGOT_THREADS", "2")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ingot serve starts");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // Reads the address, then keeps draining stderr so the server never blocks.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("listening on ") {
                let _ = tx.send(url.trim().to_string());
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("ingot serve prints `listening on http://...`");
    let server = Server { child, url };
    let deadline = Instant::now() + Duration::from_secs(120);
    while http_status(&server.url, "/ready") != Some(200) {
        assert!(Instant::now() < deadline, "the server never got ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["bench", "serve"])
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the ingot binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A successful short run on `url` with 32-token prompts and 8 output
/// tokens; returns the result file.
fn run_ok(url: &str, dir: &Path, name: &str, extra: &[&str]) -> Value {
    let out = dir.join(format!("{name}.json"));
    let model = model();
    let mut args = vec![
        "--base-url",
        url,
        "--tokenizer",
        &model,
        "--input-len",
        "32",
        "--output-len",
        "8",
        "--ignore-eos",
        "--seed",
        "1",
        "--label",
        name,
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let started = Instant::now();
    let o = bench(&args);
    eprintln!("{name}: {:.1} s", started.elapsed().as_secs_f64());
    assert!(o.status.success(), "{name}: {}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("TTFT") && table.contains("req/s"), "{table}");
    let v: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let s = &v["summary"];
    assert_eq!(s["failed"], 0, "{name}: {s}");
    assert_eq!(s["errors"], serde_json::json!({}), "{name}");
    assert_eq!(v["partial"], false);
    assert_eq!(v["config"]["label"], name);
    assert!(v["server"]["details"]["data"][0]["id"].is_string(), "{v}");
    assert!(v["started_unix"].as_u64().unwrap() > 1_600_000_000);
    let completed = s["completed"].as_u64().unwrap();
    assert_eq!(v["requests"].as_array().unwrap().len() as u64, completed);
    for r in v["requests"].as_array().unwrap() {
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["output_tokens"], 8, "{r}");
        assert_eq!(r["finish_reason"], "length", "{r}");
        assert_eq!(r["itl_s"].as_array().unwrap().len(), 7, "{r}");
    }
    assert_eq!(s["output_tokens"].as_u64(), Some(8 * completed));
    for metric in ["ttft", "tpot", "itl", "e2e"] {
        assert!(s[metric]["count"].as_u64().unwrap() > 0, "{metric}: {s}");
        assert!(s[metric]["median"].as_f64().unwrap() > 0.0, "{metric}: {s}");
    }
    v
}

fn prompt_tokens(v: &Value) -> Vec<u64> {
    v["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["prompt_tokens"].as_u64().unwrap())
        .collect()
}

/// Every dataset against one server, plus server-side errors.
#[test]
fn bench_serve_runs_every_dataset_against_ingot_serve() {
    let server = start_server();
    let dir = tempfile::tempdir().unwrap();
    let url = server.url.as_str();

    // random, Poisson arrivals under a concurrency cap, a warmup, an SLO.
    let v = run_ok(
        url,
        dir.path(),
        "random",
        &[
            "--num-prompts",
            "4",
            "--request-rate",
            "20",
            "--max-concurrency",
            "2",
            "--num-warmup",
            "1",
            "--slo",
            "ttft=600000",
        ],
    );
    assert_eq!(v["summary"]["completed"], 4);
    assert_eq!(prompt_tokens(&v), [32; 4], "exact lengths");
    assert_eq!(v["summary"]["input_tokens"], 128);
    assert!(v["summary"]["goodput"].as_f64().unwrap() > 0.0);
    assert_eq!(v["config"]["request_rate"], 20.0);

    let v = run_ok(
        url,
        dir.path(),
        "sharegpt",
        &[
            "--dataset",
            "sharegpt",
            "--num-prompts",
            "3",
            "--sharegpt-output-len",
            "8",
        ],
    );
    assert_eq!(v["summary"]["completed"], 3);
    let lens = prompt_tokens(&v);
    assert!(lens.iter().all(|l| (4..=1024).contains(l)), "{lens:?}");
    assert!(lens.windows(2).any(|w| w[0] != w[1]), "{lens:?}");

    let v = run_ok(
        url,
        dir.path(),
        "prefix",
        &[
            "--dataset",
            "prefix",
            "--num-prompts",
            "4",
            "--prefix-groups",
            "2",
            "--prefix-len",
            "32",
        ],
    );
    assert_eq!(
        prompt_tokens(&v),
        [64; 4],
        "32-token prefix + 32-token suffix"
    );

    let v = run_ok(
        url,
        dir.path(),
        "multiturn",
        &[
            "--dataset",
            "multiturn",
            "--num-prompts",
            "4",
            "--turns",
            "2",
        ],
    );
    let requests = v["requests"].as_array().unwrap();
    let turn = |t: u64| requests.iter().filter(move |r| r["turn"] == t);
    assert_eq!((turn(0).count(), turn(1).count()), (2, 2));
    // Turn 2's prompt: turn 1's (32), its 8-token answer, 32 new tokens.
    assert!(turn(0).all(|r| r["prompt_tokens"] == 32));
    assert!(
        turn(1).all(|r| (68..=76).contains(&r["prompt_tokens"].as_u64().unwrap())),
        "{requests:?}"
    );

    let v = run_ok(
        url,
        dir.path(),
        "duplicate",
        &[
            "--dataset",
            "duplicate",
            "--num-prompts",
            "4",
            "--duplicate-fraction",
            "0.5",
        ],
    );
    assert_eq!(prompt_tokens(&v), [32; 4]);

    // Chat: messages through the template (longer than the 32-token
    // content), multi-turn with the assistant's answers.
    let v = run_ok(
        url,
        dir.path(),
        "chat",
        &[
            "--endpoint",
            "/v1/chat/completions",
            "--dataset",
            "multiturn",
            "--num-prompts",
            "2",
            "--turns",
            "2",
        ],
    );
    let requests = v["requests"].as_array().unwrap();
    let of_turn = |t: u64| -> Vec<u64> {
        requests
            .iter()
            .filter(|r| r["turn"] == t)
            .map(|r| r["prompt_tokens"].as_u64().unwrap())
            .collect()
    };
    let (first, second) = (of_turn(0), of_turn(1));
    assert_eq!((first.len(), second.len()), (1, 1), "{requests:?}");
    assert!(
        first[0] > 32 && second[0] > first[0] + 32,
        "{first:?} {second:?}"
    );

    // A wrong model name: every request fails with the server's 404,
    // recorded with its message; exit code 1, the file still written.
    let out = dir.path().join("wrong.json");
    let o = bench(&[
        "--base-url",
        url,
        "--model",
        "no-such-model",
        "--num-prompts",
        "2",
        "--input-len",
        "8",
        "--output-len",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(v["summary"]["errors"]["404"], 2, "{}", v["summary"]);
    let e = v["requests"][0]["error"].as_str().unwrap();
    assert!(
        e.starts_with("HTTP 404") && e.contains("no-such-model"),
        "{e}"
    );
}

#[test]
fn unreachable_server_is_one_clear_error() {
    let o = bench(&["--base-url", "http://127.0.0.1:1", "--num-prompts", "2"]);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("error: cannot reach http://127.0.0.1:1"),
        "{err}"
    );
    assert!(lines[0].contains("refused"), "{err}");
}

#[test]
fn bad_flags_are_named() {
    for (flags, needle) in [
        (&["--slo", "ttft=abc"][..], "--slo"),
        (&["--request-rate", "0"][..], "--request-rate"),
        (&["--duration", "5"][..], "--duration needs"),
        (&["--base-url", "https://x:1"][..], "only http://"),
    ] {
        let o = bench(flags);
        let err = stderr(&o);
        assert!(!o.status.success() && !err.contains("panicked"), "{err}");
        assert!(err.contains(needle), "{flags:?}: {err}");
    }
}
