//! `ingot serve`: the OpenAI-compatible server.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ingot_engine::EngineConfig;
use ingot_scheduler::SchedulerConfig;
use ingot_server::ServeConfig;

use crate::model::{load_engine, ModelArgs};

/// Flags of `ingot serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", env = "INGOT_HOST")]
    host: String,
    /// Port (0: any free port; the bound address is printed).
    #[arg(long, default_value_t = 8000, env = "INGOT_PORT")]
    port: u16,
    /// Name clients pass as `model` (default: the model file's stem).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Most sequences running at once.
    #[arg(long, default_value_t = 64)]
    max_num_seqs: usize,
    /// Waiting-queue bound; beyond it requests get 429 (low tiers earlier).
    #[arg(long, default_value_t = 256)]
    max_waiting: usize,
    /// Disable automatic prefix caching.
    #[arg(long)]
    no_prefix_caching: bool,
    /// Seconds a client may stop reading before its request is cut off.
    #[arg(long, default_value_t = 30.0)]
    stall_timeout: f64,
    /// Seconds to let in-flight requests finish after SIGTERM.
    #[arg(long, default_value_t = 30.0)]
    shutdown_timeout: f64,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Seconds waited per tier before a request is promoted one tier.
    #[arg(long, default_value_t = 10.0)]
    aging: f64,
    /// First-token deadlines in seconds for critical,high,normal,low,background;
    /// a request past its deadline is scheduled before others of its tier.
    #[arg(long, default_value = "0.25,1,5,30,120")]
    priority_deadlines: String,
}

/// Parses five comma-separated second values.
fn deadlines(spec: &str) -> anyhow::Result<[Duration; 5]> {
    let values: Vec<Duration> = spec
        .split(',')
        .map(|v| secs("priority-deadlines", v.trim().parse().unwrap_or(f64::NAN)))
        .collect::<anyhow::Result<_>>()?;
    values.try_into().map_err(|v: Vec<Duration>| {
        anyhow::anyhow!("--priority-deadlines needs 5 values, got {}", v.len())
    })
}

fn secs(name: &str, v: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(v)
        .with_context(|| format!("--{name} must be a non-negative number of seconds"))
}

/// Runs the command.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .with_context(|| format!("invalid --host/--port {}:{}", args.host, args.port))?;
    let model_name = args.served_model_name.clone().unwrap_or_else(|| {
        let p = &args.model.model;
        let stem = if p.is_dir() {
            p.file_name()
        } else {
            p.file_stem()
        };
        stem.map_or_else(|| "model".to_string(), |s| s.to_string_lossy().into_owned())
    });
    anyhow::ensure!(args.max_num_seqs > 0, "--max-num-seqs must be positive");
    let engine = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: args.max_num_seqs,
            max_num_batched_tokens: args.model.max_num_batched_tokens,
            max_waiting: args.max_waiting,
            aging: secs("aging", args.aging)?,
            tier_deadlines: deadlines(&args.priority_deadlines)?,
        },
        prefix_caching: !args.no_prefix_caching,
        stall_timeout: secs("stall-timeout", args.stall_timeout)?,
        ..EngineConfig::default()
    };
    let config = ServeConfig {
        addr,
        model_name,
        max_body_bytes: args.max_body_bytes,
        shutdown_timeout: secs("shutdown-timeout", args.shutdown_timeout)?,
    };
    let model = args.model;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ingot-http")
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(ingot_server::serve(config, move || {
        let gen = load_engine(&model, engine).map_err(|e| format!("{e:#}"))?;
        eprintln!("ingot: serving on {}", gen.device_name());
        Ok(gen)
    }))?;
    Ok(())
}
