//! `ingot serve`: the OpenAI-compatible server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use ingot_config::{Layers, Loaded};
use ingot_server::{LogLevelFn, ReloadFn, ServeConfig};

use crate::logging;
use crate::model::{self, ModelArgs};
use crate::served;
use crate::settings::{self, FlagSet, LogArgs};

/// Flags of `ingot serve` (and `ingot config show`). Every one is optional:
/// a flag that is not given leaves its key to the config file, then
/// `INGOT_*`, then the built-in default (docs/config.md). The key each sets
/// is in brackets, with its default.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// A TOML config file (see ingot.example.toml).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    pub log: LogArgs,
    /// Address to listen on [server.host; 127.0.0.1].
    #[arg(long)]
    host: Option<String>,
    /// Port; 0 picks a free one and prints it [server.port; 8000].
    #[arg(long)]
    port: Option<u16>,
    /// Name clients pass as `model` [model.served_model_name; the Hub id
    /// `org/name`, else the file's stem].
    #[arg(long)]
    served_model_name: Option<String>,
    /// Most sequences running at once [scheduler.max_num_seqs; 64].
    #[arg(long)]
    max_num_seqs: Option<usize>,
    /// Waiting-queue bound; beyond it requests get 429, low tiers earlier
    /// [scheduler.max_waiting; 256].
    #[arg(long)]
    max_waiting: Option<usize>,
    /// Disable automatic prefix caching [engine.prefix_caching = false].
    #[arg(long)]
    no_prefix_caching: bool,
    /// How long a client may stop reading before its request is cut off:
    /// "30s", "500ms" or seconds [engine.stall_timeout; 30s].
    #[arg(long)]
    stall_timeout: Option<String>,
    /// How long in-flight requests may finish after SIGTERM
    /// [server.shutdown_timeout; 30s].
    #[arg(long)]
    shutdown_timeout: Option<String>,
    /// Largest request body: "4MiB" or bytes [server.max_body_bytes; 4MiB].
    #[arg(long)]
    max_body_bytes: Option<String>,
    /// Waiting this long promotes a request one tier [scheduler.aging; 10s].
    #[arg(long)]
    aging: Option<String>,
    /// First-token deadlines for critical,high,normal,low,background, in
    /// seconds or with units; a request past its deadline is scheduled before
    /// others of its tier [scheduler.priority_deadlines; 0.25,1,5,30,120].
    #[arg(long)]
    priority_deadlines: Option<String>,
    /// Require this API key (Bearer or x-api-key): an admin key without
    /// limits. Only its SHA-256 is kept [auth.api_key_sha256]; prefer
    /// `[auth]` keys or `auth.key_file` where other users can read the
    /// command line.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
}

/// The five keys `--priority-deadlines` sets, in its order.
const DEADLINE_KEYS: [&str; 5] = [
    "scheduler.priority_deadlines.critical",
    "scheduler.priority_deadlines.high",
    "scheduler.priority_deadlines.normal",
    "scheduler.priority_deadlines.low",
    "scheduler.priority_deadlines.background",
];

impl ServeArgs {
    /// The config layers: `--config`, the current environment, these flags.
    pub fn layers(&self) -> anyhow::Result<Layers> {
        Ok(Layers {
            file: self.config.clone(),
            env: settings::env(),
            flags: self.flags()?.into_vec(),
        })
    }

    fn flags(&self) -> anyhow::Result<FlagSet> {
        let mut f = FlagSet::default();
        self.model.add_to(&mut f)?;
        self.log.add_to(&mut f);
        f.opt("--host", "server.host", &self.host);
        f.opt("--port", "server.port", &self.port);
        f.opt(
            "--served-model-name",
            "model.served_model_name",
            &self.served_model_name,
        );
        f.opt(
            "--max-num-seqs",
            "scheduler.max_num_seqs",
            &self.max_num_seqs,
        );
        f.opt("--max-waiting", "scheduler.max_waiting", &self.max_waiting);
        f.switch(
            "--no-prefix-caching",
            "engine.prefix_caching",
            self.no_prefix_caching,
            false,
        );
        f.opt(
            "--stall-timeout",
            "engine.stall_timeout",
            &self.stall_timeout,
        );
        f.opt(
            "--shutdown-timeout",
            "server.shutdown_timeout",
            &self.shutdown_timeout,
        );
        f.opt(
            "--max-body-bytes",
            "server.max_body_bytes",
            &self.max_body_bytes,
        );
        f.opt("--aging", "scheduler.aging", &self.aging);
        let api_key = self.api_key.as_deref().map(ingot_edge::hash_key_hex);
        f.opt("--api-key", "auth.api_key_sha256", &api_key);
        if let Some(spec) = &self.priority_deadlines {
            let values: Vec<String> = spec.split(',').map(|v| v.trim().to_string()).collect();
            anyhow::ensure!(
                values.len() == DEADLINE_KEYS.len(),
                "--priority-deadlines needs 5 values (critical,high,normal,low,background), got {}",
                values.len()
            );
            for (key, value) in DEADLINE_KEYS.into_iter().zip(values) {
                f.opt("--priority-deadlines", key, &Some(value));
            }
        }
        Ok(f)
    }
}

