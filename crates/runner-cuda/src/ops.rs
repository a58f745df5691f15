//! The CUDA [`DecoderOps`]: each block op enqueues its kernels and GEMMs on
//! the stream, keeping the fusions across op boundaries. At GEMV batch
//! sizes the writer of the residual stream (the embedding, or an
//! accumulating GEMV) leaves the sums of squares and the input pre-scaled
//! by the [`NextNorm`]'s weights, and the op that owns that norm folds it
//! into its first GEMV instead of running a norm kernel. Post-norm blocks
//! (Gemma) write their output to an f32 scratch, and `post_norm_add`
//! normalizes it into the residual and prepares the next norm's input the
//! same way. [`encode`] runs
//! the model's architecture file over these ops (the same sequence is
//! captured into the decode graphs).

use ingot_arch::{
    AttentionSpec, DecoderOps, EmbedSpec, HeadSpec, MlpSpec, MoeSpec, NextNorm, RopeTable,
};
use ingot_models::llama::is_sparse;
use ingot_models::ModelConfig;

use crate::buffers::{Buffers, StepPlan, SUMSQ_MAX_BLOCKS};
use crate::device::{DevPtr, Gpu};
use crate::fused::{AttentionOut, FusedBlock, FusedBlocks, NextQkv};
use crate::gemm::{Gemm, OutType, GEMV_MAX_TOKENS};
use crate::kernels::{
    ArgmaxRows, AttentionCombine, DecodeAttention, EmbedRows, GatedMul, GatedMulE4m3,
    GatherVocabShards, GemvInput, Heads, Kernels, KvCache, KvDtype, MoeAlign, MoeDownSum,
    MoeGateUp, MoeGroupedDown, MoeGroupedGateUp, MoeRoute, MoeRouter, NextNormOut, PagedInputs,
    PostNormAdd, PrefillAttention, QkvRopeGemv, RmsNorm, RmsNormE4m3, RopeQkv, RopeTarget,
    SoftcapRows,
};
use crate::nccl::Communicator;
use crate::peer::PeerReduce;
use crate::profile::{Category, Marks};
use crate::weights::{DeviceWeights, ExpertWeights, LayerWeights};
use crate::CudaError;

/// What a step reads: the device, GEMM handle, kernels, weights, buffers
/// and shapes.
#[derive(Clone, Copy)]
pub struct Model<'a> {
    pub gpu: &'a Gpu,
    pub gemm: &'a Gemm,
    pub kernels: &'a Kernels,
    pub weights: &'a DeviceWeights,
    pub buffers: &'a Buffers,
    pub config: &'a ModelConfig,
    /// The fused o_proj + MLP kernels, for small models.
    pub fused: Option<&'a FusedBlocks>,
    /// Tensor parallel: this rank's communicator (`config` is the rank's).
    pub comm: Option<&'a Communicator>,
    /// Tensor parallel: the one-shot all-reduce for small messages.
    pub peer: Option<&'a PeerReduce>,
    /// Residual rows to keep for an EAGLE head.
    pub capture: Option<Capture<'a>>,
}

/// Where the residual rows entering chosen layers are copied for an EAGLE
/// head: per token, every slot's row side by side.
#[derive(Clone, Copy)]
pub struct Capture<'a> {
    /// The layer of each slot (a layer may fill several).
    pub layers: &'a [usize],
    /// `[tokens, layers.len() * hidden]` f32.
    pub rows: DevPtr,
}

impl Model<'_> {
    /// Tensor parallel: the in-place sum over ranks of `rows` rows of
    /// `width` f32 at `buf`; `next` (`(norm weights, xg)`) asks for the
    /// next RMSNorm's pre-scaled input and sums of squares, which only the
    /// one-shot kernel leaves (see [`Model::fuses_after_reduce`]).
    fn all_reduce(
        &self,
        buf: DevPtr,
        (rows, width): (usize, usize),
        next: Option<(DevPtr, DevPtr)>,
    ) -> Result<(), CudaError> {
        let Some(comm) = self.comm else {
            return Ok(());
        };
        if let Some(peer) = self.peer {
            let sumsq = self.buffers.sumsq;
            if peer.all_reduce_f32(self.gpu, buf, (rows, width), next, sumsq)? {
                return Ok(());
            }
        }
        if next.is_some() {
            return Err(unsupported("a fused norm after an NCCL all-reduce"));
        }
        comm.all_reduce_sum_f32(buf, rows * width, self.stream())
    }

    /// Whether the residual's all-reduce of `rows` rows can leave the next
    /// norm's input (one GPU: no all-reduce, the writers do).
    fn fuses_after_reduce(&self, rows: usize) -> bool {
        match (self.comm, self.peer) {
            (None, _) => true,
            (Some(_), Some(peer)) => peer.takes(rows, self.config.hidden_size),
            (Some(_), None) => false,
        }
    }

    /// Whether this rank leaves the residual's sum to rank 0 (it writes
    /// only its partial product, which the all-reduce adds).
    fn partial_residual(&self) -> bool {
        self.comm.is_some_and(|c| c.rank > 0)
    }

    fn stream(&self) -> *mut std::ffi::c_void {
        self.gpu.stream.cu_stream() as *mut std::ffi::c_void
    }
}

