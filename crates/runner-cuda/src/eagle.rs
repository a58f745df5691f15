//! An EAGLE-3 draft head on the GPU ([`ingot_models::eagle`] has the
//! layout; `ingot-runner-cpu`'s `eagle.rs` the same head on the CPU).
//!
//! The head is one Llama layer whose q/k/v read the normed token embedding
//! beside the normed fused row, so it runs eagerly over the target's
//! kernels rather than through the decoder ops: `fc` (the target's rows to
//! the residual), the two norms side by side in one bf16 row, q/k/v, rope
//! and the KV write into the head's own one-layer pool, paged attention,
//! o_proj and the SwiGLU MLP accumulated into the f32 residual. `pick` is
//! the final norm, the head's LM head and an argmax on the device; the
//! draft ids map to target ids on the host (`d2t`). It runs on a stream of
//! its own (beside a step the target launched ahead) and reads the
//! target's embedding table (only while the target is awake, as the engine
//! runs it only then). Batches larger than the head's
//! workspace run in pieces of whole or split chunks, in order.

use half::bf16;
use ingot_arch::Activation;
use ingot_core::TokenId;
use ingot_models::eagle::{EagleHeadConfig, EagleHeadWeights};
use ingot_models::{HostTensor, ModelConfig};
use ingot_runner::{
    DraftHead, ForwardBatch, HeadBatch, HeadInput, KvCacheShape, RunnerError, SequenceChunk,
};

use crate::buffers::{Buffers, StepPlan, SUMSQ_BYTES};
use crate::device::{Arena, DevPtr, Gpu, Pinned};
use crate::gemm::{Gemm, OutType};
use crate::kernels::{
    ArgmaxRows, EmbedRows, GatedMul, Heads, Kernels, KvCache, KvDtype, L2PrefetchSpec, RmsNorm,
    RopeQkv, RopeTarget,
};
use crate::ops::{paged_attention, AttentionSite};
use crate::CudaError;

/// Most tokens of one piece of a head's forward pass (its workspace).
const HEAD_MAX_TOKENS: usize = 1024;

/// What a head takes from its target's runner.
pub(crate) struct HeadParts {
    pub gpu: Gpu,
    /// The target's embedding table (bf16 rows, or a k-quant header).
    pub embed: (DevPtr, bool),
    pub block_size: usize,
    pub max_seqs: usize,
}

/// The head's matrices (bf16) and vectors (f32) on the device.
struct HeadWeights {
    fc: DevPtr,
    input_norm: DevPtr,
    hidden_norm: DevPtr,
    /// `[q_dim + 2 kv_dim, 2 hidden]`.
    qkv: DevPtr,
    o_proj: DevPtr,
    post_norm: DevPtr,
    /// `[2 ff, hidden]`: gate rows then up rows.
    gate_up: DevPtr,
    down: DevPtr,
    norm: DevPtr,
    lm_head: DevPtr,
    /// Its own embedding, when it has one.
    embed: Option<DevPtr>,
    cos: DevPtr,
    sin: DevPtr,
    _arena: Arena,
}

/// The head's own scratch beside the layer's [`Buffers`].
struct HeadScratch {
    /// The target's rows in bf16, `[tokens, feature width]`.
    features: DevPtr,
    /// Token embeddings (f32), then rows for `pick`.
    embedded: DevPtr,
    /// The normed fused rows (bf16).
    normed: DevPtr,
    /// `[normed embedding | normed fused row]` per token (bf16): q/k/v's input.
    wide: DevPtr,
}

/// An EAGLE-3 head on a CUDA device.
pub struct CudaEagleHead {
    config: EagleHeadConfig,
    /// The layer as the buffers see it (`vocab_size`: the draft vocabulary).
    layer: ModelConfig,
    kv_shape: KvCacheShape,
    target_embed: (DevPtr, bool),
    draft_to_target: Vec<u32>,
    scratch: HeadScratch,
    rows_host: Pinned<f32>,
    ids_host: Pinned<i32>,
    // Drop order: the GEMM plans and buffers before the arenas they use.
    gemm: Gemm,
    buffers: Buffers,
    kernels: Kernels,
    w: HeadWeights,
    gpu: Gpu,
}

// Used from the engine's thread only, as the runner it came from.
unsafe impl Send for CudaEagleHead {}

