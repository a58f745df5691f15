//! The step's kernels: loading them for a model, and one typed argument
//! struct per kernel whose `launch` lays its fields out in the kernel's
//! parameter order and picks its grid (no positional argument lists at the
//! call sites).

use cudarc::driver::sys::CUdevice_attribute;
use ingot_arch::Activation;
use ingot_models::ModelConfig;

use crate::device::{Arg, DevPtr, Gpu, Kernel};
use crate::CudaError;

/// Query rows per prefill-attention tile (the kernel's `PREFILL_ROWS`):
/// 128 / G tokens of a chunk times the G query heads of a kv head.
pub const PREFILL_TILE: usize = 128;
/// Threads of a prefill-attention block (`PREFILL_THREADS`: a warp per 16
/// rows).
const PREFILL_THREADS: u32 = 256;
/// Keys per staged K/V tile (the kernel's `KEY_TILE`).
const PREFILL_KEY_TILE: usize = 64;
/// Heads (one per warp) of a `rope_qkv` block (its `ROPE_WARPS`).
const ROPE_WARPS: usize = 8;

/// Element type of the paged KV cache (`model.kv_cache_dtype`); the kernels
/// that write and read the cache are loaded for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KvDtype {
    /// The model's dtype.
    #[default]
    Bf16,
    /// FP8 e4m3, per-tensor scale 1.0, saturated (kv_types.cuh).
    Fp8,
}

impl KvDtype {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            Self::Bf16 => 2,
            Self::Fp8 => 1,
        }
    }

    /// The infix of the kernels specialized for it (`paged_attention{}_hd…`).
    fn kernel_infix(self) -> &'static str {
        match self {
            Self::Bf16 => "",
            Self::Fp8 => "_fp8",
        }
    }
}

/// The kernels this model needs.
pub struct Kernels {
    embed_rows: Kernel,
    embed_rows_scaled: Kernel,
    embed_kq: Kernel,
    add_rms_norm: Kernel,
    post_norm_add: Kernel,
    softcap_rows: Kernel,
    rope_qkv: Kernel,
    silu_mul: Kernel,
    gelu_tanh_mul: Kernel,
    rms_norm_e4m3: Kernel,
    silu_mul_e4m3: Kernel,
    gelu_tanh_mul_e4m3: Kernel,
    argmax_rows: Kernel,
    gather_vocab_shards: Kernel,
    moe_router: Kernel,
    moe_route: Kernel,
    /// The per-slot expert GEMVs, `[one token, several]`.
    moe_gate_up: [GateUpKernels; 2],
    moe_down_sum: [DownSumKernels; 2],
    moe_align: Kernel,
    moe_grouped_gate_up_silu: Kernel,
    moe_grouped_gate_up_gelu_tanh: Kernel,
    moe_grouped_gate_up_silu_e4m3: Kernel,
    moe_grouped_gate_up_gelu_tanh_e4m3: Kernel,
    moe_grouped_down: Kernel,
    moe_grouped_down_e4m3: Kernel,
    moe_weighted_sum: Kernel,
    decode_attention: Kernel,
    /// The tensor-core decode attention and its dynamic shared memory, for
    /// steps of at least `tc_decode_min_rows` decode rows (absent when off
    /// or for head sizes without one).
    tc_decode_attention: Option<(Kernel, u32)>,
    tc_decode_min_rows: usize,
    combine: Kernel,
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

    /// The `(base, bytes, mode)` kernel arguments for prefetching (up to)
    /// `bytes` at `base`.
    fn args(&self, base: DevPtr, bytes: usize) -> [Arg; 3] {
        let n = self.bytes.min(bytes) & !15;
        let base = if n == 0 { 0 } else { base };
        [Arg::Ptr(base), Arg::I64(n as i64), Arg::I32(self.mode)]
    }
}

/// The fewest decode rows of a step that runs the tensor-core decode
/// attention for `opts`' cache (0: never): the smaller non-zero of
/// `tc_decode_min_rows` and, with an FP8 cache, `tc_decode_fp8_min_rows`.
pub(crate) fn tc_decode_rows(opts: &crate::CudaRunnerConfig) -> usize {
    // A row threshold would make the kernel depend on the batch size.
    if opts.deterministic {
        return 0;
    }
    let fp8 = match opts.kv_cache_dtype {
        KvDtype::Fp8 => opts.tc_decode_fp8_min_rows,
        KvDtype::Bf16 => 0,
    };
    [opts.tc_decode_min_rows, fp8]
        .into_iter()
        .filter(|&rows| rows > 0)
        .min()
        .unwrap_or(0)
}

/// The fewest tokens of a step that take the grouped expert GEMMs
/// (`cuda.moe_grouped_min_tokens`; 0: never): off for dense models, under
/// `engine.deterministic` (the path would depend on the batch size) and
/// for expert shapes the tiles do not cover.
pub(crate) fn moe_grouped_min_tokens(
    opts: &crate::CudaRunnerConfig,
    config: &ModelConfig,
) -> usize {
    match &config.block.moe {
        Some(m)
            if !opts.deterministic
                && moe_grouped_fits(config.hidden_size, m.expert_intermediate_size) =>
        {
            opts.moe_grouped_min_tokens
        }
        _ => 0,
    }
}

