//! Opening a model and building a runner: the one place that picks a backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use ingot_engine::{start_engine, EngineConfig, EngineHandle};
use ingot_models::{LlamaWeights, LoadFormat, ModelFiles};
use ingot_runner::ModelRunner;
use ingot_runner_cpu::{CpuRunner, CpuRunnerConfig, WeightDtype};
use ingot_runner_cuda::{CudaRunner, CudaRunnerConfig};
use ingot_tokenizer::Tokenizer;

/// Flags shared by every command that loads a model.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A GGUF file or a Hugging Face model directory.
    #[arg(long, short = 'm', env = "INGOT_MODEL")]
    pub model: PathBuf,
    /// `auto` reads weights from the files; `dummy` makes random weights
    /// of the configured shapes (benchmarks only).
    #[arg(long, default_value = "auto", value_parser = ["auto", "dummy"])]
    pub load_format: String,
    /// Worker threads for the CPU backend (default: all cores).
    #[arg(long, env = "INGOT_THREADS")]
    pub threads: Option<usize>,
    /// Tokens of KV cache to allocate (default: 1 GiB worth, at least one
    /// full context).
    #[arg(long)]
    pub kv_cache_tokens: Option<usize>,
    /// Cap the context length below the model's.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Weight storage on the CPU: f32 (exact; the default) or bf16 (about
    /// 2x faster decode; logits differ by bf16 rounding of the weights).
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
    pub dtype: String,
    /// Most tokens per engine step (prefill chunks + decodes).
    #[arg(long, default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    /// Where to run: `cuda` when a GPU driver and this build's kernels are
    /// present (`auto`, the default), else `cpu`.
    #[arg(long, default_value = "auto", value_parser = ["auto", "cpu", "cuda"], env = "INGOT_DEVICE")]
    pub device: String,
    /// Share of GPU memory for weights, workspace and KV cache (CUDA).
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Run every step eagerly instead of replaying captured CUDA graphs.
    #[arg(long)]
    pub enforce_eager: bool,
}

/// KV block size (token slots per block).
pub const BLOCK_SIZE: usize = 16;

/// KV cache memory when `--kv-cache-tokens` is not given.
const DEFAULT_KV_BYTES: usize = 1 << 30;

/// Opens the model files and its tokenizer.
pub fn open(path: &Path, load_format: &str) -> anyhow::Result<(ModelFiles, Arc<Tokenizer>)> {
    let format = if load_format == "dummy" {
        LoadFormat::Dummy
    } else {
        LoadFormat::Auto
    };
    let files = ingot_models::open(path, format)
        .with_context(|| format!("cannot load model {}", path.display()))?;
    let tokenizer = match (&files.gguf, &files.hf_dir) {
        (Some(gguf), _) => Tokenizer::from_gguf(gguf),
        (None, Some(dir)) => Tokenizer::from_hf_dir(dir),
        (None, None) => anyhow::bail!("{} has no tokenizer", path.display()),
    }
    .with_context(|| format!("cannot load the tokenizer of {}", path.display()))?;
    Ok((files, Arc::new(tokenizer)))
}

/// Loads the model onto the chosen device and starts an engine over it.
pub fn load_engine(args: &ModelArgs, mut engine: EngineConfig) -> anyhow::Result<EngineHandle> {
    engine.scheduler.max_num_batched_tokens = args.max_num_batched_tokens;
    let (runner, tokenizer) = load_runner(args, engine.scheduler.max_num_seqs)?;
    Ok(start_engine(runner, tokenizer, engine)?)
}

/// Opens the model and builds the runner for `--device`; `max_num_seqs`
/// sizes the GPU workspace and graph buckets.
pub fn load_runner(
    args: &ModelArgs,
    max_num_seqs: usize,
) -> anyhow::Result<(Box<dyn ModelRunner>, Arc<Tokenizer>)> {
    if let Some(n) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("cannot size the thread pool")?;
    }
    let (mut files, tokenizer) = open(&args.model, &args.load_format)?;
    if let Some(len) = args.max_model_len {
        files.config.max_context = files.config.max_context.min(len.max(1));
    }
    let start = Instant::now();
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} tensors")
            .expect("static template. This is a bug.")
            .progress_chars("=> "),
    );
    bar.set_message(files.format);
    let progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let runner: Box<dyn ModelRunner> = match pick_device(&args.device)? {
        Device::Cuda => Box::new(cuda_runner(args, &files, max_num_seqs, &progress)?),
        Device::Cpu => Box::new(cpu_runner(args, &files, &progress)?),
    };
    bar.finish_and_clear();
    tracing::info!(
        model = %args.model.display(),
        device = runner.device_name(),
        elapsed = ?start.elapsed(),
        "model loaded"
    );
    Ok((runner, tokenizer))
}

enum Device {
    Cpu,
    Cuda,
}

/// `auto` takes CUDA when it can and says why not otherwise.
fn pick_device(flag: &str) -> anyhow::Result<Device> {
    match (flag, ingot_runner_cuda::availability()) {
        ("cpu", _) => Ok(Device::Cpu),
        ("cuda", Err(e)) => Err(anyhow::anyhow!("--device cuda: {e}")),
        (_, Ok(())) => Ok(Device::Cuda),
        (_, Err(e)) => {
            tracing::info!(reason = %e, "running on the CPU");
            Ok(Device::Cpu)
        }
    }
}

fn cuda_runner(
    args: &ModelArgs,
    files: &ModelFiles,
    max_num_seqs: usize,
    progress: &dyn Fn(usize, usize),
) -> anyhow::Result<CudaRunner> {
    anyhow::ensure!(
        args.gpu_memory_utilization > 0.0 && args.gpu_memory_utilization <= 1.0,
        "--gpu-memory-utilization must be in (0, 1]"
    );
    let opts = CudaRunnerConfig {
        block_size: BLOCK_SIZE,
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_num_seqs,
        gpu_memory_utilization: args.gpu_memory_utilization,
        kv_cache_tokens: args.kv_cache_tokens,
        cuda_graphs: !args.enforce_eager,
        ..Default::default()
    };
    let runner = CudaRunner::new(files.config.clone(), files.tensors.as_ref(), opts, progress)
        .with_context(|| format!("cannot load {} on the GPU", args.model.display()))?;
    runner.memory().publish();
    Ok(runner)
}

fn cpu_runner(
    args: &ModelArgs,
    files: &ModelFiles,
    progress: &dyn Fn(usize, usize),
) -> anyhow::Result<CpuRunner> {
    let config = files.config.clone();
    let weights = LlamaWeights::load(&config, files.tensors.as_ref(), progress)
        .with_context(|| format!("cannot load weights of {}", args.model.display()))?;
    // Default: 1 GiB of KV cache, and never less than one full context.
    let per_token = CpuRunner::kv_bytes_per_token(&config).max(1);
    let kv_tokens = args
        .kv_cache_tokens
        .unwrap_or_else(|| (DEFAULT_KV_BYTES / per_token).max(config.max_context))
        .max(BLOCK_SIZE);
    Ok(CpuRunner::new(
        config,
        weights,
        CpuRunnerConfig {
            num_blocks: kv_tokens.div_ceil(BLOCK_SIZE),
            block_size: BLOCK_SIZE,
            weight_dtype: if args.dtype == "bf16" {
                WeightDtype::Bf16
            } else {
                WeightDtype::F32
            },
        },
    )?)
}
