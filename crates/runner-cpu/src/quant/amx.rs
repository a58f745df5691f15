//! AMX tile products for the 32-block formats (Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0), taken with `model.cpu_weights = "amx"` on CPUs with AMX-INT8
//! (Intel Xeon from Sapphire Rapids on).
//!
//! One `tdpbssd` multiplies up to 16 activation rows (the A tile, read in
//! place from the quantized activations) by 16 weight rows (the B tile,
//! unpacked once per task to a byte a weight in the tiles' layout) over one
//! 32-block, giving each pair's exact integer block sum `S` (unsigned
//! quants fit i8; Q4_0 and Q5_0 are offset to `q - 8`, `q - 16`). Each pair
//! then accumulates, block by block, `acc = fma(d_w, S · d_x, acc)` and,
//! for formats with a min, `acc = fma(m_w, s_x, acc)` (`s_x = d_x Σq_x`).
//! A lone activation row (decode) skips the tiles: an AVX-512 kernel reads
//! the blocks as they are and computes the same block sums and operations.
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

use super::act::{ActRow, QuantActs};
use super::avx2::{fifth_bits, nibbles, prefetch_ahead};
use super::OutPtr;

/// Weight rows per tile.
pub const ROWS: usize = 16;
/// Activation rows per tile.
const COLS: usize = 16;

/// `arch_prctl` request for permission to use an extended state component.
const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
/// The AMX tile data state component.
const XFEATURE_XTILEDATA: libc::c_long = 18;

/// Whether this CPU and OS run the AMX kernels: AMX-TILE and AMX-INT8
/// (CPUID leaf 7), AVX512F/BW/VL, F16C, and the kernel's permission for the
/// tile data state (Linux asks each process to request it).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let leaf7 = __cpuid_count(7, 0);
        let amx = (leaf7.edx >> 24) & 1 == 1 && (leaf7.edx >> 25) & 1 == 1;
        let simd = std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
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

/// A task's 16 weight rows unpacked for the B tiles (`[block][8][16][4]`
/// bytes: four consecutive quants of each row per tile row), with each
/// block's 16 scales and mins as f32 (`[block][row]`).
#[derive(Default)]
struct Unpacked {
    w: Lines,
    d: Vec<f32>,
    m: Vec<f32>,
}

thread_local! {
    static UNPACKED: RefCell<Unpacked> = RefCell::default();
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

/// Block bytes of `KIND`.
const fn block_bytes(kind: u8) -> usize {
    [18, 20, 22, 24, 34][kind as usize]
}

/// Dwords `t` of eight rows of eight: row t of the result holds dword t of
/// each row (the standard unpack / permute transpose).
///
/// # Safety
/// AVX2 available.
#[inline(always)]
unsafe fn transpose8(r: &[__m256i]) -> [__m256i; 8] {
    // SAFETY: AVX2 (caller contract).
    unsafe {
        let lo = |a: __m256i, b: __m256i| _mm256_unpacklo_epi32(a, b);
        let hi = |a: __m256i, b: __m256i| _mm256_unpackhi_epi32(a, b);
        let (t0, t1, t2, t3) = (
            lo(r[0], r[1]),
            hi(r[0], r[1]),
            lo(r[2], r[3]),
            hi(r[2], r[3]),
        );
        let (t4, t5, t6, t7) = (
            lo(r[4], r[5]),
            hi(r[4], r[5]),
            lo(r[6], r[7]),
            hi(r[6], r[7]),
        );
        let (u0, u1) = (_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2));
        let (u2, u3) = (_mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3));
        let (u4, u5) = (_mm256_unpacklo_epi64(t4, t6), _mm256_unpackhi_epi64(t4, t6));
        let (u6, u7) = (_mm256_unpacklo_epi64(t5, t7), _mm256_unpackhi_epi64(t5, t7));
        [
            _mm256_permute2x128_si256(u0, u4, 0x20),
            _mm256_permute2x128_si256(u1, u5, 0x20),
            _mm256_permute2x128_si256(u2, u6, 0x20),
            _mm256_permute2x128_si256(u3, u7, 0x20),
            _mm256_permute2x128_si256(u0, u4, 0x31),
            _mm256_permute2x128_si256(u1, u5, 0x31),
            _mm256_permute2x128_si256(u2, u6, 0x31),
            _mm256_permute2x128_si256(u3, u7, 0x31),
        ]
    }
}

