//! One forward step: the step's inputs laid out for a single upload, the
//! activation buffers, and [`encode`], which enqueues every kernel and GEMM
//! of the decoder (the same sequence is captured into the decode graphs).

use cudarc::driver::sys::CUdevice_attribute;
use ingot_models::ModelConfig;
use ingot_runner::ForwardBatch;

use crate::device::{Arena, Arg, DevPtr, Gpu, Kernel, Pinned};
use crate::gemm::{Gemm, OutType, GEMV_MAX_TOKENS};
use crate::profile::{Category, Marks};
use crate::weights::{DeviceWeights, LayerWeights};
use crate::CudaError;

/// Query rows per prefill-attention tile (the kernel's `TILE`): 64 / G
/// tokens of a chunk times the G query heads of a kv head.
const PREFILL_TILE: usize = 64;
/// Chunks at least this long use the tensor-core prefill attention.
const PREFILL_MIN_TOKENS: usize = 8;
/// Bytes of the kernels' `SumSq` (common.cuh): the block count padded to 8
/// words, and the block partials of every row.
pub const SUMSQ_BYTES: usize = 4 * (8 + SUMSQ_ROWS * SUMSQ_MAX_BLOCKS);
/// Most blocks of an accumulating GEMV that can leave sums of squares
/// (one per 8 output columns).
const SUMSQ_MAX_BLOCKS: usize = 4096;
/// Rows `SumSq` holds: every GEMV batch size.
const SUMSQ_ROWS: usize = 8;
const _: () = assert!(GEMV_MAX_TOKENS <= SUMSQ_ROWS);

/// Heads (one per warp) of a `rope_qkv` block (its `ROPE_WARPS`).
const ROPE_WARPS: usize = 8;
/// Most (token, split) rows of split-K partial results.
const PART_ROWS: usize = 2048;
/// Keys per split that make a block long enough to be worth its launch.
const KEYS_PER_SPLIT: usize = 256;
/// Most splits of one token's keys.
const MAX_SPLITS: usize = 32;

/// The kernels this model needs.
pub struct Kernels {
    embed_rows: Kernel,
    add_rms_norm: Kernel,
    rope_qkv: Kernel,
    silu_mul: Kernel,
    argmax_rows: Kernel,
    decode_attention: Kernel,
    combine: Kernel,
    advance_decode: Kernel,
    /// Absent for head sizes without a tensor-core kernel.
    prefill_attention: Option<(Kernel, u32)>,
    pub num_sms: usize,
    /// What the decode attention prefetches into L2 at GEMV batch sizes.
    l2_prefetch: L2Prefetch,
}

/// Small-batch decode attention is latency-bound and leaves DRAM idle; it
/// uses that time to bring the first `bytes` of the output projection's
/// weights into L2 (`l2_prefetch` in common.cuh; `mode` bit 0: issue before
/// waiting for the q/k/v GEMV, bit 1: evict-last hint).
#[derive(Clone, Copy, Debug)]
struct L2Prefetch {
    bytes: usize,
    mode: i32,
}

/// A parsed `cuda.l2_prefetch` spec: `<MiB>[:<mode>]`, either part falling
/// back to the default when the spec is unset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct L2PrefetchSpec {
    mib: Option<usize>,
    mode: Option<i32>,
}

impl L2PrefetchSpec {
    /// Parses `<MiB>[:<mode>]` (`None`: the defaults). A malformed spec is an
    /// error, never silently the default: a benchmark must run what it says.
    pub fn parse(spec: Option<&str>) -> Result<Self, CudaError> {
        let Some(spec) = spec else {
            return Ok(Self::default());
        };
        let bad = || {
            CudaError::InvalidOption(format!(
                "l2_prefetch {spec:?}: expected <MiB>[:<mode>], e.g. \"8\" or \"8:1\""
            ))
        };
        let (mib, mode) = match spec.split_once(':') {
            Some((mib, mode)) => (mib, Some(mode)),
            None => (spec, None),
        };
        let mib = mib.trim().parse::<usize>().map_err(|_| bad())?;
        let mode = match mode {
            Some(m) => Some(m.trim().parse::<i32>().map_err(|_| bad())?),
            None => None,
        };
        if mib.checked_mul(1 << 20).is_none() {
            return Err(bad());
        }
        Ok(Self {
            mib: Some(mib),
            mode,
        })
    }
}

impl L2Prefetch {
    /// A sixth of the L2 by default (8 MiB on an H100: 8B batch 1 at
    /// 182.0 tok/s against 180.6 without, 181.6 / 181.5 / 180.6 / 178.9
    /// with 4 / 12 / 16 / 33 MiB; an evict-last hint was slower); `spec`
    /// (`cuda.l2_prefetch`) overrides it (0: off).
    fn new(l2_bytes: usize, spec: L2PrefetchSpec) -> Self {
        Self {
            bytes: spec.mib.map_or(l2_bytes / 6, |m| m << 20),
            mode: spec.mode.unwrap_or(1),
        }
    }