/// Enqueues the whole decoder for `plan` on the stream (the architecture
/// file over [`CudaOps`]), then the argmax of each sequence's logits.
pub fn encode(m: &Model<'_>, plan: &StepPlan, marks: Option<&mut Marks>) -> Result<(), CudaError> {
    let mut ops = CudaOps::new(m, plan, marks);
    ingot_arch::forward(m.config, &mut ops)?;
    let b = m.buffers;
    ArgmaxRows {
        rows: plan.seqs,
        logits: b.logits,
        vocab: m.config.vocab_size,
        out: b.sampled,
    }
    .launch(m.gpu, m.kernels)?;
    ops.mark(Category::Other)
}

/// Enqueues the final norm and LM head of `rows` residual rows left by the
/// last [`encode`] (their indices uploaded by
/// [`Buffers::upload_last_rows`]); their logits land in `logits`. Scored
/// prompt positions take this path after the step, in groups of at most
/// `max_seqs` rows.
pub fn project_rows(m: &Model<'_>, rows: usize) -> Result<(), CudaError> {
    head(m, rows, &ingot_arch::head_spec(m.config), &mut |_| Ok(()))
}

/// Final norm of `rows` gathered residual rows, then the LM head.
fn head(
    m: &Model<'_>,
    rows: usize,
    spec: &HeadSpec,
    mark: &mut dyn FnMut(Category) -> Result<(), CudaError>,
) -> Result<(), CudaError> {
    let (b, c, w) = (m.buffers, m.config, m.weights);
    RmsNorm {
        rows,
        x: b.x,
        gather: b.input(b.layout.last_rows),
        weight: w.norm,
        out: b.last,
        hidden: c.hidden_size,
        eps: c.rms_norm_eps,
    }
    .launch(m.gpu, m.kernels)?;
    mark(Category::Other)?;
    let d = c.hidden_size;
    // A tensor-parallel rank computes its vocabulary rows, then every
    // rank's are gathered into the full logits.
    let out = if m.comm.is_some() {
        b.head_shard
    } else {
        b.logits
    };
    m.gemm.linear(
        m.gpu,
        b.last,
        w.lm_head,
        out,
        rows,
        d,
        c.lm_head_rows(),
        OutType::F32,
    )?;
    mark(Category::Gemm)?;
    if let (Some(comm), Some(shard)) = (m.comm, c.shard) {
        let count = rows * shard.vocab_rows;
        comm.all_gather_f32(b.head_shard, b.head_gather, count, m.stream())?;
        GatherVocabShards {
            rows,
            gathered: b.head_gather,
            logits: b.logits,
            vocab: c.vocab_size,
            vocab_rows: shard.vocab_rows,
        }
        .launch(m.gpu, m.kernels)?;
        mark(Category::Collective)?;
    }
    if let Some(cap) = spec.softcap {
        SoftcapRows {
            rows,
            logits: b.logits,
            vocab: c.vocab_size,
            cap,
        }
        .launch(m.gpu, m.kernels)?;
        mark(Category::Other)?;
    }
    Ok(())
}

fn unsupported(what: &str) -> CudaError {
    CudaError::Unsupported(format!("{what} on CUDA"))
}

/// One step's ops over the model.
pub struct CudaOps<'a, 'm> {
    m: &'a Model<'a>,
    plan: &'a StepPlan,
    marks: Option<&'m mut Marks>,
    /// At GEMV batch sizes the norms run inside the GEMVs that consume them.
    fuse_norms: bool,
    /// The norm whose input the residual's last writer left in `xn`, and
    /// in which form.
    prescaled: Option<(NextNorm, Ready)>,
    /// The layer whose attention left split partials for a fused block
    /// (its o_proj has not run yet).
    deferred: Option<usize>,
    /// The last attention block's spec (every layer's, where layers do not
    /// alternate: what a fused block's q/k/v phase runs for the next).
    attention_spec: Option<AttentionSpec>,
    /// The layer whose q/k/v, rope and KV write a fused block already ran.
    qkv_ready: Option<usize>,
    /// A matrix whose FP8 input rows its producer (the norm or activation
    /// before it) wrote already, and where they are.
    quantized: Option<(DevPtr, DevPtr)>,
}

/// What the residual's writer left in `xn` for the next norm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ready {
    /// `x ⊙ g` and the sums of squares: the consuming GEMV fuses the norm.
    Prescaled,
    /// The normed activations.
    Normed,
}

impl<'a, 'm> CudaOps<'a, 'm> {
    pub fn new(m: &'a Model<'a>, plan: &'a StepPlan, marks: Option<&'m mut Marks>) -> Self {
        let (t, d) = (plan.tokens, m.config.hidden_size);
        // Deterministic mode runs the norms the same way at every batch
        // size; under tensor parallelism the all-reduce, not the writer
        // (which holds a partial residual), leaves the norm's input.
        let gemv_sizes = t <= GEMV_MAX_TOKENS && !m.gemm.deterministic && m.fuses_after_reduce(t);
        Self {
            m,
            plan,
            marks,
            // Tensor-core GEMV steps take their norms apart.
            fuse_norms: gemv_sizes && d.div_ceil(8) <= SUMSQ_MAX_BLOCKS && !m.gemm.tc_rows(t, d),
            prescaled: None,
            deferred: None,
            attention_spec: None,
            qkv_ready: None,
            quantized: None,
        }
    }

    /// Tensor parallel: sums `rows` rows of `width` f32 at `buf` over the
    /// ranks, leaving `next`'s norm input when given (no-op on one GPU).
    fn all_reduce(
        &mut self,
        buf: DevPtr,
        shape: (usize, usize),
        next: Option<(DevPtr, DevPtr)>,
    ) -> Result<(), CudaError> {
        if self.m.comm.is_none() {
            return Ok(());
        }
        self.m.all_reduce(buf, shape, next)?;
        self.mark(Category::Collective)
    }

