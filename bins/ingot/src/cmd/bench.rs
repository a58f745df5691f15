//! `ingot bench`: performance measurements.

use std::time::Instant;

use clap::{Args, Subcommand};
use ingot_core::{SamplingParams, StopCriteria, TokenId};
use ingot_engine::{EngineHandle, EngineRequest, TokenEvent};
use rand::{Rng, SeedableRng};

use crate::model::{load_engine, ModelArgs};
use crate::settings::{self, FlagSet};

/// Benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Single-request latency: prefill time, per-token decode time, tok/s.
    Latency(LatencyArgs),
    /// Offline throughput: many requests through the engine at once (no HTTP).
    Throughput(ThroughputArgs),
    /// Model load and switch times: cold (page cache dropped and warm) and
    /// back from a warm host copy, each with its first token.
    Load(crate::cmd::bench_load::LoadArgs),
    /// Load an OpenAI-compatible server and report TTFT, TPOT, ITL, E2E, throughput.
    Serve(ingot_bench::serve::ServeArgs),
    /// Run `serve` over several rates or concurrencies; table and plots.
    Sweep(ingot_bench::sweep::SweepArgs),
    /// Raise the load step by step until the SLO or the error rate breaks.
    Stress(ingot_bench::stress::StressArgs),
    /// Hold a load for a duration and watch for drift.
    Soak(ingot_bench::soak::SoakArgs),
    /// Compare two result files; exit 1 on regression.
    Compare(ingot_bench::compare::CompareArgs),
}

/// Flags of `ingot bench throughput`.
#[derive(Args, Debug)]
pub struct ThroughputArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Requests to run.
    #[arg(long, default_value_t = 64)]
    num_prompts: usize,
    /// Prompt length in tokens (random ids, seeded).
    #[arg(long, default_value_t = 128)]
    input_len: usize,
    /// Tokens generated per request (EOS ignored).
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    /// Sequences running at once, the concurrency measured
    /// [scheduler.max_num_seqs; 64].
    #[arg(long)]
    max_num_seqs: Option<usize>,
    #[command(flatten)]
    sampling: BenchSampling,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// How the benchmark's requests pick tokens: greedy unless a temperature is
/// given (each request then has its own seed, so runs repeat).
#[derive(Args, Debug, Clone)]
pub struct BenchSampling {
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling mass (1 disables).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep the k most likely tokens (0 disables).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Drop tokens below min_p times the best one's probability (0 disables).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Also report this many top logprobs per token (0 to 20; off when
    /// absent).
    #[arg(long)]
    logprobs: Option<usize>,
}

impl BenchSampling {
    /// The parameters of request `i`, checked like an API request's.
    fn params(&self, i: usize) -> anyhow::Result<SamplingParams> {
        let p = SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            seed: Some(i as u64),
            logprobs: self.logprobs,
            ..SamplingParams::default()
        };
        p.validate()?;
        Ok(p)
    }

    /// The knobs in words, for the text result.
    fn describe(&self) -> String {
        let picks = if self.temperature == 0.0 {
            "greedy".into()
        } else {
            format!(
                "temperature {}, top_p {}, top_k {}, min_p {}",
                self.temperature, self.top_p, self.top_k, self.min_p
            )
        };
        match self.logprobs {
            Some(n) => format!("{picks}, top {n} logprobs"),
            None => picks,
        }
    }

    /// The knobs, for the JSON result.
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
            "logprobs": self.logprobs,
        })
    }
}

/// Flags of `ingot bench latency`.
#[derive(Args, Debug)]
pub struct LatencyArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt length in tokens (random ids, seeded).
    #[arg(long, default_value_t = 128)]
    input_len: usize,
    /// Tokens to generate (EOS ignored).
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    /// Measured repetitions; the median is reported.
    #[arg(long, default_value_t = 5)]
    num_iters: usize,
    /// Unmeasured repetitions first.
    #[arg(long, default_value_t = 1)]
    num_iters_warmup: usize,
    #[command(flatten)]
    sampling: BenchSampling,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Latency(args) => latency(args),
        BenchCommand::Throughput(args) => throughput(args),
        BenchCommand::Load(args) => crate::cmd::bench_load::run(args),
        BenchCommand::Serve(args) => client(|| ingot_bench::serve::run(args)),
        BenchCommand::Sweep(args) => client(|| ingot_bench::sweep::run(args)),
        BenchCommand::Stress(args) => client(|| ingot_bench::stress::run(args)),
        BenchCommand::Soak(args) => client(|| ingot_bench::soak::run(args)),
        BenchCommand::Compare(args) => client(|| ingot_bench::compare::run(args)),
    }
}

/// Seconds from submission to the first and to the last token.
pub(crate) struct RunTimes {
    pub(crate) first_token: f64,
    total: f64,
    /// Tokens generated.
    tokens: usize,
    /// When each token arrived, in seconds since the run's epoch.
    token_times: Vec<f64>,
}