    /// Kernel arguments for prefetching (up to) `bytes` at `base`.
    fn args(&self, base: DevPtr, bytes: usize) -> [Arg; 3] {
        let n = self.bytes.min(bytes) & !15;
        let base = if n == 0 { 0 } else { base };
        [Arg::Ptr(base), Arg::I64(n as i64), Arg::I32(self.mode)]
    }
}

impl Kernels {
    /// Loads the kernels for `config`'s head size and GQA group.
    pub fn load(
        gpu: &Gpu,
        config: &ModelConfig,
        prefetch: L2PrefetchSpec,
    ) -> Result<Self, CudaError> {
        let (hd, group) = (
            config.head_dim,
            config.num_heads / config.num_kv_heads.max(1),
        );
        if group * config.num_kv_heads != config.num_heads || !(1..=8).contains(&group) {
            return Err(CudaError::Unsupported(format!(
                "{} query heads over {} kv heads (groups of 1 to 8 are supported)",
                config.num_heads, config.num_kv_heads
            )));
        }
        if !config.intermediate_size.is_multiple_of(8) || !config.hidden_size.is_multiple_of(8) {
            return Err(CudaError::Unsupported(format!(
                "hidden size {} / MLP width {} (multiples of 8 are supported)",
                config.hidden_size, config.intermediate_size
            )));
        }
        let decode_attention = gpu
            .kernel(&format!("paged_attention_hd{hd}_g{group}"))
            .map_err(|_| {
                CudaError::Unsupported(format!("head_dim {hd} (64, 128 and 256 are supported)"))
            })?;
        let prefill_attention = match gpu.kernel(&format!("prefill_attention_hd{hd}")) {
            Ok(k) => {
                let bytes = prefill_shared_bytes(hd) as u32;
                k.allow_shared_memory(bytes)?;
                Some((k, bytes))
            }
            Err(_) => None,
        };
        Ok(Self {
            embed_rows: gpu.kernel("embed_rows")?,
            add_rms_norm: gpu.kernel("add_rms_norm")?,
            rope_qkv: gpu.kernel("rope_qkv")?,
            silu_mul: gpu.kernel("silu_mul")?,
            argmax_rows: gpu.kernel("argmax_rows")?,
            decode_attention,
            combine: gpu.kernel("attention_combine")?,
            advance_decode: gpu.kernel("advance_decode")?,
            prefill_attention,
            num_sms: gpu
                .ctx
                .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
                as usize,
            l2_prefetch: L2Prefetch::new(
                gpu.ctx
                    .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?
                    as usize,
                prefetch,
            ),
        })
    }
}

impl Kernels {
    /// Whether long chunks can use the tensor-core prefill attention.
    pub fn has_prefill(&self) -> bool {
        self.prefill_attention.is_some()
    }
}

/// Mirrors `PrefillSmem<HD>::BYTES` in attention.cu.
fn prefill_shared_bytes(hd: usize) -> usize {
    // Q, K and V: 64-row tiles of hd + 8 bf16.
    3 * PREFILL_TILE * (hd + 8) * 2
}

/// What one step runs: counts that pick grid sizes.
#[derive(Debug, Clone, Copy)]
pub struct StepPlan {
    /// Token rows (padded up to the graph size for graph steps).
    pub tokens: usize,
    /// Sequences (rows of logits).
    pub seqs: usize,
    /// Tokens for the paged decode kernel.
    pub decode_tokens: usize,
    /// Whether the decode kernel reads a token list (else tokens 0..n).
    pub decode_list: bool,
    /// Prefill-attention tiles.
    pub tiles: usize,
    /// Splits of each decode token's keys.
    pub splits: usize,
    /// i32 elements of the input region to upload.
    upload_len: usize,
    /// The captured graph this step replays (its padded size).
    pub graph_size: Option<usize>,
}

/// Offsets (in i32 elements) of the step inputs inside one region that is
/// mirrored in pinned host memory and copied up in one transfer.
#[derive(Debug, Clone, Copy)]
struct InputLayout {
    slots: usize,
    ids: usize,
    positions: usize,
    token_seq: usize,
    decode_ids: usize,
    tiles: usize,
    last_rows: usize,
    stride: usize,
    tables: usize,
    len: usize,
}

impl InputLayout {
    fn new(max_tokens: usize, max_seqs: usize, max_blocks: usize) -> Self {
        // Tiles hold 64 / G tokens; G is at most 8.
        let max_tiles = max_tokens * 8 / PREFILL_TILE + max_seqs + 1;
        let slots = 0;
        let ids = slots + 2 * max_tokens;
        let positions = ids + max_tokens;
        let token_seq = positions + max_tokens;
        let decode_ids = token_seq + max_tokens;
        let tiles = decode_ids + max_tokens;
        let last_rows = tiles + 3 * max_tiles;
        let stride = last_rows + max_seqs;
        let tables = stride + 2;
        Self {
            slots,
            ids,
            positions,
            token_seq,
            decode_ids,
            tiles,
            last_rows,
            stride,
            tables,
            len: tables + max_seqs * max_blocks,
        }
    }
}

