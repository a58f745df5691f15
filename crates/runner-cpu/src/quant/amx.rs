//! AMX tile products for the 32-block formats (Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0), taken with `model.cpu_weights = "amx"` on CPUs with AMX-INT8
//! (Intel Xeon from Sapphire Rapids on).
//!
//! At load each part's rows are repacked 16 at a time ([`Packed`]): per
//! block, the quants as 8 tile rows of four consecutive values of each of
//! the 16 rows (the B tile layout, and the layout `vpdpbusd` over 16 rows
//! wants), 4-bit values two a byte, Q5's fifth bits as masks, Q8_0 offset
//! to unsigned, then the 16 rows' f16 scales (and mins). The same bytes as
//! the file's blocks, one copy.
//!
//! Many activation rows: one `tdpbsud` multiplies up to 16 activation rows
//! (the A tile, read in place from the quantized activations) by the 16
//! weight rows (the B tile, expanded to a byte a weight once per task) over
//! one block. Up to eight rows skip the tiles: each block's tile rows are
//! expanded once, then eight `vpdpbusd` per activation row with its values
//! broadcast give the same per-row integer sums (lanes are weight rows).
//! Either way each pair's exact block sum is `S = Σ u·x − offset·Σx`
//! (unsigned quants `u`, offset 8 for Q4_0, 16 for Q5_0, 128 for Q8_0),
//! then, block by block, `acc = fma(d_w, S · d_x, acc)` and, for formats
//! with a min, `acc = fma(m_w, s_x, acc)` (`s_x = d_x Σq_x`).
//!
//! Every pair runs those operations in that order whatever the batch, so
//! results do not depend on it. They differ from the AVX2 kernels' in the
//! last bits: those sum each block's integers in eight lanes before
//! scaling.
//!
//! The tile configuration stays loaded on a thread between products (a
//! `ldtilecfg` costs about as much as a dozen tile products here); nothing
//! else in the process uses the tiles.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::{Cell, RefCell};
use std::sync::OnceLock;

use rayon::prelude::*;

use super::act::{ActRow, QuantActs};
use super::{OutPtr, QuantKind};

/// Weight rows per tile (and per packed chunk).
pub const ROWS: usize = 16;
/// Activation rows per tile.
const COLS: usize = 16;

/// `arch_prctl` request for permission to use an extended state component.
const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
/// The AMX tile data state component.
const XFEATURE_XTILEDATA: libc::c_long = 18;

/// Whether this CPU and OS run the AMX kernels: AMX-TILE and AMX-INT8
/// (CPUID leaf 7), AVX512F/BW/VL/VNNI, F16C, and the kernel's permission
/// for the tile data state (Linux asks each process to request it).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let leaf7 = __cpuid_count(7, 0);
        let amx = (leaf7.edx >> 24) & 1 == 1 && (leaf7.edx >> 25) & 1 == 1;
        let simd = std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512vnni")
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c");
        // SAFETY: a plain syscall; it only grants this process the state.
        amx && simd
            && unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            } == 0
    })
}

/// A byte buffer that starts on a cache line: tile rows (32 or 64 bytes
/// at strides that are multiples of 64) then never straddle two lines.
#[derive(Default)]
struct Lines(Vec<Line>);

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl Lines {
    /// At least `len` bytes.
    fn resize(&mut self, len: usize) {
        self.0.resize(len.div_ceil(64), Line([0; 64]));
    }

    fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr() as *const u8
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the lines are initialized bytes, contiguous.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.0.len() * 64) }
    }
}

/// The formats, as the kernels' `KIND` (QuantKind's order).
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;

/// GGUF block bytes.
const fn block_bytes(kind: u8) -> usize {
    [18, 20, 22, 24, 34][kind as usize]
}

/// Bytes of one packed tile row: 64 values, two a byte below 8 bits.
const fn qrow(kind: u8) -> usize {
    if kind == Q8_0 {
        64
    } else {
        32
    }
}

