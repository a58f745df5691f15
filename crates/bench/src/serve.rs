//! `ingot bench serve`: load one OpenAI-compatible server (ingot,
//! llama.cpp's server, vLLM, SGLang) with streamed requests and report
//! TTFT, TPOT, ITL, end-to-end latency, throughput and goodput.
//!
//! Flags follow vLLM's `benchmark_serving.py` where it has them (with its
//! names as aliases: `--dataset-name`, `--random-input-len`, ...). Prompts
//! come from [`crate::dataset`], requests are issued by `load.rs` and timed
//! by [`crate::client`]. Other commands (`sweep`, `stress`, `soak`) call
//! [`run_once`] with modified [`ServeArgs`].

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, TRANSFER_ENCODING};
use indicatif::{ProgressBar, ProgressStyle};
use ingot_tokenizer::Tokenizer;
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::client::{GetError, HttpClient};
use crate::dataset::{Conversation, Dataset, DatasetConfig, DatasetKind};
use crate::load::{self, Arrival, RequestTemplate, Source};
use crate::result::{BenchResult, RequestRecord, RunSummary, ServerInfo, Slo, Summary};
use crate::BenchError;

/// Flags of `ingot bench serve`.
#[derive(Args, Debug, Clone, Serialize)]
pub struct ServeArgs {
    /// Server root URL, e.g. http://127.0.0.1:8000 [default: http://HOST:PORT].
    #[arg(long)]
    pub base_url: Option<String>,
    /// Server host when --base-url is not given.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Server port when --base-url is not given.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// API path: /v1/completions, or /v1/chat/completions (any path ending
    /// in chat/completions is sent chat messages).
    #[arg(long, default_value = "/v1/completions")]
    pub endpoint: String,
    /// Model name in requests [default: the first id of GET /v1/models].
    #[arg(long)]
    pub model: Option<String>,
    /// Tokenizer (a GGUF file or a Hugging Face directory) for exact prompt
    /// lengths; without it prompts are common words (about one token each).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Synthetic workload (see `ingot_bench::dataset`); `duplicate` is the
    /// one for measuring the response cache.
    #[arg(long, value_enum, default_value_t = DatasetKind::Random, alias = "dataset-name")]
    pub dataset: DatasetKind,
    /// Requests to measure (multiturn: turns in all; ignored with --duration).
    #[arg(long, default_value_t = 100)]
    pub num_prompts: usize,
    /// Prompt tokens (prefix: suffix tokens; multiturn: tokens per user message).
    #[arg(long, default_value_t = 1024, alias = "random-input-len")]
    pub input_len: usize,
    /// Tokens to generate per request (sent as max_tokens).
    #[arg(long, default_value_t = 128, alias = "random-output-len")]
    pub output_len: usize,
    /// Lengths are uniform in [len·(1−r), len·(1+r)].
    #[arg(long, default_value_t = 0.0, alias = "random-range-ratio")]
    pub range_ratio: f64,
    /// Seeds prompts and arrival times.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// prefix: number of distinct shared prefixes.
    #[arg(long, default_value_t = 8)]
    pub prefix_groups: usize,
    /// prefix: tokens in each shared prefix.
    #[arg(long, default_value_t = 512)]
    pub prefix_len: usize,
    /// prefix: each request's prefix drawn at random (multi-tenant traffic)
    /// instead of in turn, so no router policy gets cache affinity by
    /// accident of the order.
    #[arg(long)]
    pub prefix_random: bool,
    /// multiturn: requests per conversation.
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// duplicate: fraction of requests that repeat an earlier prompt (the
    /// response cache's workload; its hit rate is at most this).
    #[arg(long, default_value_t = 0.5)]
    pub duplicate_fraction: f64,
    /// sharegpt: fixed output length instead of the distribution's.
    #[arg(long)]
    pub sharegpt_output_len: Option<usize>,
    /// Conversations started per second, Poisson (inf: all at once).
    #[arg(long, default_value_t = f64::INFINITY)]
    #[serde(serialize_with = "rate_as_json")]
    pub request_rate: f64,
    /// Requests in flight at most.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Issue requests for this many seconds instead of --num-prompts (needs
    /// --max-concurrency or a finite --request-rate).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Unmeasured requests first (from a differently seeded dataset).
    #[arg(long, default_value_t = 0, alias = "num-warmups")]
    pub num_warmup: usize,
    /// Send "ignore_eos": true so every request generates --output-len tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Sampling temperature sent.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// JSON object merged into every request body (overrides our fields).
    #[arg(long, value_parser = parse_extra_body)]
    pub extra_body: Option<Map<String, Value>>,
    /// 'Name: value' header sent with every request, e.g. 'Cache-Control:
    /// no-cache' (repeatable; replaces the client's own of the same name).
    #[arg(long = "header", short = 'H', value_name = "NAME: VALUE", value_parser = parse_header)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<RequestHeader>,
    /// Goodput SLO in ms, e.g. ttft=500,tpot=50,e2e=10000.
    #[arg(long, value_parser = parse_slo)]
    pub slo: Option<Slo>,
    /// Seconds allowed per request.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Write the result (config, summary, every request) as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Free text stored in the result.
    #[arg(long)]
    pub label: Option<String>,
    /// Client runtime threads (1 is plenty: see the crate's overhead test).
    #[arg(long, default_value_t = 1)]
    pub client_threads: usize,
    /// Runs of the same workload, run i seeded --seed + i (fresh prompts,
    /// so no run replays the server's prefix cache of the one before, and
    /// the runs sample the workload, not one draw of it); each run's
    /// summary is kept for `ingot bench compare`, which tests between
    /// runs. Two files with the same --seed and --repeat send the same
    /// prompts.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    #[serde(skip_serializing_if = "is_one")]
    pub repeat: usize,
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

impl Default for ServeArgs {
    /// The flags' defaults.
    fn default() -> ServeArgs {
        crate::runs::flag_defaults("serve")
    }
}

/// `inf` as the string "inf" (JSON has no infinity).
fn rate_as_json<S: serde::Serializer>(rate: &f64, s: S) -> Result<S::Ok, S::Error> {
    if rate.is_infinite() {
        s.serialize_str("inf")
    } else {
        s.serialize_f64(*rate)
    }
}

fn parse_extra_body(s: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str(s) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err("must be a JSON object".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// One `--header`: checked when parsed, so a typo fails before the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeader {
    /// Header name (lowercase).
    pub name: HeaderName,
    /// Header value.
    pub value: HeaderValue,
}

impl Serialize for RequestHeader {
    /// `"name: value"` in the result's config, credentials redacted: result
    /// files get shared, keys should not.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        const SECRET: [&str; 5] = [
            "authorization",
            "proxy-authorization",
            "cookie",
            "x-api-key",
            "api-key",
        ];
        let value = if SECRET.contains(&self.name.as_str()) {
            "<redacted>".into()
        } else {
            String::from_utf8_lossy(self.value.as_bytes())
        };
        s.serialize_str(&format!("{}: {value}", self.name))
    }
}

