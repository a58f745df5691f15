//! [`ModelRunner`] on an NVIDIA GPU: the Llama-family decoder in bf16 with
//! f32 accumulation; [`encoder`] runs the BERT-family embedding models.
//!
//! - Memory: three arenas allocated at start-up (weights, activation
//!   workspace sized for `max_num_batched_tokens`, the KV block pool sized
//!   from `--gpu-memory-utilization` after a profiling forward pass); the
//!   hot path never allocates.
//! - GEMMs: cuBLASLt with per-shape cached plans ([`gemm`]); everything else
//!   is ingot's own kernels (`ingot-kernels-cuda`).
//! - Decode steps replay CUDA graphs captured per batch-size bucket (at GEMV
//!   sizes also per attention split count, picked by the step's longest
//!   context); other steps (prefill, mixed, larger batches) run eagerly.
//! - A step's inputs (ids, positions, slots, block tables) go up in one copy
//!   from pinned memory; only picked ids (greedy or sampled on the device)
//!   and the logprobs rows ask for come back.

mod buffers;
mod device;
pub mod encoder;
mod fp8_keep;
mod fused;
mod gemm;
mod kernels;
mod kv_views;
mod ops;
mod profile;
mod sampling;
#[cfg(test)]
mod test_configs;
mod weights;

use std::time::Instant;

use cudarc::driver::{sys, CudaEvent, CudaGraph};
use ingot_core::TokenId;
use ingot_kv_cache::KvLayout;
use ingot_models::{ModelConfig, ModelError, TensorSource};
use ingot_runner::{
    ForwardBatch, KvCacheShape, MaskSource, ModelRunner, Pick, RowSampling, RunnerError,
    SequenceChunk,
};

use buffers::{Buffers, StepPlan};
use device::{Arena, Gpu, Pinned};
pub use fp8_keep::Fp8Keep;
use fused::FusedBlocks;
use gemm::{Fp8Limits, Gemm};
pub use kernels::KvDtype;
use kernels::{Kernels, L2PrefetchSpec};
use kv_views::KvSizing;
use profile::{Marks, Profiler};
use sampling::DeviceSampler;
use weights::DeviceWeights;
pub use weights::WeightFormat;

/// A failure of the CUDA backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// No driver, no GPU, or no kernels in this build.
    #[error("CUDA unavailable: {0}")]
    Unavailable(String),
    /// The model or GPU needs something this backend lacks.
    #[error("unsupported on CUDA: {0}")]
    Unsupported(String),
    /// Device memory ran out.
    #[error("out of GPU memory: {0}")]
    OutOfMemory(String),
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// A cuBLASLt call failed.
    #[error("cuBLASLt: {0:?}")]
    Blas(#[from] cudarc::cublaslt::result::CublasError),
    /// Reading weights failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A caller's option is malformed.
    #[error("invalid CUDA option: {0}")]
    InvalidOption(String),
}

impl From<CudaError> for RunnerError {
    fn from(e: CudaError) -> Self {
        RunnerError::Backend(e.to_string())
    }
}

/// Whether this process can run the CUDA backend: kernels compiled in and a
/// driver library present (checked without touching the GPU).
pub fn availability() -> Result<(), CudaError> {
    if !ingot_kernels_cuda::compiled() {
        return Err(CudaError::Unavailable(
            "this build has no CUDA kernels (nvcc was not found when it was compiled)".into(),
        ));
    }
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::Unavailable(
            "no CUDA driver (libcuda) found".into(),
        ));
    }
    Ok(())
}

/// Whether this backend runs `config`'s architecture: the Llama family and
/// Gemma 3 (sliding windows, local rope, post-norms, GELU-tanh MLP, scaled
/// embeddings, logit soft-capping). Head sizes and GQA groups are checked
/// where the kernels load.
/// Bytes the model's weights take on the device in `format` (the start-up
/// memory estimate).
/// `keep`: the matrices `model.fp8_ignore` keeps in bf16 under FP8.
pub fn weight_bytes(config: &ModelConfig, format: WeightFormat, keep: &Fp8Keep) -> usize {
    DeviceWeights::bytes(config, format, keep)
}

/// Whether `format` suits the model: e4m3 GEMMs and the FP8 GEMV read
/// 16 weights per load, so every matrix's input width must be a multiple
/// of 16.
fn supports_format(config: &ModelConfig, format: WeightFormat) -> Result<(), CudaError> {
    let widths = [config.hidden_size, config.q_dim(), config.intermediate_size];
    if format.is_fp8() && widths.iter().any(|w| !w.is_multiple_of(16)) {
        return Err(CudaError::Unsupported(format!(
            "FP8 weights (model.quantization = \"fp8\") need matrix widths that are \
             multiples of 16; this model has {widths:?} (hidden, q, intermediate)"
        )));
    }
    Ok(())
}

/// How the weights are stored: `opts.fp8_weights` and `opts.fp8_lm_head`;
/// an FP8 head without FP8 weights is refused rather than ignored.
fn weight_format(opts: &CudaRunnerConfig) -> Result<WeightFormat, CudaError> {
    match (opts.fp8_weights, opts.fp8_lm_head) {
        (true, lm_head) => {
            if lm_head {
                tracing::info!("FP8: model.fp8_lm_head puts the LM head in e4m3");
            }
            Ok(WeightFormat::Fp8 { lm_head })
        }
        (false, false) => Ok(WeightFormat::Bf16),
        (false, true) => Err(CudaError::Unsupported(
            "model.fp8_lm_head needs model.quantization = \"fp8\"".into(),
        )),
    }
}

/// The largest FP8 product of a step of `max_tokens` tokens and
/// `max_seqs` sequences: any layer matrix over every token, and with an
/// FP8 LM head its vocab-wide logits of up to `max_seqs` rows (the last
/// rows of a step, or scored prompt positions, which go in groups of
/// `max_seqs`).
fn fp8_limits(
    config: &ModelConfig,
    format: WeightFormat,
    max_tokens: usize,
    max_seqs: usize,
) -> Fp8Limits {
    // The widest input of a quantized matrix (o_proj's q, down's ff; the
    // head's is the hidden size).
    let max_inputs = config
        .hidden_size
        .max(config.q_dim())
        .max(config.intermediate_size);
    // The widest output of a layer matrix (q/k/v, gate/up).
    let max_outputs = (config.q_dim() + 2 * config.kv_dim())
        .max(2 * config.intermediate_size)
        .max(config.hidden_size);
    let head_sums = if format.fp8_lm_head() {
        max_seqs * config.vocab_size
    } else {
        0
    };
    Fp8Limits {
        max_tokens,
        max_inputs,
        max_sums: (max_tokens * max_outputs).max(head_sums),
    }
}

/// The matrices kept in bf16: `opts.fp8_ignore` parsed (see [`Fp8Keep`]);
/// a list without FP8 weights is refused rather than ignored.
fn fp8_keep(opts: &CudaRunnerConfig, num_layers: usize) -> Result<Fp8Keep, CudaError> {
    if !opts.fp8_weights && !opts.fp8_ignore.trim().is_empty() {
        return Err(CudaError::Unsupported(
            "model.fp8_ignore needs model.quantization = \"fp8\"".into(),
        ));
    }
    let keep = Fp8Keep::parse(&opts.fp8_ignore, num_layers)?;
    if keep.count() > 0 {
        tracing::info!(
            matrices = keep.count(),
            "FP8: model.fp8_ignore keeps matrices in bf16"
        );
    }
    Ok(keep)
}

