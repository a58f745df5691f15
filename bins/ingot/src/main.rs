//! `ingot`: the one binary. Subcommands: `serve`, `route`, `generate`,
//! `inspect`, `logits`, `bench`, `config`.

mod cmd;
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

fn main() -> ExitCode {
    logging::init();
    let cli = Cli::parse();
    // Commands that load a model take `log.level` from their config; the
    // others from the environment (INGOT_LOG, INGOT_LOG_LEVEL).
    let result = match cli.command {
        Command::Serve(args) => cmd::serve::run(args),
        Command::Route(args) => settings::log_from_env().and_then(|()| cmd::route::run(args)),
        Command::Generate(args) => cmd::generate::run(args),
        Command::Inspect(args) => settings::log_from_env().and_then(|()| cmd::inspect::run(args)),
        Command::Logits(args) => cmd::logits::run(args),
        Command::Bench(cmd) => cmd::bench::run(cmd),
        Command::Config(cmd) => cmd::config::run(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line for the user; the chain joined with ": ".
            eprintln!("error: {e:#}");
            if std::env::var_os("RUST_BACKTRACE").is_some() {
                eprintln!("{}", e.backtrace());
            }
            ExitCode::FAILURE
        }
    }
}
