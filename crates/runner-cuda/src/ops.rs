//! The CUDA [`DecoderOps`]: each block op enqueues its kernels and GEMMs on
//! the stream, keeping the fusions across op boundaries. At GEMV batch
//! sizes the writer of the residual stream (the embedding, or an
//! accumulating GEMV) leaves the sums of squares and the input pre-scaled
//! by the [`NextNorm`]'s weights, and the op that owns that norm folds it
//! into its first GEMV instead of running a norm kernel. [`encode`] runs
//! the model's architecture file over these ops (the same sequence is
//! captured into the decode graphs).

use ingot_arch::{AttentionSpec, DecoderOps, EmbedSpec, HeadSpec, MlpSpec, NextNorm};
use ingot_models::ModelConfig;

use crate::buffers::{Buffers, StepPlan, SUMSQ_MAX_BLOCKS};
use crate::device::{DevPtr, Gpu};
use crate::gemm::{Gemm, OutType, GEMV_MAX_TOKENS};
use crate::kernels::{
    ArgmaxRows, DecodeAttention, EmbedRows, GemvInput, Heads, Kernels, KvCache, PagedInputs,
    PrefillAttention, QkvRopeGemv, RmsNorm, RopeQkv, RopeTarget, SiluMul,
};
use crate::profile::{Category, Marks};
use crate::weights::{DeviceWeights, LayerWeights};
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
    if let Some(what) = spec.beyond_llama() {
        return Err(unsupported(what));
    }
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
    m.gemm.linear(
        m.gpu,
        b.last,
        w.lm_head,
        b.logits,
        rows,
        d,
        c.vocab_size,
        OutType::F32,
    )?;
    mark(Category::Gemm)
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
    /// The norm whose pre-scaled input (in `xn`, with the sums of squares)
    /// the residual's last writer left.
    prescaled: Option<NextNorm>,
}

impl<'a, 'm> CudaOps<'a, 'm> {
    pub fn new(m: &'a Model<'a>, plan: &'a StepPlan, marks: Option<&'m mut Marks>) -> Self {
        let (t, d) = (plan.tokens, m.config.hidden_size);
        Self {
            m,
            plan,
            marks,
            fuse_norms: t <= GEMV_MAX_TOKENS && d.div_ceil(8) <= SUMSQ_MAX_BLOCKS,
            prescaled: None,
        }
    }

    fn mark(&mut self, category: Category) -> Result<(), CudaError> {
        match self.marks.as_deref_mut() {
            Some(marks) => marks.mark(self.m.gpu, category),
            None => Ok(()),
        }
    }