/// Parses `--header 'Name: value'`. The headers that frame the body are the
/// client's own: another value would break the request.
pub fn parse_header(s: &str) -> Result<RequestHeader, String> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: want 'Name: value'"))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("{:?} is not a valid header name", name.trim()))?;
    if [CONTENT_LENGTH, TRANSFER_ENCODING].contains(&name) {
        return Err(format!(
            "{name} is set by the client and cannot be overridden"
        ));
    }
    let value = HeaderValue::from_str(value.trim())
        .map_err(|_| format!("the value of {name} has characters a header cannot carry"))?;
    Ok(RequestHeader { name, value })
}

/// The `--header`s as one map (repeated names keep every value).
fn header_map(headers: &[RequestHeader]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for h in headers {
        map.append(h.name.clone(), h.value.clone());
    }
    map
}

/// Parses `ttft=500,tpot=50,e2e=2000` (milliseconds, any subset).
pub fn parse_slo(s: &str) -> Result<Slo, String> {
    let mut slo = Slo::default();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once(['=', ':'])
            .ok_or_else(|| format!("{part:?}: want NAME=MS"))?;
        let ms: f64 = value
            .trim()
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v > 0.0)
            .ok_or_else(|| format!("{part:?}: {value:?} is not a positive number of ms"))?;
        let slot = match key.trim() {
            "ttft" => &mut slo.ttft_ms,
            "tpot" => &mut slo.tpot_ms,
            "e2e" | "e2el" => &mut slo.e2e_ms,
            other => return Err(format!("unknown SLO metric {other:?} (ttft, tpot, e2e)")),
        };
        *slot = Some(ms);
    }
    if slo == Slo::default() {
        return Err("give at least one of ttft=MS, tpot=MS, e2e=MS".into());
    }
    Ok(slo)
}

