//! The step's inputs and buffers: the input region laid out for a single
//! upload (token ids, positions, KV slots, block tables, attention tiles),
//! the activation workspace and the KV pool (one K/V buffer pair per layer
//! of a page, see [`KvViews`]).

use ingot_models::ModelConfig;
use ingot_runner::ForwardBatch;

use cudarc::driver::CudaEvent;

use crate::device::{Arena, DevPtr, Gpu, Pinned};
use crate::gemm::GEMV_MAX_TOKENS;
use crate::kernels::{self, KvDtype, PREFILL_TILE};
use crate::kv_views::KvViews;
use crate::CudaError;

/// Chunks at least this long use the tensor-core prefill attention.
const PREFILL_MIN_TOKENS: usize = 8;
/// Bytes of the kernels' `SumSq` (common.cuh): the block count padded to 8
/// words, and the block partials of every row.
pub const SUMSQ_BYTES: usize = 4 * (8 + SUMSQ_ROWS * SUMSQ_MAX_BLOCKS);
/// Most blocks of an accumulating GEMV that can leave sums of squares
/// (one per 8 output columns).
pub(crate) const SUMSQ_MAX_BLOCKS: usize = 4096;
/// Rows `SumSq` holds: every GEMV batch size.
const SUMSQ_ROWS: usize = 8;
const _: () = assert!(GEMV_MAX_TOKENS <= SUMSQ_ROWS);

/// Most (token, split) rows of split-K partial results.
const PART_ROWS: usize = 2048;
/// Keys per split that make a block long enough to be worth its launch.
const KEYS_PER_SPLIT: usize = 256;
/// Decode rows from which the GPU is filled by rows and kv heads alone, so
/// splits are sized for long blocks rather than for parallelism.
const LARGE_BATCH_ROWS: usize = 9;
/// The longest split at large batch: one row far longer than the others
/// must not leave a block of all its keys running alone at the end (a
/// block streams ~7 GB/s of the ~2.7 TB/s the launch gets: 4,096 FP8 keys
/// are ~150 us, a layer's 256 x 1k ~210 us).
const LARGE_BATCH_MAX_SPLIT_KEYS: usize = 4096;
/// Blocks per SM a large-batch decode launch aims at: splits beyond that
/// only add each block's fixed start (Q, block-table and first-tile
/// latency) and its partials, which at 256 x 1k dominated the blocks of
/// ~136 keys that a 4,096-token graph's splits gave. The kernels stream
/// K/V near the DRAM rate, so a last wave's idle SMs cost less than more
/// splits: at 64 and 256 rows one split was fastest on an H100
/// (docs/perf/large-batch.md, att22).
const LARGE_BATCH_BLOCKS_PER_SM: usize = 4;
/// Blocks per SM that fill the GPU at small batch.
const FILL_BLOCKS_PER_SM: usize = 2;
/// Most splits of one token's keys (`attention_combine` weighs a split per
/// lane of one warp: at most 32).
const MAX_SPLITS: usize = 32;
/// Split counts a graph of at most [`GEMV_MAX_TOKENS`] rows is captured
/// with (see [`graph_split_counts`]). Measured on an H100 at batch 1
/// (`tests/gpu/bench_decode_splits.py`, SmolLM2's and the 8B's heads, bf16
/// and FP8 caches): attention + combine is fastest with one split up to
/// ~64 keys, 8 splits up to ~512, 16 up to ~1,500, 32 beyond; 2 to 4
/// splits never win (their blocks walk too many keys one after another).
const SMALL_GRAPH_SPLITS: [usize; 4] = [1, 8, 16, 32];
/// Keys per split a small graph's step may give each attention block
/// before the next captured split count pays (see [`pick_splits`]).
const SMALL_KEYS_PER_SPLIT: usize = 64;

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
    /// i32 elements of each further view's table (sequences × stride).
    table_len: usize,
    /// The captured graph this step replays (its padded size).
    pub graph_size: Option<usize>,
}

/// Offsets (in i32 elements) of the step inputs inside one region that is
/// mirrored in pinned host memory and copied up in one transfer. A layout
/// of several [`KvViews`] adds, per further view, its KV-write slots and
/// table (one more transfer each); with one view the region is what it
/// was before layer groups.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InputLayout {
    pub(crate) slots: usize,
    pub(crate) ids: usize,
    pub(crate) positions: usize,
    pub(crate) token_seq: usize,
    pub(crate) decode_ids: usize,
    pub(crate) tiles: usize,
    pub(crate) last_rows: usize,
    pub(crate) stride: usize,
    pub(crate) tables: usize,
    /// Views staged (1 without sliding windows).
    views: usize,
    /// Where view 1's slots start; views after it follow every `view_len`.
    extra: usize,
    /// i32 elements of a further view: its slots, then its table.
    view_len: usize,
    /// Slots before a further view's table (2 per token).
    view_slots: usize,
    pub(crate) len: usize,
}