    fn mark(&mut self, category: Category) -> Result<(), CudaError> {
        match self.marks.as_deref_mut() {
            Some(marks) => marks.mark(self.m.gpu, category),
            None => Ok(()),
        }
    }

    /// Copies the residual rows entering layer `i` (complete here: every
    /// writer before, fused blocks included, has run) into each capture
    /// slot that names it.
    fn capture_input(&mut self, i: usize) -> Result<(), CudaError> {
        let Some(cap) = self.m.capture else {
            return Ok(());
        };
        let row = self.m.config.hidden_size * 4;
        let pitch = cap.layers.len() * row;
        for (slot, _) in cap.layers.iter().enumerate().filter(|(_, &l)| l == i) {
            let dst = cap.rows + (slot * row) as u64;
            let rows = self.plan.tokens;
            self.m
                .gpu
                .copy_rows((dst, self.m.buffers.x), (pitch, row), row, rows)?;
        }
        Ok(())
    }

    fn layer(&self, i: usize) -> Result<&'a LayerWeights, CudaError> {
        self.m
            .weights
            .layers
            .get(i)
            .ok_or_else(|| CudaError::Unsupported(format!("layer {i} is not loaded")))
    }

    /// The weights of `next` (none for the final norm, which gathers rows).
    fn norm_weight(&self, next: NextNorm) -> Option<DevPtr> {
        let layers = &self.m.weights.layers;
        match next {
            NextNorm::Attention(i) => layers.get(i).map(|l| l.attn_norm),
            NextNorm::Mlp(i) => layers.get(i).map(|l| l.mlp_norm),
            NextNorm::Final => None,
        }
    }

    /// `(weights, xg)` for the writer of the residual to pre-apply `next`
    /// when norms are fused (the final norm gathers rows: never fused);
    /// records what the consumer will find.
    fn fuse_next(&mut self, next: NextNorm) -> Option<(DevPtr, DevPtr)> {
        // The expert blocks read normed rows (their GEMVs fuse no norm).
        let experts = matches!(next, NextNorm::Mlp(i) if is_sparse(self.m.config, i));
        let fused = self
            .norm_weight(next)
            .filter(|_| self.fuse_norms && !experts);
        self.prescaled = fused.map(|_| (next, Ready::Prescaled));
        fused.map(|g| (g, self.m.buffers.xn))
    }

    /// What a post-norm add leaves for `next`: the pre-scaled input where
    /// norms are fused, else the normed activations; records it.
    fn post_norm_next(&mut self, next: NextNorm) -> NextNormOut {
        let Some(weight) = self.norm_weight(next) else {
            self.prescaled = None;
            return NextNormOut::Skip;
        };
        if self.fuse_norms {
            self.prescaled = Some((next, Ready::Prescaled));
            NextNormOut::Prescaled {
                weight,
                sumsq: self.m.buffers.sumsq,
            }
        } else {
            self.prescaled = Some((next, Ready::Normed));
            NextNormOut::Normed { weight }
        }
    }

    /// Adds a post-norm block's output (f32, in the `proj` scratch) to the
    /// residual through its norm `post`, then prepares `next`.
    fn post_norm_add(&mut self, post: DevPtr, next: NextNorm) -> Result<(), CudaError> {
        let (b, c) = (self.m.buffers, self.m.config);
        PostNormAdd {
            tokens: self.plan.tokens,
            x: b.x,
            y: b.proj(),
            post,
            hidden: c.hidden_size,
            eps: c.rms_norm_eps,
            next: self.post_norm_next(next),
            xn: b.xn,
        }
        .launch(self.m.gpu, self.m.kernels)?;
        self.mark(Category::Other)
    }

    /// A block's output projection `input·wᵀ` into the residual: added
    /// directly (fusing the next norm), or through the post-norm `post`.
    fn project_out(
        &mut self,
        (input, w, inputs): (DevPtr, DevPtr, usize),
        post: Option<DevPtr>,
        next: NextNorm,
    ) -> Result<(), CudaError> {
        let input = self.gemm_input(w, input);
        let (gpu, gemm, b, c) = (self.m.gpu, self.m.gemm, self.m.buffers, self.m.config);
        let (t, d) = (self.plan.tokens, c.hidden_size);
        let Some(post) = post else {
            let next_norm = self.fuse_next(next);
            if self.m.comm.is_none() {
                gemm.accumulate(gpu, input, w, b.x, t, inputs, d, next_norm)?;
                return self.mark(Category::Gemm);
            }
            // Rank 0 adds its product to the residual, the others write
            // theirs alone; the all-reduce sums them and leaves the next
            // norm's input.
            if self.m.partial_residual() {
                gemm.linear(gpu, input, w, b.x, t, inputs, d, OutType::F32)?;
            } else {
                gemm.accumulate(gpu, input, w, b.x, t, inputs, d, None)?;
            }
            self.mark(Category::Gemm)?;
            return self.all_reduce(b.x, (t, d), next_norm);
        };
        gemm.linear(gpu, input, w, b.proj(), t, inputs, d, OutType::F32)?;
        self.mark(Category::Gemm)?;
        self.all_reduce(b.proj(), (t, d), None)?;
        self.post_norm_add(post, next)
    }

    /// Whether the residual's writer pre-applied `norm` (the GEMV fuses
    /// it); else makes sure `xn` holds it normed, running the norm (over
    /// every token row) unless the writer already did.
    /// `consumer` is the matrix the normed rows feed: an FP8 one on the GEMM
    /// path gets them quantized by the norm itself.
    fn take_norm(
        &mut self,
        norm: NextNorm,
        weight: DevPtr,
        consumer: DevPtr,
    ) -> Result<bool, CudaError> {
        match self.prescaled.take() {
            Some((n, Ready::Prescaled)) if n == norm => return Ok(true),
            Some((n, Ready::Normed)) if n == norm => return Ok(false),
            _ => {}
        }
        let (b, c) = (self.m.buffers, self.m.config);
        let (t, d) = (self.plan.tokens, c.hidden_size);
        let quantized = self.m.gemm.quantized_input(consumer, t, d);
        if let Some(q) = quantized.filter(|_| RmsNormE4m3::fits(d)) {
            RmsNormE4m3 {
                rows: t,
                x: b.x,
                weight,
                quantized: q,
                hidden: d,
                eps: c.rms_norm_eps,
            }
            .launch(self.m.gpu, self.m.kernels)?;
            self.quantized = Some((consumer, q.0));
            self.mark(Category::Other)?;
            return Ok(false);
        }
        RmsNorm {
            rows: self.plan.tokens,
            x: b.x,
            gather: 0,
            weight,
            out: b.xn,
            hidden: c.hidden_size,
            eps: c.rms_norm_eps,
        }
        .launch(self.m.gpu, self.m.kernels)?;
        self.mark(Category::Other)?;
        Ok(false)
    }

    /// The gated activation of the gate/up product, into `act`, or (when
    /// `down` takes FP8 input on the GEMM path) into its e4m3 rows.
    fn activate(&mut self, spec: &MlpSpec, down: DevPtr) -> Result<(), CudaError> {
        let (gpu, b, k) = (self.m.gpu, self.m.buffers, self.m.kernels);
        let (t, ff) = (self.plan.tokens, self.m.config.intermediate_size);
        let quantized = self.m.gemm.quantized_input(down, t, ff);
        match quantized.filter(|_| GatedMulE4m3::fits(ff)) {
            Some(q) => {
                GatedMulE4m3 {
                    tokens: t,
                    activation: spec.act,
                    gate_up: b.gate_up,
                    quantized: q,
                    width: ff,
                }
                .launch(gpu, k)?;
                self.quantized = Some((down, q.0));
            }
            None => GatedMul {
                tokens: t,
                activation: spec.act,
                gate_up: b.gate_up,
                act: b.act,
                width: ff,
            }
            .launch(gpu, k)?,
        }
        self.mark(Category::Other)
    }

    /// `w`'s input: `x`, or the e4m3 rows its producer wrote for it.
    fn gemm_input(&mut self, w: DevPtr, x: DevPtr) -> DevPtr {
        match self.quantized {
            Some((consumer, rows)) if consumer == w => {
                self.quantized = None;
                rows
            }
            _ => x,
        }
    }

    /// Layer `i`'s K/V buffers and the view (table and KV-write slots)
    /// it reads: its group's, its page part's (see [`crate::kv_views`]).
    fn kv_cache(&self, i: usize) -> Result<(KvCache, usize), CudaError> {
        let b = self.m.buffers;
        let site = b.views.of_layer(i);
        let &(k, v) = b
            .kv_slices
            .get(site.slice)
            .ok_or_else(|| CudaError::Unsupported("the KV cache is not allocated".into()))?;
        let kv = KvCache {
            k,
            v,
            block_size: b.block_size,
            dtype: b.kv_dtype,
        };
        Ok((kv, site.view))
    }

    /// q/k/v projection, bias, q/k norm, rotary embedding and the paged KV
    /// write: one fused GEMV at small batch (layers without q/k norm), else
    /// a GEMM (or normed GEMV) followed by `rope_qkv`.
    fn project_qkv(
        &mut self,
        layer: &LayerWeights,
        spec: &AttentionSpec,
        (kv, view): (KvCache, usize),
        fused_norm: bool,
    ) -> Result<(), CudaError> {
        let target = self.rope_target(spec, (kv, view))?;
        let input_rows = self.gemm_input(layer.qkv, self.m.buffers.xn);
        let Model {
            gpu,
            gemm,
            kernels,
            buffers: b,
            config: c,
            ..
        } = *self.m;
        let (t, d) = (self.plan.tokens, c.hidden_size);
        let width = c.q_dim() + 2 * c.kv_dim();
        let bias = layer.qkv_bias.filter(|_| spec.qkv_bias).unwrap_or(0);
        let qk_norm = layer.qk_norm.filter(|_| spec.qk_norm);
        let eps = c.rms_norm_eps;
        // xn holds the normed activations, or (fused norm) the pre-scaled
        // residual that the GEMV scales by 1/rms.
        let input = if fused_norm {
            GemvInput::Normed {
                xg: b.xn,
                eps,
                sumsq: b.sumsq,
            }
        } else {
            GemvInput::Plain(b.xn)
        };
        // The fused GEMV writes bf16 K/V; an FP8 cache takes rope_qkv_fp8.
        if let Some(kernel) = gemm
            .qkv_rope_kernel(layer.qkv, t, d, fused_norm)
            .filter(|_| qk_norm.is_none() && kv.dtype == KvDtype::Bf16)
        {
            QkvRopeGemv {
                input,
                weight: layer.qkv,
                inputs: d,
                width,
                bias,
                target,
            }
            .launch(gpu, kernel)?;
            return self.mark(Category::Gemm);
        }
        if !fused_norm {
            gemm.linear(
                gpu,
                input_rows,
                layer.qkv,
                b.qkv,
                t,
                d,
                width,
                OutType::Bf16,
            )?;
        } else if !gemm.linear_normed(gpu, (b.xn, layer.qkv, b.qkv), t, d, width, eps)? {
            return Err(CudaError::Unsupported(format!(
                "a fused RMSNorm for {t} tokens (GEMV sizes only)"
            )));
        }
        self.mark(Category::Gemm)?;
        RopeQkv {
            tokens: t,
            qkv: b.qkv,
            bias,
            qk_norm: qk_norm.unwrap_or((0, 0)),
            eps,
            target,
        }
        .launch(gpu, kernels)?;
        self.mark(Category::Other)
    }

    /// Where a layer's rope and KV write go: the step's positions, its
    /// view's slots, `spec`'s rotary table, the queries and `kv`.
    fn rope_target(
        &self,
        spec: &AttentionSpec,
        (kv, view): (KvCache, usize),
    ) -> Result<RopeTarget, CudaError> {
        let (cos, sin) = self.rope_table(spec.rope)?;
        let (b, c) = (self.m.buffers, self.m.config);
        let l = b.layout;
        Ok(RopeTarget {
            positions: b.input(l.positions),
            slots: b.input(l.slots_of(view)),
            cos,
            sin,
            q: b.q,
            kv,
            heads: Heads::of(c),
        })
    }

    /// The post-norm weights a block's spec asks for (picked from the
    /// layer's pair), or an error when the model has none; the `proj`
    /// scratch they need must fit.
    fn post_norm(
        &self,
        wanted: bool,
        layer: &LayerWeights,
        pick: fn((DevPtr, DevPtr)) -> DevPtr,
    ) -> Result<Option<DevPtr>, CudaError> {
        if !wanted {
            return Ok(None);
        }
        let c = self.m.config;
        if c.intermediate_size < c.hidden_size {
            return Err(unsupported(
                "a post-norm block with an MLP narrower than the model",
            ));
        }
        layer
            .post_norms
            .map(pick)
            .map(Some)
            .ok_or_else(|| unsupported("a post-norm the model has no weights for"))
    }

    /// The `(cos, sin)` tables of `table`.
    fn rope_table(&self, table: RopeTable) -> Result<(DevPtr, DevPtr), CudaError> {
        let w = self.m.weights;
        match table {
            RopeTable::Global => Ok((w.cos, w.sin)),
            RopeTable::Local => w
                .local_rope
                .ok_or_else(|| unsupported("a local rope table without a local rope base")),
        }
    }

    /// Paged attention of the step's decode rows and prefill tiles into
    /// `attn` (the last `window` positions; 0: all); at GEMV sizes the
    /// decode kernel prefetches `o_proj` (which adds into the residual when
    /// `o_adds`).
    fn attend(
        &mut self,
        (kv, view): (KvCache, usize),
        (o_proj, o_adds): (DevPtr, bool),
        window: usize,
        keep_partials: bool,
    ) -> Result<(), CudaError> {
        let (c, plan) = (self.m.config, self.plan);
        let scale_log2 = match c.block.attention_scale {
            Some(scale) => std::f32::consts::LOG2_E * scale,
            None => std::f32::consts::LOG2_E / (c.head_dim as f32).sqrt(),
        };
        // The output projection streams its weights only at GEMV sizes, and
        // a whole-row GEMV issues all of them before its wait already (a
        // prefetch then only doubles the traffic: Qwen3-30B-A3B batch 1,
        // H200, 358.8 -> 359.5 tok/s without it).
        let gemm = self.m.gemm;
        let streams = plan.decode_tokens > 0 && plan.tokens <= GEMV_MAX_TOKENS;
        let o_bytes = if streams
            && !(o_adds && gemm.whole_row_fits(plan.tokens, c.q_dim(), c.hidden_size, o_proj))
        {
            gemm.weight_bytes(o_proj, c.hidden_size, c.q_dim())
        } else {
            0
        };
        let site = AttentionSite {
            kv: (kv, view),
            heads: Heads::of(c),
            scale_log2,
            window,
            prefetch: (o_proj, o_bytes),
            keep_partials,
        };
        paged_attention((self.m.gpu, self.m.kernels), self.m.buffers, plan, site)?;
        self.mark(Category::Attention)
    }
}