pub fn supports(config: &ModelConfig) -> Result<(), CudaError> {
    // Post-norm blocks stage their f32 output in the gate/up buffer.
    if config.block.post_norms && config.intermediate_size < config.hidden_size {
        return Err(CudaError::Unsupported(format!(
            "the {} architecture with an MLP ({}) narrower than the model ({}) on the \
             CUDA backend; serve it on the CPU (--device cpu)",
            config.architecture.name(),
            config.intermediate_size,
            config.hidden_size
        )));
    }
    Ok(())
}

/// Free and total bytes of device `ordinal`'s memory (opens its primary
/// context, which the runner later shares).
pub fn device_memory(ordinal: usize) -> Result<(usize, usize), CudaError> {
    availability()?;
    let ctx = cudarc::driver::CudaContext::new(ordinal)?;
    ctx.bind_to_thread()?;
    Ok(cudarc::driver::result::mem_get_info()?)
}

/// Checks a `cuda.l2_prefetch` spec (`<MiB>[:<mode>]`) without a GPU, so a
/// config can be validated anywhere.
pub fn check_l2_prefetch(spec: &str) -> Result<(), CudaError> {
    L2PrefetchSpec::parse(Some(spec)).map(|_| ())
}

/// Sizes and switches chosen by the caller.
#[derive(Debug, Clone)]
pub struct CudaRunnerConfig {
    /// GPU ordinal.
    pub device: usize,
    /// Token slots per KV block.
    pub block_size: usize,
    /// Most tokens in one forward pass (sizes the workspace).
    pub max_num_batched_tokens: usize,
    /// Most sequences in one forward pass (graph buckets go up to it).
    pub max_num_seqs: usize,
    /// Share of the GPU's memory to use in all (weights + workspace + KV).
    pub gpu_memory_utilization: f64,
    /// KV tokens to allocate instead of filling the memory budget.
    pub kv_cache_tokens: Option<usize>,
    /// Element type of the KV cache (`model.kv_cache_dtype`).
    pub kv_cache_dtype: KvDtype,
    /// Capture decode steps in CUDA graphs.
    pub cuda_graphs: bool,
    /// Log a per-step GPU time breakdown (`cuda.profile`).
    pub profile: bool,
    /// Synchronize after every launch and name the kernel that failed
    /// (`cuda.check`; debugging only).
    pub check: bool,
    /// `<MiB>[:<mode>]`: how much of o_proj's weights small-batch decode
    /// attention prefetches into L2 (`cuda.l2_prefetch`; `None`: a sixth of
    /// L2; `0`: off). Checked by [`check_l2_prefetch`].
    pub l2_prefetch: Option<String>,
    /// Programmatic dependent launch on sm_90+ (`cuda.pdl`).
    pub pdl: bool,
    /// The decoder's weight matrices in FP8 (e4m3, per-channel scales;
    /// `model.quantization = "fp8"`).
    pub fp8_weights: bool,
    /// With `fp8_weights`: matrices kept in bf16 (`model.fp8_ignore`, see
    /// [`Fp8Keep`]); empty keeps none.
    pub fp8_ignore: String,
    /// With `fp8_weights`: the LM head in e4m3 too (`model.fp8_lm_head`;
    /// off by default: it changes answers).
    pub fp8_lm_head: bool,
    /// One kernel for each layer's attention combine, o_proj, MLP and the
    /// next layer's q/k/v on small models at GEMV batch sizes
    /// (`cuda.fused_block`; off by default: measured slower).
    pub fused_block: bool,
    /// Batch-invariant kernels (`engine.deterministic`): a row's result
    /// does not depend on what else is in the step. Linear layers run
    /// cuBLASLt with one split-K-free algorithm per matrix at every token
    /// count (no GEMV kernels, no fused norms), attention runs every token
    /// through the decode kernel in one split. Costs speed.
    pub deterministic: bool,
    /// Decode steps with at least this many decode rows use the
    /// tensor-core decode attention (`cuda.tc_decode_min_rows`; 0: never).
    pub tc_decode_min_rows: usize,
    /// The same for an FP8 KV cache (`cuda.tc_decode_fp8_min_rows`; 0:
    /// never); the smaller non-zero threshold of the two applies.
    pub tc_decode_fp8_min_rows: usize,
}

impl Default for CudaRunnerConfig {
    fn default() -> Self {
        Self {
            device: 0,
            block_size: 16,
            max_num_batched_tokens: 2048,
            max_num_seqs: 256,
            gpu_memory_utilization: 0.9,
            kv_cache_tokens: None,
            kv_cache_dtype: KvDtype::Bf16,
            cuda_graphs: true,
            profile: false,
            check: false,
            l2_prefetch: None,
            pdl: true,
            fp8_weights: false,
            fp8_ignore: String::new(),
            fp8_lm_head: false,
            fused_block: false,
            deterministic: false,
            tc_decode_min_rows: 0,
            tc_decode_fp8_min_rows: 0,
        }
    }
}

/// Device memory reserved at start-up, by use.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryReport {
    /// Weights and rotary tables.
    pub weights: usize,
    /// Activations, step inputs and the cuBLASLt workspace.
    pub workspace: usize,
    /// The KV page pool.
    pub kv_cache: usize,
    /// The GPU's memory.
    pub total: usize,
}

impl MemoryReport {
    /// Sets the `ingot_gpu_memory_bytes{use=...}` gauges shown on /metrics.
    pub fn publish(&self) {
        metrics::describe_gauge!(
            "ingot_gpu_memory_bytes",
            metrics::Unit::Bytes,
            "GPU memory by use: weights, workspace, kv_cache, and the GPU's total."
        );
        for (use_, bytes) in [
            ("weights", self.weights),
            ("workspace", self.workspace),
            ("kv_cache", self.kv_cache),
            ("total", self.total),
        ] {
            metrics::gauge!("ingot_gpu_memory_bytes", "use" => use_).set(bytes as f64);
        }
    }
}

/// Milliseconds since `t`.
fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// A decode step launched before the engine asked for it (the engine's
/// `expect_next` hint): used if the next batch is exactly the expected one.
struct Speculation {
    /// Per row: the position and block the next chunk must have.
    rows: Vec<(usize, u32)>,
    /// The size of the graph it replayed.
    graph: usize,
    /// Which pinned id buffer its ids land in, and when they have.
    buffer: usize,
    done: CudaEvent,
}

/// The captured decode steps for batches of up to `size` sequences, one
/// per attention split count (`splits`, ascending).
struct DecodeGraph {
    size: usize,
    splits: Vec<usize>,
    graphs: Vec<CudaGraph>,
}

impl DecodeGraph {
    /// The split count and graph for a step whose longest context is
    /// `max_ctx` (see [`buffers::pick_splits`]).
    fn for_context(&self, max_ctx: usize) -> Result<(usize, &CudaGraph), CudaError> {
        let i = buffers::pick_splits(&self.splits, max_ctx);
        match (self.splits.get(i), self.graphs.get(i)) {
            (Some(&splits), Some(graph)) => Ok((splits, graph)),
            _ => Err(CudaError::Unsupported(format!(
                "no decode graph of size {}",
                self.size
            ))),
        }
    }
}

