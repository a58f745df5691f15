//! The served models of `ingot serve`: `[[models]]`, or `[model]` alone,
//! as a registry whose loader opens, sizes and builds them. Each model's
//! path and settings are derived once ([`ModelPlan`]); the one backend
//! picker is `model::build_runner`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use ingot_config::{Config, CudaWeights, Device, Dtype, ModelEntry, Quantization};
use ingot_engine::RequestLimits;
use ingot_registry::{Budget, ModelSpec, Prefetch, Registry};
use ingot_runner_cpu::CpuRunner;
use ingot_server::{EngineLoader, LoadError, ModelBuilder, ModelFront, Models, ServedModel};

use crate::model;
use crate::settings;

/// The model entries to serve: `[[models]]`, or one made of `[model]`
/// (named `default_name`, preloaded and pinned: today's single model).
pub fn entries(config: &Config, default_name: &str) -> anyhow::Result<Vec<ModelEntry>> {
    if !config.models.is_empty() {
        return Ok(config.models.clone());
    }
    let path = settings::model_path(config)?;
    Ok(vec![ModelEntry {
        id: default_name.to_string(),
        aliases: Vec::new(),
        path: path.to_path_buf(),
        load_format: Some(config.model.load_format),
        dtype: Some(config.model.dtype),
        max_model_len: config.model.max_model_len,
        kv_cache_tokens: config.model.kv_cache_tokens,
        reasoning_parser: Some(config.model.reasoning_parser),
        chat_template: config.model.chat_template.clone(),
        pinned: true,
        preload: true,
        idle_timeout: ingot_config::Duration::from_secs(0),
    }])
}

/// One served model, derived once from its entry: its id, the file it is
/// read from, the config its engine is built with and whether it embeds.
struct ModelPlan {
    id: String,
    path: PathBuf,
    config: Config,
    embedding: bool,
    /// The operator's chat template (`model.chat_template`), read and
    /// checked when the plan is made.
    chat_template: Option<String>,
}

impl ModelPlan {
    /// `base` with the entry's fields in `[model]`; fails on a chat
    /// template that does not compile (at start-up, not at a request).
    fn new(base: &Config, e: &ModelEntry) -> anyhow::Result<Self> {
        let mut config = base.clone();
        let m = &mut config.model;
        m.path = Some(e.path.clone());
        m.served_model_name = Some(e.id.clone());
        if let Some(f) = e.load_format {
            m.load_format = f;
        }
        if let Some(d) = e.dtype {
            m.dtype = d;
        }
        m.max_model_len = e.max_model_len.or(m.max_model_len);
        m.kv_cache_tokens = e.kv_cache_tokens.or(m.kv_cache_tokens);
        if let Some(r) = e.reasoning_parser {
            m.reasoning_parser = r;
        }
        if e.chat_template.is_some() {
            m.chat_template = e.chat_template.clone();
        }
        let chat_template =
            model::chat_template_of(&config.model).with_context(|| format!("model {}", e.id))?;
        Ok(Self {
            id: e.id.clone(),
            path: e.path.clone(),
            config,
            embedding: ingot_models::bert::is_bert(&e.path),
            chat_template,
        })
    }

    /// The longest context the model's files and settings allow, before an
    /// engine knows its KV pool (which may bound it further on the GPU).
    fn context_bound(&self, model: &ingot_models::ModelConfig) -> usize {
        let m = &self.config.model;
        let mut len = model.max_context;
        if let Some(cap) = m.max_model_len {
            len = len.min(cap.max(1));
        }
        if let Some(kv) = m.kv_cache_tokens {
            len = len.min(kv.max(1));
        }
        len
    }
}

/// Opens, sizes and builds the models of `ingot serve`; the registry's
/// loader calls it on blocking threads.
struct ServedModels {
    plans: Vec<ModelPlan>,
    /// Where the models' KV tiers share pages from.
    tiers: crate::kv_tiers::TierContext,
}

