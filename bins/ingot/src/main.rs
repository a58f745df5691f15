//! `ingot`: the one binary. Subcommands: `serve`, `route`, `generate`,
//! `inspect`, `logits`, `bench`, `config`.

mod cmd;
mod hub;
mod kv_tiers;
mod logging;
mod model;
mod served;
mod settings;
mod signal;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// ingot: an LLM serving engine.
#[derive(Parser)]
#[command(version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at startup
enum Command {
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(cmd::serve::ServeArgs),
    /// Route requests over several `ingot serve` workers (health checks,
    /// retries, circuit breakers, supervised local workers).
    Route(cmd::route::RouteArgs),
    /// Generate text from a prompt (or chat interactively) and stream it to stdout.
    Generate(cmd::generate::GenerateArgs),
    /// Print a model's architecture, size, tensor types, tokenizer and chat template.
    Inspect(cmd::inspect::InspectArgs),
    /// Run one forward pass and write the last position's logits (for
    /// correctness checks across backends and frameworks).
    Logits(cmd::logits::LogitsArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// The config file: its schema, a validity check, the effective settings.
    #[command(subcommand)]
    Config(cmd::config::ConfigCommand),
}

impl Command {
    /// `--log-level`, on the commands that take it.
    fn log_level(&self) -> Option<&str> {
        match self {
            Command::Serve(a) => a.log.log_level.as_deref(),
            Command::Route(a) => a.log.log_level.as_deref(),
            Command::Generate(a) => a.log.log_level.as_deref(),
            Command::Inspect(a) => a.log.log_level.as_deref(),
            Command::Logits(_) | Command::Bench(_) | Command::Config(_) => None,
        }
    }
}

fn main() -> ExitCode {
    logging::init();
    let cli = Cli::parse();
    let debug = asks_for_debug(cli.command.log_level());
    if debug && std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // anyhow captures an error's backtrace only when this (or
        // RUST_BACKTRACE) is set. Set before any thread starts, so no
        // other thread reads the environment while it changes.
        std::env::set_var("RUST_LIB_BACKTRACE", "1");
    }
    // Commands that load a model take `log.level` from their config; the
    // others from `--log-level` or the environment (INGOT_LOG,
    // INGOT_LOG_LEVEL).
    let result = match cli.command {
        Command::Serve(args) => cmd::serve::run(args),
        Command::Route(args) => settings::log_from(&args.log).and_then(|()| cmd::route::run(args)),
        Command::Generate(args) => cmd::generate::run(args),
        Command::Inspect(args) => {
            settings::log_from(&args.log).and_then(|()| cmd::inspect::run(args))
        }
        Command::Logits(args) => cmd::logits::run(args),
        Command::Bench(cmd) => cmd::bench::run(cmd),
        Command::Config(cmd) => cmd::config::run(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line for the user; the chain joined with ": ". A
            // backtrace is for whoever debugs ingot: only at the debug log
            // level, whatever RUST_BACKTRACE says (a configuration error
            // with 40 lines of frames under it reads as a crash).
            eprintln!("error: {e:#}");
            let captured = e.backtrace().status() == std::backtrace::BacktraceStatus::Captured;
            if captured && (debug || logging::debug_enabled()) {
                eprintln!("{}", e.backtrace());
            }
            ExitCode::FAILURE
        }
    }
}

/// Whether the user asked for debug logs before any config was read:
/// `--log-level`, else `INGOT_LOG_LEVEL` or `INGOT_LOG` (a config that
/// fails to load never sets its own level; one that loads is asked through
/// [`logging::debug_enabled`]).
fn asks_for_debug(flag: Option<&str>) -> bool {
    let env = |name: &str| std::env::var(name).ok();
    flag.map(str::to_string)
        .or_else(|| env("INGOT_LOG_LEVEL"))
        .or_else(|| env("INGOT_LOG"))
        .is_some_and(|d| logging::is_debug(&d))
}