/// The CUDA backend.
pub struct CudaRunner {
    config: ModelConfig,
    opts: CudaRunnerConfig,
    kv_shape: KvCacheShape,
    graphs: Vec<DecodeGraph>,
    logits_host: Pinned<f32>,
    /// Last-token rows then scored positions' rows of a scored step.
    scored_host: Vec<f32>,
    /// Two, so a speculative step's ids can land while the last are read.
    ids_host: [Pinned<i32>; 2],
    next_ids_buffer: usize,
    /// Ids returned by the last greedy step (what a speculation assumed).
    last_ids: Vec<TokenId>,
    pending: Option<Speculation>,
    /// Speculative steps used / discarded.
    speculation_hits: usize,
    /// Hits for the rows still running after some of the speculated rows
    /// finished (see [`CudaRunner::speculated_rows`]).
    speculation_partial_hits: usize,
    speculation_misses: usize,
    memory: MemoryReport,
    /// Set by [`CudaRunnerConfig::profile`].
    profiler: Option<Profiler>,
    /// Staging for sampled steps; sized once the KV pool is known.
    sampler: Option<DeviceSampler>,
    /// The weights in host memory, made at the first sleep and kept (they
    /// never change), so later sleeps copy nothing.
    host_weights: Option<Pinned<u8>>,
    /// Weights, workspace and KV pool are unmapped (see [`CudaRunner::sleep`]).
    asleep: bool,
    // Drop order: graphs above reference the buffers below.
    gemm: Gemm,
    buffers: Buffers,
    kernels: Kernels,
    fused: Option<FusedBlocks>,
    weights: DeviceWeights,
    gpu: Gpu,
}

impl CudaRunner {
    /// Loads the weights, sizes the workspace and KV pool, and captures the
    /// decode graphs. `progress(done, total)` is called per tensor.
    pub fn new(
        config: ModelConfig,
        source: &dyn TensorSource,
        opts: CudaRunnerConfig,
        progress: &dyn Fn(usize, usize),
    ) -> Result<Self, CudaError> {
        // A bad spec fails before any GPU work.
        supports(&config)?;
        let format = weight_format(&opts)?;
        supports_format(&config, format)?;
        let keep = fp8_keep(&opts, config.num_layers)?;
        if opts.fp8_weights && opts.deterministic {
            return Err(CudaError::Unsupported(
                "FP8 weights (model.quantization = \"fp8\") with engine.deterministic: \
                 the FP8 GEMMs have no batch-invariant algorithm choice"
                    .into(),
            ));
        }
        let prefetch = L2PrefetchSpec::parse(opts.l2_prefetch.as_deref())?;
        let started = Instant::now();
        let gpu = Gpu::open(opts.device, opts.pdl, opts.check)?;
        let tc_decode_min_rows = kernels::tc_decode_rows(&opts);
        let kernels = Kernels::load(
            &gpu,
            &config,
            opts.kv_cache_dtype,
            prefetch,
            tc_decode_min_rows,
        )?;
        // The fused block reads its weights as bf16.
        let fused = FusedBlocks::load(&gpu, &config, opts.fused_block && !opts.fp8_weights)?;
        let (_, total) = gpu.memory()?;
        let context_ms = ms_since(started);
        let weights_started = Instant::now();
        let weights = DeviceWeights::load(&gpu, &config, source, format, &keep, progress)?;
        let weights_ms = ms_since(weights_started);
        let max_tokens = opts.max_num_batched_tokens.max(opts.max_num_seqs);
        let max_seqs = opts.max_num_seqs;
        let fp8_limits = fp8_limits(&config, format, max_tokens, max_seqs);
        let fp8_scratch = match weights.fp8_region {
            Some(_) => Gemm::fp8_scratch_bytes(fp8_limits),
            None => 0,
        };
        let mut workspace = Arena::new(
            &gpu,
            "workspace",
            Buffers::bytes(&config, max_tokens, max_seqs, opts.block_size)
                + Gemm::workspace_bytes()
                + fp8_scratch,
        )?;
        let mut gemm = Gemm::new(&gpu, &mut workspace)?;
        gemm.deterministic = opts.deterministic;
        if let Some(region) = weights.fp8_region {
            gemm.enable_fp8(&gpu, &mut workspace, region, fp8_limits)?;
        }
        // Start-up passes run on scratch data: time GEMM candidates there.
        gemm.tune = true;
        gemm.max_tokens = max_tokens;
        let mut buffers = Buffers::new(
            &gpu,
            &config,
            (max_tokens, max_seqs, opts.block_size),
            workspace,
        )?;
        buffers.deterministic = opts.deterministic;
        // SumSq starts empty (every step's embedding fills it first).
        gpu.upload(buffers.sumsq, &vec![0u32; buffers::SUMSQ_BYTES / 4])?;
        gemm.sumsq = buffers.sumsq;
        let mut runner = Self {
            kv_shape: KvCacheShape {
                num_blocks: 0,
                block_size: opts.block_size,
            },
            graphs: Vec::new(),
            logits_host: Pinned::new(&gpu, max_seqs * config.vocab_size)?,
            scored_host: Vec::new(),
            ids_host: [Pinned::new(&gpu, max_seqs)?, Pinned::new(&gpu, max_seqs)?],
            next_ids_buffer: 0,
            last_ids: Vec::new(),
            pending: None,
            speculation_hits: 0,
            speculation_partial_hits: 0,
            speculation_misses: 0,
            profiler: None,
            sampler: None,
            host_weights: None,
            asleep: false,
            memory: MemoryReport {
                weights: weights.arena.size(),
                workspace: 0,
                kv_cache: 0,
                total,
            },
            gemm,
            buffers,
            kernels,
            fused,
            weights,
            gpu,
            config,
            opts,
        };
        runner.memory.workspace = runner.buffers.workspace_size();
        let prefill_started = Instant::now();
        runner.profile_and_allocate_kv()?;
        let prefill_ms = ms_since(prefill_started);
        // A batch's seen tokens are at most its sequences' tokens, which
        // all sit in the KV pool.
        let sampler = DeviceSampler::new(
            &runner.gpu,
            max_seqs,
            runner.kv_shape.num_blocks * runner.kv_shape.block_size + max_seqs,
            runner.config.vocab_size,
        )?;
        runner.memory.workspace += sampler.bytes();
        runner.sampler = Some(sampler);
        let graphs_started = Instant::now();
        if runner.opts.cuda_graphs {
            runner.capture_graphs()?;
        }
        runner.gemm.tune = false;
        // Where a cold start goes: the first request pays none of it (the
        // warm-up prefill ran at the largest step, and each graph's decode
        // ran once eagerly before its capture).
        tracing::info!(
            context_ms,
            weights_ms,
            warmup_prefill_ms = prefill_ms,
            graphs_and_warmup_decode_ms = ms_since(graphs_started),
            total_ms = ms_since(started),
            "GPU load breakdown"
        );
        // Set after start-up so the profiling pass and warm-up are not counted.
        runner.profiler = runner.opts.profile.then(Profiler::default);
        Ok(runner)
    }

    /// Gives back the device memory of the weights, the workspace and the
    /// KV pool, keeping their addresses, so the captured graphs, kernels and
    /// tuned GEMM plans stay valid. The weights go to pinned host memory
    /// first (once; the copy is kept); the KV cache's contents are lost.
    /// Returns the bytes of the host copy.
    pub fn sleep(&mut self) -> Result<usize, CudaError> {
        if !self.asleep {
            self.gpu.sync()?;
            // A speculative step's results die with the workspace.
            self.pending = None;
            self.last_ids.clear();
            if self.host_weights.is_none() {
                let started = Instant::now();
                let mut host = Pinned::<u8>::new(&self.gpu, self.weights.arena.used())?;
                self.gpu
                    .download(host.as_mut_slice(), self.weights.arena.base())?;
                self.gpu.sync()?;
                tracing::info!(
                    mib = host.as_slice().len() >> 20,
                    ms = started.elapsed().as_secs_f64() * 1e3,
                    "weights copied to host"
                );
                self.host_weights = Some(host);
            }
            self.weights.arena.unmap()?;
            self.buffers.unmap()?;
            self.asleep = true;
        }
        Ok(self.host_weights.as_ref().map_or(0, |h| h.as_slice().len()))
    }