/// The checked options of one run.
struct Plan {
    base_url: String,
    chat: bool,
    timeout: Duration,
    arrival: Arrival,
    dataset: DatasetConfig,
}

fn plan(args: &ServeArgs) -> Result<Plan, BenchError> {
    let bad = |m: String| Err(BenchError::Options(m));
    let base_url = args
        .base_url
        .clone()
        .unwrap_or_else(|| format!("http://{}:{}", args.host, args.port));
    if !args.endpoint.starts_with('/') {
        return bad(format!("--endpoint {:?} must start with /", args.endpoint));
    }
    if args.request_rate.is_nan() || args.request_rate <= 0.0 {
        return bad(format!(
            "--request-rate must be positive, got {}",
            args.request_rate
        ));
    }
    if args.max_concurrency == Some(0) {
        return bad("--max-concurrency must be positive".into());
    }
    let duration = match args.duration {
        None if args.num_prompts == 0 => return bad("--num-prompts must be positive".into()),
        None => None,
        Some(d) if !(d.is_finite() && d > 0.0) => {
            return bad(format!(
                "--duration must be a positive number of seconds, got {d}"
            ))
        }
        Some(_) if args.max_concurrency.is_none() && args.request_rate.is_infinite() => {
            return bad("--duration needs --max-concurrency or a finite --request-rate".into())
        }
        Some(d) => Some(Duration::from_secs_f64(d)),
    };
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        return bad(format!(
            "--timeout must be a positive number of seconds, got {}",
            args.timeout
        ));
    }
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        return bad(format!(
            "--temperature must be >= 0, got {}",
            args.temperature
        ));
    }
    if args.client_threads == 0 {
        return bad("--client-threads must be positive".into());
    }
    let chat = args
        .endpoint
        .trim_end_matches('/')
        .ends_with("chat/completions");
    Ok(Plan {
        base_url,
        chat,
        timeout: Duration::from_secs_f64(args.timeout),
        arrival: Arrival {
            rate: args.request_rate,
            max_concurrency: args.max_concurrency,
            duration,
            seed: args.seed,
        },
        dataset: DatasetConfig {
            kind: args.dataset,
            input_len: args.input_len,
            output_len: args.output_len,
            range_ratio: args.range_ratio,
            prefix_groups: args.prefix_groups,
            prefix_len: args.prefix_len,
            prefix_random: args.prefix_random,
            turns: args.turns,
            duplicate_fraction: args.duplicate_fraction,
            sharegpt_output_len: args.sharegpt_output_len,
            count_special: !chat,
            seed: args.seed,
        },
    })
}

/// Loads a tokenizer (a GGUF file, a HF directory or its `tokenizer.json`),
/// once per path per process: sweeps call [`run_once`] many times.
pub fn load_tokenizer(path: &Path) -> Result<Arc<Tokenizer>, BenchError> {
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, Arc<Tokenizer>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(t) = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(path)
    {
        return Ok(t.clone());
    }
    let fail = |e: &dyn std::fmt::Display| {
        BenchError::Options(format!("--tokenizer {}: {e}", path.display()))
    };
    if !path.exists() {
        return Err(fail(&"no such file or directory"));
    }
    let tokenizer = if path.is_dir() {
        Tokenizer::from_hf_dir(path).map_err(|e| fail(&e))?
    } else if path.extension().is_some_and(|e| e == "json") {
        let dir = path.parent().unwrap_or(Path::new("."));
        Tokenizer::from_hf_dir(dir).map_err(|e| fail(&e))?
    } else {
        let gguf = ingot_models::gguf::GgufFile::open(path).map_err(|e| fail(&e))?;
        Tokenizer::from_gguf(&gguf).map_err(|e| fail(&e))?
    };
    let tokenizer = Arc::new(tokenizer);
    cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(path.to_path_buf(), tokenizer.clone());
    Ok(tokenizer)
}

