//! `ingot bench load`: how long a model takes to come up and to come back.
//!
//! Three measurements, each followed by one request's first token:
//! - cold load with the model's files dropped from the page cache (where the
//!   kernel lets an unprivileged process drop them),
//! - cold load with the page cache warm,
//! - a switch back from a warm host copy: the engine is put to sleep (device
//!   memory given back, weights kept in host memory) and woken, as the
//!   registry does when a model it evicted is asked for again.

use std::path::Path;
use std::time::Instant;

use clap::Args;
use ingot_core::{SamplingParams, TokenId};
use ingot_engine::EngineHandle;

use crate::cmd::bench::run_once;
use crate::model::{load_engine, model_files, ModelArgs};
use crate::settings::{self, FlagSet};

/// Flags of `ingot bench load`.
#[derive(Args, Debug)]
pub struct LoadArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Cold loads of each kind.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Switches from the warm host copy.
    #[arg(long, default_value_t = 20)]
    switches: usize,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Times of one kind, in milliseconds.
#[derive(Default)]
struct Samples {
    ready: Vec<f64>,
    first_token: Vec<f64>,
}

impl Samples {
    fn push(&mut self, ready: f64, first_token: f64) {
        self.ready.push(ready * 1e3);
        self.first_token.push(first_token * 1e3);
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "n": self.ready.len(),
            "ready_ms": {"p50": percentile(&self.ready, 0.5), "p99": percentile(&self.ready, 0.99)},
            "first_token_ms": {"p50": percentile(&self.first_token, 0.5), "p99": percentile(&self.first_token, 0.99)},
        })
    }

    fn line(&self, what: &str) -> String {
        format!(
            "{what:<34} ready p50 {:>9.1} ms  p99 {:>9.1} ms | +first token p50 {:>7.1} ms  p99 {:>7.1} ms  ({} runs)",
            percentile(&self.ready, 0.5),
            percentile(&self.ready, 0.99),
            percentile(&self.first_token, 0.5),
            percentile(&self.first_token, 0.99),
            self.ready.len()
        )
    }
}

/// The nearest-rank percentile (NaN when empty).
fn percentile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n => v[((q * n as f64).ceil() as usize).clamp(1, n) - 1],
    }
}

/// Runs the command.
pub fn run(args: LoadArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.rounds > 0 || args.switches > 0,
        "--rounds and --switches are both 0"
    );
    let config = args.model.load(FlagSet::default())?.config;
    let path = settings::model_path(&config)?.to_path_buf();
    let dummy = config.model.load_format == ingot_config::LoadFormat::Dummy;
    let files = if dummy {
        Vec::new()
    } else {
        model_files(&path)
    };
    let (mut cold, mut warm_cache, mut switch) =
        (Samples::default(), Samples::default(), Samples::default());
    let mut dropped_all = !files.is_empty();
    let mut device = String::new();
    for _ in 0..args.rounds {
        if !files.is_empty() {
            dropped_all &= files.iter().all(|f| drop_page_cache(f));
            let (engine, ready) = load_timed(&config)?;
            cold.push(ready, first_token(&engine)?);
        }
        let (engine, ready) = load_timed(&config)?;
        warm_cache.push(ready, first_token(&engine)?);
        device = engine.device_name().to_string();
    }
    if args.switches > 0 {
        let (engine, _) = load_timed(&config)?;
        first_token(&engine)?;
        device = engine.device_name().to_string();
        for _ in 0..args.switches {
            engine.sleep().map_err(anyhow::Error::msg)?;
            let started = Instant::now();
            engine.wake().map_err(anyhow::Error::msg)?;
            let woke = started.elapsed().as_secs_f64();
            switch.push(woke, first_token(&engine)?);
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "device": device, "model": path, "page_cache_dropped": dropped_all,
                "cold_page_cache_dropped": cold.json(), "cold_page_cache_warm": warm_cache.json(),
                "switch_from_host_copy": switch.json(),
            })
        );
    } else {
        println!("device: {device}\nmodel:  {}", path.display());
        if !cold.ready.is_empty() {
            let how = if dropped_all {
                ""
            } else {
                " (not all pages dropped)"
            };
            println!("{}", cold.line(&format!("load, page cache dropped{how}")));
        }
        println!("{}", warm_cache.line("load, page cache warm"));
        if !switch.ready.is_empty() {
            println!("{}", switch.line("switch from the warm host copy"));
        }
    }
    Ok(())
}

/// Loads an engine; returns it and the seconds it took.
fn load_timed(config: &ingot_config::Config) -> anyhow::Result<(EngineHandle, f64)> {
    let started = Instant::now();
    let engine = load_engine(config, settings::engine_config(config))?;
    Ok((engine, started.elapsed().as_secs_f64()))
}

/// Seconds to the first token of a short greedy request.
fn first_token(engine: &EngineHandle) -> anyhow::Result<f64> {
    let prompt: Vec<TokenId> = (1..=16).collect();
    Ok(run_once(engine, prompt, 1, SamplingParams::default())?.first_token)
}

/// Asks the kernel to drop `file`'s clean pages from the page cache; true
/// when it accepted.
fn drop_page_cache(file: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(file) else {
        return false;
    };
    // SAFETY: a valid descriptor of an open file; no memory is passed.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) == 0 }
}