    /// Maps the memory [`CudaRunner::sleep`] gave back at the same
    /// addresses and copies the weights in from host memory.
    pub fn wake(&mut self) -> Result<(), CudaError> {
        if !self.asleep {
            return Ok(());
        }
        let host = self
            .host_weights
            .as_ref()
            .ok_or_else(|| CudaError::Unsupported("asleep without a host copy".into()))?;
        self.weights.arena.remap()?;
        self.gpu
            .upload(self.weights.arena.base(), host.as_slice())?;
        self.buffers.remap(&self.gpu)?;
        self.gpu.sync()?;
        self.asleep = false;
        Ok(())
    }

    /// Device memory by use.
    pub fn memory(&self) -> MemoryReport {
        self.memory
    }

    /// Runs one forward pass at the largest token count with a temporary KV
    /// pool (so cuBLASLt and the driver allocate whatever they lazily need),
    /// then gives the KV pool what is left of the memory budget, in pages
    /// of the model's layout (blocks of every layer without sliding
    /// windows).
    fn profile_and_allocate_kv(&mut self) -> Result<(), CudaError> {
        let bs = self.opts.block_size;
        let tokens = self.buffers.max_tokens.min(self.config.max_context);
        let started = Instant::now();
        let need = self.kv_sizing().need();
        let dtype = self.opts.kv_cache_dtype;
        self.buffers
            .set_kv(&self.gpu, &self.config, (need + 1, bs), dtype)?;
        self.kv_shape.num_blocks = need;
        let tables = ingot_runner::solo_tables(&*self, tokens)
            .map_err(|e| CudaError::Unsupported(e.to_string()))?;
        let ids: Vec<TokenId> = (0..tokens as TokenId)
            .map(|i| i % self.config.vocab_size as TokenId)
            .collect();
        let batch = ForwardBatch {
            chunks: vec![ingot_runner::SequenceChunk::with_tables(&ids, 0, &tables)],
            expect_next: false,
            score: Vec::new(),
        };
        self.run(&batch, false)?;
        self.buffers.drop_kv();
        let (free, total) = self.gpu.memory()?;
        let per_page = buffers::kv_page_bytes(&self.config, bs, dtype);
        let num_pages = match self.opts.kv_cache_tokens {
            Some(t) => self.kv_sizing().pages_for_tokens(t),
            None => {
                // Keep room for graph executables and driver growth.
                let reserve = 512usize << 20;
                let budget = (total as f64 * self.opts.gpu_memory_utilization) as usize;
                let used = total - free;
                budget.saturating_sub(used + reserve) / per_page
            }
        };
        // An explicit size is the caller's choice; the engine checks requests against it.
        let need = match self.opts.kv_cache_tokens {
            Some(_) => 1,
            None => need,
        };
        if num_pages < need {
            return Err(CudaError::OutOfMemory(format!(
                "only {num_pages} KV pages fit ({} MiB free of {} MiB); raise --gpu-memory-utilization or lower --max-num-batched-tokens",
                free >> 20,
                total >> 20
            )));
        }
        let kv_tokens = self.kv_sizing().capacity_tokens(num_pages);
        self.buffers
            .set_kv(&self.gpu, &self.config, (num_pages + 1, bs), dtype)?;
        self.kv_shape.num_blocks = num_pages;
        self.memory.kv_cache = (num_pages + 1) * per_page;
        tracing::info!(
            profile_ms = started.elapsed().as_secs_f64() * 1e3,
            weights_mib = self.memory.weights >> 20,
            workspace_mib = self.memory.workspace >> 20,
            kv_cache_mib = self.memory.kv_cache >> 20,
            kv_cache_dtype = ?dtype,
            kv_pages = num_pages,
            kv_tokens,
            "GPU memory reserved"
        );
        Ok(())
    }

    /// How the KV pool is sized in pages of the model's layout.
    fn kv_sizing(&self) -> KvSizing<'_> {
        KvSizing {
            layout: self.buffers.views.layout(),
            num_layers: self.config.num_layers,
            max_context: self.config.max_context,
            block_size: self.opts.block_size,
            max_tokens: self.buffers.max_tokens,
        }
    }

    /// Batch sizes that get a captured decode graph.
    fn graph_sizes(&self) -> Vec<usize> {
        let max = self.opts.max_num_seqs.min(self.buffers.max_tokens);
        let mut sizes = vec![1, 2, 4, 8, 16, 24, 32];
        let mut s = 48;
        while s <= 512 {
            sizes.push(s);
            s += 16;
        }
        sizes.retain(|&s| s < max);
        sizes.push(max);
        sizes.dedup();
        sizes
    }

    /// Captures the graphs of every batch-size bucket (one per split count
    /// at GEMV sizes); logs the time it took and the device memory the
    /// graphs took.
    fn capture_graphs(&mut self) -> Result<(), CudaError> {
        let started = Instant::now();
        let mut graph_bytes = 0;
        for size in self.graph_sizes() {
            let counts = self
                .buffers
                .graph_split_counts(size, self.kernels.num_sms, &self.config);
            let mut graphs = Vec::with_capacity(counts.len());
            // Most splits first: the warm-up and the first capture are the
            // ones a size had with a single graph (fewest first left the
            // 32-split graph ~2 % slower on SmolLM2, measured).
            for (i, &splits) in counts.iter().rev().enumerate() {
                let empty = ForwardBatch::default();
                let scratch = self.scratch_block();
                let plan = self
                    .buffers
                    .prepare_graph_decode(&empty, (size, splits), scratch)?;
                self.buffers.upload(&self.gpu, &plan)?;
                if i == 0 {
                    // Run once eagerly: creates cuBLASLt plans (one set per
                    // size) outside the capture.
                    ops::encode(&self.model(), &plan, None)?;
                }
                self.gpu.sync()?;
                let (free_before, _) = self.gpu.memory()?;
                graphs.push(self.capture(&plan)?);
                let (free_after, _) = self.gpu.memory()?;
                graph_bytes += free_before.saturating_sub(free_after);
            }
            graphs.reverse();
            self.graphs.push(DecodeGraph {
                size,
                splits: counts,
                graphs,
            });
        }
        self.gpu.sync()?;
        tracing::info!(
            sizes = self.graphs.len(),
            graphs = self.graphs.iter().map(|g| g.graphs.len()).sum::<usize>(),
            largest = self.graphs.last().map_or(0, |g| g.size),
            graph_mib = graph_bytes as f64 / (1 << 20) as f64,
            warmup_ms = started.elapsed().as_secs_f64() * 1e3,
            "CUDA graphs captured"
        );
        Ok(())
    }

    /// Captures the decode step `plan` lays out and uploads its graph.
    fn capture(&self, plan: &StepPlan) -> Result<CudaGraph, CudaError> {
        self.gpu
            .stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let encoded = ops::encode(&self.model(), plan, None);
        let graph = self
            .gpu
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))?;
        encoded?;
        let graph = graph.ok_or_else(|| CudaError::Unsupported("empty decode graph".into()))?;
        graph.upload()?;
        Ok(graph)
    }

    /// The parts a step reads.
    fn model(&self) -> ops::Model<'_> {
        ops::Model {
            gpu: &self.gpu,
            gemm: &self.gemm,
            kernels: &self.kernels,
            fused: self.fused.as_ref(),
            weights: &self.weights,
            buffers: &self.buffers,
            config: &self.config,
        }
    }

    /// The extra page behind the pool that padded graph rows write into
    /// (and given-back sliding blocks read as; they are never read).
    fn scratch_block(&self) -> u32 {
        self.kv_shape.num_blocks as u32
    }

    /// Uploads the step's inputs and runs it (graph or eager); the argmax
    /// of each row is always computed, the logits stay on the device.
    fn run(&mut self, batch: &ForwardBatch<'_>, allow_graph: bool) -> Result<StepPlan, CudaError> {
        self.gpu.ctx.bind_to_thread()?;
        let started = Instant::now();
        let decode = batch.chunks.iter().all(|c| c.tokens.len() == 1);
        let graph = if allow_graph && decode && self.profiler.is_none() {
            let max_ctx = batch.chunks.iter().map(|c| c.end_pos()).max().unwrap_or(1);
            match self.graphs.iter().find(|g| g.size >= batch.chunks.len()) {
                Some(g) => Some((g.size, g.for_context(max_ctx)?)),
                None => None,
            }
        } else {
            None
        };
        let scratch = self.scratch_block();
        let plan = match graph {
            Some((size, (splits, _))) => {
                self.buffers
                    .prepare_graph_decode(batch, (size, splits), scratch)?
            }
            None => self.buffers.prepare(
                batch,
                self.kernels.num_sms,
                &self.config,
                (self.kernels.has_prefill(), scratch),
            )?,
        };
        let mut marks = match self.profiler {
            Some(_) => Some(Marks::begin(&self.gpu)?),
            None => None,
        };
        self.buffers.upload(&self.gpu, &plan)?;
        match graph {
            Some((_, (_, g))) => g.launch()?,
            None => ops::encode(&self.model(), &plan, marks.as_mut())?,
        }
        if let (Some(p), Some(m)) = (self.profiler.as_mut(), marks) {
            self.gpu.sync()?;
            p.add(m, decode, batch.num_tokens(), started)?;
        }
        Ok(plan)
    }
}