impl Kernels {
    /// Loads the kernels for `config`'s head size and GQA group and a KV
    /// cache of `kv` elements; decode steps of at least `tc_decode_min_rows`
    /// rows (0: none) take the tensor-core decode attention.
    pub fn load(
        gpu: &Gpu,
        config: &ModelConfig,
        kv: KvDtype,
        prefetch: L2PrefetchSpec,
        tc_decode_min_rows: usize,
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
        let infix = kv.kernel_infix();
        let decode_attention = gpu
            .kernel(&format!("paged_attention{infix}_hd{hd}_g{group}"))
            .map_err(|_| {
                CudaError::Unsupported(format!("head_dim {hd} (64, 128 and 256 are supported)"))
            })?;
        let tc_decode_attention = match tc_decode_min_rows {
            0 => None,
            _ => load_tc_decode(
                gpu,
                &format!("paged_attention_tc{infix}_hd{hd}_g{group}"),
                tc_decode_shared_bytes(hd, kv),
            )?,
        };
        let (moe_gate_up, moe_down_sum) = load_moe_gemvs(gpu, config)?;
        let prefill_attention = match gpu.kernel(&format!("prefill_attention{infix}_hd{hd}")) {
            Ok(k) => {
                let bytes = prefill_shared_bytes(hd, kv) as u32;
                k.allow_shared_memory(bytes)?;
                Some((k, bytes))
            }
            Err(_) => None,
        };
        Ok(Self {
            embed_rows: gpu.kernel("embed_rows")?,
            embed_rows_scaled: gpu.kernel("embed_rows_scaled")?,
            embed_kq: gpu.kernel("embed_kq")?,
            add_rms_norm: gpu.kernel("add_rms_norm")?,
            post_norm_add: gpu.kernel("post_norm_add")?,
            softcap_rows: gpu.kernel("softcap_rows")?,
            rope_qkv: gpu.kernel(&format!("rope_qkv{infix}"))?,
            silu_mul: gpu.kernel("silu_mul")?,
            gelu_tanh_mul: gpu.kernel("gelu_tanh_mul")?,
            rms_norm_e4m3: gpu.kernel("rms_norm_e4m3")?,
            silu_mul_e4m3: gpu.kernel("silu_mul_e4m3")?,
            gelu_tanh_mul_e4m3: gpu.kernel("gelu_tanh_mul_e4m3")?,
            argmax_rows: gpu.kernel("argmax_rows")?,
            gather_vocab_shards: gpu.kernel("gather_vocab_shards")?,
            moe_router: gpu.kernel("moe_router")?,
            moe_route: gpu.kernel("moe_route")?,
            moe_gate_up,
            moe_down_sum,
            moe_align: gpu.kernel("moe_align")?,
            moe_grouped_gate_up_silu: gpu.kernel("moe_grouped_gate_up_silu")?,
            moe_grouped_gate_up_silu_e4m3: gpu.kernel("moe_grouped_gate_up_silu_e4m3")?,
            moe_grouped_gate_up_gelu_tanh: gpu.kernel("moe_grouped_gate_up_gelu_tanh")?,
            moe_grouped_gate_up_gelu_tanh_e4m3: gpu.kernel("moe_grouped_gate_up_gelu_tanh_e4m3")?,
            moe_grouped_down: gpu.kernel("moe_grouped_down")?,
            moe_grouped_down_e4m3: gpu.kernel("moe_grouped_down_e4m3")?,
            moe_weighted_sum: gpu.kernel("moe_weighted_sum")?,
            decode_attention,
            tc_decode_attention,
            tc_decode_min_rows,
            combine: gpu.kernel("attention_combine")?,
            prefill_attention,
            num_sms: gpu.num_sms()?,
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

/// Mirrors `PrefillSmem<HD>::bytes` in attention.cu.
fn prefill_shared_bytes(hd: usize, kv: KvDtype) -> usize {
    // Q (PREFILL_TILE rows), K and V (PREFILL_KEY_TILE rows each) of hd + 8
    // bf16; an FP8 cache also stages each K or V tile raw.
    let bf16_tiles = (PREFILL_TILE + 2 * PREFILL_KEY_TILE) * (hd + 8) * 2;
    match kv {
        KvDtype::Bf16 => bf16_tiles,
        KvDtype::Fp8 => bf16_tiles + PREFILL_KEY_TILE * hd,
    }
}

/// Query, key and value head counts and the head width.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl Heads {
    pub fn of(c: &ModelConfig) -> Self {
        Self {
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        }
    }
}

/// One layer's paged KV cache, `[blocks, kv_heads, block_size, head_dim]`
/// of `dtype` each.
#[derive(Debug, Clone, Copy)]
pub struct KvCache {
    pub k: DevPtr,
    pub v: DevPtr,
    pub block_size: usize,
    pub dtype: KvDtype,
}

/// `embed_rows`: `x[t] = embed[ids[t]]` (f32, times `scale` when set),
/// leaving the rows' sums of squares and, with `next_norm = (g, xg)`,
/// `xg = bf16(x ⊙ g)` for the RMSNorm fused into the next GEMV.
pub struct EmbedRows {
    pub tokens: usize,
    pub ids: DevPtr,
    pub table: DevPtr,
    /// `table` is a k-quant matrix's header (`embed_kq`), not bf16 rows.
    pub blocks: bool,
    pub x: DevPtr,
    pub hidden: usize,
    pub scale: Option<f32>,
    pub sumsq: DevPtr,
    pub next_norm: Option<(DevPtr, DevPtr)>,
}

impl EmbedRows {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let (norm, xg) = self.next_norm.unwrap_or((0, 0));
        let mut args = vec![
            Arg::Ptr(self.ids),
            Arg::Ptr(self.table),
            Arg::Ptr(self.x),
            Arg::I32(self.hidden as i32),
            Arg::Ptr(self.sumsq),
            Arg::Ptr(norm),
            Arg::Ptr(xg),
        ];
        let kernel = match self.scale {
            _ if self.blocks => {
                args.push(Arg::F32(self.scale.unwrap_or(1.0)));
                &k.embed_kq
            }
            Some(scale) => {
                args.push(Arg::F32(scale));
                &k.embed_rows_scaled
            }
            None => &k.embed_rows,
        };
        gpu.launch(kernel, (self.tokens as u32, 1, 1), 256, 0, &args)
    }
}

/// What writes the next pre-norm's input after a post-norm add.
#[derive(Debug, Clone, Copy)]
pub enum NextNormOut {
    /// None (the final norm gathers rows itself).
    Skip,
    /// `xn = bf16(x ⊙ g)` and the rows' sums of squares, for the RMSNorm
    /// fused into the next GEMV.
    Prescaled { weight: DevPtr, sumsq: DevPtr },
    /// `xn = bf16(RMSNorm(x) · g)`.
    Normed { weight: DevPtr },
}

/// `post_norm_add`: `x[t] += RMSNorm(y[t]) · post` (a post-norm block's
/// output `y`, f32), then the next pre-norm's input into `xn` as `next`
/// says.
pub struct PostNormAdd {
    pub tokens: usize,
    pub x: DevPtr,
    pub y: DevPtr,
    pub post: DevPtr,
    pub hidden: usize,
    pub eps: f32,
    pub next: NextNormOut,
    pub xn: DevPtr,
}

impl PostNormAdd {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let (weight, sumsq) = match self.next {
            NextNormOut::Skip => (0, 0),
            NextNormOut::Prescaled { weight, sumsq } => (weight, sumsq),
            NextNormOut::Normed { weight } => (weight, 0),
        };
        let args = [
            Arg::Ptr(self.x),
            Arg::Ptr(self.y),
            Arg::Ptr(self.post),
            Arg::I32(self.hidden as i32),
            Arg::F32(self.eps),
            Arg::Ptr(weight),
            Arg::Ptr(sumsq),
            Arg::Ptr(self.xn),
        ];
        gpu.launch(&k.post_norm_add, (self.tokens as u32, 1, 1), 256, 0, &args)
    }
}

/// `softcap_rows`: `logits = cap · tanh(logits / cap)` over `rows` rows.
pub struct SoftcapRows {
    pub rows: usize,
    pub logits: DevPtr,
    pub vocab: usize,
    pub cap: f32,
}

impl SoftcapRows {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let n = self.rows * self.vocab;
        let args = [
            Arg::Ptr(self.logits),
            Arg::I64(n as i64),
            Arg::F32(self.cap),
        ];
        let grid = (n.div_ceil(256).min(4096) as u32, 1, 1);
        gpu.launch(&k.softcap_rows, grid, 256, 0, &args)
    }
}