/// What one layer's paged attention reads besides the step's buffers.
pub(crate) struct AttentionSite {
    /// The layer's K/V buffers and the view (tables, slots) it reads.
    pub kv: (KvCache, usize),
    pub heads: Heads,
    pub scale_log2: f32,
    /// The last this many positions (0: all).
    pub window: usize,
    /// What the decode kernel prefetches into L2 (`(0, 0)`: nothing).
    pub prefetch: (DevPtr, usize),
    /// The decode kernel's split partials are left for a fused block
    /// instead of combined.
    pub keep_partials: bool,
}

/// Paged attention of `plan`'s decode rows (the decode kernel, in
/// `plan.splits` splits) and prefill tiles (the prefill kernel) into
/// `attn`.
pub(crate) fn paged_attention(
    (gpu, kernels): (&Gpu, &Kernels),
    b: &Buffers,
    plan: &StepPlan,
    site: AttentionSite,
) -> Result<(), CudaError> {
    let l = b.layout;
    let (kv, view) = site.kv;
    let paged = PagedInputs {
        tables: b.input(l.tables_of(view)),
        stride: b.input(l.stride),
        positions: b.input(l.positions),
    };
    if plan.decode_tokens > 0 {
        let attention = DecodeAttention {
            tokens: plan.decode_tokens,
            splits: plan.splits,
            q: b.q,
            kv,
            paged,
            token_seq: b.input(l.token_seq),
            decode_ids: b.decode_ids(plan),
            out: b.attn,
            part_acc: b.part_acc,
            part_ml: b.part_ml,
            heads: site.heads,
            scale_log2: site.scale_log2,
            window: site.window,
            prefetch: site.prefetch,
        };
        if site.keep_partials {
            attention.launch_splits(gpu, kernels)?;
        } else {
            attention.launch(gpu, kernels)?;
        }
    }
    if plan.tiles > 0 {
        PrefillAttention {
            num_tiles: plan.tiles,
            tiles: b.input(l.tiles),
            q: b.q,
            kv,
            paged,
            out: b.attn,
            heads: site.heads,
            scale_log2: site.scale_log2,
            window: site.window,
        }
        .launch(gpu, kernels)?;
    }
    Ok(())
}