impl CudaEagleHead {
    /// Uploads the head and sizes its workspace and a KV pool of
    /// `kv_tokens` positions.
    pub(crate) fn new(
        parts: HeadParts,
        config: EagleHeadConfig,
        w: EagleHeadWeights,
        kv_tokens: usize,
    ) -> Result<Self, CudaError> {
        let HeadParts {
            gpu,
            embed,
            block_size,
            max_seqs,
        } = parts;
        gpu.ctx.bind_to_thread()?;
        let mut layer = config.layer.clone();
        layer.vocab_size = config.draft_vocab_size;
        let kernels = Kernels::load(&gpu, &layer, KvDtype::Bf16, L2PrefetchSpec::parse(None)?, 0)?;
        let weights = upload_weights(&gpu, &layer, &w)?;
        let (t, s) = (HEAD_MAX_TOKENS.max(max_seqs), max_seqs);
        let scratch_sizes = scratch_bytes(&config, t);
        let mut arena = Arena::new(
            &gpu,
            "EAGLE head workspace",
            Arena::size_of(scratch_sizes)
                + Gemm::workspace_bytes()
                + Buffers::bytes(&layer, t, s, block_size, 0),
        )?;
        let mut gemm = Gemm::new(&gpu, &mut arena)?;
        let scratch = HeadScratch {
            features: arena.take(scratch_sizes[0])?,
            embedded: arena.take(scratch_sizes[1])?,
            normed: arena.take(scratch_sizes[2])?,
            wide: arena.take(scratch_sizes[3])?,
        };
        let mut buffers = Buffers::new(&gpu, &layer, (t, s, block_size), 0, arena)?;
        let num_blocks = kv_tokens.div_ceil(block_size).max(1);
        // One page more: where padded rows and given-back blocks point.
        buffers.set_kv(&gpu, &layer, (num_blocks + 1, block_size), KvDtype::Bf16)?;
        gpu.upload(buffers.sumsq, &vec![0u32; SUMSQ_BYTES / 4])?;
        gemm.sumsq = buffers.sumsq;
        gemm.max_tokens = t;
        let d = layer.hidden_size;
        let head = Self {
            kv_shape: KvCacheShape {
                num_blocks,
                block_size,
            },
            target_embed: embed,
            draft_to_target: w.draft_to_target,
            scratch,
            rows_host: Pinned::new(&gpu, s * d)?,
            ids_host: Pinned::new(&gpu, s)?,
            gemm,
            buffers,
            kernels,
            w: weights,
            layer,
            config,
            gpu,
        };
        head.gpu.sync()?;
        Ok(head)
    }

    /// Runs one piece of a batch: `chunks` (parts of the batch's chunks,
    /// in order) whose input rows are `rows`; copies the last row of each
    /// chunk marked in `last` into `rows_host[slot]`.
    fn run_piece(
        &mut self,
        chunks: Vec<SequenceChunk<'_>>,
        input: HeadInput<'_>,
        last: &[(usize, usize)],
    ) -> Result<(), CudaError> {
        let batch = ForwardBatch {
            chunks,
            ..ForwardBatch::default()
        };
        let scratch_page = self.kv_shape.num_blocks as u32;
        let prefill = self.kernels.has_prefill();
        let plan = self.buffers.prepare(
            &batch,
            self.kernels.num_sms,
            &self.layer,
            (prefill, scratch_page),
        )?;
        self.buffers.upload(&self.gpu, &plan)?;
        self.fuse_inputs(&plan, input)?;
        self.attention(&plan)?;
        self.mlp(plan.tokens)?;
        let d = self.layer.hidden_size;
        for &(row, slot) in last {
            let src = self.buffers.x + (row * d * 4) as u64;
            let dst = &mut self.rows_host.as_mut_slice()[slot * d..(slot + 1) * d];
            self.gpu.download(dst, src)?;
        }
        Ok(())
    }