impl Drop for CudaRunner {
    fn drop(&mut self) {
        tracing::debug!(
            hits = self.speculation_hits,
            partial_hits = self.speculation_partial_hits,
            misses = self.speculation_misses,
            "speculative decode steps"
        );
        if let Some(p) = &self.profiler {
            p.report();
        }
    }
}

// The runner is built on one thread and then moved to the engine's thread,
// which alone uses it (binding the context there at every step); cudarc's
// raw handles are not marked Send only because they are pointers.
unsafe impl Send for CudaRunner {}

impl ModelRunner for CudaRunner {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_cache_shape(&self) -> KvCacheShape {
        self.kv_shape
    }

    /// The model's layer groups (as the CPU runner's): Gemma 3's sliding
    /// layers read their own table, whose blocks leave with the window.
    fn kv_layout(&self) -> KvLayout {
        self.buffers.views.layout().clone()
    }

    fn device_name(&self) -> String {
        format!("cuda:{} {}", self.opts.device, self.gpu.name)
    }

    fn launches_ahead(&self) -> bool {
        true
    }

    fn sleep(&mut self) -> Result<u64, RunnerError> {
        CudaRunner::sleep(self)
            .map(|b| b as u64)
            .map_err(|e| RunnerError::Backend(e.to_string()))
    }

    fn wake(&mut self) -> Result<(), RunnerError> {
        CudaRunner::wake(self).map_err(|e| RunnerError::Backend(e.to_string()))
    }

    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<&[f32], RunnerError> {
        self.check_batch(batch)?;
        // A speculative step still in the stream runs first; its result is unused.
        if self.pending.take().is_some() {
            self.speculation_misses += 1;
        }
        // Scored rows are gathered from the eager step's token layout.
        self.run(batch, batch.score.is_empty())?;
        let n = batch.chunks.len() * self.config.vocab_size;
        let host = &mut self.logits_host.as_mut_slice()[..n];
        self.gpu.download(host, self.buffers.logits)?;
        self.gpu.sync()?;
        if batch.score.is_empty() {
            return Ok(&self.logits_host.as_slice()[..n]);
        }
        self.score_rows(batch)?;
        Ok(&self.scored_host)
    }

    fn forward_greedy(&mut self, batch: &ForwardBatch<'_>) -> Result<Vec<TokenId>, RunnerError> {
        self.forward_ids(batch, None)
    }