/// The fused second half of a layer (see [`crate::fused`]).
impl CudaOps<'_, '_> {
    /// The decode attention's row list (0: rows 0..tokens).
    fn decode_ids(&self) -> DevPtr {
        self.m.buffers.decode_ids(self.plan)
    }

    /// Whether layer `i`'s o_proj and MLP run as one fused block: a small
    /// model (the kernels are loaded), a step of decode rows only at GEMV
    /// sizes with fused norms, and the o_proj feeding the MLP's norm.
    fn fuses_block(&self, i: usize, next: NextNorm) -> bool {
        let (c, plan) = (self.m.config, self.plan);
        self.m
            .fused
            .is_some_and(|f| f.takes(plan.tokens, c.num_heads, plan.splits))
            && self.fuse_norms
            && plan.tiles == 0
            && plan.decode_tokens == plan.tokens
            && next == NextNorm::Mlp(i)
            && !is_sparse(c, i)
            && self.m.comm.is_none()
    }

    /// A deferred layer whose MLP cannot be fused after all: merges its
    /// attention splits and runs its o_proj as the unfused path does.
    fn finish_attention(&mut self, i: usize) -> Result<(), CudaError> {
        let (b, c, plan) = (self.m.buffers, self.m.config, self.plan);
        if plan.splits > 1 {
            AttentionCombine {
                tokens: plan.decode_tokens,
                splits: plan.splits,
                part_acc: b.part_acc,
                part_ml: b.part_ml,
                decode_ids: self.decode_ids(),
                out: b.attn,
                heads: Heads::of(c),
            }
            .launch(self.m.gpu, self.m.kernels)?;
        }
        let o_proj = (b.attn, self.layer(i)?.o_proj, c.q_dim());
        self.project_out(o_proj, None, NextNorm::Mlp(i))
    }