impl ServedModels {
    fn plan(&self, id: &str) -> Result<&ModelPlan, LoadError> {
        self.plans
            .iter()
            .find(|p| p.id == id)
            .ok_or_else(|| LoadError::new(format!("no model '{id}' is configured")))
    }
}

impl ModelBuilder for ServedModels {
    fn front(&self, id: &str) -> Result<ModelFront, LoadError> {
        let plan = self.plan(id)?;
        if plan.embedding {
            return Ok(ModelFront::embedding(id));
        }
        let (files, tokenizer) = model::open(
            &plan.path,
            plan.config.model.load_format,
            plan.chat_template.as_deref(),
        )
        .map_err(LoadError::new)?;
        let limits = RequestLimits {
            max_context: plan.context_bound(&files.config),
            vocab_size: files.config.vocab_size,
        };
        Ok(ModelFront::generative(id, tokenizer, limits)
            .with_reasoning_parser(plan.config.model.reasoning_parser))
    }

    fn footprint(&self, id: &str) -> Result<u64, LoadError> {
        footprint(self.plan(id)?).map_err(LoadError::new)
    }

    fn build(&self, id: &str, front: &ModelFront) -> Result<ServedModel, LoadError> {
        let plan = self.plan(id)?;
        if plan.embedding {
            let (handle, params) =
                model::load_embedding(&plan.config, id, &plan.path).map_err(LoadError::new)?;
            tracing::info!(
                target: STARTUP,
                architecture = %"bert",
                parameters = %count(params as u64),
                "{id} serving embeddings on {}",
                handle.device_name()
            );
            return Ok(ServedModel::Embedding(handle));
        }
        let tokenizer = front
            .tokenizer()
            .map_err(|e| LoadError::new(e.to_string()))?
            .clone();
        let (handle, storage, kv) =
            start_served_engine(plan, tokenizer, &self.tiers).map_err(LoadError::new)?;
        summarize(plan, &handle, &storage, &kv);
        Ok(ServedModel::Generative(handle))
    }

    fn prefetch(&self, id: &str) -> Result<u64, LoadError> {
        let plan = self.plan(id)?;
        if plan.config.model.load_format == ingot_config::LoadFormat::Dummy {
            return Ok(0);
        }
        Ok(read_ahead(&plan.path))
    }
}

/// The log target of the start-up summary, which the default `log.level`
/// shows (`warn,ingot::startup=info`).
pub const STARTUP: &str = "ingot::startup";

/// Builds `plan`'s runner and starts its engine over `tokenizer` (the one
/// its front built).
fn start_served_engine(
    plan: &ModelPlan,
    tokenizer: Arc<ingot_tokenizer::Tokenizer>,
    tiers: &crate::kv_tiers::TierContext,
) -> anyhow::Result<(ingot_engine::EngineHandle, model::Storage, KvCapacity)> {
    let mut engine = settings::engine_config(&plan.config);
    engine.metrics.model_name = plan.id.clone();
    let draft = model::load_draft(&plan.config, &tokenizer, engine.scheduler.max_num_seqs)?;
    let files = model::open_files(&plan.path, plan.config.model.load_format)?;
    let built = model::build_runner(
        &plan.config,
        &plan.path,
        files,
        engine.scheduler.max_num_seqs,
    )?;
    (engine.kv_tiers, engine.kv_share) = crate::kv_tiers::open(
        tiers,
        &plan.config,
        &plan.id,
        &plan.path,
        built.runner.as_ref(),
    )?;
    // The KV figures as the engine derives them from the pool's layout
    // (a sliding-window layer group holds only its window).
    let (shape, layout) = (built.runner.kv_cache_shape(), built.runner.kv_layout());
    let step = engine.scheduler.largest_step();
    let max_num_seqs = engine.scheduler.max_num_seqs;
    let drafter = model::drafter(&plan.config, draft, built.runner.as_ref(), max_num_seqs)?;
    let handle = ingot_engine::start_engine_with_draft(built.runner, drafter, tokenizer, engine)?;
    if let Some(t) = handle.kv_tiers() {
        let k = &plan.config.kv_tiers;
        tracing::info!(
            target: STARTUP,
            host_mib = k.host_bytes.bytes() >> 20,
            disk_mib = k.disk_bytes.bytes() >> 20,
            disk_pages = t.usage().disk_pages,
            shared = t.shares(),
            "{} keeps evicted KV pages below the pool",
            plan.id
        );
    }
    let kv = KvCapacity {
        tokens: layout.capacity_tokens(shape.num_blocks, shape.block_size, step),
        sequences: shape.num_blocks
            / layout
                .max_pages(handle.max_context(), shape.block_size, step)
                .max(1),
    };
    Ok((handle, built.storage, kv))
}

