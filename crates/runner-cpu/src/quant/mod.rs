//! Native quantized matmul: weights stay in their GGUF blocks (Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), borrowed from the memory map;
//! activations are quantized to int8 per block ([`act`]) and every output
//! is an integer dot product per block ([`scalar`], [`avx2`]).
//!
//! Batch-1 decode is bound by weight bytes read: Q4_1 is 5 bits a weight
//! against f32's 32. The price is accuracy: products use int8 activations
//! (like llama.cpp's CPU path), so logits differ from the exact f32 path
//! by about the activation rounding. Results do not depend on the batch:
//! each row's activations are quantized alone and each output is one
//! fixed-order dot product.
//!
//! Many-row products (prefill, batched decode) run tiles of four weight rows
//! by four activation rows: each weight block is decoded once for four
//! activation rows and each activation block loaded once for four weight
//! rows, which makes them as fast as the f32 FMA tiles of [`crate::matmul`]
//! (issue 20; docs/benchmarks.md); a batch's last two rows take a tile of
//! four weight rows by two, its last three the four-row tile with the last
//! row repeated (docs/speculative.md). Where the CPU has AVX512-VNNI, one
//! `vpdpbusd` replaces `maddubs` + `madd` (the same exact integers).
//!
//! A [`QuantMatrix`] may stack several tensors (fused q/k/v, gate/up) of
//! different formats; its work is cut into tasks of whole rows of one part
//! once, at load, so a call allocates nothing.

mod act;
#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod quantize;
mod scalar;

use ingot_models::gguf::{dequantize_into, GgmlType};
use ingot_models::BlockData;
use rayon::prelude::*;

pub use act::{ActFormat, ActRow, QuantActs};
pub use quantize::{quantize, quantize_q4_0, quantize_q4_k, quantize_q8_0};

/// The block formats with native kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantKind {
    /// 4-bit, symmetric, 32 per block.
    Q4_0,
    /// 4-bit with min, 32 per block.
    Q4_1,
    /// 5-bit, symmetric, 32 per block.
    Q5_0,
    /// 5-bit with min, 32 per block.
    Q5_1,
    /// 8-bit, 32 per block.
    Q8_0,
    /// 4-bit k-quant, 256 per super-block.
    Q4K,
    /// 5-bit k-quant, 256 per super-block.
    Q5K,
    /// 6-bit k-quant, 256 per super-block.
    Q6K,
}

impl QuantKind {
    /// Every kind, for tests.
    pub const ALL: [QuantKind; 8] = [
        QuantKind::Q4_0,
        QuantKind::Q4_1,
        QuantKind::Q5_0,
        QuantKind::Q5_1,
        QuantKind::Q8_0,
        QuantKind::Q4K,
        QuantKind::Q5K,
        QuantKind::Q6K,
    ];

    /// The kind for a ggml type, when there is a kernel.
    pub fn from_ggml(t: GgmlType) -> Option<Self> {
        Some(match t {
            GgmlType::Q4_0 => QuantKind::Q4_0,
            GgmlType::Q4_1 => QuantKind::Q4_1,
            GgmlType::Q5_0 => QuantKind::Q5_0,
            GgmlType::Q5_1 => QuantKind::Q5_1,
            GgmlType::Q8_0 => QuantKind::Q8_0,
            GgmlType::Q4_K => QuantKind::Q4K,
            GgmlType::Q5_K => QuantKind::Q5K,
            GgmlType::Q6_K => QuantKind::Q6K,
            _ => return None,
        })
    }

    /// The ggml type.
    pub fn ggml(self) -> GgmlType {
        match self {
            QuantKind::Q4_0 => GgmlType::Q4_0,
            QuantKind::Q4_1 => GgmlType::Q4_1,
            QuantKind::Q5_0 => GgmlType::Q5_0,
            QuantKind::Q5_1 => GgmlType::Q5_1,
            QuantKind::Q8_0 => GgmlType::Q8_0,
            QuantKind::Q4K => GgmlType::Q4_K,
            QuantKind::Q5K => GgmlType::Q5_K,
            QuantKind::Q6K => GgmlType::Q6_K,
        }
    }

    /// The activation layout this format's kernel reads.
    pub fn act(self) -> ActFormat {
        match self {
            QuantKind::Q4K | QuantKind::Q5K | QuantKind::Q6K => ActFormat::Q8K,
            _ => ActFormat::Q8,
        }
    }