pub(crate) fn run_once(
    gen: &EngineHandle,
    prompt: Vec<TokenId>,
    output_len: usize,
    sampling: SamplingParams,
) -> anyhow::Result<RunTimes> {
    run_from(gen, prompt, output_len, sampling, Instant::now())
}

/// One request; token times are measured from `epoch`.
fn run_from(
    gen: &EngineHandle,
    prompt: Vec<TokenId>,
    output_len: usize,
    sampling: SamplingParams,
    epoch: Instant,
) -> anyhow::Result<RunTimes> {
    let start = Instant::now();
    let mut token_times = Vec::with_capacity(output_len);
    let mut events = gen.submit(EngineRequest {
        prompt,
        sampling,
        stop: StopCriteria {
            max_tokens: output_len,
            ignore_eos: true,
            ..Default::default()
        },
        priority: Default::default(),
        grammar: None,
        speculative: true,
    })?;
    let mut first_token = None;
    while let Some(event) = events.next_blocking() {
        match event {
            TokenEvent::Token(_) => {
                token_times.push(epoch.elapsed().as_secs_f64());
                first_token.get_or_insert_with(|| start.elapsed().as_secs_f64());
            }
            TokenEvent::Finished(c) => {
                return Ok(RunTimes {
                    first_token: first_token.unwrap_or_default(),
                    total: start.elapsed().as_secs_f64(),
                    tokens: c.completion_tokens,
                    token_times,
                })
            }
            TokenEvent::Error(e) => anyhow::bail!("generation failed: {e}"),
            TokenEvent::Prompt(_) => {}
        }
    }
    anyhow::bail!("the engine dropped a request")
}

/// A client-side command: no model, so `log.level` comes from the
/// environment alone; a completed run whose gate failed exits with status 1.
fn client<E>(run: impl FnOnce() -> Result<bool, E>) -> anyhow::Result<()>
where
    anyhow::Error: From<E>,
{
    settings::log_from_env()?;
    gate(run()?)
}

/// A completed run whose gate failed exits with status 1.
fn gate(passed: bool) -> anyhow::Result<()> {
    if !passed {
        std::process::exit(1);
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn latency(args: LatencyArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.input_len > 0 && args.output_len > 0,
        "--input-len and --output-len must be positive"
    );
    args.sampling.params(0)?;
    let mut config = args.model.load(FlagSet::default())?.config;
    // Room for the whole request, whatever the configured cache.
    let needed = args.input_len + args.output_len;
    let kv = &mut config.model.kv_cache_tokens;
    *kv = Some(kv.unwrap_or(needed).max(needed));
    let gen = load_engine(&config, settings::engine_config(&config))?;
    let vocab = gen.model_config().vocab_size as TokenId;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let (mut prefill, mut per_token, mut total) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..args.num_iters_warmup + args.num_iters {
        // A fresh random prompt each time, so the prefix cache cannot help.
        let prompt = random_prompt(&mut rng, args.input_len, vocab);
        let t = run_once(&gen, prompt, args.output_len, args.sampling.params(i)?)?;
        if i < args.num_iters_warmup {
            continue;
        }
        prefill.push(t.first_token * 1e3);
        per_token.push((t.total - t.first_token) * 1e3 / (args.output_len - 1).max(1) as f64);
        total.push(t.total);
    }
    let (prefill, per_token, total) = (median(prefill), median(per_token), median(total));
    let decode_tps = 1e3 / per_token;
    let prefill_tps = args.input_len as f64 / (prefill / 1e3);
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "device": gen.device_name(),
                "input_len": args.input_len, "output_len": args.output_len, "num_iters": args.num_iters,
                "prefill_ms": prefill, "prefill_tok_s": prefill_tps,
                "decode_ms_per_token": per_token, "decode_tok_s": decode_tps,
                "e2e_s": total, "sampling": args.sampling.json(),
                "speculation": speculation(&gen).json(),
            })
        );
    } else {
        println!("device:            {}", gen.device_name());
        println!(
            "input/output:      {} / {} tokens, median of {}",
            args.input_len, args.output_len, args.num_iters
        );
        println!("sampling:          {}", args.sampling.describe());
        println!("prefill:           {prefill:.1} ms ({prefill_tps:.1} tok/s)");
        println!("decode:            {per_token:.2} ms/token ({decode_tps:.1} tok/s)");
        println!("end to end:        {total:.3} s");
        speculation(&gen).print();
    }
    Ok(())
}

/// Speculative decoding's proposed and kept tokens over the run.
struct Speculation {
    proposed: u64,
    kept: u64,
}

fn speculation(gen: &EngineHandle) -> Speculation {
    let s = gen.stats();
    Speculation {
        proposed: s.spec_proposed.load(std::sync::atomic::Ordering::Relaxed),
        kept: s.spec_kept.load(std::sync::atomic::Ordering::Relaxed),
    }
}