/// What a model's KV cache holds, for the start-up summary.
struct KvCapacity {
    /// The longest sequence it can always hold (with full attention, every
    /// token slot it has).
    tokens: usize,
    /// Sequences of the model's full context it holds at once.
    sequences: usize,
}

/// The start-up summary's line of a generative model: what runs where,
/// and how many tokens and full-context sequences its KV cache holds.
fn summarize(
    plan: &ModelPlan,
    handle: &ingot_engine::EngineHandle,
    storage: &model::Storage,
    kv: &KvCapacity,
) {
    let model = handle.model_config();
    // Users see whether answers are batch-invariant by choice.
    let mode = if plan.config.engine.deterministic {
        " in deterministic mode"
    } else {
        ""
    };
    tracing::info!(
        target: STARTUP,
        architecture = %model.architecture.name(),
        parameters = %count(model.num_parameters()),
        weights = %storage.weights,
        weights_mib = storage.weight_bytes >> 20,
        kv_dtype = %storage.kv_dtype,
        kv_tokens = kv.tokens,
        kv_sequences = kv.sequences,
        max_context = handle.max_context(),
        reasoning_parser = %plan.config.model.reasoning_parser.as_str(),
        "{} serving on {}{mode}",
        plan.id,
        handle.device_name()
    );
}

/// `n` in millions or billions, as model sizes are quoted ("134.5M").
fn count(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2}B", n / 1e9)
    } else {
        format!("{:.1}M", n / 1e6)
    }
}

/// The registry of `entries` under `[registry]`'s budget.
pub fn registry(
    config: &Config,
    entries: Vec<ModelEntry>,
    runtime: tokio::runtime::Handle,
) -> anyhow::Result<Models> {
    // One pool for every CPU model, sized once.
    model::size_thread_pool(config.model.threads)?;
    let device_budget = device_budget(config)?;
    let mut plans = entries
        .iter()
        .map(|e| ModelPlan::new(config, e))
        .collect::<anyhow::Result<Vec<ModelPlan>>>()?;
    if plans.len() > 1 && on_gpu(config) {
        with_kv_shares(&mut plans, device_budget)?;
    }
    let specs = entries
        .iter()
        .map(|e| ModelSpec {
            id: e.id.clone(),
            aliases: e.aliases.clone(),
            pinned: e.pinned,
            preload: e.preload,
            idle_timeout: Some(e.idle_timeout.get()).filter(|d| !d.is_zero()),
        })
        .collect();
    let budget = Budget {
        device_bytes: device_budget,
        host_bytes: host_budget(config),
        load_wait: config.registry.load_wait.get(),
    };
    let served = ServedModels {
        plans,
        tiers: crate::kv_tiers::TierContext::new(runtime),
    };
    let loader = EngineLoader::new(Arc::new(served), budget.host_bytes > 0);
    let r = &config.registry;
    let prefetch = Prefetch {
        window: r.prefetch_window.get(),
        min_requests: r.prefetch_min_requests.max(1),
        max_per_window: r.prefetch_max,
    };
    Ok(Registry::new(loader, specs, budget).with_prefetch(prefetch))
}