/// The activation workspace, the step inputs and the KV pool.
pub struct Buffers {
    pub max_tokens: usize,
    pub max_seqs: usize,
    block_size: usize,
    layout: InputLayout,
    inputs: DevPtr,
    inputs_host: Pinned<i32>,
    x: DevPtr,
    xn: DevPtr,
    qkv: DevPtr,
    q: DevPtr,
    attn: DevPtr,
    gate_up: DevPtr,
    act: DevPtr,
    last: DevPtr,
    pub logits: DevPtr,
    pub sampled: DevPtr,
    part_acc: DevPtr,
    part_ml: DevPtr,
    /// `SumSq` (common.cuh): row sums of squares for fused RMSNorms.
    pub sumsq: DevPtr,
    arena: Arena,
    /// (k, v) per layer, `[blocks, kv_heads, block_size, head_dim]` bf16 each.
    kv_layers: Vec<(DevPtr, DevPtr)>,
    kv: Option<Arena>,
}

/// Bytes of each workspace buffer, in the order [`Buffers::new`] takes them.
fn piece_sizes(c: &ModelConfig, t: usize, s: usize, layout: &InputLayout) -> [usize; 14] {
    let (d, qd, kvd, ff, v) = (
        c.hidden_size,
        c.q_dim(),
        c.kv_dim(),
        c.intermediate_size,
        c.vocab_size,
    );
    [
        layout.len * 4,
        t * d * 4,              // x (f32 residual)
        t * d * 2,              // xn
        t * (qd + 2 * kvd) * 2, // qkv
        t * qd * 2,             // q
        t * qd * 2,             // attn
        t * 2 * ff * 2,         // gate_up
        t * ff * 2,             // act
        s * d * 2,              // last
        s * v * 4,              // logits
        s * 4,                  // sampled
        PART_ROWS * c.num_heads * c.head_dim * 4,
        PART_ROWS * c.num_heads * 2 * 4,
        SUMSQ_BYTES,
    ]
}

impl Buffers {
    fn layout(c: &ModelConfig, t: usize, s: usize, bs: usize) -> InputLayout {
        InputLayout::new(t, s, c.max_context.div_ceil(bs))
    }

    /// Workspace bytes for `t` tokens and `s` sequences per step.
    pub fn bytes(c: &ModelConfig, t: usize, s: usize, bs: usize) -> usize {
        Arena::size_of(piece_sizes(c, t, s, &Self::layout(c, t, s, bs)))
    }

    /// Carves the workspace out of `arena` (which also holds cuBLASLt's).
    pub fn new(
        gpu: &Gpu,
        c: &ModelConfig,
        (t, s, bs): (usize, usize, usize),
        mut arena: Arena,
    ) -> Result<Self, CudaError> {
        let layout = Self::layout(c, t, s, bs);
        let sizes = piece_sizes(c, t, s, &layout);
        let mut p = [0; 14];
        for (slot, &bytes) in p.iter_mut().zip(sizes.iter()) {
            *slot = arena.take(bytes.max(1))?;
        }
        Ok(Self {
            max_tokens: t,
            max_seqs: s,
            block_size: bs,
            layout,
            inputs: p[0],
            inputs_host: Pinned::new(gpu, layout.len)?,
            x: p[1],
            xn: p[2],
            qkv: p[3],
            q: p[4],
            attn: p[5],
            gate_up: p[6],
            act: p[7],
            last: p[8],
            logits: p[9],
            sampled: p[10],
            part_acc: p[11],
            part_ml: p[12],
            sumsq: p[13],
            arena,
            kv_layers: Vec::new(),
            kv: None,
        })
    }

    /// Bytes of the workspace arena.
    pub fn workspace_size(&self) -> usize {
        self.arena.size()
    }

    /// (Re)allocates the KV pool with `blocks` blocks per layer.
    pub fn set_kv(
        &mut self,
        gpu: &Gpu,
        c: &ModelConfig,
        blocks: usize,
        bs: usize,
    ) -> Result<(), CudaError> {
        self.drop_kv();
        let per_layer = blocks * bs * c.kv_dim() * 2;
        let mut arena = Arena::new(
            gpu,
            "kv cache",
            Arena::size_of(vec![per_layer; 2 * c.num_layers]),
        )?;
        self.kv_layers = (0..c.num_layers)
            .map(|_| Ok((arena.take(per_layer)?, arena.take(per_layer)?)))
            .collect::<Result<_, CudaError>>()?;
        self.kv = Some(arena);
        Ok(())
    }

    /// Gives the workspace's and the KV pool's device memory back,
    /// keeping their addresses (contents are lost).
    pub fn unmap(&mut self) -> Result<(), CudaError> {
        self.arena.unmap()?;
        if let Some(kv) = &mut self.kv {
            kv.unmap()?;
        }
        Ok(())
    }