/// The name clients pass as `model`: the configured one, else the Hub id
/// `org/name` the model was given as (as vLLM), else the file's stem (a
/// directory's name).
fn model_name(loaded: &Loaded, path: &Path, hub_id: Option<String>) -> String {
    if let Some(name) = &loaded.config.model.served_model_name {
        return name.clone();
    }
    if let Some(id) = hub_id {
        return id;
    }
    let stem = if path.is_dir() {
        path.file_name()
    } else {
        path.file_stem()
    };
    stem.map_or_else(|| "model".to_string(), |s| s.to_string_lossy().into_owned())
}

/// The feature flags on for someone: `name`, or `name@P%` while rolled
/// out to P % of units; `none` when there are none.
fn enabled_flags(config: &ingot_config::Config) -> String {
    let on: Vec<String> = config
        .flags
        .iter()
        .filter(|(_, f)| f.enabled && (f.rollout_percent > 0.0 || !f.allow.is_empty()))
        .map(|(name, f)| {
            if f.rollout_percent >= 100.0 {
                name.clone()
            } else {
                format!("{name}@{}%", f.rollout_percent)
            }
        })
        .collect();
    if on.is_empty() {
        "none".to_string()
    } else {
        on.join(",")
    }
}

/// Re-runs the loader with the same file and flags and the environment as
/// it is now (SIGHUP, `POST /admin/reload`).
fn reload_fn(layers: Layers) -> ReloadFn {
    Arc::new(move || {
        settings::load_checked(&Layers {
            env: settings::env(),
            ..layers.clone()
        })
    })
}

/// Runs the command. A bad config ends it here, before anything binds.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let layers = args.layers()?;
    let loaded = settings::load(&layers)?;
    // A Hub id becomes local files here; `loaded` keeps the id, so a
    // reload compares like with like.
    let mut config = loaded.config.clone();
    let hub_id = model::resolve_hub(&mut config)?;
    let default_name = match config.models.first() {
        Some(m) => m.id.clone(),
        None => model_name(&loaded, settings::model_path(&config)?, hub_id),
    };
    let entries = served::entries(&config, &default_name)?;
    let server = &config.server;
    let addr: SocketAddr = format!("{}:{}", server.host, server.port)
        .parse()
        .with_context(|| {
            format!(
                "server.host/server.port {}:{} is not a socket address",
                server.host, server.port
            )
        })?;
    let set_log_level: LogLevelFn = Arc::new(logging::set);
    let serve = ServeConfig {
        addr,
        model_name: default_name,
        max_body_bytes: usize::try_from(server.max_body_bytes.bytes()).unwrap_or(usize::MAX),
        shutdown_timeout: server.shutdown_timeout.get(),
        connections: ingot_server::ConnLimits {
            header_timeout: server.header_timeout.get(),
            max_connections: server.max_connections,
            max_connections_per_client: server.max_connections_per_client,
        },
        runtime: loaded,
        reload: Some(reload_fn(layers)),
        set_log_level: Some(set_log_level),
        embedding_models: entries
            .iter()
            .filter(|e| ingot_models::bert::is_bert(&e.path))
            .map(|e| e.id.clone())
            .collect(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ingot-http")
        .build()
        .context("cannot start the async runtime")?;
    logging::start_tracing(&config.tracing)?;
    let count = entries.len();
    // First: a model's setting that fails (a chat template that does not
    // compile) is the one line printed.
    let models = served::registry(&config, entries, runtime.handle().clone())?;
    tracing::info!(
        target: served::STARTUP,
        models = count,
        prefix_caching = config.engine.prefix_caching,
        flags = %enabled_flags(&config),
        "features"
    );
    let served = runtime.block_on(ingot_server::serve(
        serve,
        models,
        crate::signal::shutdown_signal(),
    ));
    drop(runtime);
    logging::shutdown();
    served?;
    Ok(())
}