/// Reads a model's file (or a directory's files) so it sits in the page
/// cache; returns the bytes read. A plain read: the kernel's WILLNEED hint
/// stops at its readahead window (8 MB here).
fn read_ahead(path: &Path) -> u64 {
    use std::io::Read;
    let mut buf = vec![0u8; 4 << 20];
    let mut read = 0u64;
    for f in model::model_files(path) {
        let Ok(mut file) = std::fs::File::open(&f) else {
            continue;
        };
        while let Ok(n) = file.read(&mut buf) {
            if n == 0 {
                break;
            }
            read += n as u64;
        }
    }
    read
}

/// `[registry] host_budget`, else on the GPU a quarter of physical memory
/// (pinned copies of evicted models' weights) and none on the CPU, where
/// warm copies would hold RAM beside the device budget's.
fn host_budget(config: &Config) -> u64 {
    if let Some(b) = config.registry.host_budget {
        return b.bytes();
    }
    if on_gpu(config) {
        physical_memory().map_or(0, |m| m / 4)
    } else {
        0
    }
}

/// `[registry] device_budget`, else on the CPU three quarters of physical
/// memory and on the GPU `model.gpu_memory_utilization` of its memory.
fn device_budget(config: &Config) -> anyhow::Result<u64> {
    if let Some(b) = config.registry.device_budget {
        return Ok(b.bytes());
    }
    if on_gpu(config) {
        let (_, total) = ingot_runner_cuda::device_memory(0)
            .context("cannot read the GPU's memory for the registry's budget")?;
        Ok((total as f64 * config.model.gpu_memory_utilization) as u64)
    } else {
        Ok(physical_memory().map_or(u64::MAX / 2, |m| m / 4 * 3))
    }
}

/// Slack per GPU model beside weights and KV: activations, cuBLASLt's
/// workspace, graphs and the sampler (measured at 60-160 MiB for 135M-8B).
const GPU_WORKSPACE_SLACK: u64 = 512 << 20;

/// Several models on one GPU: each entry without `kv_cache_tokens` gets
/// the KV cache of an equal share of the budget (less its weights and
/// workspace), so every model fits at once, instead of one engine taking
/// `model.gpu_memory_utilization` of all free memory.
fn with_kv_shares(plans: &mut [ModelPlan], budget: u64) -> anyhow::Result<()> {
    let n = plans.len() as u64;
    let share = budget / n;
    for (i, plan) in plans.iter_mut().enumerate() {
        if plan.config.model.kv_cache_tokens.is_some() || plan.embedding {
            continue;
        }
        let c = &plan.config;
        let (_, model) = metadata(plan)?;
        let weights = model.num_params() as u64 * 2;
        let per_token = gpu_kv_bytes_per_token(c, &model).max(1);
        let tokens = share.saturating_sub(weights + GPU_WORKSPACE_SLACK) / per_token;
        let block = c.engine.block_size as u64;
        anyhow::ensure!(
            tokens >= block,
            "models[{i}] ({}): its share of registry.device_budget ({} MiB of {} MiB for {} models) \
             does not hold its weights ({} MiB) and a KV cache; set kv_cache_tokens or a larger budget",
            plan.id,
            share >> 20,
            budget >> 20,
            n,
            weights >> 20
        );
        plan.config.model.kv_cache_tokens = Some((tokens / block * block) as usize);
    }
    Ok(())
}
/// KV bytes per token on the GPU: the CPU's f32 bytes scaled to
/// `model.kv_cache_dtype` (bf16: half, fp8: a quarter).
fn gpu_kv_bytes_per_token(c: &Config, model: &ingot_models::ModelConfig) -> u64 {
    let f32_bytes = CpuRunner::kv_bytes_per_token(model) as u64;
    match c.model.kv_cache_dtype {
        ingot_config::KvCacheDtype::Fp8 => f32_bytes / 4,
        ingot_config::KvCacheDtype::Auto | ingot_config::KvCacheDtype::Bf16 => f32_bytes / 2,
    }
}