/// `add_rms_norm` without a residual delta: `out[r] = RMSNorm(x[r]) · weight`
/// for `rows` rows; with `gather` (a device list of row indices, or 0) row
/// r reads `x[gather[r]]`.
pub struct RmsNorm {
    pub rows: usize,
    pub x: DevPtr,
    pub gather: DevPtr,
    pub weight: DevPtr,
    pub out: DevPtr,
    pub hidden: usize,
    pub eps: f32,
}

impl RmsNorm {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(self.x),
            Arg::Ptr(0), // no residual delta: o_proj/down already added into x
            Arg::Ptr(self.gather),
            Arg::Ptr(self.weight),
            Arg::Ptr(self.out),
            Arg::I32(self.hidden as i32),
            Arg::F32(self.eps),
        ];
        let grid = (self.rows as u32, 1, 1);
        gpu.launch(&k.add_rms_norm, grid, row_threads(self.hidden), 0, &args)
    }
}

/// `rms_norm_e4m3`: [`RmsNorm`] (no gather) written as an FP8 GEMM's input
/// (e4m3 rows and row scales, [`crate::gemm::Gemm::quantized_input`]), with
/// the same bits as the norm followed by `quantize_rows_e4m3`.
pub struct RmsNormE4m3 {
    pub rows: usize,
    pub x: DevPtr,
    pub weight: DevPtr,
    pub quantized: (DevPtr, DevPtr),
    pub hidden: usize,
    pub eps: f32,
}

impl RmsNormE4m3 {
    /// Rows the kernel takes: those `add_rms_norm` keeps in registers
    /// (`NORM_VECS` float4s a thread), whose partition it repeats.
    pub fn fits(hidden: usize) -> bool {
        hidden.is_multiple_of(4) && hidden <= 4 * NORM_VECS * row_threads(hidden) as usize
    }

    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(self.x),
            Arg::Ptr(self.weight),
            Arg::Ptr(self.quantized.0),
            Arg::Ptr(self.quantized.1),
            Arg::I32(self.hidden as i32),
            Arg::F32(self.eps),
        ];
        let grid = (self.rows as u32, 1, 1);
        gpu.launch(&k.rms_norm_e4m3, grid, row_threads(self.hidden), 0, &args)
    }
}

/// `NORM_VECS` in common.cuh.
const NORM_VECS: usize = 4;

/// Threads for row-wise kernels over `d` elements.
fn row_threads(d: usize) -> u32 {
    if d >= 2048 {
        512
    } else {
        256
    }
}

/// Where rope and the KV write of a q/k/v projection go: the step's
/// positions and slots, the rotary tables, the query output and the cache.
#[derive(Debug, Clone, Copy)]
pub struct RopeTarget {
    pub positions: DevPtr,
    pub slots: DevPtr,
    pub cos: DevPtr,
    pub sin: DevPtr,
    pub q: DevPtr,
    pub kv: KvCache,
    pub heads: Heads,
}

impl RopeTarget {
    fn args(&self) -> [Arg; 11] {
        let h = self.heads;
        [
            Arg::Ptr(self.positions),
            Arg::Ptr(self.slots),
            Arg::Ptr(self.cos),
            Arg::Ptr(self.sin),
            Arg::Ptr(self.q),
            Arg::Ptr(self.kv.k),
            Arg::Ptr(self.kv.v),
            Arg::I32(h.heads as i32),
            Arg::I32(h.kv_heads as i32),
            Arg::I32(h.head_dim as i32),
            Arg::I32(self.kv.block_size as i32),
        ]
    }
}

/// The GEMV's input: bf16 activations, or (a fused RMSNorm) the pre-scaled
/// residual `xg` that the kernel scales by 1/rms from the sums of squares.
#[derive(Debug, Clone, Copy)]
pub enum GemvInput {
    Plain(DevPtr),
    Normed { xg: DevPtr, eps: f32, sumsq: DevPtr },
}

impl GemvInput {
    fn args(&self) -> Vec<Arg> {
        match *self {
            Self::Plain(x) => vec![Arg::Ptr(x)],
            Self::Normed { xg, eps, sumsq } => vec![Arg::Ptr(xg), Arg::F32(eps), Arg::Ptr(sumsq)],
        }
    }
}

/// The fused q/k/v GEMV + bias + rope + KV write (the GEMV family's
/// `qkv_rope` variants, picked by [`crate::gemm::Gemm::qkv_rope_kernel`]).
pub struct QkvRopeGemv {
    pub input: GemvInput,
    pub weight: DevPtr,
    pub inputs: usize,
    /// Output columns: `q_dim + 2 kv_dim`.
    pub width: usize,
    pub bias: DevPtr,
    pub target: RopeTarget,
}

impl QkvRopeGemv {
    pub fn launch(&self, gpu: &Gpu, kernel: &Kernel) -> Result<(), CudaError> {
        let t = self.target.args();
        let mut args = self.input.args();
        args.extend([
            Arg::Ptr(self.weight),
            Arg::I32(self.inputs as i32),
            Arg::Ptr(self.bias),
        ]);
        args.extend_from_slice(&t);
        // Two warps (of 8 per block) per rotary pair.
        let grid = (self.width.div_ceil(8) as u32, 1, 1);
        gpu.launch(kernel, grid, 256, 0, &args)
    }
}

/// `rope_qkv`: bias, q/k norm, rotary embedding and the KV write of the
/// projected `qkv` rows; the queries land in `target.q`.
pub struct RopeQkv {
    pub tokens: usize,
    pub qkv: DevPtr,
    pub bias: DevPtr,
    /// `(q_norm, k_norm)` weights, or zeros.
    pub qk_norm: (DevPtr, DevPtr),
    pub eps: f32,
    pub target: RopeTarget,
}