    fn forward_sample(
        &mut self,
        batch: &ForwardBatch<'_>,
        rows: &[RowSampling<'_>],
        masks: &mut dyn MaskSource,
    ) -> Result<Vec<Pick>, RunnerError> {
        ingot_runner::check_rows(batch, rows)?;
        // A constrained row is never a plain argmax: its mask goes through
        // the sampler (which takes the argmax of greedy rows after it).
        let plain_argmax = rows
            .iter()
            .all(|r| r.is_greedy() && !r.has_penalties() && r.params.logprobs.is_none())
            && masks.is_empty();
        let ids = self.forward_ids(batch, (!plain_argmax).then_some((rows, masks)))?;
        let sampler = self.sampler.as_ref();
        Ok(ids
            .into_iter()
            .zip(rows)
            .enumerate()
            .map(|(i, (token, r))| Pick {
                token,
                logprobs: r.params.logprobs.and(sampler).map(|s| s.logprobs(i)),
            })
            .collect())
    }
}

impl CudaRunner {
    /// Runs the batch (or takes the speculated step that already ran it),
    /// picks ids on the device (argmax, or `rows`' sampling), and, when the
    /// engine expects the same decode next, launches that step before
    /// returning.
    fn forward_ids(
        &mut self,
        batch: &ForwardBatch<'_>,
        rows: Option<(&[RowSampling<'_>], &mut dyn MaskSource)>,
    ) -> Result<Vec<TokenId>, RunnerError> {
        self.check_batch(batch)?;
        let n = batch.chunks.len();
        let pending = self.pending.take();
        // Which speculated row each of this batch's rows is (all of them, in
        // order, on a full hit; a subsequence when some rows finished).
        let kept = pending
            .as_ref()
            .and_then(|spec| self.speculated_rows(spec, batch));
        let partial = match (&pending, &kept) {
            (Some(spec), Some(k)) if k.len() == spec.rows.len() => {
                self.speculation_hits += 1;
                None
            }
            (Some(_), Some(k)) => {
                self.speculation_partial_hits += 1;
                Some(k.as_slice())
            }
            (Some(_), None) => {
                // A miss: the stream runs the wasted step first; nothing else to undo.
                self.speculation_misses += 1;
                None
            }
            (None, _) => None,
        };
        let speculated = pending.filter(|_| kept.is_some());
        let graph = match (&speculated, partial) {
            // The device's inputs are laid out for the speculated rows, so
            // nothing is chained after a partial hit.
            (Some(_), Some(_)) => None,
            (Some(spec), None) => Some(spec.graph),
            (None, _) => self.run(batch, true)?.graph_size,
        };
        // Ids sampled here are in this batch's order; a greedy hit's were
        // picked by the speculated step, in its rows' order.
        let id_rows = partial.filter(|_| rows.is_none());
        let (buffer, done) = match (rows, speculated) {
            (Some((rows, masks)), _) => {
                if let Some(kept) = partial {
                    self.compact_logits(kept)?;
                }
                let sampler = self
                    .sampler
                    .as_mut()
                    .ok_or_else(|| RunnerError::Backend("no device sampler".into()))?;
                // The forward pass is enqueued: the host waits for the
                // grammar masks while the device runs it.
                let masks = masks.masks();
                sampler.launch(
                    &self.gpu,
                    rows,
                    masks,
                    self.buffers.logits,
                    self.config.vocab_size,
                    self.buffers.sampled,
                )?;
                self.download_ids(n)?
            }
            (None, Some(spec)) => (spec.buffer, spec.done),
            (None, None) => self.download_ids(n)?,
        };
        if let Some(size) = graph.filter(|_| batch.expect_next && self.profiler.is_none()) {
            if let Some(next) = self.next_rows(batch) {
                // Its rows are one position further: their context is one longer.
                let max_ctx = next.iter().map(|&(pos, _)| pos + 1).max().unwrap_or(1);
                let (splits, _) = self.graph_for(size, max_ctx)?;
                self.stage_next_step(batch, (size, splits))?;
                let (_, graph) = self.graph_for(size, max_ctx)?;
                graph.launch().map_err(CudaError::from)?;
                let (buffer, done) = self.download_ids(n)?;
                self.pending = Some(Speculation {
                    rows: next,
                    graph: size,
                    buffer,
                    done,
                });
            }
        }
        done.synchronize().map_err(CudaError::from)?;
        let ids = self.ids_host[buffer].as_slice();
        self.last_ids = match id_rows {
            Some(kept) => kept.iter().map(|&j| ids[j] as TokenId).collect(),
            None => ids[..n].iter().map(|&i| i as TokenId).collect(),
        };
        Ok(self.last_ids.clone())
    }
}

impl CudaRunner {
    /// After an eager step of `batch`: the last-token rows (already in
    /// `logits_host`) followed by the logits of every scored position, in
    /// `scored_host`. The residual rows are still in the workspace; they go
    /// through the final norm and LM head in groups of `max_seqs` rows.
    fn score_rows(&mut self, batch: &ForwardBatch<'_>) -> Result<(), RunnerError> {
        let vocab = self.config.vocab_size;
        let n = batch.chunks.len();
        let mut first = Vec::with_capacity(n);
        let mut end = 0;
        for c in &batch.chunks {
            first.push(end);
            end += c.tokens.len();
        }
        let first = &first;
        let rows: Vec<i32> = batch
            .score
            .iter()
            .flat_map(|s| (0..s.next.len()).map(move |i| (first[s.chunk] + i) as i32))
            .collect();
        self.scored_host.clear();
        self.scored_host
            .extend_from_slice(&self.logits_host.as_slice()[..n * vocab]);
        let done = self.scored_host.len();
        self.scored_host.resize(done + rows.len() * vocab, 0.0);
        for (g, group) in rows.chunks(self.buffers.max_seqs).enumerate() {
            self.buffers.upload_last_rows(&self.gpu, group)?;
            ops::project_rows(&self.model(), group.len())?;
            let at = done + g * self.buffers.max_seqs * vocab;
            let host = &mut self.logits_host.as_mut_slice()[..group.len() * vocab];
            self.gpu.download(host, self.buffers.logits)?;
            // The pinned staging is rewritten by the next group.
            self.gpu.sync()?;
            self.scored_host[at..at + group.len() * vocab].copy_from_slice(host);
        }
        Ok(())
    }

    /// Enqueues the copy of `n` picked ids into the next pinned buffer.
    fn download_ids(&mut self, n: usize) -> Result<(usize, CudaEvent), CudaError> {
        let buffer = self.next_ids_buffer;
        self.next_ids_buffer ^= 1;
        let host = &mut self.ids_host[buffer].as_mut_slice()[..n];
        self.gpu.download(host, self.buffers.sampled)?;
        let done = self
            .gpu
            .stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))?;
        Ok((buffer, done))
    }

    /// Where each row goes next, when every row's tables already hold its
    /// next position (inside its block, or a block the engine took a step
    /// early: `Scheduler::reserve_next_position`): its position and its
    /// first-group page there (only its sequence writes it, so the page
    /// names the sequence and, with it, the pages of its other groups).
    fn next_rows(&self, batch: &ForwardBatch<'_>) -> Option<Vec<(usize, u32)>> {
        let shape = (
            self.kv_shape.block_size,
            self.buffers.views.layout().pages_per_block(0),
        );
        next_rows(batch, shape, self.config.max_context)
    }

    /// The split count and graph of `size` rows for a longest context of
    /// `max_ctx`.
    fn graph_for(&self, size: usize, max_ctx: usize) -> Result<(usize, &CudaGraph), RunnerError> {
        let g = self
            .graphs
            .iter()
            .find(|g| g.size == size)
            .ok_or_else(|| RunnerError::Backend(format!("no graph of size {size}")))?;
        Ok(g.for_context(max_ctx)?)
    }

    /// Stages and uploads the inputs of the decode step after `batch` (one
    /// position further, the same tables) for the graph of `size` rows and
    /// `splits` attention splits, and
    /// copies the ids this step picks into them on the device: the next
    /// step can then be launched before the host has seen those ids.
    fn stage_next_step(
        &mut self,
        batch: &ForwardBatch<'_>,
        (size, splits): (usize, usize),
    ) -> Result<(), CudaError> {
        // The ids are the device's: a placeholder stands in on the host.
        const PICKED: [TokenId; 1] = [0];
        let next = ForwardBatch {
            chunks: batch
                .chunks
                .iter()
                .map(|c| SequenceChunk {
                    tokens: &PICKED,
                    start_pos: c.start_pos + 1,
                    ..*c
                })
                .collect(),
            ..Default::default()
        };
        let scratch = self.scratch_block();
        let plan = self
            .buffers
            .prepare_graph_decode(&next, (size, splits), scratch)?;
        self.buffers.upload(&self.gpu, &plan)?;
        let rows = next.chunks.len();
        self.gpu.copy_within(
            self.buffers.input(self.buffers.layout.ids),
            self.buffers.sampled,
            rows * std::mem::size_of::<i32>(),
        )
    }

    /// Which speculated row each row of `batch` is (see
    /// [`speculated_rows`]).
    fn speculated_rows(&self, spec: &Speculation, batch: &ForwardBatch<'_>) -> Option<Vec<usize>> {
        let shape = (
            self.kv_shape.block_size,
            self.buffers.views.layout().pages_per_block(0),
        );
        speculated_rows(&spec.rows, &self.last_ids, shape, batch)
    }

