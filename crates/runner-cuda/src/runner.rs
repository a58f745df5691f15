//! [`CudaRunner`]: start-up (weights, workspace, the KV pool sized after a
//! profiling pass, graph capture), sleep and wake, and the
//! [`ModelRunner`] steps. Graph capture and replay live in [`graphs`], the
//! decode steps launched ahead of the engine in [`launch_ahead`].

mod capture;
mod graphs;
mod launch_ahead;
mod parallel;

use std::time::Instant;

use cudarc::driver::{sys, CudaEvent};
use ingot_core::TokenId;
use ingot_kv_cache::{BlockId, KvLayout};
use ingot_models::{ModelConfig, TensorSource};
use ingot_runner::{
    ForwardBatch, KvCacheShape, MaskSource, ModelRunner, Pick, RowSampling, RunnerError,
};

use crate::buffers::{self, Buffers, StepPlan};
use crate::config::{
    fp8_checkpoint, fp8_keep, fp8_limits, native_blocks, weight_format, CudaRunnerConfig,
};
use crate::device::{Arena, Gpu, Pinned};
use crate::fused::FusedBlocks;
use crate::gemm::{Gemm, NativeRegions};
use crate::kernels::{self, Kernels, L2PrefetchSpec};
use crate::kv_views::KvSizing;
use crate::memory::MemoryReport;
use crate::nccl::Communicator;
use crate::ops;
use crate::profile::{Marks, Profiler};
use crate::sampling::DeviceSampler;
use crate::support::{supports, supports_format};
use crate::weights::{DeviceWeights, NativeBlocks};
use crate::CudaError;
use graphs::DecodeGraph;
use launch_ahead::{LaunchAhead, LaunchAheadCounts};
pub use parallel::TpRunner;