impl RopeQkv {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let t = self.target.args();
        let mut args = vec![
            Arg::Ptr(self.qkv),
            Arg::Ptr(self.bias),
            Arg::Ptr(self.qk_norm.0),
            Arg::Ptr(self.qk_norm.1),
        ];
        // The epsilon sits before the block size (the target's last).
        args.extend_from_slice(&t[..10]);
        args.extend([Arg::F32(self.eps), t[10]]);
        let h = self.target.heads;
        // A warp per head, ROPE_WARPS heads per block.
        let blocks = (h.heads + 2 * h.kv_heads).div_ceil(ROPE_WARPS) as u32;
        let grid = (self.tokens as u32, blocks, 1);
        gpu.launch(&k.rope_qkv, grid, 32 * ROPE_WARPS as u32, 0, &args)
    }
}

/// `silu_mul` / `gelu_tanh_mul`: `act = f(gate) · up` from the fused
/// gate/up rows.
pub struct GatedMul {
    pub tokens: usize,
    pub activation: Activation,
    pub gate_up: DevPtr,
    pub act: DevPtr,
    pub width: usize,
}

impl GatedMul {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let grid = (self.tokens as u32, self.width.div_ceil(8 * 256) as u32, 1);
        let args = [
            Arg::Ptr(self.gate_up),
            Arg::Ptr(self.act),
            Arg::I32(self.width as i32),
        ];
        let kernel = match self.activation {
            Activation::Silu => &k.silu_mul,
            Activation::GeluTanh => &k.gelu_tanh_mul,
        };
        gpu.launch(kernel, grid, 256, 0, &args)
    }
}

/// Warps (rows) per block of the expert GEMVs (`MOE_WARPS` in moe.cu).
const MOE_WARPS: usize = 8;
/// Most experts per token `moe_route` takes (`MOE_MAX_TOP_K` in moe.cu).
pub const MOE_MAX_TOP_K: usize = 16;
/// Most experts `moe_route` takes (`MOE_MAX_EXPERTS` in moe.cu).
pub const MOE_MAX_EXPERTS: usize = 256;

/// `moe_router`: the router's f32 logits of every token, normed from the
/// f32 residual.
pub struct MoeRouter {
    pub tokens: usize,
    pub x: DevPtr,
    pub norm: DevPtr,
    /// `[experts, hidden]` bf16.
    pub router: DevPtr,
    pub hidden: usize,
    pub eps: f32,
    pub experts: usize,
    pub logits: DevPtr,
    /// Where the normed rows go in bf16 too (the experts' input; 0: not).
    pub xn: DevPtr,
}

impl MoeRouter {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(self.x),
            Arg::Ptr(self.norm),
            Arg::Ptr(self.router),
            Arg::I32(self.hidden as i32),
            Arg::F32(self.eps),
            Arg::I32(self.experts as i32),
            Arg::Ptr(self.logits),
            Arg::Ptr(self.xn),
        ];
        let grid = (
            self.tokens as u32,
            self.experts.div_ceil(MOE_WARPS) as u32,
            1,
        );
        gpu.launch(&k.moe_router, grid, (32 * MOE_WARPS) as u32, 0, &args)
    }
}

/// `moe_route`: each token's top-k experts (ascending) and their weights
/// from the router's f32 logits.
pub struct MoeRoute {
    pub tokens: usize,
    pub logits: DevPtr,
    pub experts: usize,
    pub top_k: usize,
    pub normalize: bool,
    pub ids: DevPtr,
    pub weights: DevPtr,
}

impl MoeRoute {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(self.logits),
            Arg::I32(self.tokens as i32),
            Arg::I32(self.experts as i32),
            Arg::I32(self.top_k as i32),
            Arg::I32(self.normalize as i32),
            Arg::Ptr(self.ids),
            Arg::Ptr(self.weights),
        ];
        // A warp per token.
        let grid = (self.tokens.div_ceil(MOE_WARPS) as u32, 1, 1);
        gpu.launch(&k.moe_route, grid, (32 * MOE_WARPS) as u32, 0, &args)
    }
}

/// `moe_gate_up_*`: the gated activation of every slot's expert, from the
/// normed bf16 rows `x` into `act` (`[tokens * top_k, width]` bf16).
pub struct MoeGateUp {
    pub tokens: usize,
    pub activation: Activation,
    pub x: DevPtr,
    /// `(gate, up)` stacks, `[experts, width, hidden]` bf16 each, or e4m3
    /// with `scales`.
    pub weights: (DevPtr, DevPtr),
    /// e4m3 stacks' row scales (gate's, up's).
    pub scales: Option<(DevPtr, DevPtr)>,
    pub ids: DevPtr,
    pub top_k: usize,
    pub hidden: usize,
    pub width: usize,
    pub act: DevPtr,
}

impl MoeGateUp {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let mut args = vec![
            Arg::Ptr(self.x),
            Arg::Ptr(self.weights.0),
            Arg::Ptr(self.weights.1),
        ];
        if let Some((gate, up)) = self.scales {
            args.extend([Arg::Ptr(gate), Arg::Ptr(up)]);
        }
        args.extend([
            Arg::Ptr(self.ids),
            Arg::I32(self.top_k as i32),
            Arg::I32(self.hidden as i32),
            Arg::I32(self.width as i32),
            Arg::Ptr(self.act),
        ]);
        let grid = (
            (self.tokens * self.top_k) as u32,
            self.width.div_ceil(MOE_WARPS) as u32,
            1,
        );
        let one = self.tokens == 1;
        let gelu = usize::from(self.activation == Activation::GeluTanh);
        let kernel = &k.moe_gate_up[usize::from(!one)][gelu][usize::from(self.scales.is_some())];
        let shared = if one {
            moe_gate_up_shared_bytes(self.hidden)
        } else {
            0
        };
        gpu.launch(kernel, grid, (32 * MOE_WARPS) as u32, shared, &args)
    }
}

/// `moe_down_sum`: every slot's down projection, weighted and summed per
/// token in ascending expert order, added to the f32 residual.
pub struct MoeDownSum {
    pub tokens: usize,
    pub act: DevPtr,
    /// `[experts, hidden, width]` bf16, or e4m3 with `scales`.
    pub down: DevPtr,
    /// An e4m3 stack's row scales.
    pub scales: Option<DevPtr>,
    pub ids: DevPtr,
    pub weights: DevPtr,
    pub top_k: usize,
    pub hidden: usize,
    pub width: usize,
    pub residual: DevPtr,
    /// `(sumsq, weight, xg)`: leave the next RMSNorm of `weight` fused for
    /// the GEMV that consumes it (decode, tokens <= 8): the updated rows'
    /// sums of squares and the pre-scaled input `xg`.
    pub next_norm: Option<(DevPtr, DevPtr, DevPtr)>,
}