/// Whether the engines will run on the GPU.
fn on_gpu(config: &Config) -> bool {
    match config.model.device {
        Device::Cpu => false,
        Device::Cuda => true,
        Device::Auto => ingot_runner_cuda::availability().is_ok(),
    }
}

/// `MemTotal` of /proc/meminfo.
fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A model's files opened for their metadata (no weights, no tokenizer: a
/// 128k vocabulary takes ~0.4 s to build) and its config under
/// `max_model_len`.
fn metadata(
    plan: &ModelPlan,
) -> anyhow::Result<(ingot_models::ModelFiles, ingot_models::ModelConfig)> {
    let c = &plan.config;
    let files = model::open_files(&plan.path, c.model.load_format)?;
    let mut model = files.config.clone();
    if let Some(len) = c.model.max_model_len {
        model.max_context = model.max_context.min(len.max(1));
    }
    Ok((files, model))
}

/// Device bytes of a model once loaded: its weights as the backend holds
/// them (bf16 on the GPU, or e4m3 layer matrices with `fp8`, or a GGUF's
/// quantized blocks with `cuda_weights = "native"`; on the CPU the file's quantized blocks on the
/// native path, else f32 or bf16) plus its KV cache, read from the model's
/// metadata without loading weights.
fn footprint(plan: &ModelPlan) -> anyhow::Result<u64> {
    let own = footprint_of(plan)?;
    let c = &plan.config;
    let Some(path) = c.speculative.model.as_ref() else {
        return Ok(own);
    };
    match c.speculative.method {
        ingot_config::SpeculativeMethod::Draft => {}
        ingot_config::SpeculativeMethod::Eagle3 => return Ok(own + head_footprint(plan, path)?),
        _ => return Ok(own),
    }
    // The draft model's weights and KV cache count too.
    let files = model::open_files(path, c.model.load_format)?;
    let draft = ModelPlan {
        id: format!("{} (draft)", plan.id),
        path: path.clone(),
        config: model::draft_config(c, &files.config, c.scheduler.max_num_seqs),
        embedding: false,
        chat_template: None,
    };
    Ok(own + footprint_of(&draft)?)
}

/// Bytes an EAGLE-3 head (`path`) of `plan`'s model holds on the CPU, at
/// most: its weights as f32 (Q8_0 on the native kernels is less) and one
/// layer of KV cache. On the GPU the head's bf16 weights and KV take half
/// of that, and its workspace and the target's captured rows about the
/// other half (the Llama-3.1-8B shape's head: 1.7 GB estimated, ~1.7 GB
/// held).
fn head_footprint(plan: &ModelPlan, path: &Path) -> anyhow::Result<u64> {
    let (_, model) = metadata(plan)?;
    let head = ingot_models::eagle::load_config(path, &model)
        .with_context(|| format!("cannot load the EAGLE-3 head {}", path.display()))?;
    let c = &plan.config;
    let kv_tokens = model::head_kv_tokens(c, &model, c.scheduler.max_num_seqs);
    let kv = kv_tokens * 2 * head.layer.kv_dim();
    Ok(((head.num_params() + kv) * std::mem::size_of::<f32>()) as u64)
}