/// Asks the server for its models: the `/v1/models` document and the model
/// name to send. An unreachable server is an error; a server without
/// `/v1/models` is fine when `--model` is given.
async fn discover(client: &HttpClient, model: Option<&str>) -> Result<(Value, String), BenchError> {
    let base = client.base_url();
    match client.get_json("/v1/models", Duration::from_secs(30)).await {
        Ok(doc) => {
            let first = doc.pointer("/data/0/id").and_then(Value::as_str);
            match model.or(first) {
                Some(name) => {
                    let name = name.to_string();
                    Ok((doc, name))
                }
                None => Err(BenchError::Server(format!(
                    "GET {base}/v1/models lists no model; pass --model"
                ))),
            }
        }
        Err(GetError::Transport(e)) => Err(BenchError::Server(format!("cannot reach {base}: {e}"))),
        Err(e) => match model {
            Some(name) => {
                tracing::warn!("GET {base}/v1/models: {e}; going on with --model {name}");
                Ok((Value::Null, name.to_string()))
            }
            None => Err(BenchError::Server(format!(
                "GET {base}/v1/models: {e} (pass --model)"
            ))),
        },
    }
}

/// Runs the command: the run, its table on stdout, `--out`. `Ok(false)`
/// when a request failed, none completed, or the run was interrupted.
pub fn run(args: ServeArgs) -> Result<bool, BenchError> {
    let result = if args.repeat > 1 {
        run_repeated(&args)?
    } else {
        run_once(&args, true)?
    };
    print_summary(&result);
    print_runs(&result.runs);
    if let Some(path) = &args.out {
        write_result(path, &result)?;
        eprintln!("wrote {}", path.display());
    }
    let s = &result.summary;
    Ok(!result.partial && s.failed == 0 && s.completed > 0)
}

/// `--repeat N`: N runs, run i seeded `--seed + i`, each with its warmup;
/// the result pools their requests (tagged with the run) and keeps each
/// run's summary. Stops after an interrupted run.
fn run_repeated(args: &ServeArgs) -> Result<BenchResult, BenchError> {
    let mut runs = Vec::with_capacity(args.repeat);
    let mut requests = Vec::new();
    let mut first: Option<BenchResult> = None;
    for i in 0..args.repeat {
        let one = ServeArgs {
            seed: args.seed.wrapping_add(i as u64),
            ..args.clone()
        };
        let mut r = run_once(&one, true)?;
        let s = &r.summary;
        eprintln!(
            "run {}/{}: {:.2} req/s, TPOT mean {:.2} ms",
            i + 1,
            args.repeat,
            s.request_throughput,
            s.tpot.mean
        );
        requests.extend(r.requests.drain(..).map(|q| RequestRecord { run: i, ..q }));
        runs.push(RunSummary {
            seed: one.seed,
            started_unix: r.started_unix,
            partial: r.partial,
            summary: r.summary.clone(),
        });
        let interrupted = r.partial;
        first.get_or_insert(r);
        if interrupted {
            break;
        }
    }
    let first = first.ok_or_else(|| BenchError::Options("--repeat must be positive".into()))?;
    let duration: f64 = runs.iter().map(|r| r.summary.duration_s).sum();
    Ok(BenchResult {
        summary: Summary::of(&requests, duration, args.slo.as_ref()),
        partial: runs.iter().any(|r| r.partial),
        requests,
        runs,
        ..first
    })
}