    /// Combine, o_proj, the MLP's norm, gate/up and down of `layer` in one
    /// kernel; the residual's writer protocol (sums of squares, `next`'s
    /// pre-scaled input) is the unfused GEMVs'.
    fn fused_block(
        &mut self,
        layer: &LayerWeights,
        spec: &MlpSpec,
        next: NextNorm,
    ) -> Result<(), CudaError> {
        let (b, c, plan) = (self.m.buffers, self.m.config, self.plan);
        let fused = self
            .m
            .fused
            .ok_or_else(|| unsupported("a fused block without its kernels"))?;
        let next_norm = self.fuse_next(next).map_or(0, |(g, _)| g);
        let next_qkv = self.next_qkv(next)?;
        FusedBlock {
            tokens: plan.tokens,
            activation: spec.act,
            attention: AttentionOut {
                part_acc: b.part_acc,
                part_ml: b.part_ml,
                decode_ids: self.decode_ids(),
                attn: b.attn,
                heads: c.num_heads,
                head_dim: c.head_dim,
                splits: plan.splits,
            },
            o_proj: layer.o_proj,
            x: b.x,
            mlp_norm: layer.mlp_norm,
            xn: b.xn,
            sumsq: b.sumsq,
            eps: c.rms_norm_eps,
            gate_up: layer.gate_up,
            act: b.act,
            down: layer.down,
            next_norm,
            hidden: c.hidden_size,
            ff: c.intermediate_size,
            next_qkv,
        }
        .launch(self.m.gpu, fused)?;
        if let (Some(_), NextNorm::Attention(j)) = (next_qkv, next) {
            self.qkv_ready = Some(j);
        }
        self.mark(Category::Gemm)
    }

    /// The next layer's q/k/v work for a fused block to run: when `next`
    /// is a layer's attention norm (fused: pre-scaled input), layers do
    /// not alternate (its spec is the last one's), its q/k/v takes the
    /// fused rope GEMV (no q/k norm) and its KV cache is bf16.
    /// The router's logits over `n` experts and each token's top k (ids
    /// and weights in the MoE scratch); with `xn`, the router writes the
    /// experts' normed input there too.
    fn route(
        &mut self,
        (norm, xn): (DevPtr, DevPtr),
        router: DevPtr,
        n: usize,
        spec: &MoeSpec,
    ) -> Result<(), CudaError> {
        let (gpu, kernels, b, c) = (self.m.gpu, self.m.kernels, self.m.buffers, self.m.config);
        let (t, s) = (self.plan.tokens, b.moe);
        MoeRouter {
            tokens: t,
            x: b.x,
            norm,
            router,
            hidden: c.hidden_size,
            eps: c.rms_norm_eps,
            experts: n,
            logits: s.logits,
            xn,
        }
        .launch(gpu, kernels)?;
        MoeRoute {
            tokens: t,
            logits: s.logits,
            experts: n,
            top_k: spec.top_k,
            normalize: spec.normalize,
            ids: s.ids,
            weights: s.weights,
        }
        .launch(gpu, kernels)
    }