/// Milliseconds since `t`.
fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
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
    /// Two, so a launch-ahead step's ids can land while the last are read.
    ids_host: [Pinned<i32>; 2],
    next_ids_buffer: usize,
    /// Ids returned by the last greedy step (what a launch-ahead step
    /// assumed).
    last_ids: Vec<TokenId>,
    /// The step launched ahead of the engine, if any.
    pending: Option<LaunchAhead>,
    launch_ahead: LaunchAheadCounts,
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
    /// Page copies for KV tiers, made at the first copy.
    kv_copier: Option<crate::kv_copy::KvCopier>,
    /// EAGLE heads: the layers whose input rows each step keeps.
    capture: Option<capture::HiddenCapture>,
    /// Start-up timings (logged once the graphs are captured).
    started: Option<Instant>,
    context_ms: f64,
    weights_ms: f64,
    warmup_prefill_ms: f64,
    // Drop order: graphs above reference the buffers below.
    gemm: Gemm,
    buffers: Buffers,
    kernels: Kernels,
    fused: Option<FusedBlocks>,
    weights: DeviceWeights,
    /// Tensor parallel: this rank's side of the one-shot all-reduce.
    peer: Option<crate::peer::PeerReduce>,
    /// Tensor parallel: this rank's communicator (`config` is then the
    /// rank's share of the model, see [`TpRunner`]).
    comm: Option<Communicator>,
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
        let mut runner = Self::load(config, source, opts, progress, None)?;
        let pages = runner.measure_kv_pages()?;
        runner.finish(pages)?;
        Ok(runner)
    }

    /// The first part of start-up, with no collective in it (a tensor-
    /// parallel rank's failure here cannot leave the others waiting):
    /// weights, workspace, GEMM handle.
    fn load(
        config: ModelConfig,
        source: &dyn TensorSource,
        opts: CudaRunnerConfig,
        progress: &dyn Fn(usize, usize),
        comm: Option<Communicator>,
    ) -> Result<Self, CudaError> {
        // A bad spec fails before any GPU work.
        supports(&config)?;
        let format = weight_format(&opts, fp8_checkpoint(&opts, &config, source))?;
        supports_format(&config, format)?;
        let keep = fp8_keep(&opts, config.num_layers)?;
        let native = match format.fp8_from_file() {
            true => NativeBlocks::none(),
            false => native_blocks(&opts, &config, source)?,
        };
        if format.is_fp8() && opts.deterministic {
            return Err(CudaError::Unsupported(
                "FP8 weights (model.quantization = \"fp8\") with engine.deterministic: \
                 the FP8 GEMMs have no batch-invariant algorithm choice"
                    .into(),
            ));
        }
        let prefetch = L2PrefetchSpec::parse(opts.l2_prefetch.as_deref())?;
        let started = Instant::now();
        let mut gpu = Gpu::open(opts.device, opts.pdl, opts.check)?;
        gpu.prefer_shared_memory(opts.smem_carveout);
        let tc_decode_min_rows = kernels::tc_decode_rows(&opts);
        let kernels = Kernels::load(
            &gpu,
            &config,
            opts.kv_cache_dtype,
            prefetch,
            tc_decode_min_rows,
        )?;
        // The fused block reads its weights as bf16.
        let bf16_only = !format.is_fp8() && native.count() == 0;
        let fused = FusedBlocks::load(&gpu, &config, opts.fused_block && bf16_only)?;
        let (_, total) = gpu.memory()?;
        let context_ms = ms_since(started);
        let weights_started = Instant::now();
        let weights =
            DeviceWeights::load(&gpu, &config, source, format, (&keep, &native), progress)?;
        let weights_ms = ms_since(weights_started);
        let max_tokens = opts.max_num_batched_tokens.max(opts.max_num_seqs);
        let max_seqs = opts.max_num_seqs;
        let moe_grouped = kernels::moe_grouped_min_tokens(&opts, &config);
        let fp8_limits = fp8_limits(&config, format, max_tokens, max_seqs);
        let fp8_scratch = match weights.fp8_region {
            Some(_) => Gemm::fp8_scratch_bytes(fp8_limits),
            None => 0,
        };
        let native_elements = native.max_elements(&config);
        let native_scratch = if native.count() > 0 {
            Gemm::native_scratch_bytes(native_elements)
        } else {
            0
        };
        let mut workspace = Arena::new(
            &gpu,
            "workspace",
            Buffers::bytes(&config, max_tokens, max_seqs, opts.block_size, moe_grouped)
                + Gemm::workspace_bytes()
                + fp8_scratch
                + native_scratch,
        )?;
        let mut gemm = Gemm::new(&gpu, &mut workspace)?;
        gemm.deterministic = opts.deterministic;
        gemm.tc_min_rows = opts.tc_gemv_min_rows;
        if let Some(region) = weights.fp8_region {
            gemm.enable_fp8(&gpu, &mut workspace, region, fp8_limits)?;
        }
        if native.count() > 0 {
            let regions = NativeRegions {
                q8_0: weights.q8_region,
                kq: weights.kq_region,
                max_elements: native_elements,
                kq_matrices: weights.kq_matrices.iter().copied().collect(),
            };
            gemm.enable_native(&gpu, &mut workspace, regions)?;
        }
        // Start-up passes run on scratch data: time GEMM candidates there.
        gemm.tune = true;
        gemm.max_tokens = max_tokens;
        let mut buffers = Buffers::new(
            &gpu,
            &config,
            (max_tokens, max_seqs, opts.block_size),
            moe_grouped,
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
            launch_ahead: LaunchAheadCounts::default(),
            profiler: None,
            sampler: None,
            host_weights: None,
            asleep: false,
            kv_copier: None,
            capture: None,
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
            peer: None,
            comm,
            gpu,
            config,
            opts,
            started: None,
            context_ms,
            weights_ms,
            warmup_prefill_ms: 0.0,
        };
        runner.memory.workspace = runner.buffers.workspace_size();
        runner.started = Some(started);
        Ok(runner)
    }

    /// The second part: the profiling pass, then the KV pages the memory
    /// budget leaves (not yet allocated; tensor-parallel ranks take the
    /// least of theirs).
    fn measure_kv_pages(&mut self) -> Result<usize, CudaError> {
        let prefill_started = Instant::now();
        let pages = self.profile_kv_pages()?;
        self.warmup_prefill_ms = ms_since(prefill_started);
        Ok(pages)
    }

    /// The last part: the KV pool of `pages` pages, the sampler and the
    /// decode graphs.
    fn finish(&mut self, pages: usize) -> Result<(), CudaError> {
        self.allocate_kv(pages)?;
        let max_seqs = self.opts.max_num_seqs;
        // A batch's seen tokens are at most its sequences' tokens, which
        // all sit in the KV pool.
        let sampler = DeviceSampler::new(
            &self.gpu,
            max_seqs,
            self.kv_shape.num_blocks * self.kv_shape.block_size + max_seqs,
            self.config.vocab_size,
        )?;
        self.memory.workspace += sampler.bytes();
        self.sampler = Some(sampler);
        let graphs_started = Instant::now();
        if self.opts.cuda_graphs {
            self.capture_graphs()?;
        }
        self.gemm.tune = false;
        // Where a cold start goes: the first request pays none of it (the
        // warm-up prefill ran at the largest step, and each graph's decode
        // ran once eagerly before its capture).
        tracing::info!(
            context_ms = self.context_ms,
            weights_ms = self.weights_ms,
            warmup_prefill_ms = self.warmup_prefill_ms,
            graphs_and_warmup_decode_ms = ms_since(graphs_started),
            total_ms = self.started.map_or(0.0, ms_since),
            "GPU load breakdown"
        );
        // Set after start-up so the profiling pass and warm-up are not counted.
        self.profiler = self.opts.profile.then(Profiler::default);
        Ok(())
    }

    /// Gives back the device memory of the weights, the workspace and the
    /// KV pool, keeping their addresses, so the captured graphs, kernels and
    /// tuned GEMM plans stay valid. The weights go to pinned host memory
    /// first (once; the copy is kept); the KV cache's contents are lost.
    /// Returns the bytes of the host copy.
    pub fn sleep(&mut self) -> Result<usize, CudaError> {
        if !self.asleep {
            self.gpu.sync()?;
            // A launch-ahead step's results die with the workspace.
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
            self.kv_copier = None;
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
    /// then returns the pages of the model's layout (blocks of every layer
    /// without sliding windows) that the memory budget leaves for the KV
    /// pool.
    fn profile_kv_pages(&mut self) -> Result<usize, CudaError> {
        let bs = self.opts.block_size;
        let tokens = self.buffers.max_tokens.min(self.config.max_context);
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
            ..ForwardBatch::default()
        };
        self.run(&batch, false)?;
        self.gpu.sync()?;
        self.buffers.drop_kv();
        let (free, total) = self.gpu.memory()?;
        let per_page = buffers::kv_page_bytes(&self.config, bs, dtype);
        Ok(match self.opts.kv_cache_tokens {
            Some(t) => self.kv_sizing().pages_for_tokens(t),
            None => {
                // Keep room for graph executables and driver growth.
                let reserve = 512usize << 20;
                let budget = (total as f64 * self.opts.gpu_memory_utilization) as usize;
                let used = total - free;
                budget.saturating_sub(used + reserve) / per_page
            }
        })
    }

    /// Allocates the KV pool of `num_pages` pages (plus the scratch page),
    /// or says why too few fit.
    fn allocate_kv(&mut self, num_pages: usize) -> Result<(), CudaError> {
        let (bs, dtype) = (self.opts.block_size, self.opts.kv_cache_dtype);
        // An explicit size is the caller's choice; the engine checks requests against it.
        let need = match self.opts.kv_cache_tokens {
            Some(_) => 1,
            None => self.kv_sizing().need(),
        };
        if num_pages < need {
            let (free, total) = self.gpu.memory()?;
            return Err(CudaError::OutOfMemory(format!(
                "only {num_pages} KV pages fit ({} MiB free of {} MiB); raise --gpu-memory-utilization or lower --max-num-batched-tokens",
                free >> 20,
                total >> 20
            )));
        }
        let per_page = buffers::kv_page_bytes(&self.config, bs, dtype);
        let kv_tokens = self.kv_sizing().capacity_tokens(num_pages);
        self.buffers
            .set_kv(&self.gpu, &self.config, (num_pages + 1, bs), dtype)?;
        self.kv_shape.num_blocks = num_pages;
        self.memory.kv_cache = (num_pages + 1) * per_page;
        tracing::info!(
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
            comm: self.comm.as_ref(),
            peer: self.peer.as_ref(),
            capture: self.capture.as_ref().map(|c| c.target()),
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
            graphs::for_rows(&self.graphs, batch.chunks.len(), max_ctx)?
        } else {
            None
        };
        let scratch = self.scratch_block();
        let plan = match graph {
            Some((size, splits, _)) => {
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
        // Rows of steps nobody reads are not copied (graphs copy them on
        // the device, a few rows).
        let keep = self.keeps_rows(batch);
        match graph {
            Some((_, _, g)) => g.launch()?,
            None => {
                let mut model = self.model();
                if !keep {
                    model.capture = None;
                }
                ops::encode(&model, &plan, marks.as_mut())?
            }
        }
        self.download_captured(batch.num_tokens(), keep)?;
        if let (Some(p), Some(m)) = (self.profiler.as_mut(), marks) {
            self.gpu.sync()?;
            p.add(m, decode, batch.num_tokens(), started)?;
        }
        Ok(plan)
    }
}

#[cfg(test)]
impl CudaRunner {
    /// Launch-ahead steps used whole so far.
    pub(crate) fn launch_ahead_hits(&self) -> usize {
        self.launch_ahead.hits
    }
}

impl Drop for CudaRunner {
    fn drop(&mut self) {
        tracing::debug!(
            hits = self.launch_ahead.hits,
            partial_hits = self.launch_ahead.partial_hits,
            misses = self.launch_ahead.misses,
            "launch-ahead steps"
        );
        if let Some(p) = &self.profiler {
            p.report();
        }
    }
}

/// The step's token rows of the positions `batch.score` names, in order.
fn scored_rows(batch: &ForwardBatch<'_>) -> Vec<i32> {
    let mut first = Vec::with_capacity(batch.chunks.len());
    let mut end = 0;
    for c in &batch.chunks {
        first.push(end);
        end += c.tokens.len();
    }
    let first = &first;
    batch
        .score
        .iter()
        .flat_map(|s| (0..s.next.len()).map(move |i| (first[s.chunk] + i) as i32))
        .collect()
}

fn no_copier() -> RunnerError {
    RunnerError::Backend("no KV page copier".into())
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

    /// Decode rows replay the captured graphs; a multi-token chunk runs
    /// eagerly.
    fn verifies_as_decode_rows(&self) -> bool {
        true
    }

    fn sleep(&mut self) -> Result<u64, RunnerError> {
        CudaRunner::sleep(self)
            .map(|b| b as u64)
            .map_err(RunnerError::from)
    }

    fn wake(&mut self) -> Result<(), RunnerError> {
        CudaRunner::wake(self).map_err(RunnerError::from)
    }

    /// Every page slice's K then V, in the pool's element type.
    fn kv_page_bytes(&self) -> usize {
        crate::buffers::kv_page_bytes(
            &self.config,
            self.kv_shape.block_size,
            self.buffers.kv_dtype,
        )
    }

    fn kv_page_format(&self) -> String {
        format!("cuda-{:?}", self.buffers.kv_dtype).to_lowercase()
    }

    fn read_kv_pages(
        &mut self,
        pages: &[BlockId],
        out: &mut [&mut [u8]],
    ) -> Result<(), RunnerError> {
        self.check_pages(pages, out.iter().map(|o| o.len()))?;
        self.ensure_kv_copier()?;
        let copier = self.kv_copier.as_mut().ok_or_else(no_copier)?;
        copier
            .read(&self.gpu, pages, out)
            .map_err(RunnerError::from)
    }

    fn write_kv_pages(&mut self, pages: &[BlockId], data: &[&[u8]]) -> Result<(), RunnerError> {
        self.check_pages(pages, data.iter().map(|d| d.len()))?;
        self.ensure_kv_copier()?;
        let copier = self.kv_copier.as_mut().ok_or_else(no_copier)?;
        copier
            .write(&self.gpu, pages, data)
            .map_err(RunnerError::from)
    }

    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<&[f32], RunnerError> {
        self.check_batch(batch)?;
        // A launch-ahead step still in the stream runs first; its result is unused.
        if self.pending.take().is_some() {
            self.launch_ahead.misses += 1;
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

    fn capture_hidden(&mut self, layers: &[usize]) -> Result<(), RunnerError> {
        self.set_capture(layers)
    }

    fn captured_hidden(&self) -> &[f32] {
        self.capture.as_ref().map_or(&[], |c| c.rows())
    }

    fn draft_head(
        &self,
        config: ingot_models::eagle::EagleHeadConfig,
        weights: ingot_models::eagle::EagleHeadWeights,
        kv_tokens: usize,
    ) -> Result<Box<dyn ingot_runner::DraftHead>, RunnerError> {
        // The head gets a stream of its own: it runs beside a launched step.
        let parts = crate::eagle::HeadParts {
            gpu: self.gpu.with_own_stream().map_err(RunnerError::from)?,
            embed: (self.weights.embed, self.weights.embed_blocks),
            block_size: self.opts.block_size,
            max_seqs: self.opts.max_num_seqs,
        };
        let head = crate::eagle::CudaEagleHead::new(parts, config, weights, kv_tokens)
            .map_err(RunnerError::from)?;
        Ok(Box::new(head))
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
    /// After an eager step of `batch`: the last-token rows (already in
    /// `logits_host`) followed by the logits of every scored position, in
    /// `scored_host`. The residual rows are still in the workspace; they go
    /// through the final norm and LM head in groups of `max_seqs` rows.
    fn score_rows(&mut self, batch: &ForwardBatch<'_>) -> Result<(), RunnerError> {
        let vocab = self.config.vocab_size;
        let n = batch.chunks.len();
        let rows = scored_rows(batch);
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

    /// Samples `rows` from the logits on the device (masks applied) and
    /// enqueues the copy of the `n` picked ids.
    fn sample_ids(
        &mut self,
        rows: &[RowSampling<'_>],
        masks: &mut dyn MaskSource,
        n: usize,
    ) -> Result<(usize, CudaEvent), RunnerError> {
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
        Ok(self.download_ids(n)?)
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

    /// A page copy of one buffer per page, in an awake pool.
    fn check_pages(
        &self,
        pages: &[BlockId],
        lens: impl ExactSizeIterator<Item = usize>,
    ) -> Result<(), RunnerError> {
        if self.asleep {
            return Err(RunnerError::Backend("the model is asleep".into()));
        }
        let (page_bytes, num_pages) = (self.kv_page_bytes(), self.kv_shape.num_blocks);
        ingot_runner::check_kv_copy(pages, lens, page_bytes, num_pages)
    }

    /// Makes the page copier at the first copy.
    fn ensure_kv_copier(&mut self) -> Result<(), RunnerError> {
        self.gpu
            .ctx
            .bind_to_thread()
            .map_err(|e| RunnerError::Backend(e.to_string()))?;
        if self.kv_copier.is_none() {
            let b = &self.buffers;
            let pieces: Vec<_> = b.kv_slices.iter().flat_map(|&(k, v)| [k, v]).collect();
            let piece = b.block_size * self.config.kv_dim() * b.kv_dtype.bytes();
            let copier = crate::kv_copy::KvCopier::new(&self.gpu, &pieces, piece)
                .map_err(RunnerError::from)?;
            self.kv_copier = Some(copier);
        }
        Ok(())
    }

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
