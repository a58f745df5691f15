//! The step's inputs and buffers: the input region laid out for a single
//! upload (token ids, positions, KV slots, block tables, attention tiles),
//! the activation workspace and the KV pool.

use ingot_models::ModelConfig;
use ingot_runner::ForwardBatch;

use crate::device::{Arena, DevPtr, Gpu, Pinned};
use crate::gemm::GEMV_MAX_TOKENS;
use crate::kernels::{AdvanceDecode, Kernels, PREFILL_TILE};
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
/// Most splits of one token's keys.
const MAX_SPLITS: usize = 32;

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
    pub(crate) len: usize,
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
    pub(crate) block_size: usize,
    pub(crate) layout: InputLayout,
    inputs: DevPtr,
    inputs_host: Pinned<i32>,
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
    arena: Arena,
    /// (k, v) per layer, `[blocks, kv_heads, block_size, head_dim]` bf16 each.
    pub(crate) kv_layers: Vec<(DevPtr, DevPtr)>,
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
        let stride = table_stride(batch);
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
        let stride = table_stride(batch);
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

/// Entries per block-table row: the longest table of the batch.
fn table_stride(batch: &ForwardBatch<'_>) -> usize {
    batch
        .chunks
        .iter()
        .map(|ch| ch.block_table.len())
        .max()
        .unwrap_or(1)
        .max(1)
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
    AdvanceDecode {
        rows,
        ids: b.input(l.ids),
        positions: b.input(l.positions),
        slots: b.input(l.slots),
        sampled: b.sampled,
    }
    .launch(gpu, k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_models::{Architecture, RopeConfig, RopeScaling};

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
            block: Default::default(),
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
}
