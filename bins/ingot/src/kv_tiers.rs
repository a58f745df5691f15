//! `[kv_tiers]` and `[redis] share_kv` for one served model: the namespace
//! its pages are stored under, its tiers and its shared store.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use ingot_config::{Config, LoadFormat};
use ingot_kv_tiers::{KvTiers, Namespace, SharedKv, TierSettings};
use ingot_models::ModelConfig;
use ingot_runner::ModelRunner;

/// Windows of a weights file hashed for its identity, and their size.
const WINDOWS: u64 = 16;
const WINDOW: u64 = 64 << 10;

/// What a model's KV tiers are built with, shared by its engines.
pub struct TierContext {
    /// Where the publisher and prefetches run.
    pub runtime: tokio::runtime::Handle,
    /// The connection for shared pages (made on first use).
    fleet: OnceLock<Option<ingot_fleet::Fleet>>,
}

impl TierContext {
    /// Tiers whose shared store runs on `runtime`.
    pub fn new(runtime: tokio::runtime::Handle) -> Self {
        Self {
            runtime,
            fleet: OnceLock::new(),
        }
    }

    /// Its own connections, so large page transfers never hold up the
    /// small commands of rate limits and the registry; commands carry a
    /// few MiB, so they get at least a second.
    fn fleet(&self, config: &Config) -> Option<ingot_fleet::Fleet> {
        self.fleet
            .get_or_init(|| {
                let mut settings = ingot_fleet::FleetSettings::from_section(&config.redis)?;
                settings.command_timeout = settings
                    .command_timeout
                    .max(std::time::Duration::from_secs(1));
                let _entered = self.runtime.enter();
                ingot_fleet::Fleet::connect(&settings)
                    .map_err(|e| tracing::warn!(error = %e, "KV sharing off"))
                    .ok()
            })
            .clone()
    }
}

/// A model's tiers and its shared store (each `None` when off).
pub type ModelTiers = (Option<Arc<KvTiers>>, Option<Arc<SharedKv>>);

/// The tiers of a model served by `runner` from `path` (none when
/// `[kv_tiers]` is off or the backend cannot copy pages).
pub fn open(
    context: &TierContext,
    config: &Config,
    id: &str,
    path: &Path,
    runner: &dyn ModelRunner,
) -> anyhow::Result<ModelTiers> {
    let section = &config.kv_tiers;
    if !section.enabled() || !config.engine.prefix_caching {
        return Ok((None, None));
    }
    let page_bytes = runner.kv_page_bytes();
    if page_bytes == 0 {
        tracing::warn!(
            "{id}: KV tiers are off: {} cannot copy KV pages",
            runner.device_name()
        );
        return Ok((None, None));
    }
    let settings = TierSettings {
        host_bytes: section.host_bytes.bytes(),
        disk_path: section.disk_path.clone(),
        disk_bytes: section.disk_bytes.bytes(),
    };
    let ns = namespace(config, path, runner)?;
    let tiers = Arc::new(
        KvTiers::open(&settings, ns, id)
            .context("cannot open the KV disk tier (kv_tiers.disk_path)")?,
    );
    let share = match (config.redis.share_kv, context.fleet(config)) {
        (true, Some(fleet)) => {
            let entry = page_bytes + ingot_kv_tiers::entry::HEADER;
            let store = ingot_fleet::kv::RedisKvStore::new(
                fleet,
                &ns.hex(),
                entry,
                config.redis.kv_max_bytes.bytes(),
                config.redis.kv_ttl.get(),
            );
            let layout = runner.kv_layout();
            let pages = (0..layout.groups().len())
                .map(|g| layout.pages_per_block(g) as u32)
                .collect();
            let _entered = context.runtime.enter();
            Some(SharedKv::start(
                Arc::new(store),
                tiers.clone(),
                runner.kv_cache_shape().block_size,
                pages,
                page_bytes,
            ))
        }
        _ => None,
    };
    Ok((Some(tiers), share))
}

/// Everything that decides a page's bytes: the weights (and with them the
/// tokenizer a GGUF carries), a directory's tokenizer and config files,
/// the decoder config, the numeric settings, the backend's page format,
/// the block size and layer layout, and the tensor-parallel split (one
/// rank today). Pages are only restored under the same namespace.
fn namespace(config: &Config, path: &Path, runner: &dyn ModelRunner) -> anyhow::Result<Namespace> {
    let m = &config.model;
    let weights = match m.load_format {
        LoadFormat::Dummy => b"dummy".to_vec(),
        LoadFormat::Auto => files_identity(path)?,
    };
    let model: &ModelConfig = runner.config();
    let numerics = format!(
        "{:?} {:?} {:?} {:?} {:?} deterministic={}",
        m.dtype,
        m.cpu_weights,
        m.cuda_weights,
        m.quantization,
        m.kv_cache_dtype,
        config.engine.deterministic
    );
    let shape = runner.kv_cache_shape();
    let page = format!(
        "{} block={} page_bytes={} layout={:?}",
        runner.kv_page_format(),
        shape.block_size,
        runner.kv_page_bytes(),
        runner.kv_layout()
    );
    Ok(Namespace::of(&[
        ("weights", &weights),
        ("model", format!("{model:?}").as_bytes()),
        ("numerics", numerics.as_bytes()),
        ("page", page.as_bytes()),
        ("tensor_parallel", b"1"),
    ]))
}

/// A file's (or a directory's files') names, sizes and sampled contents:
/// 16 windows of 64 KiB spread over each file, first and last included.
/// Two different checkpoints of one shape differ in almost every window;
/// hashing whole files would cost a read of the model at every start.
fn files_identity(path: &Path) -> anyhow::Result<Vec<u8>> {
    let mut files = Vec::new();
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            let p = entry?.path();
            if p.is_file() {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut h = blake3::Hasher::new();
    for file in files {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
        h.update(name.unwrap_or_default().as_bytes());
        let mut f = std::fs::File::open(&file).with_context(|| format!("{}", file.display()))?;
        let len = f.metadata()?.len();
        h.update(&len.to_le_bytes());
        let mut buf = vec![0u8; WINDOW as usize];
        for i in 0..WINDOWS {
            let at = (len.saturating_sub(WINDOW)) * i / (WINDOWS - 1);
            f.seek(SeekFrom::Start(at))?;
            let n = f.read(&mut buf)?;
            h.update(&buf[..n]);
        }
    }
    Ok(h.finalize().as_bytes().to_vec())
}