    /// Moves the logits rows of a partial speculation hit together, so row
    /// `i` holds speculated row `kept[i]` (which is never before `i`).
    fn compact_logits(&self, kept: &[usize]) -> Result<(), RunnerError> {
        let row = self.config.vocab_size * std::mem::size_of::<f32>();
        for (i, &j) in kept.iter().enumerate().filter(|(i, j)| i != *j) {
            let at = |r: usize| self.buffers.logits + (r * row) as u64;
            self.gpu.copy_within(at(i), at(j), row)?;
        }
        Ok(())
    }
}

impl CudaRunner {
    /// The shared batch checks, then this runner's workspace limits.
    fn check_batch(&self, batch: &ForwardBatch<'_>) -> Result<(), RunnerError> {
        if self.asleep {
            // Its memory is unmapped: a launch would fault the context.
            return Err(RunnerError::Backend("the model is asleep".into()));
        }
        let layout = self.buffers.views.layout();
        ingot_runner::validate_grouped(&self.config, self.kv_shape, layout, batch)?;
        let (tokens, seqs) = (batch.num_tokens(), batch.chunks.len());
        if tokens > self.buffers.max_tokens || seqs > self.buffers.max_seqs {
            return Err(RunnerError::InvalidBatch(format!(
                "{tokens} tokens in {seqs} sequences exceed the workspace ({} tokens, {} sequences)",
                self.buffers.max_tokens, self.buffers.max_seqs
            )));
        }
        Ok(())
    }
}

/// [`CudaRunner::next_rows`] for `(block_size, pages_per_block)` of the
/// first group and `max_context` positions.
fn next_rows(
    batch: &ForwardBatch<'_>,
    (block_size, pages_per_block): (usize, usize),
    max_context: usize,
) -> Option<Vec<(usize, u32)>> {
    batch
        .chunks
        .iter()
        .map(|c| {
            let next = c.start_pos + 1;
            let block = next / block_size;
            let held = next < max_context && c.group_tables.iter().all(|t| t.num_blocks() > block);
            let page = c.block_table.get(block * pages_per_block).copied();
            page.filter(|_| held).map(|page| (next, page))
        })
        .collect()
}

/// Which speculated row each row of `batch` is, when the batch is the
/// speculated one or the speculated one less some rows (finished ones):
/// every row carries the id it was given last step (`last_ids`, one per
/// speculated row), one position further in the same block (`spec`: the
/// position and first-group page each speculated row must have; `shape`:
/// block size and the first group's pages per block), in the speculated
/// order. `None` when a row was not speculated.
fn speculated_rows(
    spec: &[(usize, u32)],
    last_ids: &[TokenId],
    (block_size, pages_per_block): (usize, usize),
    batch: &ForwardBatch<'_>,
) -> Option<Vec<usize>> {
    if spec.len() != last_ids.len() || batch.chunks.is_empty() {
        return None;
    }
    let mut next = 0;
    batch
        .chunks
        .iter()
        .map(|c| {
            let found = (next..spec.len()).find(|&j| {
                let (pos, block) = spec[j];
                c.tokens == [last_ids[j]]
                    && c.start_pos == pos
                    && c.block_table.get(pos / block_size * pages_per_block) == Some(&block)
            })?;
            next = found + 1;
            Some(found)
        })
        .collect()
}

#[cfg(test)]
mod speculation_tests {
    use super::*;
    use ingot_runner::SequenceChunk;

    /// Three speculated rows: ids 7, 8, 9 at positions 5, 6, 7 of blocks
    /// 10, 11, 12 (block size 16).
    const SPEC: [(usize, u32); 3] = [(5, 10), (6, 11), (7, 12)];
    const IDS: [TokenId; 3] = [7, 8, 9];
    const TABLES: [[u32; 1]; 3] = [[10], [11], [12]];