impl Speculation {
    /// The JSON result's `speculation` (null when nothing was proposed).
    fn json(&self) -> serde_json::Value {
        if self.proposed == 0 {
            return serde_json::Value::Null;
        }
        serde_json::json!({"proposed_tokens": self.proposed, "kept_tokens": self.kept,
            "acceptance": self.kept as f64 / self.proposed as f64})
    }

    /// The text result's line, when anything was proposed.
    fn print(&self) {
        if self.proposed > 0 {
            println!(
                "speculation:       {} of {} proposed tokens kept ({:.1} %)",
                self.kept,
                self.proposed,
                100.0 * self.kept as f64 / self.proposed as f64
            );
        }
    }
}

fn random_prompt(rng: &mut rand_chacha::ChaCha8Rng, len: usize, vocab: TokenId) -> Vec<TokenId> {
    (0..len).map(|_| rng.random_range(0..vocab)).collect()
}

fn throughput(args: ThroughputArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.num_prompts > 0 && args.input_len > 0 && args.output_len > 0,
        "--num-prompts, --input-len and --output-len must be positive"
    );
    args.sampling.params(0)?;
    let mut flags = FlagSet::default();
    flags.opt(
        "--max-num-seqs",
        "scheduler.max_num_seqs",
        &args.max_num_seqs,
    );
    let config = args.model.load(flags)?.config;
    let max_num_seqs = config.scheduler.max_num_seqs;
    let mut engine = settings::engine_config(&config);
    // Every prompt is submitted at once: none may be shed.
    engine.scheduler.max_waiting = engine.scheduler.max_waiting.max(args.num_prompts * 2);
    let gen = load_engine(&config, engine)?;
    let vocab = gen.model_config().vocab_size as TokenId;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let prompts: Vec<Vec<TokenId>> = (0..args.num_prompts)
        .map(|_| random_prompt(&mut rng, args.input_len, vocab))
        .collect();
    // Warm up threads and caches with one short request.
    run_once(
        &gen,
        random_prompt(&mut rng, 8, vocab),
        2,
        args.sampling.params(0)?,
    )?;
    let start = Instant::now();
    let runs = std::thread::scope(|scope| -> anyhow::Result<Vec<RunTimes>> {
        let handles: Vec<_> = prompts
            .into_iter()
            .enumerate()
            .map(|(i, prompt)| {
                let gen = gen.clone();
                let output_len = args.output_len;
                let sampling = args.sampling.params(i);
                scope.spawn(move || run_from(&gen, prompt, output_len, sampling?, start))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a benchmark thread panicked"))?
            })
            .collect()
    })?;
    let elapsed = start.elapsed().as_secs_f64();
    let generated: usize = runs.iter().map(|r| r.tokens).sum();
    let decode_tps = decode_after_prefill(&runs);
    let out_tps = generated as f64 / elapsed;
    let total_tps = (generated + args.num_prompts * args.input_len) as f64 / elapsed;
    let req_s = args.num_prompts as f64 / elapsed;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "device": gen.device_name(),
                "num_prompts": args.num_prompts, "input_len": args.input_len, "output_len": args.output_len,
                "max_num_seqs": max_num_seqs, "elapsed_s": elapsed, "requests_per_s": req_s,
                "output_tok_s": out_tps, "total_tok_s": total_tps,
                "decode_tok_s_after_prefill": decode_tps, "sampling": args.sampling.json(),
                "speculation": speculation(&gen).json(),
            })
        );
    } else {
        println!("device:            {}", gen.device_name());
        println!(
            "requests:          {} x ({} in, {} out), {} at once",
            args.num_prompts, args.input_len, args.output_len, max_num_seqs
        );
        println!("sampling:          {}", args.sampling.describe());
        println!("elapsed:           {elapsed:.2} s ({req_s:.2} req/s)");
        println!("output:            {out_tps:.1} tok/s");
        println!("total (in + out):  {total_tps:.1} tok/s");
        println!("decode after all prefills: {decode_tps:.1} tok/s");
        speculation(&gen).print();
    }
    Ok(())
}

/// Tokens per second across all sequences once every prompt has its first
/// token (the pure-decode phase; meaningful when all requests run at once).
fn decode_after_prefill(runs: &[RunTimes]) -> f64 {
    let first = runs
        .iter()
        .filter_map(|r| r.token_times.first().copied())
        .fold(0.0, f64::max);
    let end = runs
        .iter()
        .filter_map(|r| r.token_times.last().copied())
        .fold(0.0, f64::max);
    let after = runs
        .iter()
        .flat_map(|r| &r.token_times)
        .filter(|&&t| t > first)
        .count();
    if end > first {
        after as f64 / (end - first)
    } else {
        f64::NAN
    }
}