/// One line per run of `--repeat`: what the pooled table hides.
fn print_runs(runs: &[RunSummary]) {
    if runs.is_empty() {
        return;
    }
    println!(
        "\n{:<5}{:>8}{:>10}{:>12}{:>12}{:>12}{:>12}{:>12}",
        "run", "seed", "req/s", "out tok/s", "TTFT p50", "TPOT mean", "ITL mean", "E2E p50"
    );
    for (i, r) in runs.iter().enumerate() {
        let s = &r.summary;
        println!(
            "{:<5}{:>8}{:>10.2}{:>12.1}{:>12.2}{:>12.2}{:>12.2}{:>12.2}",
            i + 1,
            r.seed,
            s.request_throughput,
            s.output_tok_s,
            s.ttft.median,
            s.tpot.mean,
            s.itl.mean,
            s.e2e.median
        );
    }
}

/// Writes `result` as pretty JSON.
pub fn write_result(path: &Path, result: &BenchResult) -> Result<(), BenchError> {
    let io = |source| BenchError::Io {
        path: path.to_path_buf(),
        source,
    };
    let json = serde_json::to_vec_pretty(result).map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(path, json).map_err(io)
}

/// One run, printing nothing but the progress bar (when `on_progress` and
/// stderr is a terminal). Ctrl-C during the run stops it early and returns
/// `partial: true` (callers looping over runs should stop then); Ctrl-C is
/// only caught while a run is going.
pub fn run_once(args: &ServeArgs, on_progress: bool) -> Result<BenchResult, BenchError> {
    let plan = plan(args)?;
    let tokenizer = args.tokenizer.as_deref().map(load_tokenizer).transpose()?;
    let runtime = if args.client_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.client_threads)
            .enable_all()
            .build()
    }
    .map_err(|e| BenchError::Options(format!("cannot start the client runtime: {e}")))?;
    let client = HttpClient::new(&plan.base_url)?.with_headers(header_map(&args.headers));
    let (models, model) = runtime.block_on(discover(&client, args.model.as_deref()))?;

    let mut dataset = Dataset::new(plan.dataset.clone(), tokenizer.clone())?;
    let warmup = if args.num_warmup > 0 {
        let cfg = DatasetConfig {
            seed: plan.dataset.seed ^ 0x77a2_4d00_0000_0001,
            ..plan.dataset.clone()
        };
        Dataset::new(cfg, tokenizer)?.take_requests(args.num_warmup)?
    } else {
        Vec::new()
    };
    let (source, generator, total) = match plan.arrival.duration {
        None => {
            let convs = dataset.take_requests(args.num_prompts)?;
            (
                Source::Fixed(convs.into_iter()),
                None,
                Some(args.num_prompts),
            )
        }
        Some(_) => {
            let (rx, handle) = generate_in_background(dataset)?;
            (Source::Stream(rx), Some(handle), None)
        }
    };
    let template = RequestTemplate {
        path: args.endpoint.clone(),
        chat: plan.chat,
        model: model.clone(),
        ignore_eos: args.ignore_eos,
        temperature: args.temperature,
        extra: args.extra_body.clone().unwrap_or_default(),
        timeout: plan.timeout,
    };
    let progress = progress_bar(total, on_progress);
    let (outcome, started_unix) = runtime.block_on(async {
        let (tx, mut interrupts) = watch::channel(0);
        let mut signals = JoinSet::new();
        signals.spawn(load::count_interrupts(tx));
        if !warmup.is_empty() {
            let arrival = Arrival {
                rate: f64::INFINITY,
                duration: None,
                ..plan.arrival
            };
            let source = Source::Fixed(warmup.into_iter());
            let w = load::drive(
                &client,
                template.clone(),
                source,
                arrival,
                ProgressBar::hidden(),
                &mut interrupts,
            )
            .await;
            if w.interrupted {
                let nothing = load::LoadOutcome {
                    interrupted: true,
                    ..Default::default()
                };
                return (nothing, unix_now());
            }
        }
        let started = unix_now();
        let outcome = load::drive(
            &client,
            template,
            source,
            plan.arrival,
            progress.clone(),
            &mut interrupts,
        )
        .await;
        signals.abort_all();
        (outcome, started)
    });
    progress.finish_and_clear();
    if let Some(handle) = generator {
        let _ = handle.join();
    }
    let records = outcome.records;
    Ok(BenchResult {
        config: serde_json::to_value(args).unwrap_or(Value::Null),
        git_commit: git_commit(),
        server: ServerInfo {
            base_url: client.base_url().to_string(),
            model,
            details: models,
        },
        started_unix,
        partial: outcome.interrupted,
        summary: Summary::of(&records, outcome.duration_s, args.slo.as_ref()),
        requests: records,
        runs: Vec::new(),
    })
}