/// [`footprint`] of the model alone.
fn footprint_of(plan: &ModelPlan) -> anyhow::Result<u64> {
    let (c, path) = (&plan.config, plan.path.as_path());
    if plan.embedding {
        // f32 weights (on the GPU, matrices also in f16); activations are
        // per batch and small.
        let files = ingot_models::bert::open_bert(path)?;
        let bytes_per_param = if on_gpu(c) { 6 } else { 4 };
        return Ok(files.config.num_params() as u64 * bytes_per_param);
    }
    let (files, model) = metadata(plan)?;
    let params = model.num_params() as u64;
    let cpu = !on_gpu(c);
    let weights = if !cpu {
        let tp = c.model.tensor_parallel_size;
        let native = tp == 1 && c.model.cuda_weights == CudaWeights::Native;
        // An FP8 checkpoint kept as it is (e4m3 and scales) under `native`.
        let from_file = native
            && c.model.quantization != Quantization::Fp8
            && ingot_runner_cuda::e4m3_decoder(&model, files.tensors.as_ref());
        let format = if c.model.quantization == Quantization::Fp8 || from_file {
            ingot_runner_cuda::WeightFormat::Fp8 {
                lm_head: c.model.fp8_lm_head,
                from_file,
            }
        } else {
            ingot_runner_cuda::WeightFormat::Bf16
        };
        let keep = ingot_runner_cuda::Fp8Keep::parse(&c.model.fp8_ignore, model.num_layers)?;
        // Per GPU under tensor parallelism: one rank's share.
        let rank = match tp {
            1 => model.clone(),
            n => ingot_models::parallel::ShardPlan::new(&model, n)?.rank_config(0),
        };
        // GGUF quantized matrices kept in their blocks (one GPU: a rank's shard expands).
        let native = if native && !from_file {
            ingot_runner_cuda::NativeBlocks::plan(&model, files.tensors.as_ref())
        } else {
            ingot_runner_cuda::NativeBlocks::none()
        };
        ingot_runner_cuda::weight_bytes(&rank, format, &keep, &native) as u64
    } else if c.model.quantization == Quantization::Q4_0 {
        // 18-byte blocks of 32 weights.
        params * 18 / 32
    } else if c.model.quantization != Quantization::None {
        // Q8_0: 34-byte blocks of 32 weights; also the bound for Q4_K,
        // whose rows 256 does not divide take Q8_0.
        params * 34 / 32
    } else if c.model.cpu_weights.keeps_blocks() && files.gguf.is_some() {
        // Quantized blocks stay as the file holds them (mmap'd).
        std::fs::metadata(path).map_or(params * 4, |m| m.len())
    } else if c.model.dtype == Dtype::F32 {
        params * 4
    } else {
        params * 2
    };
    let kv_tokens = c.model.kv_cache_tokens.map_or_else(
        || crate::model::default_kv_tokens(&model, c.engine.block_size),
        |t| t as u64,
    );
    let kv_per_token = if cpu {
        CpuRunner::kv_bytes_per_token(&model) as u64
    } else {
        // A rank holds its heads' share of each token.
        gpu_kv_bytes_per_token(c, &model) / c.model.tensor_parallel_size as u64
    };
    Ok(weights + kv_tokens * kv_per_token)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The registry's estimate of a model with a draft model counts the
    /// draft's weights and KV cache too.
    #[test]
    fn the_footprint_counts_a_draft_model() {
        let m = ingot_testkit::smollm2_gguf();
        let plan = |config: Config| ModelPlan {
            id: "m".into(),
            path: m.clone(),
            config,
            embedding: false,
            chat_template: None,
        };
        let mut config = Config::default();
        config.model.device = ingot_config::Device::Cpu;
        let alone = footprint(&plan(config.clone())).unwrap();
        config.speculative.method = ingot_config::SpeculativeMethod::Draft;
        config.speculative.model = Some(m.clone());
        config.speculative.draft_kv_cache_tokens = Some(1024);
        let with_draft = footprint(&plan(config)).unwrap();
        let weights = std::fs::metadata(&m).unwrap().len();
        let kv = 1024 * CpuRunner::kv_bytes_per_token(&metadata_of(&m).config) as u64;
        assert_eq!(with_draft, alone + weights + kv);
    }

    fn metadata_of(path: &Path) -> ingot_models::ModelFiles {
        model::open_files(path, ingot_config::LoadFormat::Auto).unwrap()
    }
}