    /// Every routed slot's gate/up and down products (experts of `width`),
    /// weighted and summed per token into the residual: per-slot GEMVs, or
    /// grouped GEMMs over the slots sorted by expert for steps of at least
    /// `grouped_min_tokens` tokens.
    /// `next_norm` (`(weight, xg)` of [`Self::fuse_next`]): the GEMVs'
    /// down sum leaves that norm fused for its consumer.
    fn run_experts(
        &mut self,
        experts: &ExpertWeights,
        (n, width): (usize, usize),
        spec: &MoeSpec,
        next_norm: Option<(DevPtr, DevPtr)>,
    ) -> Result<(), CudaError> {
        let (gpu, kernels, b, c) = (self.m.gpu, self.m.kernels, self.m.buffers, self.m.config);
        let (t, d, s) = (self.plan.tokens, c.hidden_size, b.moe);
        if self.grouped_experts() {
            return self.run_experts_grouped(experts, (n, width), spec);
        }
        MoeGateUp {
            tokens: t,
            activation: spec.act,
            x: b.xn,
            weights: (experts.gate, experts.up),
            scales: experts.gate_up_scales,
            ids: s.ids,
            top_k: spec.top_k,
            hidden: d,
            width,
            act: s.act,
        }
        .launch(gpu, kernels)?;
        MoeDownSum {
            tokens: t,
            act: s.act,
            down: experts.down,
            scales: experts.down_scales,
            ids: s.ids,
            weights: s.weights,
            top_k: spec.top_k,
            hidden: d,
            width,
            residual: b.x,
            next_norm: next_norm.map(|(weight, xg)| (b.sumsq, weight, xg)),
        }
        .launch(gpu, kernels)
    }

    /// Whether this step's experts run as grouped GEMMs (else GEMVs).
    fn grouped_experts(&self) -> bool {
        let min = self.m.buffers.moe.grouped_min_tokens;
        min > 0 && self.plan.tokens >= min
    }

    /// [`Self::run_experts`] on the tensor cores: the slots sorted into
    /// tiles of one expert, each tile's gate/up then down product, and the
    /// weighted per-token sums (same order as the GEMVs').
    fn run_experts_grouped(
        &mut self,
        experts: &ExpertWeights,
        (n, width): (usize, usize),
        spec: &MoeSpec,
    ) -> Result<(), CudaError> {
        let (gpu, kernels, b, c) = (self.m.gpu, self.m.kernels, self.m.buffers, self.m.config);
        let (t, d, s) = (self.plan.tokens, c.hidden_size, b.moe);
        let slots = t * spec.top_k;
        MoeAlign {
            slots,
            experts: n,
            ids: s.ids,
            sorted: s.sorted,
            tile_expert: s.tile_expert,
        }
        .launch(gpu, kernels)?;
        MoeGroupedGateUp {
            slots,
            experts: n,
            activation: spec.act,
            x: b.xn,
            top_k: spec.top_k,
            weights: (experts.gate, experts.up),
            scales: experts.gate_up_scales,
            width,
            hidden: d,
            sorted: s.sorted,
            tile_expert: s.tile_expert,
            act: s.act,
        }
        .launch(gpu, kernels)?;
        MoeGroupedDown {
            tokens: t,
            experts: n,
            top_k: spec.top_k,
            act: s.act,
            down: experts.down,
            scales: experts.down_scales,
            weights: s.weights,
            hidden: d,
            width,
            sorted: s.sorted,
            tile_expert: s.tile_expert,
            out: s.out,
            residual: b.x,
        }
        .launch(gpu, kernels)
    }

    fn next_qkv(&self, next: NextNorm) -> Result<Option<NextQkv>, CudaError> {
        let (NextNorm::Attention(j), Some(spec)) = (next, self.attention_spec) else {
            return Ok(None);
        };
        let uniform = self.m.config.block.sliding_window.is_none();
        let ready = matches!(self.prescaled, Some((n, Ready::Prescaled)) if n == next);
        if !uniform || !ready || spec.qk_norm || spec.post_norm {
            return Ok(None);
        }
        let (layer, kv) = (self.layer(j)?, self.kv_cache(j)?);
        // The phase writes bf16 K/V (an FP8 cache takes rope_qkv's stores).
        if kv.0.dtype != KvDtype::Bf16 {
            return Ok(None);
        }
        Ok(Some(NextQkv {
            weight: layer.qkv,
            bias: layer.qkv_bias.filter(|_| spec.qkv_bias).unwrap_or(0),
            target: self.rope_target(&spec, kv)?,
        }))
    }
}

impl DecoderOps for CudaOps<'_, '_> {
    type Error = CudaError;

    fn embed(&mut self, spec: &EmbedSpec, next: NextNorm) -> Result<(), CudaError> {
        let (b, c) = (self.m.buffers, self.m.config);
        EmbedRows {
            tokens: self.plan.tokens,
            ids: b.input(b.layout.ids),
            table: self.m.weights.embed,
            blocks: self.m.weights.embed_blocks,
            x: b.x,
            hidden: c.hidden_size,
            scale: spec.scale,
            sumsq: b.sumsq,
            next_norm: self.fuse_next(next),
        }
        .launch(self.m.gpu, self.m.kernels)?;
        self.mark(Category::Other)
    }