impl InputLayout {
    fn new(max_tokens: usize, max_seqs: usize, max_blocks: usize, views: usize) -> Self {
        // Tiles hold PREFILL_TILE / G tokens (at least 16: G is at most 8).
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
        let end = tables + max_seqs * max_blocks;
        // i64 slots start 8-byte aligned.
        let extra = end.next_multiple_of(2);
        let view_slots = 2 * max_tokens;
        let view_len = (view_slots + max_seqs * max_blocks).next_multiple_of(2);
        let len = match views {
            1 => end,
            _ => extra + (views - 1) * view_len,
        };
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
            views,
            extra,
            view_len,
            view_slots,
            len,
        }
    }

    /// Where view `v`'s KV-write slots (i64 per token) start.
    pub(crate) fn slots_of(&self, v: usize) -> usize {
        match v {
            0 => self.slots,
            _ => self.extra + (v - 1) * self.view_len,
        }
    }

    /// Where view `v`'s block tables start.
    pub(crate) fn tables_of(&self, v: usize) -> usize {
        match v {
            0 => self.tables,
            _ => self.slots_of(v) + self.view_slots,
        }
    }
}

/// The activation workspace, the step inputs and the KV pool.
pub struct Buffers {
    pub max_tokens: usize,
    pub max_seqs: usize,
    pub(crate) block_size: usize,
    pub(crate) layout: InputLayout,
    /// The tables and buffers layers read.
    pub(crate) views: KvViews,
    inputs: DevPtr,
    /// Two pinned mirrors of the input region, used in turn: the next step
    /// is staged in one while the other's copy may still be queued.
    inputs_host: [Pinned<i32>; 2],
    /// The mirror the last step was staged in.
    turn: usize,
    /// Per mirror: recorded after its last copy up was enqueued.
    uploaded: [Option<CudaEvent>; 2],
    pub(crate) x: DevPtr,
    pub(crate) xn: DevPtr,
    pub(crate) qkv: DevPtr,
    pub(crate) q: DevPtr,
    pub(crate) attn: DevPtr,
    pub(crate) gate_up: DevPtr,
    pub(crate) act: DevPtr,
    pub(crate) last: DevPtr,
    pub logits: DevPtr,
    pub sampled: DevPtr,
    pub(crate) part_acc: DevPtr,
    pub(crate) part_ml: DevPtr,
    /// `SumSq` (common.cuh): row sums of squares for fused RMSNorms.
    pub sumsq: DevPtr,
    /// The expert blocks' scratch (empty for a dense model).
    pub(crate) moe: MoeScratch,
    /// Tensor parallel: this rank's LM-head logits `[seqs, vocab_rows]`
    /// f32, and every rank's gathered `[ranks, seqs, vocab_rows]`.
    pub(crate) head_shard: DevPtr,
    pub(crate) head_gather: DevPtr,
    arena: Arena,
    /// (k, v) per layer of a page (every layer without sliding windows),
    /// `[pages, kv_heads, block_size, head_dim]` of `kv_dtype` each.
    pub(crate) kv_slices: Vec<(DevPtr, DevPtr)>,
    pub(crate) kv_dtype: KvDtype,
    kv: Option<Arena>,
    /// Batch-invariant attention: every token through the decode kernel
    /// in one split (see [`batch_invariant`]).
    pub deterministic: bool,
}

/// The expert blocks' buffers: router logits `[tokens, experts]` f32,
/// each token's experts `[tokens, top_k]` i32 and weights f32, and the
/// experts' activations `[tokens, top_k, width]` bf16; for the grouped
/// GEMMs (`grouped_min_tokens > 0`), the slots sorted by expert, each
/// tile's expert and every slot's down product `[tokens, top_k, hidden]`
/// f32.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MoeScratch {
    pub logits: DevPtr,
    pub ids: DevPtr,
    pub weights: DevPtr,
    pub act: DevPtr,
    pub sorted: DevPtr,
    pub tile_expert: DevPtr,
    pub out: DevPtr,
    /// Steps of at least this many tokens take the grouped GEMMs (0:
    /// never; `cuda.moe_grouped_min_tokens`).
    pub grouped_min_tokens: usize,
}

/// Bytes of the [`MoeScratch`] buffers for `t` tokens, in its order; the
/// grouped GEMMs' only when `grouped`.
fn moe_sizes(c: &ModelConfig, t: usize, grouped: bool) -> [usize; 7] {
    match &c.block.moe {
        Some(m) => {
            let slots = t * m.experts_per_token;
            let tiles = kernels::moe_grouped_tiles(slots, m.num_experts);
            let g = usize::from(grouped);
            [
                t * m.num_experts * 4,
                slots * 4,
                slots * 4,
                slots * m.expert_intermediate_size * 2,
                g * kernels::moe_sorted_bytes(slots, m.num_experts),
                g * tiles * 4,
                g * slots * c.hidden_size * 4,
            ]
        }
        None => [0; 7],
    }
}

/// Bytes of one K (or V) buffer of `pages` pages.
fn kv_slice_bytes(c: &ModelConfig, pages: usize, bs: usize, dtype: KvDtype) -> usize {
    pages * bs * c.kv_dim() * dtype.bytes()
}

/// Bytes of one KV page (every layer of a page, K and V).
pub(crate) fn kv_page_bytes(c: &ModelConfig, bs: usize, dtype: KvDtype) -> usize {
    KvViews::of(c).slices() * 2 * kv_slice_bytes(c, 1, bs, dtype)
}