    /// Maps them again at the same addresses; `SumSq` starts empty, as
    /// after [`Buffers::new`].
    pub fn remap(&mut self, gpu: &Gpu) -> Result<(), CudaError> {
        self.arena.remap()?;
        if let Some(kv) = &mut self.kv {
            kv.remap()?;
        }
        gpu.upload(self.sumsq, &vec![0u32; SUMSQ_BYTES / 4])
    }

    /// Frees the KV pool.
    pub fn drop_kv(&mut self) {
        self.kv_layers.clear();
        self.kv = None;
    }

    /// Lays out an arbitrary batch (eager step).
    pub fn prepare(
        &mut self,
        batch: &ForwardBatch<'_>,
        num_sms: usize,
        c: &ModelConfig,
        prefill: bool,
    ) -> StepPlan {
        let (l, bs) = (self.layout, self.block_size);
        let stride = batch
            .chunks
            .iter()
            .map(|ch| ch.block_table.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let host = self.inputs_host.as_mut_slice();
        let (mut t, mut n_decode, mut n_tiles, mut max_ctx) = (0, 0, 0, 1);
        for (s, ch) in batch.chunks.iter().enumerate() {
            let first = t;
            for (i, &tok) in ch.tokens.iter().enumerate() {
                let pos = ch.start_pos + i;
                write_token(
                    host,
                    &l,
                    t,
                    tok as i32,
                    pos,
                    ch.block_table[pos / bs] as usize * bs + pos % bs,
                    s,
                );
                t += 1;
            }
            host[l.last_rows + s] = (t - 1) as i32;
            if prefill && ch.tokens.len() >= PREFILL_MIN_TOKENS {
                let tile_tokens = PREFILL_TILE / (c.num_heads / c.num_kv_heads);
                for start in (0..ch.tokens.len()).step_by(tile_tokens) {
                    let n = tile_tokens.min(ch.tokens.len() - start);
                    host[l.tiles + 3 * n_tiles..l.tiles + 3 * n_tiles + 3].copy_from_slice(&[
                        (first + start) as i32,
                        n as i32,
                        s as i32,
                    ]);
                    n_tiles += 1;
                }
            } else {
                for tok in first..t {
                    host[l.decode_ids + n_decode] = tok as i32;
                    n_decode += 1;
                }
                max_ctx = max_ctx.max(ch.end_pos());
            }
            write_table(host, &l, s, stride, ch.block_table);
        }
        host[l.stride] = stride as i32;
        let splits = decode_splits(n_decode, max_ctx, num_sms, c);
        StepPlan {
            tokens: t,
            seqs: batch.chunks.len(),
            decode_tokens: n_decode,
            decode_list: true,
            tiles: n_tiles,
            splits,
            upload_len: l.tables + batch.chunks.len() * stride,
            graph_size: None,
        }
    }

    /// Lays out a decode batch padded to a graph's `size`: padded rows
    /// read and write only the scratch block.
    pub fn prepare_graph_decode(
        &mut self,
        batch: &ForwardBatch<'_>,
        size: usize,
        scratch: u32,
        num_sms: usize,
        c: &ModelConfig,
    ) -> StepPlan {
        let (l, bs) = (self.layout, self.block_size);
        let stride = batch
            .chunks
            .iter()
            .map(|ch| ch.block_table.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let host = self.inputs_host.as_mut_slice();
        for s in 0..size {
            match batch.chunks.get(s) {
                Some(ch) => {
                    let pos = ch.start_pos;
                    let slot = ch.block_table[pos / bs] as usize * bs + pos % bs;
                    write_token(host, &l, s, ch.tokens[0] as i32, pos, slot, s);
                    write_table(host, &l, s, stride, ch.block_table);
                }
                None => {
                    write_token(host, &l, s, 0, 0, scratch as usize * bs, s);
                    write_table(host, &l, s, stride, &[scratch]);
                }
            }
            host[l.last_rows + s] = s as i32;
        }
        host[l.stride] = stride as i32;
        StepPlan {
            tokens: size,
            seqs: size,
            decode_tokens: size,
            decode_list: false,
            tiles: 0,
            splits: graph_splits(size, num_sms, c),
            upload_len: l.tables + size * stride,
            graph_size: Some(size),
        }
    }

    /// Sets the final norm's gather list to `rows` (token rows of the last
    /// step, at most `max_seqs`) and uploads it. The caller syncs the
    /// stream before the next call rewrites the pinned staging.
    pub fn upload_last_rows(&mut self, gpu: &Gpu, rows: &[i32]) -> Result<(), CudaError> {
        let at = self.layout.last_rows;
        if rows.len() > self.max_seqs {
            return Err(CudaError::Unsupported(format!(
                "{} gathered rows exceed the {} logits rows",
                rows.len(),
                self.max_seqs
            )));
        }
        let dst = self.input(at);
        let host = &mut self.inputs_host.as_mut_slice()[at..at + rows.len()];
        host.copy_from_slice(rows);
        gpu.upload(dst, host)
    }

    /// Copies the step's inputs to the device (stream-ordered).
    pub fn upload(&self, gpu: &Gpu, plan: &StepPlan) -> Result<(), CudaError> {
        gpu.upload(self.inputs, &self.inputs_host.as_slice()[..plan.upload_len])
    }

    fn input(&self, offset: usize) -> DevPtr {
        self.inputs + (offset * 4) as u64
    }
}

/// Splits of each decode token's keys: enough blocks to fill the GPU at
/// small batch, and blocks of at most ~[`KEYS_PER_SPLIT`] keys at large
/// batch, so the last wave of long blocks does not idle most SMs.
fn decode_splits(tokens: usize, max_ctx: usize, num_sms: usize, c: &ModelConfig) -> usize {
    let tokens = tokens.max(1);
    let fill = (2 * num_sms).div_ceil(tokens * c.num_kv_heads);
    let by_length = max_ctx.div_ceil(KEYS_PER_SPLIT);
    fill.max(by_length)
        .min(max_ctx.div_ceil(16))
        .min(MAX_SPLITS)
        .min(PART_ROWS / tokens)
        .max(1)
}

/// Splits for a graph of `size` decode rows, fixed at capture for the
/// longest context (empty splits exit at once).
fn graph_splits(size: usize, num_sms: usize, c: &ModelConfig) -> usize {
    decode_splits(size, c.max_context, num_sms, c)
}

/// Row `s` of the block tables, zero-padded to `stride`.
fn write_table(host: &mut [i32], l: &InputLayout, s: usize, stride: usize, blocks: &[u32]) {
    let row = &mut host[l.tables + s * stride..l.tables + (s + 1) * stride];
    row.fill(0);
    for (dst, &b) in row.iter_mut().zip(blocks) {
        *dst = b as i32;
    }
}

fn write_token(
    host: &mut [i32],
    l: &InputLayout,
    t: usize,
    id: i32,
    pos: usize,
    slot: usize,
    seq: usize,
) {
    host[l.ids + t] = id;
    host[l.positions + t] = pos as i32;
    host[l.token_seq + t] = seq as i32;
    let slot = slot as i64;
    host[l.slots + 2 * t] = slot as i32;
    host[l.slots + 2 * t + 1] = (slot >> 32) as i32;
}

/// Rewrites the inputs of the decode step just enqueued into those of the
/// step after it (next token = the one picked, one position further).
pub fn advance_decode(gpu: &Gpu, k: &Kernels, b: &Buffers, rows: usize) -> Result<(), CudaError> {
    let l = b.layout;
    let args = [
        Arg::Ptr(b.input(l.ids)),
        Arg::Ptr(b.input(l.positions)),
        Arg::Ptr(b.input(l.slots)),
        Arg::Ptr(b.sampled),
        Arg::I32(rows as i32),
    ];
    gpu.launch(
        &k.advance_decode,
        (rows.div_ceil(128) as u32, 1, 1),
        128,
        0,
        &args,
    )
}

/// q/k/v projection, bias, q/k norm, rotary embedding and the paged KV
/// write: one fused GEMV at small batch (models without q/k norm), else a
/// GEMM followed by `rope_qkv`.
fn project_qkv(
    m: &Model<'_>,
    layer: &LayerWeights,
    t: usize,
    (k_cache, v_cache): (DevPtr, DevPtr),
    fused_norm: bool,
    mark: &mut impl FnMut(Category) -> Result<(), CudaError>,
) -> Result<(), CudaError> {
    use Arg::{Ptr, F32, I32};
    let Model {
        gpu,
        gemm,
        kernels: k,
        weights: w,
        buffers: b,
        config: c,
    } = *m;
    let l = b.layout;
    let (d, hd) = (c.hidden_size, c.head_dim);
    let width = c.q_dim() + 2 * c.kv_dim();
    let (positions, slots) = (b.input(l.positions), b.input(l.slots));
    let heads = (
        I32(c.num_heads as i32),
        I32(c.num_kv_heads as i32),
        I32(hd as i32),
    );
    if let Some(fused) = gemm
        .qkv_rope_kernel(t, d, fused_norm)
        .filter(|_| layer.qk_norm.is_none())
    {
        // xn holds the normed activations, or (fused norm) the pre-scaled
        // residual that the kernel scales by 1/rms.
        let input: &[Arg] = if fused_norm {
            &[Ptr(b.xn), F32(c.rms_norm_eps), Ptr(b.sumsq)]
        } else {
            &[Ptr(b.xn)]
        };
        let rest = [
            Ptr(layer.qkv),
            I32(d as i32),
            Ptr(layer.qkv_bias.unwrap_or(0)),
            Ptr(positions),
            Ptr(slots),
            Ptr(w.cos),
            Ptr(w.sin),
            Ptr(b.q),
            Ptr(k_cache),
            Ptr(v_cache),
            heads.0,
            heads.1,
            heads.2,
            I32(b.block_size as i32),
        ];
        let args: Vec<Arg> = input.iter().chain(&rest).copied().collect();
        // Two warps (of 8 per block) per rotary pair.
        let grid = (width.div_ceil(8) as u32, 1, 1);
        gpu.launch(fused, grid, 256, 0, &args)?;
        return mark(Category::Gemm);
    }
    // xn: the normed activations, or (fused norm, q/k norm layers at GEMV
    // sizes) the pre-scaled residual.
    if !fused_norm {
        gemm.linear(gpu, b.xn, layer.qkv, b.qkv, t, d, width, OutType::Bf16)?;
    } else if !gemm.linear_normed(gpu, (b.xn, layer.qkv, b.qkv), t, d, width, c.rms_norm_eps)? {
        return Err(CudaError::Unsupported(format!(
            "a fused RMSNorm for {t} tokens (GEMV sizes only)"
        )));
    }
    mark(Category::Gemm)?;
    let (q_norm, k_norm) = layer.qk_norm.unwrap_or((0, 0));
    let args = [
        Ptr(b.qkv),
        Ptr(layer.qkv_bias.unwrap_or(0)),
        Ptr(q_norm),
        Ptr(k_norm),
        Ptr(positions),
        Ptr(slots),
        Ptr(w.cos),
        Ptr(w.sin),
        Ptr(b.q),
        Ptr(k_cache),
        Ptr(v_cache),
        heads.0,
        heads.1,
        heads.2,
        F32(c.rms_norm_eps),
        I32(b.block_size as i32),
    ];
    // A warp per head, ROPE_WARPS heads per block.
    let heads = (c.num_heads + 2 * c.num_kv_heads).div_ceil(ROPE_WARPS) as u32;
    gpu.launch(
        &k.rope_qkv,
        (t as u32, heads, 1),
        32 * ROPE_WARPS as u32,
        0,
        &args,
    )?;
    mark(Category::Other)
}

/// `out[r] = RMSNorm(x[r]) · weight` for `rows` rows of the residual stream;
/// with `gather` (a device list of row indices, or 0) row r reads x[gather[r]].
fn rms_norm(
    m: &Model<'_>,
    rows: usize,
    gather: DevPtr,
    weight: DevPtr,
    out: DevPtr,
) -> Result<(), CudaError> {
    let (b, c) = (m.buffers, m.config);
    let args = [
        Arg::Ptr(b.x),
        Arg::Ptr(0), // no residual delta: o_proj/down already added into x
        Arg::Ptr(gather),
        Arg::Ptr(weight),
        Arg::Ptr(out),
        Arg::I32(c.hidden_size as i32),
        Arg::F32(c.rms_norm_eps),
    ];
    let threads = row_threads(c.hidden_size);
    m.gpu.launch(
        &m.kernels.add_rms_norm,
        (rows as u32, 1, 1),
        threads,
        0,
        &args,
    )
}

/// Threads for row-wise kernels over `d` elements.
fn row_threads(d: usize) -> u32 {
    if d >= 2048 {
        512
    } else {
        256
    }
}

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

/// Enqueues the final norm and LM head of `rows` residual rows left by the
/// last [`encode`] (their indices uploaded by
/// [`Buffers::upload_last_rows`]); their logits land in `logits`. Scored
/// prompt positions take this path after the step, in groups of at most
/// `max_seqs` rows.
pub fn project_rows(m: &Model<'_>, rows: usize) -> Result<(), CudaError> {
    let (b, c, w) = (m.buffers, m.config, m.weights);
    rms_norm(m, rows, b.input(b.layout.last_rows), w.norm, b.last)?;
    m.gemm.linear(
        m.gpu,
        b.last,
        w.lm_head,
        b.logits,
        rows,
        c.hidden_size,
        c.vocab_size,
        OutType::F32,
    )
}

/// Enqueues the whole decoder for `plan` on the stream: embedding, every
/// layer, final norm of each sequence's last token, LM head and argmax.
pub fn encode(
    m: &Model<'_>,
    plan: &StepPlan,
    mut marks: Option<&mut Marks>,
) -> Result<(), CudaError> {
    let Model {
        gpu,
        gemm,
        kernels: k,
        weights: w,
        buffers: b,
        config: c,
    } = *m;
    let l = b.layout;
    let mut mark = |cat: Category| match marks.as_deref_mut() {
        Some(m) => m.mark(gpu, cat),
        None => Ok(()),
    };
    let (d, qd, hd, ff) = (c.hidden_size, c.q_dim(), c.head_dim, c.intermediate_size);
    let (heads, kv_heads) = (c.num_heads as i32, c.num_kv_heads as i32);
    let t = plan.tokens;
    let (t32, d32) = (t as u32, d as i32);
    let eps = c.rms_norm_eps;
    // At GEMV batch sizes the RMSNorms run inside the GEMVs that consume
    // them, from the sums of squares that the residual's writer (embedding
    // or accumulating GEMV) left: no norm kernels between the projections.
    let fuse_norms = t <= GEMV_MAX_TOKENS && d.div_ceil(8) <= SUMSQ_MAX_BLOCKS;
    let scale_log2 = std::f32::consts::LOG2_E / (hd as f32).sqrt();
    let (ids, positions) = (b.input(l.ids), b.input(l.positions));
    let (token_seq, tables, stride) = (b.input(l.token_seq), b.input(l.tables), b.input(l.stride));
    let decode_ids = if plan.decode_list {
        b.input(l.decode_ids)
    } else {
        0
    };
    use Arg::{Ptr, F32, I32};

    // A fused norm reads xg = bf16(x ⊙ g) (in xn) that the residual's
    // writer leaves: every attention norm (the q/k/v GEMV also does rope
    // for layers without q/k norm) and every MLP norm.
    let fused_attn_norm = |i: usize| {
        w.layers
            .get(i)
            .filter(|_| fuse_norms)
            .map(|l| (l.attn_norm, b.xn))
    };
    let [embed_norm, embed_xg] =
        fused_attn_norm(0).map_or([Ptr(0), Ptr(0)], |(g, xg)| [Ptr(g), Ptr(xg)]);
    gpu.launch(
        &k.embed_rows,
        (t32, 1, 1),
        256,
        0,
        &[
            Ptr(ids),
            Ptr(w.embed),
            Ptr(b.x),
            I32(d32),
            Ptr(b.sumsq),
            embed_norm,
            embed_xg,
        ],
    )?;
    mark(Category::Other)?;
    for (i, (layer, &(k_cache, v_cache))) in w.layers.iter().zip(&b.kv_layers).enumerate() {
        let fuse_attn_norm = fused_attn_norm(i).is_some();
        if !fuse_attn_norm {
            rms_norm(m, t, 0, layer.attn_norm, b.xn)?;
            mark(Category::Other)?;
        }
        project_qkv(m, layer, t, (k_cache, v_cache), fuse_attn_norm, &mut mark)?;
        if plan.decode_tokens > 0 {
            let n = plan.decode_tokens as u32;
            // The output projection streams its weights only at GEMV sizes.
            let o_bytes = if t <= GEMV_MAX_TOKENS { qd * d * 2 } else { 0 };
            let [pf_base, pf_bytes, pf_mode] = k.l2_prefetch.args(layer.o_proj, o_bytes);
            let args = [
                Ptr(b.q),
                Ptr(k_cache),
                Ptr(v_cache),
                Ptr(tables),
                Ptr(stride),
                Ptr(token_seq),
                Ptr(positions),
                Ptr(decode_ids),
                Ptr(b.attn),
                Ptr(b.part_acc),
                Ptr(b.part_ml),
                I32(heads),
                I32(kv_heads),
                I32(b.block_size as i32),
                F32(scale_log2),
                I32(plan.splits as i32),
                pf_base,
                pf_bytes,
                pf_mode,
            ];
            let grid = (n, kv_heads as u32, plan.splits as u32);
            gpu.launch(&k.decode_attention, grid, 128, 0, &args)?;
            if plan.splits > 1 {
                let args = [
                    Ptr(b.part_acc),
                    Ptr(b.part_ml),
                    Ptr(decode_ids),
                    Ptr(b.attn),
                    I32(heads),
                    I32(hd as i32),
                    I32(plan.splits as i32),
                ];
                gpu.launch(&k.combine, (n, heads as u32, 1), 128, 0, &args)?;
            }
        }
        if plan.tiles > 0 {
            let (kernel, smem) = k.prefill_attention.as_ref().ok_or_else(|| {
                CudaError::Unsupported("prefill tiles without a prefill kernel".into())
            })?;
            let args = [
                Ptr(b.q),
                Ptr(k_cache),
                Ptr(v_cache),
                Ptr(tables),
                Ptr(stride),
                Ptr(b.input(l.tiles)),
                Ptr(positions),
                Ptr(b.attn),
                I32(heads),
                I32(kv_heads),
                I32(b.block_size as i32),
                F32(scale_log2),
            ];
            gpu.launch(
                kernel,
                (plan.tiles as u32, kv_heads as u32, 1),
                128,
                *smem,
                &args,
            )?;
        }
        mark(Category::Attention)?;
        let mlp_norm = fuse_norms.then_some((layer.mlp_norm, b.xn));
        gemm.accumulate(gpu, b.attn, layer.o_proj, b.x, t, qd, d, mlp_norm)?;
        mark(Category::Gemm)?;
        if !fuse_norms {
            rms_norm(m, t, 0, layer.mlp_norm, b.xn)?;
            mark(Category::Other)?;
        }
        // Small batches fuse the activation into the gate/up projection.
        let norm_eps = fuse_norms.then_some(eps);
        if !gemm.swiglu(gpu, (b.xn, layer.gate_up, b.act), t, d, ff, norm_eps)? {
            let gate_up = b.gate_up;
            gemm.linear(
                gpu,
                b.xn,
                layer.gate_up,
                gate_up,
                t,
                d,
                2 * ff,
                OutType::Bf16,
            )?;
            mark(Category::Gemm)?;
            let silu_grid = (t32, ff.div_ceil(8 * 256) as u32, 1);
            let silu_args = [Ptr(gate_up), Ptr(b.act), I32(ff as i32)];
            gpu.launch(&k.silu_mul, silu_grid, 256, 0, &silu_args)?;
            mark(Category::Other)?;
        }
        let next_norm = fused_attn_norm(i + 1);
        gemm.accumulate(gpu, b.act, layer.down, b.x, t, ff, d, next_norm)?;
        mark(Category::Gemm)?;
    }
    let s = plan.seqs;
    let last_rows = b.input(l.last_rows);
    rms_norm(m, s, last_rows, w.norm, b.last)?;
    mark(Category::Other)?;
    gemm.linear(
        gpu,
        b.last,
        w.lm_head,
        b.logits,
        s,
        d,
        c.vocab_size,
        OutType::F32,
    )?;
    mark(Category::Gemm)?;
    let argmax_args = [Ptr(b.logits), I32(c.vocab_size as i32), Ptr(b.sampled)];
    gpu.launch(&k.argmax_rows, (s as u32, 1, 1), 1024, 0, &argmax_args)?;
    mark(Category::Other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_models::{Architecture, RopeConfig, RopeScaling};

    #[test]
    fn l2_prefetch_specs_parse_strictly() {
        let parse = |s| L2PrefetchSpec::parse(Some(s));
        let spec = |mib, mode| L2PrefetchSpec { mib, mode };
        assert_eq!(L2PrefetchSpec::parse(None).ok(), Some(spec(None, None)));
        assert_eq!(parse("8").ok(), Some(spec(Some(8), None)));
        assert_eq!(parse("0").ok(), Some(spec(Some(0), None)));
        assert_eq!(parse(" 12 : 3 ").ok(), Some(spec(Some(12), Some(3))));
        for bad in ["", "lots", "8:", "8:x", "-1", ":1", "8:1:2"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let default = L2Prefetch::new(48 << 20, spec(None, None));
        assert_eq!((default.bytes, default.mode), (8 << 20, 1));
        let off = L2Prefetch::new(48 << 20, spec(Some(0), Some(0)));
        assert_eq!((off.bytes, off.mode), (0, 0));
    }

    fn llama8b() -> ModelConfig {
        ModelConfig {
            architecture: Architecture::Llama,
            hidden_size: 4096,
            intermediate_size: 14336,
            num_layers: 32,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            vocab_size: 128256,
            max_context: 4096,
            rms_norm_eps: 1e-5,
            rope: RopeConfig {
                theta: 500000.0,
                scaling: RopeScaling::None,
            },
            qkv_bias: false,
            qk_norm: false,
            tie_word_embeddings: false,
        }
    }

    #[test]
    fn splits_fill_the_gpu_at_batch_one_and_stay_within_the_partials() {
        let c = llama8b();
        // One token, long context: many splits (capped).
        assert_eq!(decode_splits(1, 4096, 132, &c), MAX_SPLITS);
        // Short contexts never get splits shorter than 16 keys.
        assert_eq!(decode_splits(1, 40, 132, &c), 3);
        // Large batches: splits by length, within the partial buffer.
        for tokens in [64, 128, 256, 512, 1024, 2048] {
            let s = decode_splits(tokens, 4096, 132, &c);
            assert!(s >= 1 && tokens * s <= PART_ROWS, "{tokens}: {s}");
        }
        assert_eq!(decode_splits(256, 1024, 132, &c), 4);
    }

    #[test]
    fn input_regions_do_not_overlap() {
        let l = InputLayout::new(512, 64, 256);
        let regions = [
            (l.slots, 2 * 512),
            (l.ids, 512),
            (l.positions, 512),
            (l.token_seq, 512),
            (l.decode_ids, 512),
            (l.tiles, 3 * (512 * 8 / PREFILL_TILE + 64 + 1)),
            (l.last_rows, 64),
            (l.stride, 2),
            (l.tables, 64 * 256),
        ];
        for w in regions.windows(2) {
            assert_eq!(w[0].0 + w[0].1, w[1].0, "{regions:?}");
        }
        assert_eq!(l.tables + 64 * 256, l.len);
        // i64 slots start 8-byte aligned.
        assert_eq!(l.slots % 2, 0);
    }

    #[test]
    fn prefill_shared_memory_fits_hopper() {
        // 227 KiB per SM on sm_90: four blocks per SM for head_dim 128
        // (the kernel's launch bounds).
        assert!(prefill_shared_bytes(128) * 4 <= 227 * 1024);
        assert!(prefill_shared_bytes(64) <= 163 * 1024, "sm_80 limit");
    }
}