/// Where a record's fifth-bit masks (Q5), scales and mins start.
const fn fifth_at(kind: u8) -> usize {
    8 * qrow(kind)
}
const fn scales_at(kind: u8) -> usize {
    fifth_at(kind) + if matches!(kind, Q5_0 | Q5_1) { 64 } else { 0 }
}
const fn has_min(kind: u8) -> bool {
    matches!(kind, Q4_1 | Q5_1)
}

/// Bytes of one (16 rows, one block) record, whole cache lines.
const fn record(kind: u8) -> usize {
    (scales_at(kind) + 32 + if has_min(kind) { 32 } else { 0 }).div_ceil(64) * 64
}

/// What the unsigned quants are offset by from the weights' integers.
const fn offset(kind: u8) -> i32 {
    [8, 0, 16, 0, 128][kind as usize]
}

/// Four bytes at `at` as a little-endian u32.
fn u32_at(block: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]])
}

/// Row `i` of a chunk, block `block` of `kind`, into the block's record.
fn pack_block(kind: u8, block: &[u8], i: usize, r: &mut [u8]) {
    for t in 0..8 {
        // Quants 4t..4t + 4: of a 32-block's 16 bytes, the low nibbles
        // hold quants 0..16, the high ones 16..32.
        if kind == Q8_0 {
            let q = u32_at(block, 2 + 4 * t) ^ 0x8080_8080;
            r[t * 64 + 4 * i..t * 64 + 4 * i + 4].copy_from_slice(&q.to_le_bytes());
            continue;
        }
        let nibbles = [2, 4, 6, 8][kind as usize];
        let v = u32_at(block, nibbles + 4 * (t % 4));
        let q = if t < 4 {
            v & 0x0F0F_0F0F
        } else {
            (v >> 4) & 0x0F0F_0F0F
        };
        // Rows 0..8 in the low nibbles of a tile row's 32 bytes, 8..16 high.
        let at = t * 32 + 4 * (i % 8);
        let mut word = u32_at(r, at);
        word |= q << (4 * (i / 8));
        r[at..at + 4].copy_from_slice(&word.to_le_bytes());
        if matches!(kind, Q5_0 | Q5_1) {
            let qh = u32_at(block, nibbles - 4);
            let fifth = u64::from((qh >> (4 * t)) & 0xF) << (4 * i);
            let at = fifth_at(kind) + 8 * t;
            let mut bits = u64::from_le_bytes(r[at..at + 8].try_into().expect("8 bytes"));
            bits |= fifth;
            r[at..at + 8].copy_from_slice(&bits.to_le_bytes());
        }
    }
    let s = scales_at(kind);
    r[s + 2 * i..s + 2 * i + 2].copy_from_slice(&block[..2]);
    if has_min(kind) {
        r[s + 32 + 2 * i..s + 34 + 2 * i].copy_from_slice(&block[2..4]);
    }
}

/// A part's rows repacked 16 at a time (module docs): record (chunk c,
/// block b) at `(c * blocks + b) * record(kind)`; rows past the part's are
/// zeros.
pub struct Packed {
    bytes: Lines,
    kind: u8,
    blocks: usize,
}

impl Packed {
    /// `rows` rows of `cols` weights in `kind`'s GGUF blocks; `None` for
    /// the formats without AMX kernels.
    pub fn new(kind: QuantKind, data: &[u8], rows: usize, cols: usize) -> Option<Self> {
        let kind = match kind {
            QuantKind::Q4_0 => Q4_0,
            QuantKind::Q4_1 => Q4_1,
            QuantKind::Q5_0 => Q5_0,
            QuantKind::Q5_1 => Q5_1,
            QuantKind::Q8_0 => Q8_0,
            _ => return None,
        };
        let (blocks, bb, rec) = (cols / 32, block_bytes(kind), record(kind));
        let mut bytes = Lines::default();
        bytes.resize(rows.div_ceil(ROWS) * blocks * rec);
        // A chunk's records are its 16 rows' blocks: chunks pack apart.
        bytes
            .bytes_mut()
            .par_chunks_mut(blocks * rec)
            .take(rows.div_ceil(ROWS))
            .enumerate()
            .for_each(|(chunk, out)| {
                for i in 0..ROWS.min(rows - chunk * ROWS) {
                    let row = &data[(chunk * ROWS + i) * blocks * bb..][..blocks * bb];
                    for (b, r) in out.chunks_exact_mut(rec).enumerate() {
                        pack_block(kind, &row[b * bb..(b + 1) * bb], i, r);
                    }
                }
            });
        Some(Self {
            bytes,
            kind,
            blocks,
        })
    }