/// Bytes of each workspace buffer, in the order [`Buffers::new`] takes them.
fn piece_sizes(
    c: &ModelConfig,
    t: usize,
    s: usize,
    layout: &InputLayout,
    moe_grouped: bool,
) -> [usize; 23] {
    let (d, qd, kvd, ff, v) = (
        c.hidden_size,
        c.q_dim(),
        c.kv_dim(),
        c.intermediate_size,
        c.vocab_size,
    );
    let moe = moe_sizes(c, t, moe_grouped);
    // Tensor parallel: this rank's LM-head rows, and every rank's gathered.
    let (head_rows, ranks) = c
        .shard
        .map_or((0, 0), |sh| (s * sh.vocab_rows * 4, sh.size));
    let sizes = [
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
        moe[0],
        moe[1],
        moe[2],
        moe[3],
        moe[4],
        moe[5],
        moe[6],
        head_rows,
        ranks * head_rows,
    ];
    // An empty piece still gets its own address (one alignment unit).
    sizes.map(|b| b.max(1))
}

impl Buffers {
    fn layout(c: &ModelConfig, t: usize, s: usize, bs: usize) -> InputLayout {
        InputLayout::new(t, s, c.max_context.div_ceil(bs), KvViews::of(c).count())
    }

    /// Workspace bytes for `t` tokens and `s` sequences per step, with the
    /// grouped expert GEMMs' scratch when `moe_grouped_min_tokens > 0`.
    pub fn bytes(
        c: &ModelConfig,
        t: usize,
        s: usize,
        bs: usize,
        moe_grouped_min_tokens: usize,
    ) -> usize {
        let layout = Self::layout(c, t, s, bs);
        Arena::size_of(piece_sizes(c, t, s, &layout, moe_grouped_min_tokens > 0))
    }

    /// Carves the workspace out of `arena` (which also holds cuBLASLt's).
    pub fn new(
        gpu: &Gpu,
        c: &ModelConfig,
        (t, s, bs): (usize, usize, usize),
        moe_grouped_min_tokens: usize,
        mut arena: Arena,
    ) -> Result<Self, CudaError> {
        let layout = Self::layout(c, t, s, bs);
        let sizes = piece_sizes(c, t, s, &layout, moe_grouped_min_tokens > 0);
        let mut p = [0; 23];
        for (slot, &bytes) in p.iter_mut().zip(sizes.iter()) {
            *slot = arena.take(bytes)?;
        }
        Ok(Self {
            max_tokens: t,
            max_seqs: s,
            block_size: bs,
            layout,
            views: KvViews::of(c),
            inputs: p[0],
            inputs_host: [Pinned::new(gpu, layout.len)?, Pinned::new(gpu, layout.len)?],
            turn: 0,
            uploaded: [None, None],
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
            moe: MoeScratch {
                logits: p[14],
                ids: p[15],
                weights: p[16],
                act: p[17],
                sorted: p[18],
                tile_expert: p[19],
                out: p[20],
                grouped_min_tokens: moe_grouped_min_tokens,
            },
            head_shard: p[21],
            head_gather: p[22],
            arena,
            kv_slices: Vec::new(),
            kv_dtype: KvDtype::Bf16,
            kv: None,
            deterministic: false,
        })
    }

    /// Bytes of the workspace arena.
    pub fn workspace_size(&self) -> usize {
        self.arena.size()
    }

    /// (Re)allocates the KV pool with `pages` pages per buffer of `dtype`.
    pub fn set_kv(
        &mut self,
        gpu: &Gpu,
        c: &ModelConfig,
        (pages, bs): (usize, usize),
        dtype: KvDtype,
    ) -> Result<(), CudaError> {
        self.drop_kv();
        let per_slice = kv_slice_bytes(c, pages, bs, dtype);
        self.kv_dtype = dtype;
        let slices = self.views.slices();
        let mut arena = Arena::new(gpu, "kv cache", Arena::size_of(vec![per_slice; 2 * slices]))?;
        self.kv_slices = (0..slices)
            .map(|_| Ok((arena.take(per_slice)?, arena.take(per_slice)?)))
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
        self.kv_slices.clear();
        self.kv = None;
    }

    /// Lays out an arbitrary batch (eager step); given-back sliding blocks
    /// read as the `scratch` page.
    pub fn prepare(
        &mut self,
        batch: &ForwardBatch<'_>,
        num_sms: usize,
        c: &ModelConfig,
        (prefill, scratch): (bool, u32),
    ) -> Result<StepPlan, CudaError> {
        let deterministic = self.deterministic;
        let staging = self.staging()?;
        Ok(stage_step(
            staging,
            batch,
            num_sms,
            c,
            (prefill, scratch),
            deterministic,
        ))
    }

    /// Lays out a decode batch padded to a graph's `size`, captured with
    /// `splits` attention splits: padded rows read and write only the
    /// scratch block (as do given-back blocks).
    pub fn prepare_graph_decode(
        &mut self,
        batch: &ForwardBatch<'_>,
        (size, splits): (usize, usize),
        scratch: u32,
    ) -> Result<StepPlan, CudaError> {
        let deterministic = self.deterministic;
        let staging = self.staging()?;
        let plan = stage_graph_decode(staging, batch, (size, splits, scratch));
        Ok(batch_invariant(plan, deterministic))
    }

    /// The split counts to capture graphs of `size` rows with, ascending
    /// (one in deterministic mode, whose steps always take one split).
    pub fn graph_split_counts(&self, size: usize, num_sms: usize, c: &ModelConfig) -> Vec<usize> {
        graph_split_counts(size, num_sms, c, self.deterministic)
    }