/// Conversations made on a thread while the run goes (`--duration`).
fn generate_in_background(
    mut dataset: Dataset,
) -> Result<(mpsc::Receiver<Conversation>, std::thread::JoinHandle<()>), BenchError> {
    let (tx, rx) = mpsc::channel(64);
    let handle = std::thread::Builder::new()
        .name("bench-prompts".into())
        .spawn(move || loop {
            match dataset.next_conversation() {
                Ok(c) => {
                    if tx.blocking_send(c).is_err() {
                        break; // the run is over
                    }
                }
                Err(e) => {
                    tracing::warn!("cannot make more prompts: {e}");
                    break;
                }
            }
        })
        .map_err(|e| BenchError::Options(format!("cannot start the prompt thread: {e}")))?;
    Ok((rx, handle))
}

fn progress_bar(total: Option<usize>, on: bool) -> ProgressBar {
    if !on || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let (bar, template) = match total {
        Some(n) => (
            ProgressBar::new(n as u64),
            "{elapsed_precise} [{bar:40}] {pos}/{len} requests ({per_sec})",
        ),
        None => (
            ProgressBar::new_spinner(),
            "{spinner} {elapsed_precise} {pos} requests ({per_sec})",
        ),
    };
    let style = ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `git rev-parse HEAD` in the current directory, if it is a checkout.
fn git_commit() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let commit = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !commit.is_empty()).then_some(commit)
}