/// Unpacks the blocks of weight rows `w` into B tiles.
///
/// # Safety
/// AVX512F and AVX2 available; every row is `k / 32` whole blocks of `KIND`.
#[inline(always)]
unsafe fn unpack_rows<const KIND: u8>(w: &[&[u8]; ROWS], k: usize, u: &mut Unpacked) {
    let nb = k / 32;
    u.w.resize(nb * 512);
    u.d.resize(nb * ROWS, 0.0);
    u.m.resize(nb * ROWS, 0.0);
    // SAFETY: block b of each row is in bounds (caller contract); the
    // stores stay inside the buffers sized above.
    unsafe {
        for b in 0..nb {
            let mut q = [_mm256_setzero_si256(); ROWS];
            let mut d = [0u16; ROWS];
            let mut m = [0u16; ROWS];
            for i in 0..ROWS {
                (q[i], d[i], m[i]) = unpack_block::<KIND>(w[i].as_ptr().add(b * block_bytes(KIND)));
            }
            let (lo, hi) = (transpose8(&q[..8]), transpose8(&q[8..]));
            let tile = u.w.as_mut_ptr().add(b * 512);
            for t in 0..8 {
                let row = _mm512_inserti64x4(_mm512_castsi256_si512(lo[t]), hi[t], 1);
                _mm512_storeu_si512(tile.add(64 * t) as *mut _, row);
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(d.as_ptr() as *const __m256i));
            _mm512_storeu_ps(u.d.as_mut_ptr().add(b * ROWS), d);
            let m = _mm512_cvtph_ps(_mm256_loadu_si256(m.as_ptr() as *const __m256i));
            _mm512_storeu_ps(u.m.as_mut_ptr().add(b * ROWS), m);
        }
    }
}

/// `C = 0; A = activations block; B = weights block; C += A · B` (signed
/// bytes), C stored to `c` (rows 64 bytes apart), on tiles 0-2 (`set` 0)
/// or 3-5 (`set` 1): consecutive blocks alternate, so one block's product
/// runs while the last one's result is stored and scaled.
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
            asm!(concat!("tdpbssd ", $c, ", ", $a, ", ", $b), options(nostack, nomem));
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

/// Weight rows `w` (the first `rows` real) against the `m` activation rows
/// of `acts` (Q8 layout): `out[a * n + col + i]` for activation row a and
/// weight row i.
///
/// # Safety
/// [`available`] is true; every row of `w` is `k / 32` whole blocks of
/// `KIND`; the output indices are inside `out` and written by no other
/// thread.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn rows<const KIND: u8>(
    w: [&[u8]; ROWS],
    rows: usize,
    (acts, m): (&QuantActs, usize),
    (out, n, col): (OutPtr, usize, usize),
) {
    let k = acts.k();
    let (qs, d, s) = acts.parts();
    UNPACKED.with_borrow_mut(|u| {
        // SAFETY: forwarded contract.
        unsafe {
            unpack_rows::<KIND>(&w, k, u);
            for first in (0..m).step_by(COLS) {
                let group = COLS.min(m - first);
                configure(group);
                let nb = k / 32;
                let x = (&qs[first * k..], &d[first * nb..], &s[first * nb..]);
                let acc = if matches!(KIND, 1 | 3) {
                    group_rows::<true>(u, k, x, group)
                } else {
                    group_rows::<false>(u, k, x, group)
                };
                let keep: __mmask16 = ((1u32 << rows) - 1) as u16;
                for (j, acc) in acc.iter().enumerate().take(group) {
                    _mm512_mask_storeu_ps(out.0.add((first + j) * n + col), keep, *acc);
                }
            }
        }
    });
}

/// A group of up to 16 activation rows (`qs`, `d`, `s` from its first)
/// against the unpacked weight rows: lanes are weight rows.
///
/// # Safety
/// As [`rows`], tiles configured for `group` rows.
#[inline(always)]
unsafe fn group_rows<const MIN: bool>(
    u: &Unpacked,
    k: usize,
    (qs, d, s): (&[i8], &[f32], &[f32]),
    group: usize,
) -> [__m512; COLS] {
    let nb = k / 32;
    let mut c = [Results([[0; ROWS]; COLS]); 2];
    // SAFETY: in-bounds block reads of the unpacked rows and the group.
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
        for b in 0..nb {
            // Block b + 1's product runs while block b is scaled.
            if b + 1 < nb {
                product(b + 1, &mut c[(b + 1) & 1]);
            }
            let c = &c[b & 1].0;
            let dw = _mm512_loadu_ps(u.d.as_ptr().add(b * ROWS));
            let mw = _mm512_loadu_ps(u.m.as_ptr().add(b * ROWS));
            for j in 0..COLS {
                if j < group {
                    let sum = _mm512_cvtepi32_ps(_mm512_loadu_si512(c[j].as_ptr() as *const _));
                    let t = _mm512_mul_ps(sum, _mm512_set1_ps(*d.get_unchecked(j * nb + b)));
                    acc[j] = _mm512_fmadd_ps(dw, t, acc[j]);
                    if MIN {
                        acc[j] = _mm512_fmadd_ps(
                            mw,
                            _mm512_set1_ps(*s.get_unchecked(j * nb + b)),
                            acc[j],
                        );
                    }
                }
            }
        }
        acc
    }
}