    /// Chunk `c`'s records (weight rows `16c..16c + 16`).
    fn chunk(&self, c: usize) -> *const u8 {
        self.bytes
            .as_ptr()
            .wrapping_add(c * self.blocks * record(self.kind))
    }
}

/// Tile row `t` of a record: 64 unsigned quants (four of each of the 16
/// rows).
///
/// # Safety
/// AVX512F/BW and AVX2 available; `rec` is a whole record of `KIND`.
#[inline(always)]
unsafe fn tile_row<const KIND: u8>(rec: *const u8, t: usize) -> __m512i {
    // SAFETY: inside the record (caller contract).
    unsafe {
        if KIND == Q8_0 {
            return _mm512_load_si512(rec.add(64 * t) as *const _);
        }
        let p = _mm256_load_si256(rec.add(32 * t) as *const __m256i);
        let low = _mm256_set1_epi8(0x0F);
        let lo = _mm256_and_si256(p, low);
        let hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
        let q = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        if matches!(KIND, Q5_0 | Q5_1) {
            let bits = std::ptr::read_unaligned(rec.add(fifth_at(KIND) + 8 * t) as *const u64);
            return _mm512_or_si512(q, _mm512_maskz_mov_epi8(bits, _mm512_set1_epi8(0x10)));
        }
        q
    }
}

/// The 16 rows' scales (and mins) of a record, as f32.
///
/// # Safety
/// AVX512F available; `rec` is a whole record of `KIND`.
#[inline(always)]
unsafe fn scales<const KIND: u8>(rec: *const u8) -> (__m512, __m512) {
    // SAFETY: inside the record (caller contract).
    unsafe {
        let at = rec.add(scales_at(KIND));
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(at as *const __m256i));
        let m = match has_min(KIND) {
            true => _mm512_cvtph_ps(_mm256_loadu_si256(at.add(32) as *const __m256i)),
            false => _mm512_setzero_ps(),
        };
        (d, m)
    }
}

/// One block of one activation row into `acc` (lanes are weight rows):
/// `sum` the integer sums of the unsigned quants against its values, then
/// the module's chain with its block sum `x_sum`, scale `dx` and `d·Σq`
/// `sx`, and the weight rows' scales and mins `(dw, mw)`. Both kernels
/// run this, so their bits are the same.
///
/// # Safety
/// AVX512F available.
#[inline(always)]
unsafe fn scale_block<const KIND: u8>(
    acc: __m512,
    sum: __m512i,
    (x_sum, dx, sx): (i16, f32, f32),
    (dw, mw): (__m512, __m512),
) -> __m512 {
    // SAFETY: AVX512F (caller contract).
    unsafe {
        let mut sum = sum;
        if offset(KIND) != 0 {
            sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(offset(KIND) * i32::from(x_sum)));
        }
        let t = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(dx));
        let acc = _mm512_fmadd_ps(dw, t, acc);
        match has_min(KIND) {
            true => _mm512_fmadd_ps(mw, _mm512_set1_ps(sx), acc),
            false => acc,
        }
    }
}