    /// The fused rows into the residual `x`, and q/k/v's wide input.
    fn fuse_inputs(&mut self, plan: &StepPlan, input: HeadInput<'_>) -> Result<(), CudaError> {
        let (b, s, c) = (&self.buffers, &self.scratch, &self.layer);
        let (t, d, eps) = (plan.tokens, c.hidden_size, c.rms_norm_eps);
        match input {
            HeadInput::Target(rows) => {
                let fw = self.config.feature_width();
                let features: Vec<bf16> = rows.iter().map(|&v| bf16::from_f32(v)).collect();
                self.gpu.upload(s.features, &features)?;
                self.gemm.linear(
                    &self.gpu,
                    s.features,
                    self.w.fc,
                    b.x,
                    t,
                    fw,
                    d,
                    OutType::F32,
                )?;
            }
            HeadInput::Own(rows) => self.gpu.upload(b.x, rows)?,
        }
        let (table, blocks) = match self.w.embed {
            Some(own) => (own, false),
            None => self.target_embed,
        };
        EmbedRows {
            tokens: t,
            ids: b.input(b.layout.ids),
            table,
            blocks,
            x: s.embedded,
            hidden: d,
            scale: None,
            sumsq: b.sumsq,
            next_norm: None,
        }
        .launch(&self.gpu, &self.kernels)?;
        let norm = |x, weight, out| RmsNorm {
            rows: t,
            x,
            gather: 0,
            weight,
            out,
            hidden: d,
            eps,
        };
        norm(s.embedded, self.w.input_norm, b.xn).launch(&self.gpu, &self.kernels)?;
        norm(b.x, self.w.hidden_norm, s.normed).launch(&self.gpu, &self.kernels)?;
        let row = d * 2;
        let pitches = (2 * row, row);
        self.gpu.copy_rows((s.wide, b.xn), pitches, row, t)?;
        self.gpu
            .copy_rows((s.wide + row as u64, s.normed), pitches, row, t)
    }

    /// q/k/v, rope and the KV write, paged attention, o_proj into `x`.
    fn attention(&mut self, plan: &StepPlan) -> Result<(), CudaError> {
        let (b, c, gpu, k) = (&self.buffers, &self.layer, &self.gpu, &self.kernels);
        let (t, d, qd) = (plan.tokens, c.hidden_size, c.q_dim());
        let width = qd + 2 * c.kv_dim();
        let wide = self.scratch.wide;
        self.gemm
            .linear(gpu, wide, self.w.qkv, b.qkv, t, 2 * d, width, OutType::Bf16)?;
        let &(kv_k, kv_v) = b
            .kv_slices
            .first()
            .ok_or_else(|| CudaError::Unsupported("the head's KV cache is not allocated".into()))?;
        let kv = KvCache {
            k: kv_k,
            v: kv_v,
            block_size: b.block_size,
            dtype: b.kv_dtype,
        };
        let l = b.layout;
        let heads = Heads::of(c);
        RopeQkv {
            tokens: t,
            qkv: b.qkv,
            bias: 0,
            qk_norm: (0, 0),
            eps: c.rms_norm_eps,
            target: RopeTarget {
                positions: b.input(l.positions),
                slots: b.input(l.slots_of(0)),
                cos: self.w.cos,
                sin: self.w.sin,
                q: b.q,
                kv,
                heads,
            },
        }
        .launch(gpu, k)?;
        let site = AttentionSite {
            kv: (kv, 0),
            heads,
            scale_log2: std::f32::consts::LOG2_E / (c.head_dim as f32).sqrt(),
            window: 0,
            prefetch: (0, 0),
            keep_partials: false,
        };
        paged_attention((gpu, k), b, plan, site)?;
        self.gemm
            .accumulate(gpu, b.attn, self.w.o_proj, b.x, t, qd, d, None)
    }

    /// The SwiGLU MLP of `t` rows into `x`.
    fn mlp(&mut self, t: usize) -> Result<(), CudaError> {
        let (b, c, gpu) = (&self.buffers, &self.layer, &self.gpu);
        let (d, ff) = (c.hidden_size, c.intermediate_size);
        RmsNorm {
            rows: t,
            x: b.x,
            gather: 0,
            weight: self.w.post_norm,
            out: b.xn,
            hidden: d,
            eps: c.rms_norm_eps,
        }
        .launch(gpu, &self.kernels)?;
        let io = (b.xn, self.w.gate_up, b.act);
        if !self.gemm.gated(gpu, io, Activation::Silu, t, d, ff, None)? {
            self.gemm.linear(
                gpu,
                b.xn,
                self.w.gate_up,
                b.gate_up,
                t,
                d,
                2 * ff,
                OutType::Bf16,
            )?;
            GatedMul {
                tokens: t,
                activation: Activation::Silu,
                gate_up: b.gate_up,
                act: b.act,
                width: ff,
            }
            .launch(gpu, &self.kernels)?;
        }
        self.gemm
            .accumulate(gpu, b.act, self.w.down, b.x, t, ff, d, None)
    }