    fn batch(rows: &[usize]) -> ForwardBatch<'static> {
        ForwardBatch {
            chunks: rows
                .iter()
                .map(|&r| SequenceChunk {
                    tokens: std::slice::from_ref(&IDS[r]),
                    start_pos: SPEC[r].0,
                    block_table: &TABLES[r],
                    group_tables: &[],
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn rows_go_on_into_a_block_taken_early_and_not_past_their_tables() {
        let ids = [1u32];
        let chunk = |start_pos, block_table| SequenceChunk {
            tokens: &ids,
            start_pos,
            block_table,
            group_tables: &[],
        };
        let batch = |chunks| ForwardBatch {
            chunks,
            ..Default::default()
        };
        // Position 14 goes on in its block; 15 crosses into the block the
        // engine took early (page 8).
        let both = batch(vec![chunk(14, &[3]), chunk(15, &[4, 8])]);
        assert_eq!(
            next_rows(&both, (16, 1), 4096),
            Some(vec![(15, 3), (16, 8)])
        );
        // A row crossing without its next block: no speculation.
        let short = batch(vec![chunk(14, &[3]), chunk(15, &[4])]);
        assert_eq!(next_rows(&short, (16, 1), 4096), None);
        // Nor at the end of the context.
        assert_eq!(next_rows(&batch(vec![chunk(14, &[3])]), (16, 1), 15), None);
        // Two pages a block: the next block's first page names the row.
        let paged = batch(vec![chunk(15, &[4, 5, 8, 9])]);
        assert_eq!(next_rows(&paged, (16, 2), 4096), Some(vec![(16, 8)]));
    }

    #[test]
    fn the_same_rows_are_a_full_hit() {
        assert_eq!(
            speculated_rows(&SPEC, &IDS, (16, 1), &batch(&[0, 1, 2])),
            Some(vec![0, 1, 2])
        );
    }

    #[test]
    fn finished_rows_leave_a_partial_hit_in_order() {
        assert_eq!(
            speculated_rows(&SPEC, &IDS, (16, 1), &batch(&[0, 2])),
            Some(vec![0, 2])
        );
        assert_eq!(
            speculated_rows(&SPEC, &IDS, (16, 1), &batch(&[1])),
            Some(vec![1])
        );
    }

    #[test]
    fn a_first_group_of_two_pages_per_block_is_matched_on_the_written_blocks_page() {
        // Position 21 is in block 1: its pages are entries 2 and 3.
        let table = [4, 5, 6, 7];
        let b = ForwardBatch {
            chunks: vec![SequenceChunk {
                tokens: &IDS[..1],
                start_pos: 21,
                block_table: &table,
                group_tables: &[],
            }],
            ..Default::default()
        };
        assert_eq!(
            speculated_rows(&[(21, 6)], &IDS[..1], (16, 2), &b),
            Some(vec![0])
        );
        // Entry 1 (block 0's second page) is a shared prefix's page.
        assert_eq!(speculated_rows(&[(21, 5)], &IDS[..1], (16, 2), &b), None);
    }

    #[test]
    fn reordered_new_or_changed_rows_are_a_miss() {
        assert_eq!(speculated_rows(&SPEC, &IDS, (16, 1), &batch(&[2, 0])), None);
        assert_eq!(speculated_rows(&SPEC, &IDS, (16, 1), &batch(&[])), None);
        let mut b = batch(&[0, 1]);
        b.chunks[1].start_pos = 9;
        assert_eq!(speculated_rows(&SPEC, &IDS, (16, 1), &b), None);
        let other = [8];
        let mut b = batch(&[0, 1]);
        b.chunks[0].tokens = &other;
        assert_eq!(speculated_rows(&SPEC, &IDS, (16, 1), &b), None);
    }
}

#[cfg(test)]
mod support_tests {
    use super::*;
    use ingot_models::{Architecture, BlockOptions, RopeConfig, RopeScaling, SlidingWindow};

    /// Gemma 3 270M's shape.
    fn gemma3() -> ModelConfig {
        let rope = |theta| RopeConfig {
            theta,
            scaling: RopeScaling::None,
        };
        ModelConfig {
            architecture: Architecture::Gemma3,
            hidden_size: 640,
            intermediate_size: 2048,
            num_layers: 18,
            num_heads: 4,
            num_kv_heads: 1,
            head_dim: 256,
            vocab_size: 262_144,
            max_context: 2048,
            rms_norm_eps: 1e-6,
            rope: rope(1e6),
            qkv_bias: false,
            qk_norm: true,
            tie_word_embeddings: true,
            block: BlockOptions {
                sliding_window: Some(SlidingWindow {
                    size: 512,
                    global_every: 6,
                    local_rope: rope(1e4),
                }),
                post_norms: true,
                attention_scale: None,
                final_logit_softcap: None,
            },
        }
    }

    #[test]
    fn gemma3_is_supported_and_a_narrow_post_norm_mlp_is_refused() {
        let mut c = gemma3();
        assert!(supports(&c).is_ok());
        c.intermediate_size = 320;
        let err = supports(&c).map(|_| ()).unwrap_err().to_string();
        assert!(
            err.contains("narrower") && err.contains("--device cpu"),
            "{err}"
        );
    }

    #[test]
    fn sliding_models_get_a_second_pair_of_rope_tables() {
        let c = gemma3();
        let mut global_only = c.clone();
        global_only.block.sliding_window = None;
        let table = c.max_context * (c.head_dim / 2) * 4;
        let bytes = |c| weights::DeviceWeights::bytes(c, WeightFormat::Bf16, &Fp8Keep::default());
        let extra = bytes(&c) - bytes(&global_only);
        assert!((2 * table..2 * table + 1024).contains(&extra), "{extra}");
    }

    #[test]
    fn fp8_weights_take_one_byte_per_layer_weight_plus_row_scales() {
        let c = gemma3();
        let (d, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let layer_weights = (q + 2 * kv) * d + d * q + 2 * ff * d + d * ff;
        let layer_rows = (q + 2 * kv) + d + 2 * ff + d;
        let none = Fp8Keep::default();
        let saved = weight_bytes(&c, WeightFormat::Bf16, &none) - weight_bytes(&c, FP8, &none);
        // bf16 2 bytes -> e4m3 1 byte, plus a 4-byte scale per row (and
        // the arena's 256-byte rounding of each piece).
        let want = c.num_layers * (layer_weights - 4 * layer_rows);
        let slack = c.num_layers * 16 * 256;
        assert!(saved.abs_diff(want) < slack, "saved {saved}, want {want}");
    }

    #[test]
    fn fp8_ignore_keeps_its_matrices_at_two_bytes_a_weight() {
        let c = gemma3();
        let (d, ff) = (c.hidden_size, c.intermediate_size);
        let none = Fp8Keep::default();
        let down = Fp8Keep::parse("down_proj", c.num_layers).unwrap();
        let extra = weight_bytes(&c, FP8, &down) - weight_bytes(&c, FP8, &none);
        // Each layer's down_proj: 2 bytes instead of 1, less its row scales.
        let want = c.num_layers * (d * ff - 4 * d);
        assert!(
            extra.abs_diff(want) < c.num_layers * 2 * 256,
            "extra {extra}, want {want}"
        );
        // Everything kept: the bf16 size.
        let all = Fp8Keep::parse("layers", c.num_layers).unwrap();
        assert_eq!(
            weight_bytes(&c, FP8, &all),
            weight_bytes(&c, WeightFormat::Bf16, &none)
        );
    }

    #[test]
    fn fp8_ignore_without_fp8_is_refused() {
        let opts = CudaRunnerConfig {
            fp8_ignore: "down_proj".into(),
            ..CudaRunnerConfig::default()
        };
        let err = fp8_keep(&opts, 4).unwrap_err().to_string();
        assert!(err.contains("model.quantization"), "{err}");
        let opts = CudaRunnerConfig {
            fp8_weights: true,
            ..opts
        };
        assert_eq!(fp8_keep(&opts, 4).unwrap().count(), 4);
    }

    const FP8: WeightFormat = WeightFormat::Fp8 { lm_head: false };
    const FP8_HEAD: WeightFormat = WeightFormat::Fp8 { lm_head: true };

    /// A tied FP8 head is a second copy beside the bf16 embedding table
    /// (1 byte a weight plus a 4-byte scale a row); an untied one replaces
    /// the bf16 head (saving 1 byte a weight, less the scales).
    #[test]
    fn fp8_lm_head_bytes_are_counted_in_the_plan() {
        let tied = gemma3();
        let (v, d) = (tied.vocab_size, tied.hidden_size);
        let none = Fp8Keep::default();
        let head = v * d + 4 * v;
        let extra = weight_bytes(&tied, FP8_HEAD, &none) - weight_bytes(&tied, FP8, &none);
        assert!(extra.abs_diff(head) < 2 * 256, "extra {extra}, want {head}");
        let mut untied = gemma3();
        untied.tie_word_embeddings = false;
        let saved = weight_bytes(&untied, FP8, &none) - weight_bytes(&untied, FP8_HEAD, &none);
        let want = v * d - 4 * v;
        assert!(saved.abs_diff(want) < 2 * 256, "saved {saved}, want {want}");
        // Only the head changes: the bf16 plan is the same either way.
        assert_eq!(
            weight_bytes(&untied, WeightFormat::Bf16, &none) - weight_bytes(&untied, FP8, &none),
            weight_bytes(&tied, WeightFormat::Bf16, &none) - weight_bytes(&tied, FP8, &none)
        );
    }

    /// The FP8 sums scratch holds vocab-wide logits for every row the head
    /// takes at once (up to max_seqs), and the layer products as before.
    #[test]
    fn fp8_scratch_covers_the_heads_rows_of_logits() {
        let c = gemma3();
        let widest = 2 * c.intermediate_size;
        let plain = fp8_limits(&c, FP8, 2048, 256);
        assert_eq!(plain.max_sums, 2048 * widest);
        assert_eq!(plain.max_inputs, c.intermediate_size);
        let head = fp8_limits(&c, FP8_HEAD, 2048, 256);
        assert_eq!(head.max_sums, 256 * c.vocab_size);
        assert!(head.max_sums > plain.max_sums);
        assert!(head.max_inputs >= c.hidden_size);
        // A step's tokens through the widest layer matrix can still be more.
        let long = fp8_limits(&c, FP8_HEAD, 65536, 256);
        assert_eq!(long.max_sums, 65536 * widest);
    }

    #[test]
    fn fp8_lm_head_without_fp8_is_refused() {
        let opts = CudaRunnerConfig {
            fp8_lm_head: true,
            ..CudaRunnerConfig::default()
        };
        let err = weight_format(&opts).unwrap_err().to_string();
        assert!(
            err.contains("model.fp8_lm_head") && err.contains("model.quantization"),
            "{err}"
        );
        let fp8 = CudaRunnerConfig {
            fp8_weights: true,
            ..opts.clone()
        };
        assert_eq!(weight_format(&fp8).unwrap(), FP8_HEAD);
        let plain = CudaRunnerConfig {
            fp8_lm_head: false,
            ..fp8
        };
        assert_eq!(weight_format(&plain).unwrap(), FP8);
        assert_eq!(
            weight_format(&CudaRunnerConfig::default()).unwrap(),
            WeightFormat::Bf16
        );
    }

    #[test]
    fn fp8_needs_widths_that_16_divides() {
        let mut c = gemma3();
        assert!(supports_format(&c, FP8).is_ok());
        c.intermediate_size = 2056;
        assert!(supports_format(&c, WeightFormat::Bf16).is_ok());
        let err = supports_format(&c, FP8).unwrap_err().to_string();
        assert!(err.contains("multiples of 16"), "{err}");
    }
}