/// 16 weight rows (a packed chunk, the first `rows` real) against `R`
/// activation rows: each block's tile rows expanded once, then per
/// activation row eight `vpdpbusd` with its values broadcast give the
/// rows' integer sums (lanes are weight rows), then the module's chain.
///
/// # Safety
/// [`available`] is true; `chunk` holds `blocks` records of `KIND`; every
/// row of `x` holds as many blocks; the output indices `col[r]..col[r] +
/// rows` are inside `out` and written by no other thread.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn few_rows<const KIND: u8, const R: usize>(
    (chunk, blocks): (*const u8, usize),
    rows: usize,
    x: [ActRow<'_>; R],
    (out, col): (OutPtr, [usize; R]),
) {
    // SAFETY: block b's record and activations are in bounds (caller
    // contract); prefetches never fault.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        for b in 0..blocks {
            let rec = chunk.add(b * record(KIND));
            _mm_prefetch::<_MM_HINT_T0>(rec.wrapping_add(2048) as *const i8);
            let w: [__m512i; 8] = std::array::from_fn(|t| tile_row::<KIND>(rec, t));
            let (dw, mw) = scales::<KIND>(rec);
            for r in 0..R {
                let xb = x[r].qs.as_ptr().add(32 * b);
                let mut sum = _mm512_setzero_si512();
                for (t, w) in w.iter().enumerate() {
                    let xv =
                        _mm512_set1_epi32(std::ptr::read_unaligned(xb.add(4 * t) as *const i32));
                    sum = _mm512_dpbusd_epi32(sum, *w, xv);
                }
                let xr = (
                    *x[r].bsums.get_unchecked(b),
                    *x[r].d.get_unchecked(b),
                    *x[r].s.get_unchecked(b),
                );
                acc[r] = scale_block::<KIND>(acc[r], sum, xr, (dw, mw));
            }
        }
        let keep: __mmask16 = ((1u32 << rows) - 1) as u16;
        for r in 0..R {
            _mm512_mask_storeu_ps(out.0.add(col[r]), keep, acc[r]);
        }
    }
}

/// [`few_rows`] over all `m` activation rows of `acts`, four at a time:
/// `out[a * n + col + i]` as [`rows`] writes it.
///
/// # Safety
/// As [`rows`].
pub unsafe fn vnni_rows<const KIND: u8>(
    chunk: (*const u8, usize),
    rows: usize,
    (acts, m): (&QuantActs, usize),
    (out, n, col): (OutPtr, usize, usize),
) {
    let mut a = 0;
    // SAFETY: forwarded contract, for each group of rows.
    unsafe {
        while a < m {
            let r = 4.min(m - a);
            let x = |i: usize| acts.row(a + i);
            let c = |i: usize| (a + i) * n + col;
            match r {
                4 => few_rows::<KIND, 4>(
                    chunk,
                    rows,
                    [x(0), x(1), x(2), x(3)],
                    (out, [c(0), c(1), c(2), c(3)]),
                ),
                3 => {
                    few_rows::<KIND, 3>(chunk, rows, [x(0), x(1), x(2)], (out, [c(0), c(1), c(2)]))
                }
                2 => few_rows::<KIND, 2>(chunk, rows, [x(0), x(1)], (out, [c(0), c(1)])),
                _ => few_rows::<KIND, 1>(chunk, rows, [x(0)], (out, [c(0)])),
            }
            a += r;
        }
    }
}

/// A tile's int32 results: activation rows × weight rows, on cache lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Results([[i32; ROWS]; COLS]);

/// The tile configuration `ldtilecfg` reads, for `n` activation rows:
/// tmm0 the int32 results (`n` rows × 16 weight rows), tmm1 the
/// activations (`n` rows × 32 bytes), tmm2 the weights (8 rows of four
/// bytes of each of 16 weight rows); tmm3-5 the same.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    fn new(n: usize) -> Self {
        let mut c = Self {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for set in [0, 3] {
            (c.rows[set], c.colsb[set]) = (n as u8, 64);
            (c.rows[set + 1], c.colsb[set + 1]) = (n as u8, 32);
            (c.rows[set + 2], c.colsb[set + 2]) = (8, 64);
        }
        c
    }
}