    /// Greedy draft ids of `n` rows already in `embedded` (f32).
    fn pick_rows(&mut self, n: usize) -> Result<(), CudaError> {
        let (b, c, gpu) = (&self.buffers, &self.layer, &self.gpu);
        let d = c.hidden_size;
        RmsNorm {
            rows: n,
            x: self.scratch.embedded,
            gather: 0,
            weight: self.w.norm,
            out: b.last,
            hidden: d,
            eps: c.rms_norm_eps,
        }
        .launch(gpu, &self.kernels)?;
        let dv = c.vocab_size;
        self.gemm.linear(
            gpu,
            b.last,
            self.w.lm_head,
            b.logits,
            n,
            d,
            dv,
            OutType::F32,
        )?;
        ArgmaxRows {
            rows: n,
            logits: b.logits,
            vocab: dv,
            out: b.sampled,
        }
        .launch(gpu, &self.kernels)?;
        gpu.download(&mut self.ids_host.as_mut_slice()[..n], b.sampled)?;
        gpu.sync()
    }
}

impl CudaEagleHead {
    /// [`DraftHead::forward`] of a checked batch.
    fn run_batch(&mut self, batch: &HeadBatch<'_>) -> Result<Vec<f32>, CudaError> {
        let (d, n) = (self.layer.hidden_size, batch.chunks.len());
        self.gpu.ctx.bind_to_thread()?;
        if self.rows_host.as_slice().len() < n * d {
            self.rows_host = Pinned::new(&self.gpu, n * d)?;
        }
        let lens: Vec<usize> = batch.chunks.iter().map(|c| c.tokens.len()).collect();
        let width = match batch.input {
            HeadInput::Target(_) => self.config.feature_width(),
            HeadInput::Own(_) => d,
        };
        let mut first_row = 0;
        for piece in pieces(&lens, self.buffers.max_tokens, self.buffers.max_seqs) {
            let mut chunks = Vec::with_capacity(piece.len());
            // (row in the piece, chunk) of each chunk ending here.
            let mut last = Vec::new();
            let mut tokens = 0;
            for part in &piece {
                let c = &batch.chunks[part.chunk];
                chunks.push(SequenceChunk {
                    tokens: &c.tokens[part.start..part.end],
                    start_pos: c.start_pos + part.start,
                    ..*c
                });
                tokens += part.end - part.start;
                if part.end == c.tokens.len() {
                    last.push((tokens - 1, part.chunk));
                }
            }
            let rows = first_row * width..(first_row + tokens) * width;
            let input = match batch.input {
                HeadInput::Target(r) => HeadInput::Target(&r[rows]),
                HeadInput::Own(r) => HeadInput::Own(&r[rows]),
            };
            self.run_piece(chunks, input, &last)?;
            first_row += tokens;
        }
        self.gpu.sync()?;
        Ok(self.rows_host.as_slice()[..n * d].to_vec())
    }

    /// [`DraftHead::pick`] of whole rows, in groups the workspace holds.
    fn pick_all(&mut self, rows: &[f32]) -> Result<Vec<TokenId>, CudaError> {
        let d = self.layer.hidden_size;
        self.gpu.ctx.bind_to_thread()?;
        let mut out = Vec::with_capacity(rows.len() / d);
        for group in rows.chunks(self.buffers.max_seqs * d) {
            let n = group.len() / d;
            self.gpu.upload(self.scratch.embedded, group)?;
            self.pick_rows(n)?;
            let ids = &self.ids_host.as_slice()[..n];
            out.extend(ids.iter().map(|&i| {
                let draft = i.max(0) as usize;
                self.draft_to_target.get(draft).copied().unwrap_or(0) as TokenId
            }));
        }
        Ok(out)
    }
}

impl DraftHead for CudaEagleHead {
    fn config(&self) -> &EagleHeadConfig {
        &self.config
    }

    fn kv_cache_shape(&self) -> KvCacheShape {
        self.kv_shape
    }

    fn forward(&mut self, batch: &HeadBatch<'_>) -> Result<Vec<f32>, RunnerError> {
        ingot_runner::check_head_batch(&self.config, self.kv_shape, batch)?;
        if batch.num_tokens() == 0 {
            return Ok(Vec::new());
        }
        self.run_batch(batch).map_err(RunnerError::from)
    }

    fn pick(&mut self, rows: &[f32]) -> Result<Vec<TokenId>, RunnerError> {
        ingot_runner::head_rows(rows, self.layer.hidden_size)?;
        self.pick_all(rows).map_err(RunnerError::from)
    }
}

/// A run of one chunk's tokens `start..end` inside a piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Part {
    chunk: usize,
    start: usize,
    end: usize,
}