/// Prints the human summary of a run on stdout.
pub fn print_summary(r: &BenchResult) {
    let s = &r.summary;
    let c = &r.config;
    let text = |k: &str| match &c[k] {
        Value::String(v) => v.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    println!("============ ingot bench serve ============");
    if let Some(label) = c["label"].as_str() {
        println!("{:<26}{label}", "label:");
    }
    println!(
        "{:<26}{} ({})",
        "server:", r.server.base_url, r.server.model
    );
    println!(
        "{:<26}{}, {} in / {} out, rate {}, concurrency {}",
        "workload:",
        text("dataset"),
        text("input_len"),
        text("output_len"),
        text("request_rate"),
        match c["max_concurrency"].as_u64() {
            Some(n) => n.to_string(),
            None => "unbounded".into(),
        }
    );
    let errors: Vec<String> = s.errors.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    println!(
        "{:<26}{} completed, {} failed{}",
        "requests:",
        s.completed,
        s.failed,
        if errors.is_empty() {
            String::new()
        } else {
            format!(" ({})", errors.join(", "))
        }
    );
    let mut seen = std::collections::BTreeSet::new();
    for e in r.requests.iter().filter_map(|q| q.error.as_deref()) {
        if seen.len() < 3 && seen.insert(e) {
            println!("{:<26}{e}", "  error:");
        }
    }
    println!(
        "{:<26}{:.2} s{}",
        "duration:",
        s.duration_s,
        if r.partial {
            " (interrupted: partial)"
        } else {
            ""
        }
    );
    println!(
        "{:<26}{:.2} req/s",
        "request throughput:", s.request_throughput
    );
    if let Some(g) = s.goodput {
        let slo: Slo = serde_json::from_value(c["slo"].clone()).unwrap_or_default();
        let bounds: Vec<String> = [
            ("ttft", slo.ttft_ms),
            ("tpot", slo.tpot_ms),
            ("e2e", slo.e2e_ms),
        ]
        .into_iter()
        .filter_map(|(name, ms)| Some(format!("{name} <= {} ms", ms?)))
        .collect();
        println!("{:<26}{g:.2} req/s ({})", "goodput:", bounds.join(", "));
    }
    println!(
        "{:<26}{} ({:.1} tok/s)",
        "input tokens:", s.input_tokens, s.input_tok_s
    );
    println!(
        "{:<26}{} ({:.1} tok/s)",
        "output tokens:", s.output_tokens, s.output_tok_s
    );
    println!("{:<26}{:.1} tok/s", "total throughput:", s.total_tok_s);
    if let Some(line) = cache_line(s) {
        println!("{:<26}{line}", "response cache:");
    }
    println!(
        "\n{:<6}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "ms", "mean", "std", "median", "p90", "p99", "max", "n"
    );
    for (name, st) in [
        ("TTFT", s.ttft),
        ("TPOT", s.tpot),
        ("ITL", s.itl),
        ("E2E", s.e2e),
    ] {
        println!(
            "{name:<6}{:>10.2}{:>10.2}{:>10.2}{:>10.2}{:>10.2}{:>10.2}{:>10}",
            st.mean, st.std, st.median, st.p90, st.p99, st.max, st.count
        );
    }
}

/// The response cache's part of the report: "37.5% hits (3 hit, 1
/// coalesced, 4 miss, 0 bypass)"; None when no response said.
fn cache_line(s: &Summary) -> Option<String> {
    let (c, rate) = (s.cache?, s.cache_hit_rate?);
    let other = match c.other {
        0 => String::new(),
        n => format!(", {n} other"),
    };
    Some(format!(
        "{:.1}% hits ({} hit, {} coalesced, {} miss, {} bypass{other})",
        rate * 100.0,
        c.hits,
        c.coalesced,
        c.misses,
        c.bypass
    ))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::result::CacheCounts;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ServeArgs,
    }

    #[test]
    fn headers_parse_and_bad_ones_are_clear_errors() {
        let h = parse_header("Cache-Control:  no-cache ").unwrap();
        assert_eq!(
            (h.name.as_str(), h.value.to_str().unwrap()),
            ("cache-control", "no-cache")
        );
        let h = parse_header("X-Empty:").unwrap();
        assert_eq!(h.value.as_bytes(), b"");
        for (bad, needle) in [
            ("no-colon", "want 'Name: value'"),
            ("Bad Name: x", "not a valid header name"),
            (": x", "not a valid header name"),
            ("X-A: line\nbreak", "characters a header cannot carry"),
            ("X-A: del\u{7f}", "characters a header cannot carry"),
            ("Content-Length: 3", "set by the client"),
        ] {
            let e = parse_header(bad).unwrap_err();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
    }

    #[test]
    fn header_flags_repeat_are_checked_by_clap_and_stored_redacted() {
        let cli = Cli::try_parse_from([
            "serve",
            "--header",
            "Cache-Control: no-cache",
            "-H",
            "Authorization: Bearer sk-1",
            "-H",
            "X-Tag: a",
            "-H",
            "x-tag: b",
        ])
        .unwrap();
        let map = header_map(&cli.args.headers);
        assert_eq!(map.get_all("x-tag").iter().count(), 2);
        assert_eq!(map["cache-control"], "no-cache");
        let config = serde_json::to_value(&cli.args).unwrap();
        assert_eq!(
            config["headers"],
            serde_json::json!([
                "cache-control: no-cache",
                "authorization: <redacted>",
                "x-tag: a",
                "x-tag: b"
            ])
        );
        let e = Cli::try_parse_from(["serve", "--header", "oops"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("--header") && e.contains("want 'Name: value'"),
            "{e}"
        );
        // Without --header the config has no "headers" key, as before it.
        let config = serde_json::to_value(ServeArgs::default()).unwrap();
        assert!(config.get("headers").is_none());
    }

    #[test]
    fn cache_line_only_when_the_server_sent_the_header() {
        let mut s = Summary::default();
        assert_eq!(cache_line(&s), None);
        s.cache = Some(CacheCounts {
            hits: 3,
            coalesced: 1,
            misses: 4,
            ..Default::default()
        });
        s.cache_hit_rate = Some(3.0 / 8.0);
        assert_eq!(
            cache_line(&s).as_deref(),
            Some("37.5% hits (3 hit, 1 coalesced, 4 miss, 0 bypass)")
        );
    }
}