impl MoeDownSum {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let mut args = vec![Arg::Ptr(self.act), Arg::Ptr(self.down)];
        args.extend(self.scales.map(Arg::Ptr));
        args.extend([
            Arg::Ptr(self.ids),
            Arg::Ptr(self.weights),
            Arg::I32(self.top_k as i32),
            Arg::I32(self.hidden as i32),
            Arg::I32(self.width as i32),
            Arg::Ptr(self.residual),
        ]);
        let (sumsq, weight, xg) = self.next_norm.unwrap_or_default();
        args.extend([Arg::Ptr(sumsq), Arg::Ptr(weight), Arg::Ptr(xg)]);
        let grid = (
            self.tokens as u32,
            self.hidden.div_ceil(MOE_WARPS) as u32,
            1,
        );
        let one = self.tokens == 1;
        let kernel = &k.moe_down_sum[usize::from(!one)][usize::from(self.scales.is_some())];
        let shared = if one && self.scales.is_none() {
            moe_down_shared_bytes(self.top_k, self.width)
        } else {
            0
        };
        gpu.launch(kernel, grid, (32 * MOE_WARPS) as u32, shared, &args)
    }
}

/// Dynamic shared memory of the one-token gate/up GEMVs: the normed row.
fn moe_gate_up_shared_bytes(hidden: usize) -> u32 {
    (hidden * 2) as u32
}

/// Dynamic shared memory of the one-token bf16 down sum: the token's
/// `top_k` activation rows of `width`.
fn moe_down_shared_bytes(top_k: usize, width: usize) -> u32 {
    (top_k * width * 2) as u32
}

/// One regime's gate/up GEMVs, `[SiLU, GELU-tanh][bf16, e4m3]`.
type GateUpKernels = [[Kernel; 2]; 2];
/// One regime's down sums, `[bf16, e4m3]`.
type DownSumKernels = [Kernel; 2];

/// The per-slot expert GEMVs (see [`Kernels`]'s fields). The one-token
/// kernels (`_b1`: inputs staged in shared memory, many loads a lane in
/// flight) are allowed the shared memory a MoE `config`'s shapes need
/// (above the default 48 KiB for wide experts, e.g. Mixtral's two of
/// 14,336: 56 KiB; the driver refuses more than the device has); the
/// others read their inputs from global memory, which with several tokens'
/// warps in flight measured faster (moe.cu).
fn load_moe_gemvs(
    gpu: &Gpu,
    config: &ModelConfig,
) -> Result<([GateUpKernels; 2], [DownSumKernels; 2]), CudaError> {
    let (gate_up, down) = match &config.block.moe {
        Some(moe) => (
            moe_gate_up_shared_bytes(config.hidden_size),
            moe_down_shared_bytes(moe.experts_per_token, moe.expert_intermediate_size),
        ),
        None => (0, 0),
    };
    let load = |name: &str, bytes: u32| -> Result<Kernel, CudaError> {
        let kernel = gpu.kernel(name)?;
        if bytes > 48 * 1024 {
            kernel.allow_shared_memory(bytes).map_err(|e| {
                CudaError::Unsupported(format!(
                    "{name} needs {bytes} bytes of shared memory for this model's experts: {e}"
                ))
            })?;
        }
        Ok(kernel)
    };
    let gate_ups = |suffix: &str, bytes: u32| -> Result<GateUpKernels, CudaError> {
        Ok([
            [
                load(&format!("moe_gate_up_silu{suffix}"), bytes)?,
                load(&format!("moe_gate_up_silu_e4m3{suffix}"), bytes)?,
            ],
            [
                load(&format!("moe_gate_up_gelu_tanh{suffix}"), bytes)?,
                load(&format!("moe_gate_up_gelu_tanh_e4m3{suffix}"), bytes)?,
            ],
        ])
    };
    Ok((
        [gate_ups("_b1", gate_up)?, gate_ups("", 0)?],
        [
            [
                load("moe_down_sum_b1", down)?,
                load("moe_down_sum_e4m3_b1", 0)?,
            ],
            [load("moe_down_sum", 0)?, load("moe_down_sum_e4m3", 0)?],
        ],
    ))
}

/// Slots per tile of the grouped expert GEMMs (`MOE_TILE_M` in moe.cu).
const MOE_TILE_M: usize = 64;
/// Weight rows per tile (`MOE_TILE_N`): gate/up blocks take half of each.
const MOE_TILE_N: usize = 128;
/// Threads per block of the grouped GEMMs (`MOE_GEMM_THREADS`).
const MOE_GEMM_THREADS: u32 = 128;

/// Whether the grouped expert GEMMs take experts of `width` in a model of
/// `hidden`: whole column blocks and K in steps of 32.
pub fn moe_grouped_fits(hidden: usize, width: usize) -> bool {
    width.is_multiple_of(MOE_TILE_N / 2) && hidden.is_multiple_of(MOE_TILE_N)
}

/// Tiles `moe_align` may fill for `slots` routed slots over `experts`:
/// every expert's slots padded to whole tiles.
pub fn moe_grouped_tiles(slots: usize, experts: usize) -> usize {
    slots.div_ceil(MOE_TILE_M) + experts.min(slots)
}

/// Bytes of `moe_align`'s sorted slot list for `slots` slots.
pub fn moe_sorted_bytes(slots: usize, experts: usize) -> usize {
    moe_grouped_tiles(slots, experts) * MOE_TILE_M * 4
}

/// `moe_align`: the step's slots sorted by expert into tiles of one expert
/// each (`sorted`, -1 padding) and each tile's expert (`tile_expert`).
pub struct MoeAlign {
    pub slots: usize,
    pub experts: usize,
    pub ids: DevPtr,
    pub sorted: DevPtr,
    pub tile_expert: DevPtr,
}

impl MoeAlign {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(self.ids),
            Arg::I32(self.slots as i32),
            Arg::I32(self.experts as i32),
            Arg::I32(moe_grouped_tiles(self.slots, self.experts) as i32),
            Arg::Ptr(self.sorted),
            Arg::Ptr(self.tile_expert),
        ];
        gpu.launch(&k.moe_align, (1, 1, 1), 1024, 0, &args)
    }
}