    /// Bytes of one row of `cols` weights.
    pub fn row_bytes(self, cols: usize) -> usize {
        let t = self.ggml();
        cols / t.block_size() * t.type_size()
    }
}

/// A row dot product: `w` is whole blocks, `x` the matching activations.
///
/// Marked unsafe because the SIMD kernels need their CPU features; the
/// function [`dot_fn`] returns is safe to call on this CPU.
pub type DotFn = unsafe fn(&[u8], ActRow<'_>) -> f32;

/// Two activation rows against one weight row, each weight block decoded
/// once for both (a batch's last two or three rows; a speculative verify
/// step of a few tokens).
pub type Dot2Fn = unsafe fn(&[u8], &[ActRow<'_>; 2]) -> [f32; 2];

/// Four activation rows against one weight row: each weight block is
/// decoded once for all four (prefill and batched decode).
pub type Dot4Fn = unsafe fn(&[u8], &[ActRow<'_>; 4]) -> [f32; 4];

/// Weight rows per tile.
pub const TILE_W: usize = 4;

/// [`TILE_W`] weight rows against four activation rows (prefill and
/// batched decode): each activation block is loaded once for all the
/// weight rows. Results equal [`Dot4Fn`]'s on each weight row, bit for bit.
pub type TileFn = unsafe fn([&[u8]; TILE_W], &[ActRow<'_>; 4]) -> [[f32; 4]; TILE_W];

/// [`TILE_W`] weight rows against two activation rows (a batch's last
/// two). Results equal [`Dot2Fn`]'s on each weight row, bit for bit.
pub type Tile2Fn = unsafe fn([&[u8]; TILE_W], &[ActRow<'_>; 2]) -> [[f32; 2]; TILE_W];

/// The kernels of one format for this CPU; every entry computes each
/// (weight row, activation row) pair with the same operations in the same
/// order, so a row's result does not depend on which one ran it.
#[derive(Clone, Copy)]
pub struct Kernels {
    /// One activation row.
    pub one: DotFn,
    /// Two activation rows.
    pub two: Dot2Fn,
    /// Four activation rows.
    pub four: Dot4Fn,
    /// [`TILE_W`] weight rows × four, two and one activation rows, where the
    /// format has them.
    pub tile: Option<Tiles>,
}

/// [`TILE_W`] weight rows against one activation row (batch-1 decode):
/// four rows stream at once. Results equal [`DotFn`]'s, bit for bit.
pub type Tile1Fn = unsafe fn([&[u8]; TILE_W], &[ActRow<'_>; 1]) -> [[f32; 1]; TILE_W];

/// A format's tile kernels.
#[derive(Clone, Copy)]
pub struct Tiles {
    pub four: TileFn,
    pub two: Tile2Fn,
    pub one: Tile1Fn,
}

/// The fastest kernels this CPU runs for `kind`: AVX512-VNNI (its
/// `vpdpbusd` gives the same integers as AVX2's `maddubs` + `madd` in one
/// instruction), AVX2, or portable.
pub fn kernels(kind: QuantKind) -> Kernels {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2() {
            return avx2_kernels(kind, has_vnni());
        }
    }
    Kernels {
        one: portable_dot_fn(kind),
        two: portable_rows::<2>(kind),
        four: portable_rows::<4>(kind),
        tile: None,
    }
}

/// The AVX2 kernels, with the VNNI integer product when `vnni`.
#[cfg(target_arch = "x86_64")]
fn avx2_kernels(kind: QuantKind, vnni: bool) -> Kernels {
    macro_rules! k32 {
        ($plain:ident, $vnni:ident) => {
            if vnni {
                Kernels {
                    one: avx2::$vnni::one,
                    two: avx2::$vnni::two,
                    four: avx2::$vnni::four,
                    tile: Some(Tiles {
                        four: avx2::$vnni::tile,
                        two: avx2::$vnni::tile2,
                        one: avx2::$vnni::tile1,
                    }),
                }
            } else {
                Kernels {
                    one: avx2::$plain::one,
                    two: avx2::$plain::two,
                    four: avx2::$plain::four,
                    tile: Some(Tiles {
                        four: avx2::$plain::tile,
                        two: avx2::$plain::tile2,
                        one: avx2::$plain::tile1,
                    }),
                }
            }
        };
    }
    let k = |one: DotFn, two: Dot2Fn, four: Dot4Fn| Kernels {
        one,
        two,
        four,
        tile: None,
    };
    match kind {
        QuantKind::Q4_0 => k32!(q4_0, q4_0_vnni),
        QuantKind::Q4_1 => k32!(q4_1, q4_1_vnni),
        QuantKind::Q5_0 => k32!(q5_0, q5_0_vnni),
        QuantKind::Q5_1 => k32!(q5_1, q5_1_vnni),
        QuantKind::Q8_0 => k32!(q8_0, q8_0_vnni),
        QuantKind::Q4K => k(avx2::dot_q4_k, avx2::dot_q4_k_x2, avx2::dot_q4_k_x4),
        QuantKind::Q5K => k(avx2::dot_q5_k, avx2::dot_q5_k_x2, avx2::dot_q5_k_x4),
        QuantKind::Q6K => k(avx2::dot_q6_k, avx2::dot_q6_k_x2, avx2::dot_q6_k_x4),
    }
}

/// The portable `R`-row kernel for `kind`.
fn portable_rows<const R: usize>(
    kind: QuantKind,
) -> unsafe fn(&[u8], &[ActRow<'_>; R]) -> [f32; R] {
    match kind {
        QuantKind::Q4_0 => rows::<{ QuantKind::Q4_0 as u8 }, R>,
        QuantKind::Q4_1 => rows::<{ QuantKind::Q4_1 as u8 }, R>,
        QuantKind::Q5_0 => rows::<{ QuantKind::Q5_0 as u8 }, R>,
        QuantKind::Q5_1 => rows::<{ QuantKind::Q5_1 as u8 }, R>,
        QuantKind::Q8_0 => rows::<{ QuantKind::Q8_0 as u8 }, R>,
        QuantKind::Q4K => rows::<{ QuantKind::Q4K as u8 }, R>,
        QuantKind::Q5K => rows::<{ QuantKind::Q5K as u8 }, R>,
        QuantKind::Q6K => rows::<{ QuantKind::Q6K as u8 }, R>,
    }
}

/// The portable `R`-row kernel: the one-row kernel `R` times.
///
/// # Safety
/// As [`DotFn`], for each row.
unsafe fn rows<const KIND: u8, const R: usize>(w: &[u8], x: &[ActRow<'_>; R]) -> [f32; R] {
    let dot = portable_dot_fn(QuantKind::ALL[KIND as usize]);
    // SAFETY: the portable kernels need no CPU features; forwarded contract.
    x.map(|x| unsafe { dot(w, x) })
}

/// The fastest one-row kernel this CPU runs for `kind`.
pub fn dot_fn(kind: QuantKind) -> DotFn {
    kernels(kind).one
}

/// The portable kernel for `kind`.
pub fn portable_dot_fn(kind: QuantKind) -> DotFn {
    match kind {
        QuantKind::Q4_0 => scalar::dot_q4_0,
        QuantKind::Q4_1 => scalar::dot_q4_1,
        QuantKind::Q5_0 => scalar::dot_q5_0,
        QuantKind::Q5_1 => scalar::dot_q5_1,
        QuantKind::Q8_0 => scalar::dot_q8_0,
        QuantKind::Q4K => scalar::dot_q4_k,
        QuantKind::Q5K => scalar::dot_q5_k,
        QuantKind::Q6K => scalar::dot_q6_k,
    }
}

#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    std::is_x86_feature_detected!("avx512vnni") && std::is_x86_feature_detected!("avx512vl")
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
        && std::is_x86_feature_detected!("f16c")
}

/// Activation buffers for both layouts, reused across calls.
#[derive(Default)]
pub struct ActScratch {
    q8: QuantActs,
    q8k: QuantActs,
}

/// Whether this CPU and OS run `model.cpu_weights = "amx"`: AMX-INT8,
/// AVX512 with VNNI, and Linux's permission for the tile state.
pub fn amx_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Up to this many activation rows run the AMX mode's AVX512-VNNI kernel
/// (same bits) instead of the tiles: `quant_speed`, 576 x 3072 Q4_1, ms,
/// VNNI / tiles: 4 rows 0.048-0.051 / 0.086-0.096, 8 rows 0.089-0.098 /
/// 0.109-0.122, 16 rows 0.156-0.159 / 0.111-0.113.
#[cfg(target_arch = "x86_64")]
const AMX_VNNI_MAX: usize = 8;

/// Most tensors one matrix stacks (q, k, v).
const MAX_PARTS: usize = 4;
/// Weight bytes per task: small enough to balance two to a few dozen
/// threads on decode, large enough that scheduling costs little.
const TASK_BYTES: usize = 16 * 1024;

/// One stacked tensor.
struct Part {
    kind: QuantKind,
    data: BlockData,
    rows: usize,
    row_bytes: usize,
}

/// Rows `row0..row0 + rows` of part `part`, written to output columns from `col0`.
#[derive(Clone, Copy)]
struct Task {
    part: usize,
    row0: usize,
    rows: usize,
    col0: usize,
}

/// Output pointer shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each task writes only the columns of its own rows.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Writes `v` at index `i`.
    ///
    /// # Safety
    /// `i` must be inside the output and written by no other thread.
    #[inline]
    unsafe fn write(self, i: usize, v: f32) {
        // SAFETY: caller contract.
        unsafe { *self.0.add(i) = v };
    }
}

/// Output column of weight row `r` of a task whose rows start at
/// `cols.1` and write from column `cols.0`.
#[inline]
fn col_of(cols: (usize, usize), r: usize) -> usize {
    cols.0 + r - cols.1
}

/// Weight rows `w` ([`TILE_W`]) against all `m` activation rows: tiles,
/// three rows left as a tile too, then the two-row or one-row tile.
///
/// # Safety
/// `tile` and `k` are this CPU's kernels for the rows' format; `acts` holds
/// `m` rows matching them; the output columns of `r..r + TILE_W` are inside
/// `out` (`m * n`) and written by no other thread.
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn rows_tile(
    tiles: Tiles,
    w: [&[u8]; TILE_W],
    acts: &QuantActs,
    m: usize,
    n: usize,
    out: OutPtr,
    cols: (usize, usize),
    r: usize,
) {
    let c: [usize; TILE_W] = std::array::from_fn(|j| col_of(cols, r + j));
    let mut i = 0;
    // SAFETY: caller contract; i + 3 < m.
    unsafe {
        // Three rows left take the tile too, the last one twice (its
        // second result dropped): a tile of four costs less than two rows
        // and one (quant_speed).
        while i + 3 <= m {
            let rows = acts.four_rows(i, m);
            let v = (tiles.four)(w, &rows);
            for (j, v) in v.into_iter().enumerate() {
                for (a, v) in v.into_iter().enumerate().take(m - i) {
                    out.write((i + a) * n + c[j], v);
                }
            }
            i += 4;
        }
        if i + 2 <= m {
            let rows = acts.two_rows(i);
            for (j, v) in (tiles.two)(w, &rows).into_iter().enumerate() {
                for (a, v) in v.into_iter().enumerate() {
                    out.write((i + a) * n + c[j], v);
                }
            }
            i += 2;
        }
        if i < m {
            for (j, v) in (tiles.one)(w, &[acts.row(i)]).into_iter().enumerate() {
                out.write(i * n + c[j], v[0]);
            }
        }
    }
}

/// Weight row `w` against all `m` activation rows: the four-row kernel,
/// three rows left through it too, then the two-row or one-row kernel.
///
/// # Safety
/// As [`rows_tile`], for one weight row.
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn rows_four(
    k: Kernels,
    w: &[u8],
    acts: &QuantActs,
    m: usize,
    n: usize,
    out: OutPtr,
    cols: (usize, usize),
    r: usize,
) {
    let col = col_of(cols, r);
    let mut i = 0;
    // SAFETY: caller contract.
    unsafe {
        while i + 3 <= m {
            let rows = acts.four_rows(i, m);
            for (a, v) in (k.four)(w, &rows).into_iter().enumerate().take(m - i) {
                out.write((i + a) * n + col, v);
            }
            i += 4;
        }
        if i + 2 <= m {
            for (a, v) in (k.two)(w, &acts.two_rows(i)).into_iter().enumerate() {
                out.write((i + a) * n + col, v);
            }
            i += 2;
        }
        for i in i..m {
            out.write(i * n + col, (k.one)(w, acts.row(i)));
        }
    }
}

/// The parts' rows cut into tasks of about [`TASK_BYTES`], a multiple of
/// `unit` rows each (but a part's last).
fn tasks_of(parts: &[Part], unit: usize) -> Vec<Task> {
    let mut tasks = Vec::new();
    let mut col0 = 0;
    for (i, p) in parts.iter().enumerate() {
        let per_task = (TASK_BYTES / p.row_bytes.max(1))
            .clamp(4, 256)
            .next_multiple_of(unit);
        for row0 in (0..p.rows).step_by(per_task) {
            tasks.push(Task {
                part: i,
                row0,
                rows: per_task.min(p.rows - row0),
                col0: col0 + row0,
            });
        }
        col0 += p.rows;
    }
    tasks
}

/// Each part's blocks and kernels, borrowed for one product.
type PartViews<'a> = ([&'a [u8]; MAX_PARTS], [Kernels; MAX_PARTS]);

/// One product of [`QuantMatrix::linear_many`]: `out[m, n] = x[m, k] ·
/// matrixᵀ`.
pub struct Product<'a> {
    pub matrix: &'a QuantMatrix,
    pub x: &'a [f32],
    pub m: usize,
    pub out: &'a mut [f32],
}

/// A `[rows, cols]` weight matrix in block formats: tensors stacked by rows.
pub struct QuantMatrix {
    parts: Vec<Part>,
    cols: usize,
    rows: usize,
    tasks: Vec<Task>,
    /// The 32-block parts repacked for the AMX kernels, per part
    /// ([`QuantMatrix::with_amx`]).
    #[cfg(target_arch = "x86_64")]
    packed: Vec<Option<amx::Packed>>,
}

impl QuantMatrix {
    /// Stacks `parts` (kind, blocks, rows) of rows of `cols` weights.
    /// `None` when a part's byte length does not match its shape or there
    /// are too many parts.
    pub fn new(parts: Vec<(QuantKind, BlockData, usize)>, cols: usize) -> Option<Self> {
        if parts.is_empty() || parts.len() > MAX_PARTS {
            return None;
        }
        let mut out = Vec::with_capacity(parts.len());
        for (kind, data, rows) in parts {
            let t = kind.ggml();
            if !cols.is_multiple_of(t.block_size()) {
                return None;
            }
            let row_bytes = kind.row_bytes(cols);
            if data.bytes().len() != rows * row_bytes {
                return None;
            }
            out.push(Part {
                kind,
                data,
                rows,
                row_bytes,
            });
        }
        Some(Self {
            tasks: tasks_of(&out, 1),
            rows: out.iter().map(|p| p.rows).sum(),
            parts: out,
            cols,
            #[cfg(target_arch = "x86_64")]
            packed: Vec::new(),
        })
    }

    /// With `on` (and [`amx_available`]), the parts in Q4_0, Q4_1, Q5_0,
    /// Q5_1 and Q8_0 are repacked 16 rows at a time and run the AMX
    /// kernels (module `amx`): other bits than the AVX2 kernels',
    /// batch-invariant as they are.
    pub fn with_amx(mut self, on: bool) -> Self {
        #[cfg(target_arch = "x86_64")]
        if on && amx_available() {
            let cols = self.cols;
            self.packed = self
                .parts
                .iter()
                .map(|p| amx::Packed::new(p.kind, p.data.bytes(), p.rows, cols))
                .collect();
            // Whole chunks of 16 weight rows per task.
            self.tasks = tasks_of(&self.parts, amx::ROWS);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = on;
        self
    }

    /// Whether any part runs the AMX kernels.
    pub fn uses_amx(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            self.packed.iter().any(Option::is_some)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes of blocks held.
    pub fn bytes(&self) -> usize {
        self.parts.iter().map(|p| p.rows * p.row_bytes).sum()
    }

    /// `out[m, n] = x[m, k] · selfᵀ` where self is `[n, k]`.
    pub fn linear(&self, x: &[f32], out: &mut [f32], m: usize, scratch: &mut ActScratch) {
        let (k, n) = (self.cols, self.rows);
        assert!(x.len() >= m * k && out.len() >= m * n);
        self.quantize_input(x, m, scratch);
        let ptr = OutPtr(out.as_mut_ptr());
        let scratch = &*scratch;
        let parts = self.part_views();
        self.tasks
            .par_iter()
            .for_each(|t| self.run_task(t, &parts, scratch, m, ptr));
    }

    /// Several products in one parallel pass (a step's experts): every
    /// input is quantized into its own scratch, then the products' tasks
    /// share one `par_iter`, so small products do not each pay a fork and
    /// join, and the threads balance across all of them. Each product's
    /// result is the bits [`QuantMatrix::linear`] gives.
    pub fn linear_many(products: &mut [Product<'_>], scratch: &mut Vec<ActScratch>) {
        scratch.resize_with(scratch.len().max(products.len()), ActScratch::default);
        let mut work = Vec::new();
        let mut views = Vec::with_capacity(products.len());
        for (i, (p, s)) in products.iter_mut().zip(scratch.iter_mut()).enumerate() {
            let (k, n) = (p.matrix.cols, p.matrix.rows);
            assert!(p.x.len() >= p.m * k && p.out.len() >= p.m * n);
            p.matrix.quantize_input(p.x, p.m, s);
            let matrix: &QuantMatrix = p.matrix;
            views.push((matrix, p.m, matrix.part_views(), OutPtr(p.out.as_mut_ptr())));
            work.extend((0..matrix.tasks.len()).map(|t| (i, t)));
        }
        let scratch = &*scratch;
        work.par_iter().for_each(|&(i, t)| {
            let (matrix, m, parts, ptr) = &views[i];
            matrix.run_task(&matrix.tasks[t], parts, &scratch[i], *m, *ptr);
        });
    }

    /// Quantizes `m` rows of `x` in the activation formats the parts need.
    fn quantize_input(&self, x: &[f32], m: usize, scratch: &mut ActScratch) {
        let k = self.cols;
        let needs = |f: ActFormat| self.parts.iter().any(|p| p.kind.act() == f);
        if needs(ActFormat::Q8) {
            scratch.q8.quantize(x, m, k, ActFormat::Q8);
        }
        if needs(ActFormat::Q8K) {
            scratch.q8k.quantize(x, m, k, ActFormat::Q8K);
        }
    }

    /// Each part's blocks and kernels.
    fn part_views(&self) -> PartViews<'_> {
        let mut bytes: [&[u8]; MAX_PARTS] = [&[]; MAX_PARTS];
        let mut kerns = [kernels(QuantKind::Q8_0); MAX_PARTS];
        for (i, p) in self.parts.iter().enumerate() {
            bytes[i] = p.data.bytes();
            kerns[i] = kernels(p.kind);
        }
        (bytes, kerns)
    }

    /// One task's weight rows against all `m` activation rows.
    fn run_task(
        &self,
        t: &Task,
        (bytes, kerns): &PartViews<'_>,
        scratch: &ActScratch,
        m: usize,
        ptr: OutPtr,
    ) {
        let n = self.rows;
        let p = &self.parts[t.part];
        let acts = match p.kind.act() {
            ActFormat::Q8 => &scratch.q8,
            ActFormat::Q8K => &scratch.q8k,
        };
        let w = |r: usize| &bytes[t.part][r * p.row_bytes..(r + 1) * p.row_bytes];
        let cols = (t.col0, t.row0);
        #[cfg(target_arch = "x86_64")]
        if let Some(packed) = self.packed.get(t.part).and_then(Option::as_ref) {
            let (tiles, vnni) = packed.kernels();
            for r in (t.row0..t.row0 + t.rows).step_by(amx::ROWS) {
                let real = amx::ROWS.min(t.row0 + t.rows - r);
                let (chunk, col) = (packed.chunk_arg(r / amx::ROWS), col_of(cols, r));
                // SAFETY: the AMX kernels of the part's format on its
                // packed rows (tasks start on whole chunks); `packed` is
                // only set where `amx_available`; each task writes its own
                // columns.
                unsafe {
                    let kernel = if m <= AMX_VNNI_MAX { vnni } else { tiles };
                    kernel(chunk, real, (acts, m), (ptr, n, col));
                }
            }
            return;
        }
        // Weight rows outer: a row's blocks are read from memory once,
        // decoded once per four activation rows, and stay in L1.
        let mut r = t.row0;
        if let Some(tiles) = kerns[t.part].tile {
            while r + TILE_W <= t.row0 + t.rows {
                let ws = std::array::from_fn(|j| w(r + j));
                // SAFETY: `tile` is this CPU's kernel for the format;
                // the rows are whole rows of `k` weights.
                unsafe { rows_tile(tiles, ws, acts, m, n, ptr, cols, r) };
                r += TILE_W;
            }
        }
        for r in r..t.row0 + t.rows {
            // SAFETY: as above, for one weight row.
            unsafe { rows_four(kerns[t.part], w(r), acts, m, n, ptr, cols, r) };
        }
    }

    /// Dequantizes row `r` into `out` (`cols` values): embedding lookups.
    pub fn row_into(&self, mut r: usize, out: &mut [f32]) {
        for p in &self.parts {
            if r < p.rows {
                let bytes = &p.data.bytes()[r * p.row_bytes..(r + 1) * p.row_bytes];
                // Lengths match by construction; a mismatch would be a bug.
                dequantize_into(p.kind.ggml(), bytes, out)
                    .expect("row length matches its blocks. This is a bug.");
                return;
            }
            r -= p.rows;
        }
        panic!("row {r} out of range. This is a bug.");
    }
}

#[cfg(test)]
mod tests;