/// A chunk expanded for the B tiles (`[block][8][64]` bytes), and each
/// block's scales and mins (`[block][row]` f32).
#[derive(Default)]
struct Scratch {
    w: Lines,
    d: Vec<f32>,
    m: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
    /// The activation rows the loaded tile configuration is for (0: none).
    static CONFIGURED: Cell<usize> = const { Cell::new(0) };
}

/// Loads the configuration for `n` activation rows unless it is loaded.
///
/// # Safety
/// AMX available and permitted ([`available`]).
#[inline(always)]
unsafe fn configure(n: usize) {
    if CONFIGURED.get() != n {
        let cfg = TileConfig::new(n);
        // SAFETY: a valid palette-1 configuration (caller contract).
        unsafe { asm!("ldtilecfg [{0}]", in(reg) &cfg, options(nostack, readonly)) };
        CONFIGURED.set(n);
    }
}

/// `C = 0; A = activations block; B = weights block; C += A · B` (signed
/// activations, unsigned weights), C stored to `c` (rows 64 bytes apart),
/// on tiles 0-2 (`set` 0) or 3-5 (`set` 1): consecutive blocks alternate,
/// so one block's product runs while the last one's result is scaled.
///
/// # Safety
/// Tiles configured by [`configure`]; the pointers cover the configured
/// rows at their strides.
#[inline(always)]
unsafe fn tile_product(set: usize, (a, a_stride): (*const i8, usize), b: *const u8, c: *mut i32) {
    macro_rules! product {
        ($c:literal, $a:literal, $b:literal) => {
            asm!(concat!("tilezero ", $c), options(nostack, nomem));
            asm!(concat!("tileloadd ", $a, ", [{0} + {1}]"), in(reg) a, in(reg) a_stride, options(nostack, readonly));
            asm!(concat!("tileloadd ", $b, ", [{0} + {1}]"), in(reg) b, in(reg) 64usize, options(nostack, readonly));
            asm!(concat!("tdpbsud ", $c, ", ", $a, ", ", $b), options(nostack, nomem));
            asm!(concat!("tilestored [{0} + {1}], ", $c), in(reg) c, in(reg) 64usize, options(nostack));
        };
    }
    // SAFETY: caller contract; the tile registers are used by nothing else.
    unsafe {
        if set == 0 {
            product!("tmm0", "tmm1", "tmm2");
        } else {
            product!("tmm3", "tmm4", "tmm5");
        }
    }
}

/// 16 weight rows (a packed chunk, the first `rows` real) against the `m`
/// activation rows of `acts` (Q8 layout): `out[a * n + col + i]` for
/// activation row a and weight row i.
///
/// # Safety
/// [`available`] is true; `chunk` holds `blocks` records of `KIND`, and
/// every activation row as many blocks; the output indices are inside `out`
/// and written by no other thread.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn rows<const KIND: u8>(
    (chunk, blocks): (*const u8, usize),
    rows: usize,
    (acts, m): (&QuantActs, usize),
    (out, n, col): (OutPtr, usize, usize),
) {
    let k = acts.k();
    let (qs, d, s, sums) = acts.parts();
    SCRATCH.with_borrow_mut(|u| {
        // SAFETY: forwarded contract.
        unsafe {
            expand::<KIND>(chunk, blocks, u);
            for first in (0..m).step_by(COLS) {
                let group = COLS.min(m - first);
                configure(group);
                let at = first * blocks;
                let x = (&qs[first * k..], (&d[at..], &s[at..], &sums[at..]));
                let acc = group_rows::<KIND>(u, (k, blocks), x, group);
                let keep: __mmask16 = ((1u32 << rows) - 1) as u16;
                for (j, acc) in acc.iter().enumerate().take(group) {
                    _mm512_mask_storeu_ps(out.0.add((first + j) * n + col), keep, *acc);
                }
            }
        }
    });
}