/// `moe_grouped_gate_up_*`: [`MoeGateUp`]'s output on the tensor cores,
/// a tile of one expert's slots at a time (after [`MoeAlign`]).
pub struct MoeGroupedGateUp {
    pub slots: usize,
    pub experts: usize,
    pub activation: Activation,
    pub x: DevPtr,
    pub top_k: usize,
    /// `(gate, up)` stacks, `[experts, width, hidden]` bf16 each, or e4m3
    /// with `scales`.
    pub weights: (DevPtr, DevPtr),
    /// e4m3 stacks' row scales (gate's, up's).
    pub scales: Option<(DevPtr, DevPtr)>,
    pub width: usize,
    pub hidden: usize,
    pub sorted: DevPtr,
    pub tile_expert: DevPtr,
    pub act: DevPtr,
}

impl MoeGroupedGateUp {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let mut args = vec![
            Arg::Ptr(self.x),
            Arg::I32(self.top_k as i32),
            Arg::Ptr(self.weights.0),
            Arg::Ptr(self.weights.1),
        ];
        if let Some((gate, up)) = self.scales {
            args.extend([Arg::Ptr(gate), Arg::Ptr(up)]);
        }
        args.extend([
            Arg::I32(self.width as i32),
            Arg::I32(self.hidden as i32),
            Arg::Ptr(self.sorted),
            Arg::Ptr(self.tile_expert),
            Arg::Ptr(self.act),
        ]);
        let grid = (
            (self.width / (MOE_TILE_N / 2)) as u32,
            moe_grouped_tiles(self.slots, self.experts) as u32,
            1,
        );
        let kernel = match (self.activation, self.scales.is_some()) {
            (Activation::Silu, false) => &k.moe_grouped_gate_up_silu,
            (Activation::GeluTanh, false) => &k.moe_grouped_gate_up_gelu_tanh,
            (Activation::Silu, true) => &k.moe_grouped_gate_up_silu_e4m3,
            (Activation::GeluTanh, true) => &k.moe_grouped_gate_up_gelu_tanh_e4m3,
        };
        gpu.launch(kernel, grid, MOE_GEMM_THREADS, 0, &args)
    }
}

/// `moe_grouped_down` then `moe_weighted_sum`: every slot's down product
/// (`out`, `[slots, hidden]` f32) on the tensor cores, then each token's
/// slots weighted and summed in ascending expert order into the residual.
pub struct MoeGroupedDown {
    pub tokens: usize,
    pub experts: usize,
    pub top_k: usize,
    pub act: DevPtr,
    /// `[experts, hidden, width]` bf16, or e4m3 with `scales`.
    pub down: DevPtr,
    /// An e4m3 stack's row scales.
    pub scales: Option<DevPtr>,
    pub weights: DevPtr,
    pub hidden: usize,
    pub width: usize,
    pub sorted: DevPtr,
    pub tile_expert: DevPtr,
    pub out: DevPtr,
    pub residual: DevPtr,
}

impl MoeGroupedDown {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let slots = self.tokens * self.top_k;
        let mut args = vec![Arg::Ptr(self.act), Arg::Ptr(self.down)];
        args.extend(self.scales.map(Arg::Ptr));
        args.extend([
            Arg::I32(self.hidden as i32),
            Arg::I32(self.width as i32),
            Arg::Ptr(self.sorted),
            Arg::Ptr(self.tile_expert),
            Arg::Ptr(self.out),
        ]);
        let grid = (
            (self.hidden / MOE_TILE_N) as u32,
            moe_grouped_tiles(slots, self.experts) as u32,
            1,
        );
        let kernel = match self.scales {
            Some(_) => &k.moe_grouped_down_e4m3,
            None => &k.moe_grouped_down,
        };
        gpu.launch(kernel, grid, MOE_GEMM_THREADS, 0, &args)?;
        let args = [
            Arg::Ptr(self.out),
            Arg::Ptr(self.weights),
            Arg::I32(self.top_k as i32),
            Arg::I32(self.hidden as i32),
            Arg::Ptr(self.residual),
        ];
        gpu.launch(
            &k.moe_weighted_sum,
            (self.tokens as u32, 1, 1),
            256,
            0,
            &args,
        )
    }
}

/// `silu_mul_e4m3` / `gelu_tanh_mul_e4m3`: [`GatedMul`] written as an FP8
/// GEMM's input (e4m3 rows and row scales), one block per row, with the same
/// bits as the activation followed by `quantize_rows_e4m3`.
pub struct GatedMulE4m3 {
    pub tokens: usize,
    pub activation: Activation,
    pub gate_up: DevPtr,
    pub quantized: (DevPtr, DevPtr),
    pub width: usize,
}

/// `QUANT_CHUNKS` in fp8.cu: 16-byte chunks a thread holds.
const QUANT_CHUNKS: usize = 8;
/// Threads of a `*_mul_e4m3` block.
const GATED_E4M3_THREADS: usize = 256;

impl GatedMulE4m3 {
    /// Widths the kernel takes: one block's registers hold the row.
    pub fn fits(width: usize) -> bool {
        width.is_multiple_of(8) && width <= 8 * QUANT_CHUNKS * GATED_E4M3_THREADS
    }

    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(self.gate_up),
            Arg::Ptr(self.quantized.0),
            Arg::Ptr(self.quantized.1),
            Arg::I32(self.width as i32),
        ];
        let kernel = match self.activation {
            Activation::Silu => &k.silu_mul_e4m3,
            Activation::GeluTanh => &k.gelu_tanh_mul_e4m3,
        };
        let grid = (self.tokens as u32, 1, 1);
        gpu.launch(kernel, grid, GATED_E4M3_THREADS as u32, 0, &args)
    }
}

/// `argmax_rows`: the greedy token of each row of logits.
pub struct ArgmaxRows {
    pub rows: usize,
    pub logits: DevPtr,
    pub vocab: usize,
    pub out: DevPtr,
}

impl ArgmaxRows {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(self.logits),
            Arg::I32(self.vocab as i32),
            Arg::Ptr(self.out),
        ];
        gpu.launch(&k.argmax_rows, (self.rows as u32, 1, 1), 1024, 0, &args)
    }
}

/// `gather_vocab_shards`: tensor-parallel ranks' LM-head rows, gathered
/// rank-major, into each row's full logits.
pub struct GatherVocabShards {
    pub rows: usize,
    pub gathered: DevPtr,
    pub logits: DevPtr,
    pub vocab: usize,
    pub vocab_rows: usize,
}

