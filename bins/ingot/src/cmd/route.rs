//! `ingot route`: the router in front of several `ingot serve` workers
//! (crate ingot-router; docs/router.md).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use ingot_router::RouterConfig;

use crate::settings::LogArgs;

/// Flags of `ingot route`. Each overrides its key in the config file; the
/// key is in brackets, with its default.
#[derive(Args, Debug, Clone)]
pub struct RouteArgs {
    /// The router's TOML config file (docs/router.md).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on [host; 127.0.0.1].
    #[arg(long)]
    host: Option<String>,
    /// Port; 0 picks a free one and prints it [port; 8080].
    #[arg(long)]
    port: Option<u16>,
    /// A running worker's base URL, e.g. http://10.0.0.5:8000; repeatable
    /// [workers.urls, appended].
    #[arg(long = "worker", value_name = "URL")]
    workers: Vec<String>,
    /// Start and supervise N local `ingot serve` workers [workers.local; 0].
    #[arg(long, value_name = "N")]
    local: Option<usize>,
    /// round_robin | least_outstanding | power_of_two | latency_aware |
    /// prefix_cache
    /// [policy; least_outstanding].
    #[arg(long)]
    policy: Option<String>,
    /// Print the JSON schema of the config file and exit.
    #[arg(long)]
    schema: bool,
    /// Check the config (file and flags) and exit: prints "ok".
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    pub log: LogArgs,
    /// Arguments of every local worker after `ingot serve`, given after
    /// `--` (e.g. `-- --model /m --kv-cache-tokens 4096`) [workers.args].
    #[arg(last = true, value_name = "SERVE_ARGS")]
    serve_args: Vec<String>,
}

/// Runs the router until SIGTERM or SIGINT.
pub fn run(args: RouteArgs) -> anyhow::Result<()> {
    if args.schema {
        println!("{}", serde_json::to_string_pretty(&ingot_router::schema())?);
        return Ok(());
    }
    let mut raw = match &args.config {
        Some(path) => RouterConfig::from_file(path)?,
        None => RouterConfig::default(),
    };
    if args.host.is_some() {
        raw.host = args.host;
    }
    if args.port.is_some() {
        raw.port = args.port;
    }
    raw.workers.urls.extend(args.workers);
    if args.local.is_some() {
        raw.workers.local = args.local;
    }
    if let Some(p) = &args.policy {
        raw.policy = Some(
            serde_json::from_value(serde_json::Value::String(p.clone()))
                .with_context(|| format!("--policy: unknown policy `{p}`"))?,
        );
    }
    if !args.serve_args.is_empty() {
        raw.workers.args = args.serve_args;
    }
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let config = raw.validate(exe)?;
    if args.check {
        println!("ok");
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(ingot_router::serve(
        config,
        crate::signal::shutdown_signal(),
    ))?;
    Ok(())
}
