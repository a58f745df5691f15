//! Opening a model and building a runner: the one place that picks a backend.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use ingot_config::{Config, Layers, Loaded};
use ingot_engine::{start_engine_with_draft, Drafter, EngineConfig, EngineHandle};
use ingot_models::{
    Bf16Tensor, E4m3Tensor, HostTensor, LoadFormat, ModelConfig, ModelError, ModelFiles,
    QuantTensor, TensorSource,
};
use ingot_runner::ModelRunner;
use ingot_runner_cpu::{CpuRunner, CpuRunnerConfig, CpuWeights, QuantKind, WeightDtype};
use ingot_runner_cuda::{CudaRunner, CudaRunnerConfig, KvDtype, MemoryReport, TpRunner};
use ingot_tokenizer::Tokenizer;

use crate::hub;
use crate::settings::{self, FlagSet};

/// Flags shared by every command that loads a model. Each is optional: a
/// flag that is not given leaves its key to the config (`--config`, then
/// `INGOT_*`, then the built-in default, docs/config.md).
#[derive(Args, Debug, Clone, Default)]
pub struct ModelArgs {
    /// The model: a GGUF file, a Hugging Face model directory, or a Hub
    /// model id `ORG/NAME[@REVISION][:FILE_OR_QUANT]`, found in the local
    /// Hub cache (HF_HUB_CACHE, HF_HOME) or else downloaded (HF_ENDPOINT,
    /// HF_TOKEN; HF_HUB_OFFLINE=1 never downloads) [model.path].
    #[arg(value_name = "MODEL")]
    pub model_arg: Option<PathBuf>,
    /// The same as MODEL, as a flag [model.path].
    #[arg(long, short = 'm', value_name = "MODEL")]
    pub model: Option<PathBuf>,
    /// `auto` reads weights from the files; `dummy` makes random weights
    /// of the configured shapes (benchmarks only) [model.load_format; auto].
    #[arg(long, value_parser = ["auto", "dummy"])]
    pub load_format: Option<String>,
    /// Worker threads for the CPU backend [model.threads; all cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Tokens of KV cache to allocate [model.kv_cache_tokens; 1 GiB worth on
    /// the CPU, at least one full context].
    #[arg(long)]
    pub kv_cache_tokens: Option<usize>,
    /// KV cache element type on CUDA: `auto` (the model's dtype), `bf16`, or
    /// `fp8` (e4m3: twice the tokens in the same memory, less to read per
    /// decode step; logits differ by the rounding of K and V)
    /// [model.kv_cache_dtype; auto].
    #[arg(long, value_parser = ["auto", "bf16", "fp8"])]
    pub kv_cache_dtype: Option<String>,
    /// Reasoning models: `qwen3` or `deepseek_r1` return the model's
    /// `<think>…</think>` as `reasoning_content`, not in the answer
    /// [model.reasoning_parser; none].
    #[arg(long, value_parser = ["none", "qwen3", "deepseek_r1"])]
    pub reasoning_parser: Option<String>,
    /// A chat template replacing the model's own: a Jinja file, or the
    /// template itself; checked at start-up [model.chat_template; the
    /// model's].
    #[arg(long)]
    pub chat_template: Option<String>,
    /// Cap the context length below the model's [model.max_model_len].
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Weight storage on the CPU: f32 (exact) or bf16 (about 2x faster
    /// decode; logits differ by bf16 rounding of the weights) [model.dtype; f32].
    #[arg(long, value_parser = ["f32", "bf16"])]
    pub dtype: Option<String>,
    /// Quantized GGUF weights on the CPU: `native` keeps them in their
    /// blocks (int8 activations; ~3x faster decode, logits differ by the
    /// activation rounding), `amx` as native with the 32-block formats on
    /// AMX tiles (Intel Xeon from Sapphire Rapids on), or `f32` dequantizes
    /// them at load (exact) [model.cpu_weights; native].
    #[arg(long, value_parser = ["native", "amx", "f32"])]
    pub cpu_weights: Option<String>,
    /// CPU attention's softmax weights from an 8-lane polynomial exp
    /// (within 2 ulp of the true value) instead of the C library's: faster
    /// at long contexts, not the same bits [model.cpu_fast_exp; false].
    #[arg(long)]
    pub cpu_fast_exp: bool,
    /// Quantized GGUF weights on the GPU: `bf16` expands them at load;
    /// `native` keeps Q8_0, Q4_0/Q4_1 and Q4_K/Q5_K/Q6_K tensors in their
    /// blocks (the file's size on the GPU, faster decode; other types
    /// still expand)
    /// [model.cuda_weights; bf16].
    #[arg(long, value_parser = ["bf16", "native"])]
    pub cuda_weights: Option<String>,
    /// Quantize float weight matrices (f32/f16/bf16 files, Hugging Face
    /// directories) at load to run on the native CPU kernels: `q8_0`
    /// (a quarter of f32's bytes; logits differ by the 8-bit rounding of
    /// weights and activations), `q4_0` or `q4_k` (about a seventh; 4-bit
    /// weights cost more accuracy, see docs/benchmarks.md; k-quant rows
    /// 256 does not divide take Q8_0) or `none`; on the GPU `fp8`: the
    /// decoder's weight matrices in e4m3 with per-channel scales (CUDA
    /// only) [model.quantization; none].
    #[arg(long, value_parser = ["none", "q8_0", "q4_0", "q4_k", "fp8"])]
    pub quantization: Option<String>,
    /// With `--quantization fp8`: comma-separated patterns of decoder
    /// matrices kept in bf16, e.g. `down_proj`, `layers.0`, `layers.29.mlp`
    /// (whole dot-separated segments of `model.layers.N.self_attn.qkv_proj`,
    /// `.self_attn.o_proj`, `.mlp.gate_up_proj`, `.mlp.down_proj`)
    /// [model.fp8_ignore; none].
    #[arg(long)]
    pub fp8_ignore: Option<String>,
    /// With `--quantization fp8`: the LM head in e4m3 too, one scale per
    /// vocabulary row (a separate copy when tied to the embeddings)
    /// [model.fp8_lm_head; false].
    #[arg(long)]
    pub fp8_lm_head: bool,
    /// Most tokens per engine step (prefill chunks + decodes)
    /// [scheduler.max_num_batched_tokens; 512].
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Most tokens of a step in which no sequence decodes (a prompt alone
    /// takes one step up to this length; 0: off)
    /// [scheduler.max_prefill_only_tokens; 2048].
    #[arg(long)]
    pub max_prefill_only_tokens: Option<usize>,
    /// Where to run: `cuda` when a GPU driver and this build's kernels are
    /// present (`auto`), else `cpu` [model.device; auto].
    #[arg(long, value_parser = ["auto", "cpu", "cuda"])]
    pub device: Option<String>,
    /// Share of GPU memory for weights, workspace and KV cache (CUDA)
    /// [model.gpu_memory_utilization; 0.9].
    #[arg(long)]
    pub gpu_memory_utilization: Option<f64>,
    /// Split the model over this many GPUs (tensor parallel, CUDA)
    /// [model.tensor_parallel_size; 1].
    #[arg(long)]
    pub tensor_parallel_size: Option<usize>,
    /// Tensor parallel: every all-reduce through NCCL, none through
    /// ingot's one-shot kernel [cuda.custom_all_reduce = false].
    #[arg(long)]
    pub disable_custom_all_reduce: bool,
    /// Run every step eagerly instead of replaying captured CUDA graphs
    /// [model.enforce_eager].
    #[arg(long)]
    pub enforce_eager: bool,
    /// Batch-invariant kernels: a greedy answer does not depend on what
    /// else is batched with it (the CPU backend always is; slower on the
    /// GPU) [engine.deterministic; false].
    #[arg(long)]
    pub deterministic: bool,
    /// Speculative decoding, as vLLM's flag: a JSON object with `method`
    /// (`ngram`, `draft` / `draft_model`, `eagle3` or `none`), `model` (the
    /// draft model's path, or the EAGLE-3 head's directory),
    /// `num_speculative_tokens`, `prompt_lookup_min`,
    /// `prompt_lookup_max`, `disable_by_batch_size`, `adaptive`,
    /// `rate_by_match`, `launch_ahead_unmatched` [speculative.*; off].
    #[arg(long, value_name = "JSON")]
    pub speculative_config: Option<String>,
}

impl ModelArgs {
    /// The flags that were given, as config values.
    pub fn add_to(&self, flags: &mut FlagSet) -> anyhow::Result<()> {
        let model = match (&self.model_arg, &self.model) {
            (Some(a), Some(b)) if a != b => anyhow::bail!(
                "the model is given twice, as {} and as --model {}",
                a.display(),
                b.display()
            ),
            (Some(p), _) | (None, Some(p)) => Some(
                p.to_str()
                    .with_context(|| format!("--model {}: not UTF-8", p.display()))?
                    .to_string(),
            ),
            (None, None) => None,
        };
        flags.opt("--model", "model.path", &model);
        flags.opt("--load-format", "model.load_format", &self.load_format);
        flags.opt("--threads", "model.threads", &self.threads);
        flags.opt(
            "--kv-cache-tokens",
            "model.kv_cache_tokens",
            &self.kv_cache_tokens,
        );
        flags.opt(
            "--kv-cache-dtype",
            "model.kv_cache_dtype",
            &self.kv_cache_dtype,
        );
        flags.opt(
            "--max-model-len",
            "model.max_model_len",
            &self.max_model_len,
        );
        flags.opt("--dtype", "model.dtype", &self.dtype);
        if let Some(json) = &self.speculative_config {
            speculative_flags(json, flags)?;
        }
        flags.opt(
            "--reasoning-parser",
            "model.reasoning_parser",
            &self.reasoning_parser,
        );
        flags.opt(
            "--chat-template",
            "model.chat_template",
            &self.chat_template,
        );
        flags.opt("--cpu-weights", "model.cpu_weights", &self.cpu_weights);
        flags.switch(
            "--cpu-fast-exp",
            "model.cpu_fast_exp",
            self.cpu_fast_exp,
            true,
        );
        flags.opt("--cuda-weights", "model.cuda_weights", &self.cuda_weights);
        flags.opt("--quantization", "model.quantization", &self.quantization);
        flags.opt("--fp8-ignore", "model.fp8_ignore", &self.fp8_ignore);
        flags.switch("--fp8-lm-head", "model.fp8_lm_head", self.fp8_lm_head, true);
        flags.opt(
            "--max-num-batched-tokens",
            "scheduler.max_num_batched_tokens",
            &self.max_num_batched_tokens,
        );
        flags.opt(
            "--max-prefill-only-tokens",
            "scheduler.max_prefill_only_tokens",
            &self.max_prefill_only_tokens,
        );
        flags.opt("--device", "model.device", &self.device);
        flags.opt(
            "--gpu-memory-utilization",
            "model.gpu_memory_utilization",
            &self.gpu_memory_utilization,
        );
        flags.opt(
            "--tensor-parallel-size",
            "model.tensor_parallel_size",
            &self.tensor_parallel_size,
        );
        flags.switch(
            "--disable-custom-all-reduce",
            "cuda.custom_all_reduce",
            self.disable_custom_all_reduce,
            false,
        );
        flags.switch(
            "--enforce-eager",
            "model.enforce_eager",
            self.enforce_eager,
            true,
        );
        flags.switch(
            "--deterministic",
            "engine.deterministic",
            self.deterministic,
            true,
        );
        Ok(())
    }

    /// The config of a command without a config file: these flags over
    /// `INGOT_*` over the defaults, `extra` (the command's own flags) last.
    pub fn load(&self, extra: FlagSet) -> anyhow::Result<Loaded> {
        let mut flags = FlagSet::default();
        self.add_to(&mut flags)?;
        let mut flags = flags.into_vec();
        flags.extend(extra.into_vec());
        let mut loaded = settings::load(&Layers {
            file: None,
            env: settings::env(),
            flags,
        })?;
        // These commands never reload their config: the local path can
        // stand in the loaded one.
        resolve_hub(&mut loaded.config)?;
        Ok(loaded)
    }
}

/// Replaces a Hub model id in `model.path` and `[[models]]` paths by the
/// local files (cached, else downloaded now); returns the id of
/// `model.path` when it was one (`org/name`, the default served name).
pub fn resolve_hub(config: &mut Config) -> anyhow::Result<Option<String>> {
    let vars = settings::env();
    for entry in &mut config.models {
        let (path, _) =
            hub::resolve(&entry.path, &vars).with_context(|| format!("model {}", entry.id))?;
        entry.path = path;
    }
    let Some(spec) = &config.model.path else {
        return Ok(None);
    };
    let (path, id) = hub::resolve(spec, &vars)?;
    config.model.path = Some(path);
    Ok(id.map(|id| id.repo))
}

/// KV cache memory when `model.kv_cache_tokens` is not set.
const DEFAULT_KV_BYTES: usize = 1 << 30;

/// KV tokens of a CPU model without `kv_cache_tokens`: 1 GiB worth, and
/// never less than one full context.
pub fn default_kv_tokens(model: &ingot_models::ModelConfig, block_size: usize) -> u64 {
    let per_token = CpuRunner::kv_bytes_per_token(model).max(1);
    ((DEFAULT_KV_BYTES / per_token).max(model.max_context)).max(block_size) as u64
}

/// The files a model is read from: the file itself, or a directory's files.
pub fn model_files(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    std::fs::read_dir(path)
        .map(|dir| {
            dir.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default()
}

/// Opens the model files and its tokenizer.
pub fn open(
    path: &Path,
    load_format: ingot_config::LoadFormat,
    chat_template: Option<&str>,
) -> anyhow::Result<(ModelFiles, Arc<Tokenizer>)> {
    let files = open_files(path, load_format)?;
    let mut tokenizer = tokenizer_of(&files, path)?;
    if let Some(source) = chat_template {
        tokenizer = tokenizer.with_chat_template(source.to_string());
    }
    Ok((files, Arc::new(tokenizer)))
}

/// The chat template `model.chat_template` gives, compiled once to check it:
/// the file it names, else the value itself when it is Jinja; `None` when
/// unset (the model's own template applies).
pub fn chat_template_of(model: &ingot_config::ModelSection) -> anyhow::Result<Option<String>> {
    let Some(value) = &model.chat_template else {
        return Ok(None);
    };
    let path = Path::new(value);
    let source = if path.is_file() {
        std::fs::read_to_string(path)
            .with_context(|| format!("model.chat_template: cannot read {value}"))?
    } else if value.contains("{{") || value.contains("{%") {
        value.clone()
    } else {
        anyhow::bail!("model.chat_template: {value:?} is neither a file nor a Jinja template");
    };
    ingot_tokenizer::ChatTemplate::new(&source, None, None)
        .map_err(|e| anyhow::anyhow!("model.chat_template: {e}"))?;
    Ok(Some(source))
}

/// Opens the model files (metadata and mapped tensors; no tokenizer).
pub fn open_files(
    path: &Path,
    load_format: ingot_config::LoadFormat,
) -> anyhow::Result<ModelFiles> {
    let format = match load_format {
        ingot_config::LoadFormat::Dummy => LoadFormat::Dummy,
        ingot_config::LoadFormat::Auto => LoadFormat::Auto,
    };
    ingot_models::open(path, format)
        .with_context(|| format!("cannot load model {}", path.display()))
}

/// The tokenizer `files` carry (GGUF metadata or a directory's JSON files).
fn tokenizer_of(files: &ModelFiles, path: &Path) -> anyhow::Result<Tokenizer> {
    let tokenizer = match (&files.gguf, &files.hf_dir) {
        (Some(gguf), _) => Tokenizer::from_gguf(gguf),
        (None, Some(dir)) => Tokenizer::from_hf_dir(dir),
        (None, None) => anyhow::bail!("{} has no tokenizer", path.display()),
    }
    .with_context(|| format!("cannot load the tokenizer of {}", path.display()))?;
    Ok(tokenizer)
}

/// Loads the model onto the configured device (after its draft model,
/// if speculation uses one) and starts an engine over it.
pub fn load_engine(config: &Config, engine: EngineConfig) -> anyhow::Result<EngineHandle> {
    let max_num_seqs = engine.scheduler.max_num_seqs;
    let (path, files, tokenizer) = open_target(config)?;
    let draft = load_draft(config, &tokenizer, max_num_seqs)?;
    let built = build_runner(config, path, files, max_num_seqs)?;
    let drafter = drafter(config, draft, built.runner.as_ref(), max_num_seqs)?;
    Ok(start_engine_with_draft(
        built.runner,
        drafter,
        tokenizer,
        engine,
    )?)
}

/// The configured model's path, files and tokenizer (with
/// `model.chat_template` applied).
fn open_target(config: &Config) -> anyhow::Result<(&Path, ModelFiles, Arc<Tokenizer>)> {
    let path = settings::model_path(config)?;
    let template = chat_template_of(&config.model)?;
    let (files, tokenizer) = open(path, config.model.load_format, template.as_deref())?;
    Ok((path, files, tokenizer))
}

/// The draft model's runner for `speculative.method = "draft"` (`None`
/// for other methods), built before the target's: on a GPU it takes its
/// memory first and the target's KV cache the rest. Its tokenizer must be
/// the target's, token for token; it loads with the target's `model.*`
/// settings, on one device, with a KV cache of
/// `speculative.draft_kv_cache_tokens` (default: every sequence that may
/// propose at the target's context length, within the CPU's default pool).
pub fn load_draft(
    config: &Config,
    target: &Tokenizer,
    max_num_seqs: usize,
) -> anyhow::Result<Option<Box<dyn ModelRunner>>> {
    let s = &config.speculative;
    if s.method != ingot_config::SpeculativeMethod::Draft {
        return Ok(None);
    }
    let path = s
        .model
        .as_deref()
        .context("speculative.method = \"draft\" needs speculative.model")?;
    let (files, tokenizer) = open(path, config.model.load_format, None)?;
    same_vocabulary(target, &tokenizer).with_context(|| {
        format!(
            "speculative.model {} cannot draft for this model",
            path.display()
        )
    })?;
    let draft = draft_config(config, &files.config, max_num_seqs);
    let built = build_runner(&draft, path, files, max_num_seqs)?;
    tracing::info!(
        target: crate::served::STARTUP,
        draft = %path.display(),
        kv_tokens = draft.model.kv_cache_tokens,
        "speculative decoding with a draft model on {}",
        built.runner.device_name()
    );
    Ok(Some(built.runner))
}

/// What speculation drafts with: the draft model `load_draft` loaded
/// before the target, or for `method = "eagle3"` the EAGLE-3 head, built
/// on `target`'s device beside it.
pub fn drafter(
    config: &Config,
    draft: Option<Box<dyn ModelRunner>>,
    target: &dyn ModelRunner,
    max_num_seqs: usize,
) -> anyhow::Result<Option<Drafter>> {
    if let Some(runner) = draft {
        return Ok(Some(Drafter::Model(runner)));
    }
    let s = &config.speculative;
    if s.method != ingot_config::SpeculativeMethod::Eagle3 {
        return Ok(None);
    }
    let path = s.model.as_deref().context(
        "speculative.method = \"eagle3\" needs speculative.model (the head's directory)",
    )?;
    let cannot = || format!("cannot load the EAGLE-3 head {}", path.display());
    let (head, weights) = ingot_models::eagle::load(path, target.config()).with_context(cannot)?;
    let kv_tokens = head_kv_tokens(config, target.config(), max_num_seqs);
    let head = target
        .draft_head(head, weights, kv_tokens)
        .with_context(cannot)?;
    tracing::info!(
        target: crate::served::STARTUP,
        head = %path.display(),
        aux_layers = ?head.config().aux_layers,
        kv_tokens,
        "speculative decoding with an EAGLE-3 head on {}",
        target.device_name()
    );
    Ok(Some(Drafter::Head(head)))
}

/// Positions of KV cache an EAGLE-3 head keeps: as set, else room for
/// every sequence that may propose at the target's context (one layer's
/// worth each: a fraction of the target's cache).
pub fn head_kv_tokens(
    config: &Config,
    model: &ingot_models::ModelConfig,
    max_num_seqs: usize,
) -> usize {
    let s = &config.speculative;
    s.draft_kv_cache_tokens
        .unwrap_or_else(|| proposing_positions(config, model, max_num_seqs))
}

/// Positions of every sequence that may propose (`disable_by_batch_size`,
/// at most `max_num_seqs`) at `model`'s served context: what a drafter's
/// KV cache holds unless `speculative.draft_kv_cache_tokens` says.
fn proposing_positions(
    config: &Config,
    model: &ingot_models::ModelConfig,
    max_num_seqs: usize,
) -> usize {
    let context = config
        .model
        .max_model_len
        .map_or(model.max_context, |l| l.min(model.max_context));
    let seqs = config
        .speculative
        .disable_by_batch_size
        .min(max_num_seqs)
        .max(1);
    seqs * context
}

/// The config the draft model (`model`, from `speculative.model`) of
/// `config` loads with: the target's `model.*` on one device, its own path
/// and KV cache size.
pub fn draft_config(
    config: &Config,
    model: &ingot_models::ModelConfig,
    max_num_seqs: usize,
) -> Config {
    let s = &config.speculative;
    let mut draft = config.clone();
    draft.model.path = s.model.clone();
    draft.model.tensor_parallel_size = 1;
    let pool = default_kv_tokens(model, config.engine.block_size) as usize;
    draft.model.kv_cache_tokens = Some(
        s.draft_kv_cache_tokens
            .unwrap_or_else(|| proposing_positions(config, model, max_num_seqs).min(pool)),
    );
    draft
}

/// Whether `draft` gives every id the target's token (the ids both have).
fn same_vocabulary(target: &Tokenizer, draft: &Tokenizer) -> anyhow::Result<()> {
    let shared = target.vocab_size().min(draft.vocab_size()) as u32;
    if let Some(id) = (0..shared).find(|&id| target.id_to_token(id) != draft.id_to_token(id)) {
        anyhow::bail!(
            "token {id} is {:?} in the model's tokenizer and {:?} in the draft's: a draft model \
             must share the model's tokenizer",
            target.id_to_token(id).unwrap_or_default(),
            draft.id_to_token(id).unwrap_or_default()
        );
    }
    Ok(())
}

/// Most tokens in one forward pass of an embedding model on the CPU.
/// Concurrent requests share passes; a decode step that arrives while
/// embeddings run freely waits for one piece (a matmul) of such a batch:
/// about 3 ms for MiniLM on two cores, where 2048 tokens held it for tens
/// of ms.
const EMBEDDING_BATCH_TOKENS: usize = 256;

/// The same on the GPU, which needs larger batches to be busy and shares
/// no cores with decode.
const GPU_EMBEDDING_BATCH_TOKENS: usize = 2048;

/// Share of the CPU decode steps' time that embedding work may take while
/// they run (docs/embeddings.md): the encoder grows each inter-token gap by
/// about this much at most, and request handling adds about as much again
/// (0.1 measured +16-24 % p99 against the 20 % bound; 0.05 gave +8-11 %);
/// with no decode running embeddings take every core.
const EMBEDDING_DECODE_SHARE: f64 = 0.05;

/// Loads a BERT embedding model on `model.device` (`auto`: the GPU when
/// the CUDA encoder can run it) and starts its engine, whose series are
/// labelled `model = id`; returns it with the model's parameter count. On
/// the CPU it takes turns with the CPU decode engines, so decode never
/// waits for more than its bounded share.
pub fn load_embedding(
    config: &Config,
    id: &str,
    path: &Path,
) -> anyhow::Result<(ingot_engine::EmbeddingHandle, usize)> {
    let files = ingot_models::bert::open_bert(path)
        .with_context(|| format!("cannot load model {}", path.display()))?;
    let tokenizer = ingot_tokenizer::EncoderTokenizer::from_dir(&files.dir)
        .with_context(|| format!("cannot load the tokenizer of {}", path.display()))?;
    let threads = config.model.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let engine = ingot_engine::EmbeddingConfig {
        model_name: id.to_string(),
        max_batch_tokens: EMBEDDING_BATCH_TOKENS,
        threads,
        // The turns keep it off decode's time; at idle priority its slices
        // would stretch behind any other runnable thread while decode waits.
        idle_priority: false,
        decode_share: Some(EMBEDDING_DECODE_SHARE),
    };
    let handle = match pick_encoder_device(config.model.device, &files.config)? {
        Device::Cuda => {
            let model = ingot_runner_cuda::encoder::load_bert(&files, 0)
                .with_context(|| format!("cannot load {} on the GPU", path.display()))?;
            // One thread that only enqueues GPU work: at idle priority it
            // could wait behind busy decode threads while the GPU idles.
            let engine = ingot_engine::EmbeddingConfig {
                model_name: id.to_string(),
                max_batch_tokens: GPU_EMBEDDING_BATCH_TOKENS,
                threads: 1,
                idle_priority: false,
                decode_share: None,
            };
            ingot_engine::EmbeddingHandle::start(Box::new(model), tokenizer, engine)?
        }
        Device::Cpu => {
            let model = ingot_runner_cpu::encoder::load_bert(&files)
                .with_context(|| format!("cannot load weights of {}", path.display()))?;
            ingot_engine::EmbeddingHandle::start(Box::new(model), tokenizer, engine)?
        }
    };
    tracing::info!(device = handle.device_name(), "embedding model loaded");
    Ok((handle, files.config.num_params()))
}

/// [`pick_device`] for an encoder: `auto` takes CUDA when the GPU encoder
/// runs the model.
fn pick_encoder_device(
    device: ingot_config::Device,
    model: &ingot_models::bert::BertConfig,
) -> anyhow::Result<Device> {
    let cuda = ingot_runner_cuda::availability()
        .and_then(|()| ingot_runner_cuda::encoder::supports_encoder(model));
    choose(device, cuda)
}

/// Opens the model and builds the runner for `model.device`; `max_num_seqs`
/// sizes the GPU workspace and graph buckets.
pub fn load_runner(
    config: &Config,
    max_num_seqs: usize,
) -> anyhow::Result<(Box<dyn ModelRunner>, Arc<Tokenizer>)> {
    let (path, files, tokenizer) = open_target(config)?;
    let built = build_runner(config, path, files, max_num_seqs)?;
    Ok((built.runner, tokenizer))
}

/// A runner as built, with its storage.
pub struct Built {
    pub runner: Box<dyn ModelRunner>,
    pub storage: Storage,
}

/// How a runner holds the model, for the start-up summary (known only to
/// the concrete backend).
#[derive(Debug, Clone, Copy)]
pub struct Storage {
    /// How the weight matrices are held: `f32`, `bf16`, `fp8`, a load-time
    /// quantization (`q8_0` ...) or `gguf` (the file's own blocks).
    pub weights: &'static str,
    /// Bytes of weights the backend holds.
    pub weight_bytes: usize,
    /// Element type of the KV cache.
    pub kv_dtype: &'static str,
}

/// Builds the runner of the model at `path` (opened as `files`) for
/// `model.device`.
pub fn build_runner(
    config: &Config,
    path: &Path,
    mut files: ModelFiles,
    max_num_seqs: usize,
) -> anyhow::Result<Built> {
    let m = &config.model;
    size_thread_pool(m.threads)?;
    if let Some(len) = m.max_model_len {
        files.config.max_context = files.config.max_context.min(len.max(1));
    }
    let start = Instant::now();
    // Drawn on a terminal only (indicatif hides it on a pipe or file); the
    // bytes are those of the weights as the backend takes them.
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("loading {prefix} [{bar:24}] {pos}/{len} tensors {msg}")
            .expect("static template. This is a bug.")
            .progress_chars("=> "),
    );
    bar.set_prefix(files.format);
    let bytes = Arc::new(AtomicU64::new(0));
    files.tensors = Box::new(CountingSource {
        inner: files.tensors,
        bytes: bytes.clone(),
    });
    let progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        let read = bytes.load(Ordering::Relaxed);
        if read > 0 && !bar.is_hidden() {
            let rate = read as f64 / start.elapsed().as_secs_f64().max(1e-3);
            bar.set_message(format!(
                "{}, {}/s",
                HumanBytes(read),
                HumanBytes(rate as u64)
            ));
        }
    };
    let built = match pick_device(m.device, &files.config)? {
        Device::Cuda => {
            let (runner, memory) = cuda_runner(config, path, &files, max_num_seqs, &progress)?;
            let fp8 = m.quantization == ingot_config::Quantization::Fp8;
            let storage = Storage {
                weights: if fp8 { "fp8" } else { "bf16" },
                weight_bytes: memory.weights,
                kv_dtype: match m.kv_cache_dtype {
                    ingot_config::KvCacheDtype::Fp8 => "fp8",
                    ingot_config::KvCacheDtype::Auto | ingot_config::KvCacheDtype::Bf16 => "bf16",
                },
            };
            Built { runner, storage }
        }
        Device::Cpu => {
            let runner = cpu_runner(config, path, &files, &progress)?;
            let weights = if m.quantization != ingot_config::Quantization::None {
                m.quantization.as_str()
            } else if runner.uses_quantized_weights() {
                "gguf"
            } else {
                m.dtype.as_str()
            };
            let storage = Storage {
                weights,
                weight_bytes: runner.weight_bytes(),
                kv_dtype: "f32",
            };
            Built {
                runner: Box::new(runner),
                storage,
            }
        }
    };
    let runner = &built.runner;
    bar.finish_and_clear();
    tracing::info!(
        model = %path.display(),
        device = runner.device_name(),
        // The CPU backend is batch-invariant with or without it.
        deterministic = config.engine.deterministic,
        elapsed = ?start.elapsed(),
        "model loaded"
    );
    Ok(built)
}

/// The weights' source, counting the bytes of weights the loaders take
/// from it (the load bar's bytes and rate; the loaders report tensors).
/// Every method delegates: one left to its default would change what the
/// loaders get (`load_blocks` returning `None` turns native kernels off).
struct CountingSource {
    inner: Box<dyn TensorSource>,
    bytes: Arc<AtomicU64>,
}

impl CountingSource {
    fn add(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
}

impl TensorSource for CountingSource {
    fn load(&self, name: &str) -> Result<HostTensor, ModelError> {
        let t = self.inner.load(name)?;
        self.add(std::mem::size_of_val(t.data.as_slice()));
        Ok(t)
    }

    fn load_blocks(&self, name: &str) -> Result<Option<QuantTensor>, ModelError> {
        let t = self.inner.load_blocks(name)?;
        if let Some(q) = &t {
            self.add(q.data.bytes().len());
        }
        Ok(t)
    }

    fn load_bf16(&self, name: &str) -> Result<Option<Bf16Tensor<'_>>, ModelError> {
        let t = self.inner.load_bf16(name)?;
        if let Some(b) = &t {
            self.add(b.bytes.len());
        }
        Ok(t)
    }

    fn load_slice(
        &self,
        name: &str,
        split: &dyn Fn(&[usize]) -> Option<ingot_models::parallel::Split>,
    ) -> Result<Option<HostTensor>, ModelError> {
        let t = self.inner.load_slice(name, split)?;
        if let Some(t) = &t {
            self.add(std::mem::size_of_val(t.data.as_slice()));
        }
        Ok(t)
    }

    fn stored_type(&self, name: &str) -> Option<ingot_models::gguf::GgmlType> {
        self.inner.stored_type(name)
    }

    fn stored_e4m3(&self, name: &str) -> bool {
        self.inner.stored_e4m3(name)
    }

    fn load_e4m3(&self, name: &str) -> Result<Option<E4m3Tensor>, ModelError> {
        let t = self.inner.load_e4m3(name)?;
        if let Some(e) = &t {
            self.add(e.bytes.len() + std::mem::size_of_val(e.row_scales.as_slice()));
        }
        Ok(t)
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }

    fn dtype_summary(&self) -> Vec<(String, usize)> {
        self.inner.dtype_summary()
    }

    fn dtype_bytes(&self) -> Vec<(String, usize)> {
        self.inner.dtype_bytes()
    }

    fn random_seed(&self) -> Option<u64> {
        self.inner.random_seed()
    }
}

/// Sizes rayon's global pool once (`model.threads`); later calls, such as
/// the next model's load, keep the first size.
pub fn size_thread_pool(threads: Option<usize>) -> anyhow::Result<()> {
    static SIZED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let Some(n) = threads else { return Ok(()) };
    SIZED
        .get_or_init(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build_global()
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| anyhow::anyhow!("cannot size the thread pool: {e}"))
}

enum Device {
    Cpu,
    Cuda,
}

/// `auto` takes CUDA when it can (a GPU, and an architecture the CUDA
/// backend runs) and says why not otherwise.
fn pick_device(device: ingot_config::Device, model: &ModelConfig) -> anyhow::Result<Device> {
    let cuda = ingot_runner_cuda::availability().and_then(|()| ingot_runner_cuda::supports(model));
    choose(device, cuda)
}

/// The device for `device` given whether CUDA can run the model.
fn choose(
    device: ingot_config::Device,
    cuda: Result<(), ingot_runner_cuda::CudaError>,
) -> anyhow::Result<Device> {
    use ingot_config::Device as Want;
    match (device, cuda) {
        (Want::Cpu, _) => Ok(Device::Cpu),
        (Want::Cuda, Err(e)) => Err(anyhow::anyhow!("--device cuda: {e}")),
        (_, Ok(())) => Ok(Device::Cuda),
        (_, Err(e)) => {
            tracing::info!(reason = %e, "running on the CPU");
            Ok(Device::Cpu)
        }
    }
}

fn cuda_runner(
    config: &Config,
    path: &Path,
    files: &ModelFiles,
    max_num_seqs: usize,
    progress: &dyn Fn(usize, usize),
) -> anyhow::Result<(Box<dyn ModelRunner>, MemoryReport)> {
    let (m, cuda) = (&config.model, &config.cuda);
    // Every field from the config: the runner's Default is not a source.
    let opts = CudaRunnerConfig {
        device: 0,
        block_size: config.engine.block_size,
        // The workspace holds the largest step, a prefill-only one included.
        max_num_batched_tokens: config
            .scheduler
            .max_num_batched_tokens
            .max(config.scheduler.prefill_only_tokens()),
        max_num_seqs,
        gpu_memory_utilization: m.gpu_memory_utilization,
        kv_cache_tokens: m.kv_cache_tokens,
        kv_cache_dtype: match m.kv_cache_dtype {
            ingot_config::KvCacheDtype::Auto | ingot_config::KvCacheDtype::Bf16 => KvDtype::Bf16,
            ingot_config::KvCacheDtype::Fp8 => KvDtype::Fp8,
        },
        cuda_graphs: !m.enforce_eager,
        profile: cuda.profile,
        check: cuda.check,
        l2_prefetch: cuda.l2_prefetch.clone(),
        pdl: cuda.pdl,
        fp8_weights: m.quantization == ingot_config::Quantization::Fp8,
        fp8_ignore: m.fp8_ignore.clone(),
        fp8_lm_head: m.fp8_lm_head,
        native_weights: m.cuda_weights == ingot_config::CudaWeights::Native,
        fused_block: cuda.fused_block,
        tc_gemv_min_rows: cuda.tc_gemv_min_rows,
        custom_all_reduce: cuda.custom_all_reduce,
        deterministic: config.engine.deterministic,
        tc_decode_min_rows: cuda.tc_decode_min_rows,
        tc_decode_fp8_min_rows: cuda.tc_decode_fp8_min_rows,
        moe_grouped_min_tokens: cuda.moe_grouped_min_tokens,
        smem_carveout: cuda.smem_carveout,
    };
    let (model, tensors) = (files.config.clone(), files.tensors.as_ref());
    let cannot = || format!("cannot load {} on the GPU", path.display());
    let (runner, memory): (Box<dyn ModelRunner>, _) = match m.tensor_parallel_size {
        1 => {
            let runner = CudaRunner::new(model, tensors, opts, progress).with_context(cannot)?;
            let memory = runner.memory();
            (Box::new(runner), memory)
        }
        n => {
            let runner = TpRunner::new(model, tensors, opts, n, progress).with_context(cannot)?;
            let memory = runner.memory();
            (Box::new(runner), memory)
        }
    };
    // Per GPU under tensor parallelism (every rank holds the same).
    memory.publish();
    Ok((runner, memory))
}

fn cpu_runner(
    config: &Config,
    path: &Path,
    files: &ModelFiles,
    progress: &dyn Fn(usize, usize),
) -> anyhow::Result<CpuRunner> {
    let model = files.config.clone();
    let tp = config.model.tensor_parallel_size;
    anyhow::ensure!(
        tp == 1,
        "model.tensor_parallel_size = {tp} splits the model over GPUs, and this model runs on the CPU \
         (--device {}); use --device cuda on a host with {tp} GPUs, or a size of 1",
        config.model.device.as_str()
    );
    let kv_dtype = config.model.kv_cache_dtype;
    if kv_dtype != ingot_config::KvCacheDtype::Auto {
        anyhow::bail!(
            "model.kv_cache_dtype = {:?} needs the CUDA backend: the CPU backend keeps its KV cache in f32 (use \"auto\" or --device cuda)",
            kv_dtype.as_str()
        );
    }
    let block_size = config.engine.block_size;
    let kv_tokens = config.model.kv_cache_tokens.map_or_else(
        || default_kv_tokens(&model, block_size) as usize,
        |t| t.max(block_size),
    );
    if config.model.quantization == ingot_config::Quantization::Fp8 {
        anyhow::bail!(
            "model.quantization = \"fp8\" needs the CUDA backend, and this model runs on the CPU \
             (--device {}); use none, q8_0, q4_0 or q4_k on the CPU",
            config.model.device.as_str()
        );
    }
    let weights = match config.model.cpu_weights {
        ingot_config::CpuWeights::Native => CpuWeights::Native,
        ingot_config::CpuWeights::Amx => CpuWeights::Amx,
        ingot_config::CpuWeights::F32 => CpuWeights::F32,
    };
    let runner = CpuRunner::load(
        model,
        files.tensors.as_ref(),
        CpuRunnerConfig {
            num_blocks: kv_tokens.div_ceil(block_size),
            block_size,
            weight_dtype: match config.model.dtype {
                ingot_config::Dtype::Bf16 => WeightDtype::Bf16,
                ingot_config::Dtype::F32 => WeightDtype::F32,
            },
        },
        weights,
        match config.model.quantization {
            ingot_config::Quantization::None => None,
            ingot_config::Quantization::Q8_0 => Some(QuantKind::Q8_0),
            ingot_config::Quantization::Q4_0 => Some(QuantKind::Q4_0),
            ingot_config::Quantization::Q4K => Some(QuantKind::Q4K),
            ingot_config::Quantization::Fp8 => None, // refused above
        },
        progress,
    )
    .with_context(|| format!("cannot load weights of {}", path.display()))?
    .with_fast_exp(config.model.cpu_fast_exp);
    tracing::info!(
        cpu_weights = config.model.cpu_weights.as_str(),
        quantized_kernels = runner.uses_quantized_weights(),
        "CPU weights"
    );
    Ok(runner)
}

/// `--speculative-config`'s keys as `speculative.*` config values.
fn speculative_flags(json: &str, flags: &mut FlagSet) -> anyhow::Result<()> {
    const FLAG: &str = "--speculative-config";
    let object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(json).with_context(|| format!("{FLAG}: not a JSON object: {json}"))?;
    for (name, value) in object {
        let key = match name.as_str() {
            "method" => "speculative.method",
            "model" => "speculative.model",
            "num_speculative_tokens" => "speculative.num_speculative_tokens",
            "prompt_lookup_min" => "speculative.prompt_lookup_min",
            "prompt_lookup_max" => "speculative.prompt_lookup_max",
            "disable_by_batch_size" => "speculative.disable_by_batch_size",
            "adaptive" => "speculative.adaptive",
            "rate_by_match" => "speculative.rate_by_match",
            "launch_ahead_unmatched" => "speculative.launch_ahead_unmatched",
            other => anyhow::bail!(
                "{FLAG}: unknown key {other:?} (known: method, model, num_speculative_tokens, \
                 prompt_lookup_min, prompt_lookup_max, disable_by_batch_size, adaptive, \
                 rate_by_match, launch_ahead_unmatched)"
            ),
        };
        flags.opt(FLAG, key, &Some(value));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source whose every answer is distinct from the trait's defaults.
    struct Everything;

    impl TensorSource for Everything {
        fn load(&self, _: &str) -> Result<HostTensor, ModelError> {
            Ok(HostTensor::new(vec![2], vec![1.0, 2.0]))
        }
        fn load_blocks(&self, _: &str) -> Result<Option<QuantTensor>, ModelError> {
            Ok(Some(QuantTensor {
                ggml_type: ingot_models::gguf::GgmlType::Q8_0,
                shape: vec![32],
                data: ingot_models::BlockData::Owned(vec![0; 34]),
            }))
        }
        fn load_bf16(&self, _: &str) -> Result<Option<Bf16Tensor<'_>>, ModelError> {
            Ok(Some(Bf16Tensor {
                shape: vec![1],
                bytes: std::borrow::Cow::Owned(vec![0, 0]),
            }))
        }
        fn load_slice(
            &self,
            _: &str,
            _: &dyn Fn(&[usize]) -> Option<ingot_models::parallel::Split>,
        ) -> Result<Option<HostTensor>, ModelError> {
            Ok(Some(HostTensor::new(vec![1], vec![3.0])))
        }
        fn stored_type(&self, _: &str) -> Option<ingot_models::gguf::GgmlType> {
            Some(ingot_models::gguf::GgmlType::Q4_K)
        }
        fn stored_e4m3(&self, _: &str) -> bool {
            true
        }
        fn load_e4m3(&self, _: &str) -> Result<Option<E4m3Tensor>, ModelError> {
            Ok(Some(E4m3Tensor {
                shape: vec![1, 4],
                bytes: vec![0x38; 4],
                row_scales: vec![0.5],
            }))
        }
        fn contains(&self, _: &str) -> bool {
            true
        }
        fn dtype_summary(&self) -> Vec<(String, usize)> {
            vec![("F8_E4M3".into(), 1)]
        }
        fn dtype_bytes(&self) -> Vec<(String, usize)> {
            vec![("F8_E4M3".into(), 4)]
        }
        fn random_seed(&self) -> Option<u64> {
            Some(7)
        }
    }

    /// The counting wrapper answers as its source does for every method (a
    /// method left to the trait's default once turned the FP8 checkpoint
    /// path off) and counts the bytes of each load.
    #[test]
    fn the_counting_source_delegates_every_method() {
        let bytes = Arc::new(AtomicU64::new(0));
        let s = CountingSource {
            inner: Box::new(Everything),
            bytes: bytes.clone(),
        };
        let n = "w";
        assert_eq!(s.load(n).unwrap().data, vec![1.0, 2.0]);
        assert!(s.load_blocks(n).unwrap().is_some() && s.load_bf16(n).unwrap().is_some());
        let slice = s.load_slice(n, &|_| None).unwrap();
        assert_eq!(slice.map(|t| t.data), Some(vec![3.0]));
        assert_eq!(s.stored_type(n), Some(ingot_models::gguf::GgmlType::Q4_K));
        assert!(s.stored_e4m3(n) && s.contains(n));
        assert_eq!(
            s.load_e4m3(n).unwrap().map(|e| e.row_scales),
            Some(vec![0.5])
        );
        assert_eq!(s.dtype_summary(), Everything.dtype_summary());
        assert_eq!(s.dtype_bytes(), Everything.dtype_bytes());
        assert_eq!(s.random_seed(), Some(7));
        // f32 8 + Q8_0 34 + bf16 2 + a slice's f32 4 + e4m3 4 + its scale 4.
        assert_eq!(bytes.load(Ordering::Relaxed), 8 + 34 + 2 + 4 + 4 + 4);
    }
}