impl GatherVocabShards {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(self.gathered),
            Arg::Ptr(self.logits),
            Arg::I32(self.rows as i32),
            Arg::I32(self.vocab as i32),
            Arg::I32(self.vocab_rows as i32),
        ];
        let grid = (self.vocab.div_ceil(256) as u32, self.rows as u32, 1);
        gpu.launch(&k.gather_vocab_shards, grid, 256, 0, &args)
    }
}

/// `name` (a `paged_attention_tc*` kernel) with `bytes` of dynamic shared
/// memory allowed, or `None` for a head size without one.
fn load_tc_decode(gpu: &Gpu, name: &str, bytes: usize) -> Result<Option<(Kernel, u32)>, CudaError> {
    let Ok(kernel) = gpu.kernel(name) else {
        return Ok(None);
    };
    kernel.allow_shared_memory(bytes as u32)?;
    Ok(Some((kernel, bytes as u32)))
}

/// Dynamic shared memory of `paged_attention_tc*` (`DecodeTcSmem::BYTES`):
/// per warp, 3 stages of 16-key bf16 K and V tiles with rows padded by 8
/// elements; for FP8, 4 stages of raw 16-key K and V tiles with rows padded
/// by 16 bytes (converted in registers, not in shared memory).
fn tc_decode_shared_bytes(hd: usize, kv: KvDtype) -> usize {
    const WARPS: usize = 4;
    const KEYS: usize = 16;
    let per_warp = match kv {
        KvDtype::Bf16 => 3 * 2 * KEYS * (hd + 8) * 2,
        KvDtype::Fp8 => 4 * 2 * KEYS * (hd + 16),
    };
    WARPS * per_warp
}

/// The step's paged-attention inputs shared by the decode and prefill
/// kernels.
#[derive(Debug, Clone, Copy)]
pub struct PagedInputs {
    pub tables: DevPtr,
    pub stride: DevPtr,
    pub positions: DevPtr,
}

/// `paged_attention_hd*_g*` over `tokens` decode rows split `splits` ways
/// (partials in `part_acc`/`part_ml`, then [`AttentionCombine`]); it
/// prefetches the first bytes of `prefetch = (weights, bytes)` into L2.
pub struct DecodeAttention {
    pub tokens: usize,
    pub splits: usize,
    pub q: DevPtr,
    pub kv: KvCache,
    pub paged: PagedInputs,
    pub token_seq: DevPtr,
    /// The token rows to attend for (0: rows 0..tokens).
    pub decode_ids: DevPtr,
    pub out: DevPtr,
    pub part_acc: DevPtr,
    pub part_ml: DevPtr,
    pub heads: Heads,
    pub scale_log2: f32,
    /// Attend to the last this many positions (0: all).
    pub window: usize,
    pub prefetch: (DevPtr, usize),
}

impl DecodeAttention {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        self.launch_splits(gpu, k)?;
        if self.splits > 1 {
            self.combine().launch(gpu, k)?;
        }
        Ok(())
    }

    /// The attention kernel alone: with several splits its partials stay
    /// in `part_acc`/`part_ml` for [`Self::combine`] (or a fused block).
    pub fn launch_splits(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let [pf_base, pf_bytes, pf_mode] = k.l2_prefetch.args(self.prefetch.0, self.prefetch.1);
        let args = [
            Arg::Ptr(self.q),
            Arg::Ptr(self.kv.k),
            Arg::Ptr(self.kv.v),
            Arg::Ptr(self.paged.tables),
            Arg::Ptr(self.paged.stride),
            Arg::Ptr(self.token_seq),
            Arg::Ptr(self.paged.positions),
            Arg::Ptr(self.decode_ids),
            Arg::Ptr(self.out),
            Arg::Ptr(self.part_acc),
            Arg::Ptr(self.part_ml),
            Arg::I32(self.heads.heads as i32),
            Arg::I32(self.heads.kv_heads as i32),
            Arg::I32(self.kv.block_size as i32),
            Arg::F32(self.scale_log2),
            Arg::I32(self.splits as i32),
            pf_base,
            pf_bytes,
            pf_mode,
            Arg::I32(self.window as i32),
        ];
        let grid = (
            self.tokens as u32,
            self.heads.kv_heads as u32,
            self.splits as u32,
        );
        match &k.tc_decode_attention {
            Some((tc, smem)) if self.tokens >= k.tc_decode_min_rows => {
                gpu.launch(tc, grid, 128, *smem, &args)
            }
            _ => gpu.launch(&k.decode_attention, grid, 128, 0, &args),
        }
    }

    /// The merge of this launch's split partials into `out`.
    pub fn combine(&self) -> AttentionCombine {
        AttentionCombine {
            tokens: self.tokens,
            splits: self.splits,
            part_acc: self.part_acc,
            part_ml: self.part_ml,
            decode_ids: self.decode_ids,
            out: self.out,
            heads: self.heads,
        }
    }
}

/// `attention_combine`: merges the split partials of each decode row.
pub struct AttentionCombine {
    pub tokens: usize,
    pub splits: usize,
    pub part_acc: DevPtr,
    pub part_ml: DevPtr,
    pub decode_ids: DevPtr,
    pub out: DevPtr,
    pub heads: Heads,
}

impl AttentionCombine {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(self.part_acc),
            Arg::Ptr(self.part_ml),
            Arg::Ptr(self.decode_ids),
            Arg::Ptr(self.out),
            Arg::I32(self.heads.heads as i32),
            Arg::I32(self.heads.head_dim as i32),
            Arg::I32(self.splits as i32),
        ];
        let grid = (self.tokens as u32, self.heads.heads as u32, 1);
        gpu.launch(&k.combine, grid, 128, 0, &args)
    }
}

/// `prefill_attention_hd*`: tensor-core causal attention over `num_tiles`
/// tiles of `(first row, rows, sequence)` triples.
pub struct PrefillAttention {
    pub num_tiles: usize,
    pub tiles: DevPtr,
    pub q: DevPtr,
    pub kv: KvCache,
    pub paged: PagedInputs,
    pub out: DevPtr,
    pub heads: Heads,
    pub scale_log2: f32,
    /// As [`DecodeAttention::window`].
    pub window: usize,
}

