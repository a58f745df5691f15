//! `ingot bench`: performance measurements.

use std::time::Duration;

use clap::{Args, Subcommand};
use ingot_core::{SamplingParams, StopCriteria, TokenId};
use rand::{Rng, SeedableRng};

use crate::model::{load_generator, ModelArgs};

/// Benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Single-request latency: prefill time, per-token decode time, tok/s.
    Latency(LatencyArgs),
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
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Latency(args) => latency(args),
    }
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
    let mut args = args;
    let needed = args.input_len + args.output_len;
    args.model.kv_cache_tokens = Some(args.model.kv_cache_tokens.unwrap_or(needed).max(needed));
    let mut gen = load_generator(&args.model)?;
    let vocab = gen.runner().config().vocab_size as TokenId;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let prompt: Vec<TokenId> = (0..args.input_len)
        .map(|_| rng.random_range(0..vocab))
        .collect();
    let criteria = StopCriteria {
        max_tokens: args.output_len,
        ignore_eos: true,
        ..Default::default()
    };
    let (mut prefill, mut per_token, mut total) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..args.num_iters_warmup + args.num_iters {
        let stats = gen.generate(
            prompt.clone(),
            SamplingParams::greedy(),
            criteria.clone(),
            &mut |_| {},
        )?;
        if i < args.num_iters_warmup {
            continue;
        }
        let decode: Duration = stats.decode_steps.iter().sum();
        prefill.push(stats.prefill.as_secs_f64() * 1e3);
        per_token.push(decode.as_secs_f64() * 1e3 / stats.decode_steps.len().max(1) as f64);
        total.push((stats.prefill + decode).as_secs_f64());
    }
    let (prefill, per_token, total) = (median(prefill), median(per_token), median(total));
    let decode_tps = 1e3 / per_token;
    let prefill_tps = args.input_len as f64 / (prefill / 1e3);
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "device": gen.runner().device_name(),
                "input_len": args.input_len, "output_len": args.output_len, "num_iters": args.num_iters,
                "prefill_ms": prefill, "prefill_tok_s": prefill_tps,
                "decode_ms_per_token": per_token, "decode_tok_s": decode_tps,
                "e2e_s": total,
            })
        );
    } else {
        println!("device:            {}", gen.runner().device_name());
        println!(
            "input/output:      {} / {} tokens, median of {}",
            args.input_len, args.output_len, args.num_iters
        );
        println!("prefill:           {prefill:.1} ms ({prefill_tps:.1} tok/s)");
        println!("decode:            {per_token:.2} ms/token ({decode_tps:.1} tok/s)");
        println!("end to end:        {total:.3} s");
    }
    Ok(())
}
