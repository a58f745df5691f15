//! The binary's side of `ingot-config`: the process environment and the
//! command line go in, the engine's and runners' settings come out. This is
//! the one place below `main` that reads the environment, and the config is
//! the one source of every default.

use std::path::Path;

use ingot_config::{Config, ConfigError, FlagValue, Layers, Loaded};
use ingot_engine::{EngineConfig, MetricsConfig, SpeculativeConfig, SpeculativeMethod};
use ingot_scheduler::SchedulerConfig;
use serde_json::Value;

use crate::logging;

/// The process environment, as the config loader takes it (variables whose
/// name or value is not UTF-8 cannot be config and are left out).
pub fn env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// Loads and checks `layers`, then applies `log.level` and `log.format`.
pub fn load(layers: &Layers) -> anyhow::Result<Loaded> {
    let loaded = load_checked(layers)?;
    logging::set(&loaded.config.log.level).map_err(anyhow::Error::msg)?;
    logging::set_format(loaded.config.log.format).map_err(anyhow::Error::msg)?;
    Ok(loaded)
}

/// Loads `layers` and adds the checks that need this binary's dependencies:
/// `log.level` must parse as a tracing filter and `cuda.l2_prefetch` as the
/// CUDA runner reads it (so a bad value fails here, on any machine).
pub fn load_checked(layers: &Layers) -> Result<Loaded, ConfigError> {
    let loaded = ingot_config::load(layers)?;
    logging::parse(&loaded.config.log.level)
        .map_err(|e| loaded.error("log.level", format!("not a tracing filter directive: {e}")))?;
    if let Some(spec) = &loaded.config.cuda.l2_prefetch {
        ingot_runner_cuda::check_l2_prefetch(spec)
            .map_err(|e| loaded.error("cuda.l2_prefetch", e.to_string()))?;
    }
    Ok(loaded)
}

/// Sets `log.level` from the environment alone, for commands that take no
/// other configuration (`bench serve` ...).
pub fn log_from_env() -> anyhow::Result<()> {
    log_from(&LogArgs::default())
}

/// Sets `log.level` from `--log-level` over the environment, for commands
/// that take no other configuration (`inspect`, `route`).
pub fn log_from(args: &LogArgs) -> anyhow::Result<()> {
    let mut flags = FlagSet::default();
    args.add_to(&mut flags);
    load(&Layers {
        env: env(),
        flags: flags.into_vec(),
        ..Layers::default()
    })
    .map(drop)
}

/// `--log-level`, on the commands that log while they run.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// What to log: `error`, `warn`, `info`, `debug`, `trace`, or a tracing
    /// filter directive such as `warn,ingot_server=debug`; at `debug` a
    /// failure also prints its backtrace
    /// [log.level; warn, with the start-up summary at info].
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
}

impl LogArgs {
    /// The flag, when given, as a config value.
    pub fn add_to(&self, flags: &mut FlagSet) {
        flags.opt("--log-level", "log.level", &self.log_level);
    }
}

/// The model to load.
pub fn model_path(config: &Config) -> anyhow::Result<&Path> {
    config.model.path.as_deref().ok_or_else(|| {
        anyhow::anyhow!(
            "model.path is required (--model, model.path in the config, or INGOT_MODEL)"
        )
    })
}

/// The engine's settings, every field from the config.
pub fn engine_config(config: &Config) -> EngineConfig {
    let s = &config.scheduler;
    EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: s.max_num_seqs,
            max_num_batched_tokens: s.max_num_batched_tokens,
            max_prefill_only_tokens: s.prefill_only_tokens(),
            max_waiting: s.max_waiting,
            tier_deadlines: s.priority_deadlines.as_array(),
            aging: s.aging.get(),
        },
        prefix_caching: config.engine.prefix_caching,
        stall_timeout: config.engine.stall_timeout.get(),
        close_structured_near_limit: config.structured.close_near_limit,
        speculative: speculative_config(&config.speculative),
        // The model name is the server's to give (`cmd::serve`).
        metrics: MetricsConfig {
            vllm_names: config.metrics.vllm_names,
            ..MetricsConfig::default()
        },
        // Not a config key: per-request event buffering is an engine detail.
        ..EngineConfig::default()
    }
}

/// The engine's speculation from `[speculative]`.
fn speculative_config(s: &ingot_config::SpeculativeSection) -> SpeculativeConfig {
    SpeculativeConfig {
        method: match s.method {
            ingot_config::SpeculativeMethod::None => None,
            ingot_config::SpeculativeMethod::Ngram => Some(SpeculativeMethod::Ngram),
            ingot_config::SpeculativeMethod::Draft => Some(SpeculativeMethod::Draft),
            ingot_config::SpeculativeMethod::Eagle3 => Some(SpeculativeMethod::Eagle3),
        },
        num_speculative_tokens: s.num_speculative_tokens,
        ngram_min: s.prompt_lookup_min,
        ngram_max: s.prompt_lookup_max,
        disable_by_batch_size: s.disable_by_batch_size,
        adaptive: s.adaptive,
        rate_by_match: s.rate_by_match,
        launch_ahead_unmatched: s.launch_ahead_unmatched,
    }
}

/// Command-line flags that were given, as config values.
#[derive(Debug, Default)]
pub struct FlagSet(Vec<FlagValue>);

impl FlagSet {
    /// `flag` sets `key` when it was given.
    pub fn opt<T: Clone + Into<Value>>(
        &mut self,
        flag: &'static str,
        key: &'static str,
        value: &Option<T>,
    ) {
        if let Some(v) = value {
            self.0.push(FlagValue {
                key,
                value: v.clone().into(),
                flag,
            });
        }
    }

    /// A switch: when given, `key` becomes `value`.
    pub fn switch(&mut self, flag: &'static str, key: &'static str, given: bool, value: bool) {
        self.opt(flag, key, &given.then_some(value));
    }

    /// The flags, in the order given here (a later one wins for a key).
    pub fn into_vec(self) -> Vec<FlagValue> {
        self.0
    }
}