/// Expands a chunk's records into B tiles and f32 scales.
///
/// # Safety
/// AVX512F/BW and AVX2 available; `chunk` holds `blocks` records of `KIND`.
#[inline(always)]
unsafe fn expand<const KIND: u8>(chunk: *const u8, blocks: usize, u: &mut Scratch) {
    u.w.resize(blocks * 512);
    u.d.resize(blocks * ROWS, 0.0);
    u.m.resize(blocks * ROWS, 0.0);
    // SAFETY: the records are in bounds (caller contract); the stores stay
    // inside the buffers sized above.
    unsafe {
        for b in 0..blocks {
            let rec = chunk.add(b * record(KIND));
            let tile = u.w.as_mut_ptr().add(512 * b);
            for t in 0..8 {
                _mm512_store_si512(tile.add(64 * t) as *mut _, tile_row::<KIND>(rec, t));
            }
            let (dw, mw) = scales::<KIND>(rec);
            _mm512_storeu_ps(u.d.as_mut_ptr().add(b * ROWS), dw);
            _mm512_storeu_ps(u.m.as_mut_ptr().add(b * ROWS), mw);
        }
    }
}

/// Activation rows' per-block scales, `d * Σq` and `Σq`.
type Scales<'a> = (&'a [f32], &'a [f32], &'a [i16]);

/// A group of up to 16 activation rows (`qs`, `d`, `s` from its first)
/// against the expanded weight rows: lanes are weight rows.
///
/// # Safety
/// As [`rows`], tiles configured for `group` rows.
#[inline(always)]
unsafe fn group_rows<const KIND: u8>(
    u: &Scratch,
    (k, blocks): (usize, usize),
    (qs, (d, s, sums)): (&[i8], Scales<'_>),
    group: usize,
) -> [__m512; COLS] {
    let mut c = [Results([[0; ROWS]; COLS]); 2];
    // SAFETY: in-bounds block reads of the expanded rows and the group.
    unsafe {
        let product = |b: usize, c: &mut Results| {
            let a = (qs.as_ptr().add(32 * b), k);
            tile_product(
                b & 1,
                a,
                u.w.as_ptr().add(512 * b),
                c.0.as_mut_ptr() as *mut i32,
            );
        };
        let mut acc = [_mm512_setzero_ps(); COLS];
        product(0, &mut c[0]);
        for b in 0..blocks {
            // Block b + 1's product runs while block b is scaled.
            if b + 1 < blocks {
                product(b + 1, &mut c[(b + 1) & 1]);
            }
            let c = &c[b & 1].0;
            let dw = _mm512_loadu_ps(u.d.as_ptr().add(b * ROWS));
            let mw = _mm512_loadu_ps(u.m.as_ptr().add(b * ROWS));
            for j in 0..COLS {
                if j < group {
                    let sum = _mm512_loadu_si512(c[j].as_ptr() as *const _);
                    let at = j * blocks + b;
                    let xj = (
                        *sums.get_unchecked(at),
                        *d.get_unchecked(at),
                        *s.get_unchecked(at),
                    );
                    acc[j] = scale_block::<KIND>(acc[j], sum, xj, (dw, mw));
                }
            }
        }
        acc
    }
}

/// A kernel of a packed part: a chunk's rows against every activation row.
pub type RowsFn = unsafe fn((*const u8, usize), usize, (&QuantActs, usize), (OutPtr, usize, usize));

/// The kernels of a packed part: (AMX tiles, AVX512-VNNI).
pub type Kernels = (RowsFn, RowsFn);

impl Packed {
    /// The kernels for this part's format.
    pub fn kernels(&self) -> Kernels {
        match self.kind {
            Q4_0 => (rows::<Q4_0>, vnni_rows::<Q4_0>),
            Q4_1 => (rows::<Q4_1>, vnni_rows::<Q4_1>),
            Q5_0 => (rows::<Q5_0>, vnni_rows::<Q5_0>),
            Q5_1 => (rows::<Q5_1>, vnni_rows::<Q5_1>),
            _ => (rows::<Q8_0>, vnni_rows::<Q8_0>),
        }
    }

    /// Chunk `c` as the kernels take it.
    pub fn chunk_arg(&self, c: usize) -> (*const u8, usize) {
        (self.chunk(c), self.blocks)
    }
}