impl PrefillAttention {
    pub fn launch(&self, gpu: &Gpu, k: &Kernels) -> Result<(), CudaError> {
        let (kernel, smem) = k.prefill_attention.as_ref().ok_or_else(|| {
            CudaError::Unsupported("prefill tiles without a prefill kernel".into())
        })?;
        let args = [
            Arg::Ptr(self.q),
            Arg::Ptr(self.kv.k),
            Arg::Ptr(self.kv.v),
            Arg::Ptr(self.paged.tables),
            Arg::Ptr(self.paged.stride),
            Arg::Ptr(self.tiles),
            Arg::Ptr(self.paged.positions),
            Arg::Ptr(self.out),
            Arg::I32(self.heads.heads as i32),
            Arg::I32(self.heads.kv_heads as i32),
            Arg::I32(self.kv.block_size as i32),
            Arg::F32(self.scale_log2),
            Arg::I32(self.window as i32),
        ];
        let grid = (self.num_tiles as u32, self.heads.kv_heads as u32, 1);
        gpu.launch(kernel, grid, PREFILL_THREADS, *smem, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_caches_take_the_tc_decode_threshold_of_their_own_key() {
        let opts = |kv, all, fp8, deterministic| crate::CudaRunnerConfig {
            kv_cache_dtype: kv,
            tc_decode_min_rows: all,
            tc_decode_fp8_min_rows: fp8,
            deterministic,
            ..Default::default()
        };
        assert_eq!(tc_decode_rows(&opts(KvDtype::Fp8, 0, 256, false)), 256);
        assert_eq!(tc_decode_rows(&opts(KvDtype::Bf16, 0, 256, false)), 0);
        assert_eq!(tc_decode_rows(&opts(KvDtype::Bf16, 64, 256, false)), 64);
        assert_eq!(tc_decode_rows(&opts(KvDtype::Fp8, 64, 256, false)), 64);
        assert_eq!(tc_decode_rows(&opts(KvDtype::Fp8, 512, 256, false)), 256);
        assert_eq!(tc_decode_rows(&opts(KvDtype::Fp8, 0, 0, false)), 0);
        assert_eq!(tc_decode_rows(&opts(KvDtype::Fp8, 64, 256, true)), 0);
    }

    #[test]
    fn tc_decode_rings_fit_two_or_three_blocks_an_sm_and_hold_the_accumulators() {
        // DecodeTcSmem<128, bf16 / fp8>::BYTES in attention.cu.
        assert_eq!(tc_decode_shared_bytes(128, KvDtype::Bf16), 104_448);
        assert_eq!(tc_decode_shared_bytes(128, KvDtype::Fp8), 73_728);
        for hd in [64, 128] {
            for kv in [KvDtype::Bf16, KvDtype::Fp8] {
                let bytes = tc_decode_shared_bytes(hd, kv);
                // Hopper: 228 KiB of shared memory per SM, 1 KiB reserved per
                // block; FP8 rings are small enough for 3 blocks.
                let blocks = if kv == KvDtype::Fp8 { 3 } else { 2 };
                assert!(
                    blocks * (bytes + 1024) <= 228 << 10,
                    "hd {hd} {kv:?}: {bytes}"
                );
                // The 4 warps' f32 accumulators of up to 8 heads reuse the ring.
                assert!(bytes >= 4 * 8 * hd * 4, "hd {hd} {kv:?}: {bytes}");
            }
        }
    }

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

    /// Qwen3-30B-A3B's experts on the 8B's attention shape.
    fn moe_model(width: usize) -> ModelConfig {
        let mut c = crate::test_configs::llama8b();
        c.hidden_size = 2048;
        c.block.moe = Some(ingot_models::MoeConfig {
            num_experts: 128,
            experts_per_token: 8,
            expert_intermediate_size: width,
            normalize_top_k: true,
            dense_layers: Vec::new(),
        });
        c
    }

    #[test]
    fn grouped_experts_need_the_flag_fitting_shapes_and_no_determinism() {
        let opts = |min, deterministic| crate::CudaRunnerConfig {
            moe_grouped_min_tokens: min,
            deterministic,
            ..Default::default()
        };
        assert_eq!(
            moe_grouped_min_tokens(&opts(32, false), &moe_model(768)),
            32
        );
        assert_eq!(moe_grouped_min_tokens(&opts(0, false), &moe_model(768)), 0);
        assert_eq!(moe_grouped_min_tokens(&opts(32, true), &moe_model(768)), 0);
        // Column blocks of 64: a width of 96 takes the GEMVs.
        assert_eq!(moe_grouped_min_tokens(&opts(32, false), &moe_model(96)), 0);
        let dense = crate::test_configs::llama8b();
        assert_eq!(moe_grouped_min_tokens(&opts(32, false), &dense), 0);
    }

    #[test]
    fn moe_align_tiles_cover_every_routing() {
        // Each touched expert's slots padded to whole tiles of 64 never
        // exceed the tiles the grid and the sorted list are sized for.
        let padded = |counts: &[usize]| -> usize { counts.iter().map(|c| c.div_ceil(64)).sum() };
        for (slots, experts) in [(1, 128), (8, 128), (63, 2), (65, 2), (8192, 128), (500, 8)] {
            let tiles = moe_grouped_tiles(slots, experts);
            // All on one expert, spread evenly, and one slot on each but one.
            let mut one = vec![0; experts];
            one[experts - 1] = slots;
            let even: Vec<usize> = (0..experts)
                .map(|e| slots / experts + usize::from(e < slots % experts))
                .collect();
            let mut singles = vec![0; experts];
            for (e, c) in singles.iter_mut().enumerate().take(slots.min(experts - 1)) {
                *c = 1 + usize::from(e == 0) * (slots - slots.min(experts - 1));
            }
            for counts in [one, even, singles] {
                assert_eq!(counts.iter().sum::<usize>(), slots);
                assert!(
                    padded(&counts) <= tiles,
                    "{slots} over {experts}: {counts:?}"
                );
            }
            assert_eq!(moe_sorted_bytes(slots, experts), tiles * 64 * 4);
        }
    }

    #[test]
    fn prefill_shared_memory_fits_hopper() {
        // 227 KiB per SM on sm_90: two blocks per SM for head_dim 128 (the
        // kernel's launch bounds), with either cache type.
        for kv in [KvDtype::Bf16, KvDtype::Fp8] {
            assert!(prefill_shared_bytes(128, kv) * 2 <= 227 * 1024, "{kv:?}");
            assert!(prefill_shared_bytes(64, kv) <= 163 * 1024, "sm_80 limit");
        }
        assert_eq!(prefill_shared_bytes(128, KvDtype::Bf16), 69_632);
        assert_eq!(prefill_shared_bytes(128, KvDtype::Fp8), 69_632 + 8_192);
    }
}