    fn layer(&self, i: usize) -> Result<&'a LayerWeights, CudaError> {
        self.m
            .weights
            .layers
            .get(i)
            .ok_or_else(|| CudaError::Unsupported(format!("layer {i} is not loaded")))
    }

    /// `(weights, xg)` for the writer of the residual to pre-apply `next`
    /// when norms are fused (the final norm gathers rows: never fused);
    /// records what the consumer will find.
    fn fuse_next(&mut self, next: NextNorm) -> Option<(DevPtr, DevPtr)> {
        let layers = &self.m.weights.layers;
        let weights = match next {
            NextNorm::Attention(i) => layers.get(i).map(|l| l.attn_norm),
            NextNorm::Mlp(i) => layers.get(i).map(|l| l.mlp_norm),
            NextNorm::Final => None,
        };
        let fused = weights.filter(|_| self.fuse_norms);
        self.prescaled = fused.map(|_| next);
        fused.map(|g| (g, self.m.buffers.xn))
    }

    /// Whether the residual's writer pre-applied `norm`; else runs it into
    /// `xn` (over every token row).
    fn take_norm(&mut self, norm: NextNorm, weight: DevPtr) -> Result<bool, CudaError> {
        if self.prescaled.take() == Some(norm) {
            return Ok(true);
        }
        let (b, c) = (self.m.buffers, self.m.config);
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

    fn kv_cache(&self, i: usize) -> Result<KvCache, CudaError> {
        let b = self.m.buffers;
        let &(k, v) = b
            .kv_layers
            .get(i)
            .ok_or_else(|| CudaError::Unsupported("the KV cache is not allocated".into()))?;
        Ok(KvCache {
            k,
            v,
            block_size: b.block_size,
        })
    }

    /// q/k/v projection, bias, q/k norm, rotary embedding and the paged KV
    /// write: one fused GEMV at small batch (layers without q/k norm), else
    /// a GEMM (or normed GEMV) followed by `rope_qkv`.
    fn project_qkv(
        &mut self,
        layer: &LayerWeights,
        spec: &AttentionSpec,
        kv: KvCache,
        fused_norm: bool,
    ) -> Result<(), CudaError> {
        let Model {
            gpu,
            gemm,
            kernels,
            weights: w,
            buffers: b,
            config: c,
        } = *self.m;
        let (t, d) = (self.plan.tokens, c.hidden_size);
        let width = c.q_dim() + 2 * c.kv_dim();
        let l = b.layout;
        let target = RopeTarget {
            positions: b.input(l.positions),
            slots: b.input(l.slots),
            cos: w.cos,
            sin: w.sin,
            q: b.q,
            kv,
            heads: Heads::of(c),
        };
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
        if let Some(kernel) = gemm
            .qkv_rope_kernel(t, d, fused_norm)
            .filter(|_| qk_norm.is_none())
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
            gemm.linear(gpu, b.xn, layer.qkv, b.qkv, t, d, width, OutType::Bf16)?;
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

    /// Paged attention of the step's decode rows and prefill tiles into
    /// `attn`; at GEMV sizes the decode kernel prefetches `o_proj`.
    fn attend(&mut self, kv: KvCache, o_proj: DevPtr) -> Result<(), CudaError> {
        let (b, c, plan) = (self.m.buffers, self.m.config, self.plan);
        let l = b.layout;
        let heads = Heads::of(c);
        let scale_log2 = std::f32::consts::LOG2_E / (c.head_dim as f32).sqrt();
        let paged = PagedInputs {
            tables: b.input(l.tables),
            stride: b.input(l.stride),
            positions: b.input(l.positions),
        };
        if plan.decode_tokens > 0 {
            // The output projection streams its weights only at GEMV sizes.
            let o_bytes = if plan.tokens <= GEMV_MAX_TOKENS {
                c.q_dim() * c.hidden_size * 2
            } else {
                0
            };
            DecodeAttention {
                tokens: plan.decode_tokens,
                splits: plan.splits,
                q: b.q,
                kv,
                paged,
                token_seq: b.input(l.token_seq),
                decode_ids: if plan.decode_list {
                    b.input(l.decode_ids)
                } else {
                    0
                },
                out: b.attn,
                part_acc: b.part_acc,
                part_ml: b.part_ml,
                heads,
                scale_log2,
                prefetch: (o_proj, o_bytes),
            }
            .launch(self.m.gpu, self.m.kernels)?;
        }
        if plan.tiles > 0 {
            PrefillAttention {
                num_tiles: plan.tiles,
                tiles: b.input(l.tiles),
                q: b.q,
                kv,
                paged,
                out: b.attn,
                heads,
                scale_log2,
            }
            .launch(self.m.gpu, self.m.kernels)?;
        }
        self.mark(Category::Attention)
    }
}

impl DecoderOps for CudaOps<'_, '_> {
    type Error = CudaError;

    fn embed(&mut self, spec: &EmbedSpec, next: NextNorm) -> Result<(), CudaError> {
        if let Some(what) = spec.beyond_llama() {
            return Err(unsupported(what));
        }
        let (b, c) = (self.m.buffers, self.m.config);
        EmbedRows {
            tokens: self.plan.tokens,
            ids: b.input(b.layout.ids),
            table: self.m.weights.embed,
            x: b.x,
            hidden: c.hidden_size,
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
        if let Some(what) = spec.beyond_llama() {
            return Err(unsupported(what));
        }
        let (layer, kv) = (self.layer(i)?, self.kv_cache(i)?);
        let fused_norm = self.take_norm(NextNorm::Attention(i), layer.attn_norm)?;
        self.project_qkv(layer, spec, kv, fused_norm)?;
        self.attend(kv, layer.o_proj)?;
        let (b, c) = (self.m.buffers, self.m.config);
        let next_norm = self.fuse_next(next);
        let (t, qd, d) = (self.plan.tokens, c.q_dim(), c.hidden_size);
        self.m
            .gemm
            .accumulate(self.m.gpu, b.attn, layer.o_proj, b.x, t, qd, d, next_norm)?;
        self.mark(Category::Gemm)
    }

    fn mlp(&mut self, i: usize, spec: &MlpSpec, next: NextNorm) -> Result<(), CudaError> {
        if let Some(what) = spec.beyond_llama() {
            return Err(unsupported(what));
        }
        let layer = self.layer(i)?;
        let fused_norm = self.take_norm(NextNorm::Mlp(i), layer.mlp_norm)?;
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
        if !gemm.swiglu(gpu, (b.xn, layer.gate_up, b.act), t, d, ff, norm_eps)? {
            gemm.linear(
                gpu,
                b.xn,
                layer.gate_up,
                b.gate_up,
                t,
                d,
                2 * ff,
                OutType::Bf16,
            )?;
            self.mark(Category::Gemm)?;
            SiluMul {
                tokens: t,
                gate_up: b.gate_up,
                act: b.act,
                width: ff,
            }
            .launch(gpu, self.m.kernels)?;
            self.mark(Category::Other)?;
        }
        let next_norm = self.fuse_next(next);
        gemm.accumulate(gpu, b.act, layer.down, b.x, t, ff, d, next_norm)?;
        self.mark(Category::Gemm)
    }

    /// Final norm and LM head of each sequence's last token.
    fn logits(&mut self, spec: &HeadSpec) -> Result<(), CudaError> {
        let (m, rows) = (self.m, self.plan.seqs);
        head(m, rows, spec, &mut |category| self.mark(category))
    }
}