    /// The other pinned mirror, once its last copy up has been read, and
    /// how the region is laid out.
    fn staging(&mut self) -> Result<Staging<'_>, CudaError> {
        self.turn ^= 1;
        if let Some(copied) = self.uploaded[self.turn].take() {
            copied.synchronize()?;
        }
        Ok(Staging {
            host: self.inputs_host[self.turn].as_mut_slice(),
            l: self.layout,
            bs: self.block_size,
            views: &self.views,
        })
    }
}

/// The step-input staging the layout functions write.
struct Staging<'a> {
    host: &'a mut [i32],
    l: InputLayout,
    bs: usize,
    views: &'a KvViews,
}

/// Lays out an arbitrary batch (eager step); given-back sliding blocks
/// read as the `scratch` page.
fn stage_batch(
    Staging { host, l, bs, views }: Staging<'_>,
    batch: &ForwardBatch<'_>,
    num_sms: usize,
    c: &ModelConfig,
    (prefill, scratch): (bool, u32),
) -> StepPlan {
    let stride = table_stride(views, batch);
    let (mut t, mut n_decode, mut n_tiles, mut max_ctx) = (0, 0, 0, 1);
    for (s, ch) in batch.chunks.iter().enumerate() {
        let first = t;
        for (i, &tok) in ch.tokens.iter().enumerate() {
            let pos = ch.start_pos + i;
            let slot = |v| views.page(ch, v, pos / bs, scratch) as usize * bs + pos % bs;
            write_token(host, &l, t, tok as i32, pos, slot(0), s);
            for v in 1..views.count() {
                write_slot(host, l.slots_of(v), t, slot(v));
            }
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
        for v in 0..views.count() {
            let row = l.tables_of(v) + s * stride;
            write_table(&mut host[row..row + stride], views.pages(ch, v, scratch));
        }
    }
    host[l.stride] = stride as i32;
    let splits = decode_splits(n_decode, max_ctx, num_sms, c);
    let table_len = batch.chunks.len() * stride;
    StepPlan {
        tokens: t,
        seqs: batch.chunks.len(),
        decode_tokens: n_decode,
        decode_list: true,
        tiles: n_tiles,
        splits,
        upload_len: l.tables + table_len,
        table_len,
        graph_size: None,
    }
}

/// Lays out a decode batch padded to a graph's `size`: padded rows read
/// and write only the `scratch` page (as do given-back blocks).
fn stage_graph_decode(
    Staging { host, l, bs, views }: Staging<'_>,
    batch: &ForwardBatch<'_>,
    (size, splits, scratch): (usize, usize, u32),
) -> StepPlan {
    let stride = table_stride(views, batch);
    for s in 0..size {
        let row = |v| l.tables_of(v) + s * stride..l.tables_of(v) + (s + 1) * stride;
        match batch.chunks.get(s) {
            Some(ch) => {
                let pos = ch.start_pos;
                let slot = |v| views.page(ch, v, pos / bs, scratch) as usize * bs + pos % bs;
                write_token(host, &l, s, ch.tokens[0] as i32, pos, slot(0), s);
                for v in 0..views.count() {
                    if v > 0 {
                        write_slot(host, l.slots_of(v), s, slot(v));
                    }
                    write_table(&mut host[row(v)], views.pages(ch, v, scratch));
                }
            }
            None => {
                write_token(host, &l, s, 0, 0, scratch as usize * bs, s);
                for v in 0..views.count() {
                    if v > 0 {
                        write_slot(host, l.slots_of(v), s, scratch as usize * bs);
                    }
                    write_table(&mut host[row(v)], [scratch]);
                }
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
        splits,
        upload_len: l.tables + size * stride,
        table_len: size * stride,
        graph_size: Some(size),
    }
}

impl Buffers {
    /// Sets the final norm's gather list to `rows` (token rows of the last
    /// step, at most `max_seqs`) and uploads it.
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
        let staging = self.staging()?;
        let host = &mut staging.host[at..at + rows.len()];
        host.copy_from_slice(rows);
        gpu.upload(dst, host)?;
        self.mark_uploaded(gpu)
    }

    /// Copies the step's inputs to the device (stream-ordered): one
    /// transfer, and one more per further view (its slots and table).
    pub fn upload(&mut self, gpu: &Gpu, plan: &StepPlan) -> Result<(), CudaError> {
        let (l, host) = (self.layout, self.inputs_host[self.turn].as_slice());
        gpu.upload(self.inputs, &host[..plan.upload_len])?;
        for v in 1..l.views {
            let (at, end) = (l.slots_of(v), l.tables_of(v) + plan.table_len);
            gpu.upload(self.input(at), &host[at..end])?;
        }
        self.mark_uploaded(gpu)
    }

    /// Records when the mirror staged last has been copied up.
    fn mark_uploaded(&mut self, gpu: &Gpu) -> Result<(), CudaError> {
        self.uploaded[self.turn] = Some(gpu.stream.record_event(None)?);
        Ok(())
    }

    /// `[tokens, hidden]` f32 scratch for a post-norm block's output: the
    /// gate/up buffer (`4 · intermediate` bytes a row, at least the `4 ·
    /// hidden` needed where the MLP is wider than the model, which the
    /// post-norm op checks), free whenever a block's output projection runs.
    pub(crate) fn proj(&self) -> DevPtr {
        self.gate_up
    }

    /// The device address of the input at `offset` (i32 elements).
    pub(crate) fn input(&self, offset: usize) -> DevPtr {
        self.inputs + (offset * 4) as u64
    }

    /// The decode attention's row list of `plan` (0: rows 0..tokens).
    pub(crate) fn decode_ids(&self, plan: &StepPlan) -> DevPtr {
        if plan.decode_list {
            self.input(self.layout.decode_ids)
        } else {
            0
        }
    }
}

/// Lays out an eager step; in deterministic mode every token goes to the
/// decode kernel, in one split (see [`batch_invariant`]).
fn stage_step(
    st: Staging<'_>,
    batch: &ForwardBatch<'_>,
    num_sms: usize,
    c: &ModelConfig,
    (prefill, scratch): (bool, u32),
    deterministic: bool,
) -> StepPlan {
    let prefill = (prefill && !deterministic, scratch);
    batch_invariant(stage_batch(st, batch, num_sms, c, prefill), deterministic)
}

/// `plan` in deterministic mode: one split per token, so a token's keys
/// are summed in the same order whatever the batch's size and longest
/// context (the split count otherwise follows both). The eager step also
/// sends prefill chunks to the decode kernel then (the caller turns the
/// prefill kernel off): a prompt token's attention is the same whether it
/// came in a long chunk, a short one, or after a prefix-cache hit.
fn batch_invariant(plan: StepPlan, deterministic: bool) -> StepPlan {
    if deterministic {
        StepPlan { splits: 1, ..plan }
    } else {
        plan
    }
}

/// Splits of each decode token's keys: enough blocks to fill the GPU at
/// small batch, and blocks of at most ~[`KEYS_PER_SPLIT`] keys at larger
/// batch, so the last wave of long blocks does not idle most SMs; from
/// [`LARGE_BATCH_ROWS`] rows no more splits than
/// [`LARGE_BATCH_BLOCKS_PER_SM`] blocks an SM need (but at least the fill,
/// and splits of at most [`LARGE_BATCH_MAX_SPLIT_KEYS`]). Only for head
/// sizes with a prefill kernel (up to 128): their decode rows are one token
/// of a sequence each, while head_dim 256 sends whole prompts through the
/// decode kernel, whose causal rows (1 to n keys, longest last) keep the
/// length-based splits.
fn decode_splits(tokens: usize, max_ctx: usize, num_sms: usize, c: &ModelConfig) -> usize {
    let tokens = tokens.max(1);
    let fill = splits_for_blocks(FILL_BLOCKS_PER_SM, tokens, num_sms, c);
    let mut by_length = max_ctx.div_ceil(KEYS_PER_SPLIT);
    if tokens >= LARGE_BATCH_ROWS && c.head_dim <= 128 {
        let by_blocks = splits_for_blocks(LARGE_BATCH_BLOCKS_PER_SM, tokens, num_sms, c);
        let longest = max_ctx.div_ceil(LARGE_BATCH_MAX_SPLIT_KEYS);
        by_length = by_length.min(by_blocks).max(longest);
    }
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

/// Splits of each of `tokens` rows' keys that give every SM `per_sm`
/// attention blocks (a block per row, kv head and split).
fn splits_for_blocks(per_sm: usize, tokens: usize, num_sms: usize, c: &ModelConfig) -> usize {
    (per_sm * num_sms).div_ceil(tokens * c.num_kv_heads)
}

/// The split counts graphs of `size` rows are captured with, ascending.
/// Above GEMV sizes one, the longest context's ([`graph_splits`]): rows
/// fill the GPU. At GEMV sizes the counts of [`SMALL_GRAPH_SPLITS`] up to
/// the first that fills the GPU with blocks (at most the longest context's
/// count), so that a step at a short context replays a graph whose blocks
/// have keys enough to be worth their launch and whose combine merges few
/// partials (none at one split: the attention writes its rows); more
/// splits than fill the GPU only lengthen the combine (measured: 8 rows of
/// the 8B, 8 splits beat 16 at every context). Deterministic mode: one
/// split (its steps always take one).
fn graph_split_counts(
    size: usize,
    num_sms: usize,
    c: &ModelConfig,
    deterministic: bool,
) -> Vec<usize> {
    if deterministic {
        return vec![1];
    }
    let most = graph_splits(size, num_sms, c);
    if size > GEMV_MAX_TOKENS {
        return vec![most];
    }
    let fill = splits_for_blocks(FILL_BLOCKS_PER_SM, size, num_sms, c);
    let top = SMALL_GRAPH_SPLITS
        .into_iter()
        .find(|&s| s >= fill)
        .map_or(most, |s| s.min(most));
    let mut counts: Vec<usize> = SMALL_GRAPH_SPLITS
        .into_iter()
        .filter(|&s| s < top)
        .collect();
    counts.push(top);
    counts
}

/// Which of a graph size's captured split counts (ascending) a step whose
/// longest context is `max_ctx` replays: the fewest that give each split at
/// most [`SMALL_KEYS_PER_SPLIT`] keys, else the most.
pub fn pick_splits(counts: &[usize], max_ctx: usize) -> usize {
    counts
        .iter()
        .position(|&s| max_ctx.div_ceil(s) <= SMALL_KEYS_PER_SPLIT)
        .unwrap_or(counts.len().saturating_sub(1))
}

/// Entries per block-table row: the most logical blocks of a chunk's
/// tables in the batch (its block table's length with one view).
fn table_stride(views: &KvViews, batch: &ForwardBatch<'_>) -> usize {
    batch
        .chunks
        .iter()
        .map(|ch| views.blocks_of(ch))
        .max()
        .unwrap_or(1)
        .max(1)
}

/// One row of a view's block tables, zero-padded.
fn write_table(row: &mut [i32], pages: impl IntoIterator<Item = u32>) {
    row.fill(0);
    for (dst, b) in row.iter_mut().zip(pages) {
        *dst = b as i32;
    }
}

/// Token `t`'s KV-write slot in the slots starting at `at`.
fn write_slot(host: &mut [i32], at: usize, t: usize, slot: usize) {
    let slot = slot as i64;
    host[at + 2 * t] = slot as i32;
    host[at + 2 * t + 1] = (slot >> 32) as i32;
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
    write_slot(host, l.slots, t, slot);
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_kv_cache::NULL_BLOCK;
    use ingot_models::{Architecture, RopeConfig, RopeScaling};
    use ingot_runner::SequenceChunk;

    use crate::test_configs::llama8b;

    #[test]
    fn grouped_expert_scratch_only_when_enabled() {
        let mut c = llama8b();
        c.block.moe = Some(ingot_models::MoeConfig {
            num_experts: 128,
            experts_per_token: 8,
            expert_intermediate_size: 768,
            normalize_top_k: true,
            dense_layers: Vec::new(),
        });
        let (t, s, bs) = (2048, 256, 16);
        let off = Buffers::bytes(&c, t, s, bs, 0);
        let on = Buffers::bytes(&c, t, s, bs, 32);
        // Every slot's f32 down product, the sorted slots and tile experts.
        let slots = t * 8;
        let grouped = slots * c.hidden_size * 4 + kernels::moe_sorted_bytes(slots, 128);
        assert!(on >= off + grouped, "{on} vs {off} + {grouped}");
        assert_eq!(
            Buffers::bytes(&llama8b(), t, s, bs, 32),
            Buffers::bytes(&llama8b(), t, s, bs, 0)
        );
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
        // From 9 rows: no more splits than 4 blocks an SM need, whatever
        // the length (a graph's splits are sized for the longest context).
        assert_eq!(decode_splits(256, 1024, 132, &c), 1);
        assert_eq!(decode_splits(256, 4096, 132, &c), 1);
        assert_eq!(decode_splits(64, 4096, 132, &c), 2);
        assert_eq!(decode_splits(16, 4096, 132, &c), 5);
        assert_eq!(decode_splits(16, 512, 132, &c), 3);
        // ... with splits of at most 4,096 keys (long contexts as before).
        assert_eq!(decode_splits(256, 8192, 132, &c), 2);
        assert_eq!(decode_splits(256, 32768, 132, &c), 8);
        // Head size 256 (prompts through the decode kernel): by length.
        assert_eq!(decode_splits(1024, 1024, 132, &gemma3()), 2);
        assert_eq!(decode_splits(256, 1024, 132, &gemma3()), 4);
        // Up to 8 rows, by length as before.
        assert_eq!(decode_splits(8, 1024, 132, &c), 5);
    }

    #[test]
    fn small_graphs_get_fewer_splits_at_short_context() {
        let c = llama8b();
        // Batch 1 fills the GPU with 32 splits at long context; GEMV sizes
        // also get graphs of fewer splits, larger batches only the most.
        assert_eq!(graph_split_counts(1, 132, &c, false), [1, 8, 16, 32]);
        // 8 rows x 8 kv heads x 8 splits: 512 blocks, enough for 132 SMs.
        assert_eq!(graph_split_counts(8, 132, &c, false), [1, 8]);
        for size in [2, 4] {
            let counts = graph_split_counts(size, 132, &c, false);
            assert!(counts.windows(2).all(|w| w[0] < w[1]), "{counts:?}");
            assert!(counts.last() <= Some(&graph_splits(size, 132, &c)));
        }
        assert_eq!(
            graph_split_counts(16, 132, &c, false),
            [graph_splits(16, 132, &c)]
        );
        let counts = graph_split_counts(1, 132, &c, false);
        let picked = |ctx| counts[pick_splits(&counts, ctx)];
        // Short contexts: one split, so no combine.
        assert_eq!(picked(1), 1);
        assert_eq!(picked(SMALL_KEYS_PER_SPLIT), 1);
        // One key more: the next count; then each while its splits hold
        // at most SMALL_KEYS_PER_SPLIT keys.
        assert_eq!(picked(SMALL_KEYS_PER_SPLIT + 1), 8);
        assert_eq!(picked(8 * SMALL_KEYS_PER_SPLIT), 8);
        assert_eq!(picked(8 * SMALL_KEYS_PER_SPLIT + 1), 16);
        assert_eq!(picked(16 * SMALL_KEYS_PER_SPLIT + 1), 32);
        // Long contexts: the longest context's count, never more.
        assert_eq!(picked(c.max_context), 32);
        assert_eq!(picked(usize::MAX / 2), 32);
        // More context never picks fewer splits.
        let mut last = 1;
        for ctx in 1..=c.max_context {
            let s = picked(ctx);
            assert!(s >= last, "{ctx}: {s} < {last}");
            last = s;
        }
        // A size with one count always picks it.
        assert_eq!(pick_splits(&[7], 5), 0);
        assert_eq!(pick_splits(&[7], 5000), 0);
    }

    #[test]
    fn deterministic_graphs_capture_one_split() {
        let c = llama8b();
        for size in [1, 8, 64] {
            assert_eq!(graph_split_counts(size, 132, &c, true), [1]);
        }
    }

    #[test]
    fn an_fp8_page_is_half_a_bf16_page() {
        let c = llama8b();
        // 32 layers x (K, V) x 16 slots x 8 kv heads x 128 dims.
        let elems = 32 * 2 * 16 * 8 * 128;
        assert_eq!(kv_page_bytes(&c, 16, KvDtype::Bf16), elems * 2);
        assert_eq!(kv_page_bytes(&c, 16, KvDtype::Fp8), elems);
        assert_eq!(kv_slice_bytes(&c, 10, 16, KvDtype::Fp8), 10 * 16 * 8 * 128);
    }

    #[test]
    fn input_regions_do_not_overlap() {
        let l = InputLayout::new(512, 64, 256, 1);
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

    /// Gemma 3 270M's attention shape (18 layers, every sixth global).
    fn gemma3() -> ModelConfig {
        let local_rope = RopeConfig {
            theta: 1e4,
            scaling: RopeScaling::None,
        };
        ModelConfig {
            architecture: Architecture::Gemma3,
            num_layers: 18,
            num_heads: 4,
            num_kv_heads: 1,
            head_dim: 256,
            max_context: 32768,
            shard: None,
            block: ingot_models::BlockOptions {
                sliding_window: Some(ingot_models::SlidingWindow {
                    size: 512,
                    global_every: 6,
                    local_rope,
                }),
                post_norms: true,
                ..Default::default()
            },
            ..llama8b()
        }
    }

    /// The staging of `c` for 64 tokens, 4 sequences, 2,048 blocks.
    fn staging(c: &ModelConfig) -> (Vec<i32>, InputLayout, KvViews) {
        let views = KvViews::of(c);
        let l = InputLayout::new(64, 4, 2048, views.count());
        (vec![-7; l.len], l, views)
    }

    fn slot_at(host: &[i32], at: usize, t: usize) -> i64 {
        (host[at + 2 * t] as u32 as i64) | ((host[at + 2 * t + 1] as i64) << 32)
    }

    #[test]
    fn one_view_keeps_the_region_and_stages_the_block_table_as_it_is() {
        let c = llama8b();
        let (mut host, l, views) = staging(&c);
        // Exactly the region of one table, as before layer groups.
        assert_eq!(l.len, l.tables + 4 * 2048);
        assert_eq!((l.slots_of(0), l.tables_of(0)), (l.slots, l.tables));
        let (a, b) = ([5u32, 9, 2], [4u32]);
        let ids = [1u32; 20];
        let batch = ForwardBatch {
            chunks: vec![
                SequenceChunk {
                    tokens: &ids[..1],
                    start_pos: 40,
                    block_table: &a,
                    group_tables: &[],
                },
                SequenceChunk {
                    tokens: &ids[..3],
                    start_pos: 0,
                    block_table: &b,
                    group_tables: &[],
                },
            ],
            ..Default::default()
        };
        let st = Staging {
            host: &mut host,
            l,
            bs: 16,
            views: &views,
        };
        let plan = stage_batch(st, &batch, 132, &c, (true, 77));
        assert_eq!(host[l.stride], 3);
        assert_eq!(host[l.tables..l.tables + 6], [5, 9, 2, 4, 0, 0]);
        assert_eq!(slot_at(&host, l.slots, 0), 2 * 16 + 8);
        assert_eq!(slot_at(&host, l.slots, 3), 4 * 16 + 2);
        assert_eq!((plan.upload_len, plan.table_len), (l.tables + 6, 6));
    }

    #[test]
    fn deterministic_steps_send_every_token_to_the_decode_kernel_in_one_split() {
        let c = llama8b();
        let (mut host, l, views) = staging(&c);
        let ids = [1u32; 40];
        let (long, short) = ((0..200).collect::<Vec<u32>>(), vec![300, 301, 302]);
        let batch = ForwardBatch {
            chunks: vec![
                // A decode at a long context and a 40-token prompt chunk.
                SequenceChunk {
                    tokens: &ids[..1],
                    start_pos: 3000,
                    block_table: &long,
                    group_tables: &[],
                },
                SequenceChunk {
                    tokens: &ids,
                    start_pos: 0,
                    block_table: &short,
                    group_tables: &[],
                },
            ],
            ..Default::default()
        };
        let mut plan_of = |deterministic| {
            let st = Staging {
                host: &mut host,
                l,
                bs: 16,
                views: &views,
            };
            stage_step(st, &batch, 132, &c, (true, 77), deterministic)
        };
        // Default: the prompt chunk takes prefill tiles (PREFILL_TILE / 4
        // tokens each at G = 4: 32, so 2 for 40 tokens), the decode splits.
        let default = plan_of(false);
        assert_eq!(PREFILL_TILE / 4, 32);
        assert_eq!((default.decode_tokens, default.tiles), (1, 2));
        assert!(default.splits > 1, "{default:?}");
        // Deterministic: one kernel and one split for all 41 tokens.
        let det = plan_of(true);
        assert_eq!((det.decode_tokens, det.tiles, det.splits), (41, 0, 1));
        assert_eq!(det.tokens, 41);
        // Graph steps too, whatever their size.
        for size in [1, 8, 64] {
            let st = Staging {
                host: &mut host,
                l,
                bs: 16,
                views: &views,
            };
            let splits = graph_splits(size, 132, &c);
            let graph = stage_graph_decode(st, &ForwardBatch::default(), (size, splits, 77));
            assert!(graph.splits > 1, "size {size}: {graph:?}");
            assert_eq!(batch_invariant(graph, true).splits, 1);
        }
    }

    #[test]
    fn grouped_regions_do_not_overlap_and_keep_slots_aligned() {
        let (_, l, views) = staging(&gemma3());
        assert_eq!(views.count(), 6);
        let mut regions = vec![(l.slots, 2 * 64), (l.tables, 4 * 2048)];
        for v in 1..6 {
            assert_eq!(l.slots_of(v) % 2, 0, "view {v}");
            regions.push((l.slots_of(v), 2 * 64));
            regions.push((l.tables_of(v), 4 * 2048));
        }
        for w in regions.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{regions:?}");
        }
        let last = regions[regions.len() - 1];
        assert!(last.0 + last.1 <= l.len);
    }

    #[test]
    fn each_view_gets_its_groups_part_of_the_pages_and_scratch_for_freed_blocks() {
        let c = gemma3();
        let (mut host, l, views) = staging(&c);
        let mut pool =
            ingot_kv_cache::BlockPool::with_layout(600, 16, views.layout().clone(), false);
        let (mut long, mut short) = (pool.new_tables(), pool.new_tables());
        pool.reserve_groups(&mut long, 0, 560).unwrap();
        // Decoding at 543: the sliding group gave its blocks 0 and 1 back.
        pool.reserve_groups(&mut long, 543, 560).unwrap();
        pool.reserve_groups(&mut short, 0, 20).unwrap();
        let ids = [1u32; 20];
        let batch = ForwardBatch {
            chunks: vec![
                SequenceChunk::with_tables(&ids[..1], 543, &long),
                SequenceChunk::with_tables(&ids, 0, &short),
            ],
            ..Default::default()
        };
        let scratch = 600;
        let st = Staging {
            host: &mut host,
            l,
            bs: 16,
            views: &views,
        };
        let plan = stage_batch(st, &batch, 132, &c, (true, scratch));
        let stride = 35;
        assert_eq!(
            (host[l.stride], plan.table_len),
            (stride as i32, 2 * stride)
        );
        let tables = [&long, &short];
        for v in 0..6 {
            // View 0: the global table; view 1 + p: part p of the sliding one.
            let (g, part, ppb) = if v == 0 { (0, 0, 1) } else { (1, v - 1, 5) };
            for (s, t) in tables.iter().enumerate() {
                let row = &host[l.tables_of(v) + s * stride..][..stride];
                let blocks = t[g].blocks();
                for (b, &page) in row.iter().enumerate() {
                    let want = match blocks.get(b * ppb + part) {
                        Some(&NULL_BLOCK) => scratch as i32,
                        Some(&p) => p as i32,
                        None => 0,
                    };
                    assert_eq!(page, want, "view {v} seq {s} block {b}");
                }
            }
            // Token 0 (position 543, block 33) and token 1 + 7 (position 7).
            let page = |t: &[ingot_kv_cache::BlockTable], b: usize| t[g].blocks()[b * ppb + part];
            let slot0 = page(&long, 33) as i64 * 16 + 543 % 16;
            assert_eq!(slot_at(&host, l.slots_of(v), 0), slot0, "view {v}");
            let slot8 = page(&short, 0) as i64 * 16 + 7;
            assert_eq!(slot_at(&host, l.slots_of(v), 8), slot8, "view {v}");
        }
        assert_eq!(host[l.tables_of(2)], scratch as i32);
        assert_eq!(host[l.tables_of(2) + 1], scratch as i32);
    }

    #[test]
    fn padded_graph_rows_read_and_write_scratch_in_every_view() {
        let c = gemma3();
        let (mut host, l, views) = staging(&c);
        let mut pool =
            ingot_kv_cache::BlockPool::with_layout(600, 16, views.layout().clone(), false);
        let mut tables = pool.new_tables();
        pool.reserve_groups(&mut tables, 0, 30).unwrap();
        let batch = ForwardBatch {
            chunks: vec![SequenceChunk::with_tables(&[3], 29, &tables)],
            ..Default::default()
        };
        let st = Staging {
            host: &mut host,
            l,
            bs: 16,
            views: &views,
        };
        let plan = stage_graph_decode(st, &batch, (4, 8, 600));
        assert_eq!((plan.tokens, plan.table_len, plan.splits), (4, 4 * 2, 8));
        for v in 0..6 {
            let page = views.page(&batch.chunks[0], v, 1, 600);
            assert_eq!(slot_at(&host, l.slots_of(v), 0), page as i64 * 16 + 13);
            for row in 1..4 {
                assert_eq!(slot_at(&host, l.slots_of(v), row), 600 * 16);
                assert_eq!(host[l.tables_of(v) + row * 2..][..2], [600, 0]);
            }
        }
    }
}