/// The 32 quants of the block at `p` as tile bytes (signed formats offset
/// to their signed values), its scale and min as f16 bits (min 0 where the
/// format has none).
///
/// # Safety
/// AVX2 available; `p` is a whole block of `KIND`.
#[inline(always)]
unsafe fn unpack_block<const KIND: u8>(p: *const u8) -> (__m256i, u16, u16) {
    // SAFETY: reads inside the block (caller contract).
    unsafe {
        let h = |at: usize| std::ptr::read_unaligned(p.add(at) as *const u16);
        match KIND {
            0 => (
                _mm256_sub_epi8(nibbles(p.add(2)), _mm256_set1_epi8(8)),
                h(0),
                0,
            ),
            1 => (nibbles(p.add(4)), h(0), h(2)),
            2 => {
                let qh = std::ptr::read_unaligned(p.add(2) as *const u32);
                let q = _mm256_or_si256(nibbles(p.add(6)), fifth_bits(qh));
                (_mm256_sub_epi8(q, _mm256_set1_epi8(16)), h(0), 0)
            }
            3 => {
                let qh = std::ptr::read_unaligned(p.add(4) as *const u32);
                (
                    _mm256_or_si256(nibbles(p.add(8)), fifth_bits(qh)),
                    h(0),
                    h(2),
                )
            }
            _ => (_mm256_loadu_si256(p.add(2) as *const __m256i), h(0), 0),
        }
    }
}

/// The sums of four vectors of eight i32 lanes.
///
/// # Safety
/// AVX2 available.
#[inline(always)]
unsafe fn sums4(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m128i {
    // SAFETY: AVX2 (caller contract).
    unsafe {
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))
    }
}

/// The sums of 16 vectors of eight i32 lanes, in order (integer adds are
/// exact: any order gives the same sums).
///
/// # Safety
/// AVX512F and AVX2 available.
#[inline(always)]
unsafe fn sums16(v: &[__m256i; ROWS]) -> __m512i {
    // SAFETY: the features (caller contract).
    unsafe {
        let lo = _mm256_set_m128i(sums4(v[4], v[5], v[6], v[7]), sums4(v[0], v[1], v[2], v[3]));
        let hi = _mm256_set_m128i(
            sums4(v[12], v[13], v[14], v[15]),
            sums4(v[8], v[9], v[10], v[11]),
        );
        _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
    }
}

/// 16 weight rows (the first `rows` real) against one activation row,
/// reading the blocks as they are (no tiles: a decode step): each pair's
/// integer block sum from `vpdpbusd` over eight lanes, summed exactly, then
/// the same operations as [`one`], so the same bits as a batch's tiles.
///
/// # Safety
/// [`available`] is true; every row of `w` is `k / 32` whole blocks of
/// `KIND`; `x` holds as many blocks; the output indices are inside `out`
/// and written by no other thread.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn one_row<const KIND: u8>(
    w: [&[u8]; ROWS],
    rows: usize,
    x: ActRow<'_>,
    (out, col): (OutPtr, usize),
) {
    let signed = matches!(KIND, 0 | 2 | 4);
    let min = matches!(KIND, 1 | 3);
    let nb = x.d.len().min(w[0].len() / block_bytes(KIND));
    // The rows stream side by side: ask for the same block of the next 16.
    let ahead = ROWS * w[0].len();
    // SAFETY: block b of every row and of `x` is in bounds (caller contract).
    unsafe {
        let mut acc = _mm512_setzero_ps();
        for b in 0..nb {
            let xv = _mm256_loadu_si256(x.qs.as_ptr().add(32 * b) as *const __m256i);
            let mut v = [_mm256_setzero_si256(); ROWS];
            let (mut d, mut m) = ([0u16; ROWS], [0u16; ROWS]);
            for i in 0..ROWS {
                let p = w[i].as_ptr().add(b * block_bytes(KIND));
                prefetch_ahead::<34>(p, ahead);
                let (q, di, mi) = unpack_block::<KIND>(p);
                // vpdpbusd takes u8 × i8: signed weights move their sign
                // onto the activations (the same exact products).
                v[i] = if signed {
                    _mm256_dpbusd_epi32(
                        _mm256_setzero_si256(),
                        _mm256_sign_epi8(q, q),
                        _mm256_sign_epi8(xv, q),
                    )
                } else {
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, xv)
                };
                (d[i], m[i]) = (di, mi);
            }
            let t = _mm512_mul_ps(
                _mm512_cvtepi32_ps(sums16(&v)),
                _mm512_set1_ps(*x.d.get_unchecked(b)),
            );
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(d.as_ptr() as *const __m256i));
            acc = _mm512_fmadd_ps(dw, t, acc);
            if min {
                let mw = _mm512_cvtph_ps(_mm256_loadu_si256(m.as_ptr() as *const __m256i));
                acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(*x.s.get_unchecked(b)), acc);
            }
        }
        let keep: __mmask16 = ((1u32 << rows) - 1) as u16;
        _mm512_mask_storeu_ps(out.0.add(col), keep, acc);
    }
}