    fn attention(
        &mut self,
        i: usize,
        spec: &AttentionSpec,
        next: NextNorm,
    ) -> Result<(), CudaError> {
        if spec.softcap.is_some() {
            return Err(unsupported("attention score soft-capping"));
        }
        let (layer, kv) = (self.layer(i)?, self.kv_cache(i)?);
        self.capture_input(i)?;
        let post = self.post_norm(spec.post_norm, layer, |(attn, _)| attn)?;
        let fused_norm = self.take_norm(NextNorm::Attention(i), layer.attn_norm, layer.qkv)?;
        if self.qkv_ready.take() != Some(i) {
            self.project_qkv(layer, spec, kv, fused_norm)?;
        } else if self.attention_spec != Some(*spec) {
            return Err(unsupported("a fused q/k/v for a layer of another kind"));
        }
        self.attention_spec = Some(*spec);
        let fused_block = post.is_none() && self.fuses_block(i, next);
        // project_out's o_proj adds into the residual (the whole-row GEMV's
        // case) without a post-norm, except on tensor-parallel ranks past 0.
        let o_adds = post.is_none() && !self.m.partial_residual();
        self.attend(
            kv,
            (layer.o_proj, o_adds),
            spec.window.unwrap_or(0),
            fused_block,
        )?;
        if fused_block {
            self.deferred = Some(i);
            return Ok(());
        }
        let o_proj = (self.m.buffers.attn, layer.o_proj, self.m.config.q_dim());
        self.project_out(o_proj, post, next)
    }

    /// The router's f32 logits (normed from the f32 residual), each token's
    /// top k on the device, then the chosen experts' gate/up and down
    /// products, summed into the residual: the expert choice never reaches
    /// the host.
    fn moe(&mut self, i: usize, spec: &MoeSpec, next: NextNorm) -> Result<(), CudaError> {
        let layer = self.layer(i)?;
        let experts = layer
            .experts
            .ok_or_else(|| unsupported(&format!("experts on dense layer {i}")))?;
        if let Some(attended) = self.deferred.take() {
            self.finish_attention(attended)?;
        }
        let config = self.m.config;
        let moe = config
            .block
            .moe
            .as_ref()
            .ok_or_else(|| unsupported("experts in a dense model"))?;
        // The router norms each row for its logits; it writes the experts'
        // bf16 input too unless a fused producer already did.
        let normed = matches!(self.prescaled, Some((n, _)) if n == NextNorm::Mlp(i));
        let xn = if normed {
            if self.take_norm(NextNorm::Mlp(i), layer.mlp_norm, experts.router)? {
                return Err(unsupported("a pre-scaled norm before experts"));
            }
            0
        } else {
            self.prescaled = None;
            self.m.buffers.xn
        };
        self.route((layer.mlp_norm, xn), experts.router, moe.num_experts, spec)?;
        self.mark(Category::Routing)?;
        let (b, t) = (self.m.buffers, self.plan.tokens);
        let residual = b.x;
        if self.m.partial_residual() {
            // The experts add this rank's columns' products to zeros.
            self.m.gpu.zero(residual, t * config.hidden_size * 4)?;
        }
        // The next block's norm: fused into its GEMV where norms are (the
        // GEMVs' down sum, or under tensor parallelism the all-reduce,
        // leaves its input); else it runs its own over the residual.
        let next_norm = if self.grouped_experts() {
            self.prescaled = None;
            None
        } else {
            self.fuse_next(next)
        };
        let single = self.m.comm.is_none();
        let shape = (moe.num_experts, moe.expert_intermediate_size);
        self.run_experts(&experts, shape, spec, next_norm.filter(|_| single))?;
        self.mark(Category::Experts)?;
        self.all_reduce(
            residual,
            (t, config.hidden_size),
            next_norm.filter(|_| !single),
        )
    }

    fn mlp(&mut self, i: usize, spec: &MlpSpec, next: NextNorm) -> Result<(), CudaError> {
        let layer = self.layer(i)?;
        let post = self.post_norm(spec.post_norm, layer, |(_, mlp)| mlp)?;
        if let Some(attended) = self.deferred.take() {
            if attended == i && post.is_none() {
                return self.fused_block(layer, spec, next);
            }
            self.finish_attention(attended)?;
        }
        let fused_norm = self.take_norm(NextNorm::Mlp(i), layer.mlp_norm, layer.gate_up)?;
        let input_rows = self.gemm_input(layer.gate_up, self.m.buffers.xn);
        let Model {
            gpu,
            gemm,
            buffers: b,
            config: c,
            ..
        } = *self.m;
        let (t, d, ff) = (self.plan.tokens, c.hidden_size, c.intermediate_size);
        // Small batches fuse the activation into the gate/up projection.
        let norm_eps = fused_norm.then_some(c.rms_norm_eps);
        let io = (b.xn, layer.gate_up, b.act);
        if !gemm.gated(gpu, io, spec.act, t, d, ff, norm_eps)? {
            gemm.linear(
                gpu,
                input_rows,
                layer.gate_up,
                b.gate_up,
                t,
                d,
                2 * ff,
                OutType::Bf16,
            )?;
            self.mark(Category::Gemm)?;
            self.activate(spec, layer.down)?;
        }
        self.project_out((b.act, layer.down, ff), post, next)
    }

    /// Final norm and LM head of each sequence's last token.
    fn logits(&mut self, spec: &HeadSpec) -> Result<(), CudaError> {
        let (m, rows) = (self.m, self.plan.seqs);
        head(m, rows, spec, &mut |category| self.mark(category))
    }
}