/// Splits chunks of `lens` tokens, in order, into pieces of at most
/// `max_tokens` tokens and `max_seqs` parts; a chunk too long for the room
/// left continues in the next piece (its later positions read the earlier
/// ones' KV, written by then).
fn pieces(lens: &[usize], max_tokens: usize, max_seqs: usize) -> Vec<Vec<Part>> {
    let mut out = Vec::new();
    let mut piece: Vec<Part> = Vec::new();
    let mut room = max_tokens;
    for (chunk, &len) in lens.iter().enumerate() {
        let mut start = 0;
        while start < len {
            if room == 0 || piece.len() == max_seqs {
                out.push(std::mem::take(&mut piece));
                room = max_tokens;
            }
            let end = len.min(start + room);
            piece.push(Part { chunk, start, end });
            room -= end - start;
            start = end;
        }
    }
    if !piece.is_empty() {
        out.push(piece);
    }
    out
}

/// Bytes of the head's scratch for `t` tokens, in [`HeadScratch`]'s order.
fn scratch_bytes(config: &EagleHeadConfig, t: usize) -> [usize; 4] {
    let d = config.layer.hidden_size;
    [
        t * config.feature_width() * 2,
        t * d * 4,
        t * d * 2,
        t * 2 * d * 2,
    ]
}

/// Fills an arena piece by piece.
struct Uploader<'a> {
    gpu: &'a Gpu,
    arena: Arena,
}

impl Uploader<'_> {
    /// `parts` one after another, as bf16.
    fn bf16(&mut self, parts: &[&[f32]]) -> Result<DevPtr, CudaError> {
        let values: Vec<bf16> = parts
            .iter()
            .flat_map(|p| p.iter().map(|&v| bf16::from_f32(v)))
            .collect();
        let dst = self.arena.take(values.len() * 2)?;
        self.gpu.upload(dst, &values)?;
        Ok(dst)
    }

    fn f32(&mut self, values: &[f32]) -> Result<DevPtr, CudaError> {
        let dst = self.arena.take(values.len() * 4)?;
        self.gpu.upload(dst, values)?;
        Ok(dst)
    }
}

/// The head's tensors on the device: matrices in bf16 (q/k/v and
/// gate/up each one matrix), norms and rotary tables in f32.
fn upload_weights(
    gpu: &Gpu,
    c: &ModelConfig,
    w: &EagleHeadWeights,
) -> Result<HeadWeights, CudaError> {
    let (cos, sin) = c.rope.tables(c.head_dim, c.max_context);
    let bf16_bytes = |parts: &[&HostTensor]| parts.iter().map(|t| t.data.len() * 2).sum();
    let mut sizes: Vec<usize> = vec![
        bf16_bytes(&[&w.fc]),
        bf16_bytes(&[&w.q_proj, &w.k_proj, &w.v_proj]),
        bf16_bytes(&[&w.o_proj]),
        bf16_bytes(&[&w.gate_proj, &w.up_proj]),
        bf16_bytes(&[&w.down_proj]),
        bf16_bytes(&[&w.lm_head]),
    ];
    sizes.extend(w.embed.iter().map(|e| bf16_bytes(&[e])));
    let vectors = [
        &w.input_norm,
        &w.hidden_norm,
        &w.post_attention_norm,
        &w.norm,
    ];
    sizes.extend(vectors.iter().map(|v| v.data.len() * 4));
    sizes.extend([cos.len() * 4, sin.len() * 4]);
    let arena = Arena::new(gpu, "EAGLE head weights", Arena::size_of(sizes))?;
    let mut up = Uploader { gpu, arena };
    let weights = HeadWeights {
        fc: up.bf16(&[&w.fc.data])?,
        qkv: up.bf16(&[&w.q_proj.data, &w.k_proj.data, &w.v_proj.data])?,
        o_proj: up.bf16(&[&w.o_proj.data])?,
        gate_up: up.bf16(&[&w.gate_proj.data, &w.up_proj.data])?,
        down: up.bf16(&[&w.down_proj.data])?,
        lm_head: up.bf16(&[&w.lm_head.data])?,
        embed: match &w.embed {
            Some(e) => Some(up.bf16(&[&e.data])?),
            None => None,
        },
        input_norm: up.f32(&w.input_norm.data)?,
        hidden_norm: up.f32(&w.hidden_norm.data)?,
        post_norm: up.f32(&w.post_attention_norm.data)?,
        norm: up.f32(&w.norm.data)?,
        cos: up.f32(&cos)?,
        sin: up.f32(&sin)?,
        _arena: up.arena,
    };
    // The uploads read pageable memory: done before the host copies go.
    gpu.sync()?;
    Ok(weights)
}

#[cfg(test)]
mod tests;
