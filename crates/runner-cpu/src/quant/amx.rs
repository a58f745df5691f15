//! AMX tile products for the 32-block formats (Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0), taken with `model.cpu_amx` on CPUs with AMX-INT8 (Intel Xeon from
//! Sapphire Rapids on).
//!
//! A tile multiplies 16 weight rows by up to 16 activation rows over one
//! 32-block in one `tdpbusd` (unsigned quants: Q4_1, Q5_1) or `tdpbssd`
//! (signed: Q4_0 and Q5_0 as `q - 8` / `q - 16`, Q8_0), giving each pair's
//! exact integer block sum `S`. Each pair then accumulates, block by block,
//! `acc = fma(d_w, S · d_x, acc)` and, for formats with a min,
//! `acc = fma(m_w, s_x, acc)` (`s_x = d_x Σq_x`). The weight rows of a task
//! are unpacked to one byte a weight once, then every group of 16
//! activation rows reuses them; a lone activation row reads its blocks as
//! they are.
//!
//! Every pair runs those operations in that order whatever the batch (one
//! row vectorizes over weight rows, more over activation rows, with the
//! same IEEE operations per lane), so results do not depend on the batch.
//! They differ from the AVX2 kernels' in the last bits: those sum each
//! block's integers in eight lanes before scaling.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

use super::act::{ActRow, QuantActs};
use super::avx2::{fifth_bits, nibbles, prefetch_ahead, PREFETCH_BYTES};
use super::{OutPtr, QuantKind};

/// Weight rows per tile.
pub const ROWS: usize = 16;
/// Activation rows per tile (16 int32 columns of 64 bytes).
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

/// Whether `kind` has AMX kernels.
pub fn supports(kind: QuantKind) -> bool {
    matches!(
        kind,
        QuantKind::Q4_0 | QuantKind::Q4_1 | QuantKind::Q5_0 | QuantKind::Q5_1 | QuantKind::Q8_0
    )
}

/// Activation rows laid out for the tiles, groups of up to 16 rows: per
/// block, the B tile (`[8][n][4]` bytes: four consecutive values of each
/// row per tile row), and per block 16 scales `d` and sums `s` (zero past
/// the group's rows).
#[derive(Default)]
pub struct AmxActs {
    b: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    m: usize,
    k: usize,
}

/// One group of [`AmxActs`]: its rows, B tiles, scales and sums.
struct Group<'a> {
    first: usize,
    n: usize,
    b: &'a [i8],
    d: &'a [f32],
    s: &'a [f32],
}

impl AmxActs {
    /// Lays out the `m` rows of `acts` (the Q8 layout).
    pub fn pack(&mut self, acts: &QuantActs, m: usize) {
        let k = acts.k();
        let nb = k / 32;
        let groups = m.div_ceil(COLS);
        self.b.resize(m * k, 0);
        self.d.clear();
        self.d.resize(groups * nb * COLS, 0.0);
        self.s.clear();
        self.s.resize(groups * nb * COLS, 0.0);
        self.m = m;
        self.k = k;
        for g in 0..groups {
            let (first, n) = (g * COLS, COLS.min(m - g * COLS));
            let b = &mut self.b[first * k..(first + n) * k];
            for j in 0..n {
                let row = acts.row(first + j);
                for blk in 0..nb {
                    let tile = &mut b[blk * 32 * n..(blk + 1) * 32 * n];
                    for kq in 0..8 {
                        let at = kq * 4 * n + j * 4;
                        tile[at..at + 4]
                            .copy_from_slice(&row.qs[blk * 32 + kq * 4..blk * 32 + kq * 4 + 4]);
                    }
                    self.d[(g * nb + blk) * COLS + j] = row.d[blk];
                    self.s[(g * nb + blk) * COLS + j] = row.s[blk];
                }
            }
        }
    }

    fn group(&self, g: usize) -> Group<'_> {
        let (k, nb) = (self.k, self.k / 32);
        let (first, n) = (g * COLS, COLS.min(self.m - g * COLS));
        let scales = (g * nb) * COLS..(g + 1) * nb * COLS;
        Group {
            first,
            n,
            b: &self.b[first * k..(first + n) * k],
            d: &self.d[scales.clone()],
            s: &self.s[scales],
        }
    }

    fn groups(&self) -> usize {
        self.m.div_ceil(COLS)
    }
}

/// The tile configuration `ldtilecfg` reads: tmm0 the int32 result (16
/// weight rows × `n` activation rows), tmm1 the weights (16 rows × 32
/// bytes), tmm2 the activations (8 rows × `4n` bytes); tmm3-5 the same.
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
        let n4 = (4 * n) as u16;
        for set in [0, 3] {
            (c.rows[set], c.colsb[set]) = (ROWS as u8, n4);
            (c.rows[set + 1], c.colsb[set + 1]) = (ROWS as u8, 32);
            (c.rows[set + 2], c.colsb[set + 2]) = (8, n4);
        }
        c
    }
}

/// A task's 16 weight rows unpacked to a byte a weight (`q`, row-major,
/// `k` a row) with each block's 16 scales and mins as f32 (`[block][row]`).
#[derive(Default)]
struct Unpacked {
    q: Vec<u8>,
    d: Vec<f32>,
    m: Vec<f32>,
}

thread_local! {
    static UNPACKED: RefCell<Unpacked> = RefCell::default();
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

/// Block bytes of `KIND`.
const fn block_bytes(kind: u8) -> usize {
    [18, 20, 22, 24, 34][kind as usize]
}

/// Unpacks the blocks of weight rows `w` (rows past `rows` repeat row 0).
///
/// # Safety
/// AVX512F and AVX2 available; every row is `k / 32` whole blocks of `KIND`.
#[inline(always)]
unsafe fn unpack_rows<const KIND: u8>(w: &[&[u8]; ROWS], k: usize, u: &mut Unpacked) {
    let nb = k / 32;
    u.q.resize(ROWS * k, 0);
    u.d.resize(nb * ROWS, 0.0);
    u.m.resize(nb * ROWS, 0.0);
    // SAFETY: block b of each row is in bounds (caller contract); the
    // stores stay inside the buffers sized above.
    unsafe {
        for b in 0..nb {
            let mut d = [0u16; ROWS];
            let mut m = [0u16; ROWS];
            for i in 0..ROWS {
                let (q, di, mi) = unpack_block::<KIND>(w[i].as_ptr().add(b * block_bytes(KIND)));
                _mm256_storeu_si256(u.q.as_mut_ptr().add(i * k + 32 * b) as *mut __m256i, q);
                (d[i], m[i]) = (di, mi);
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(d.as_ptr() as *const __m256i));
            _mm512_storeu_ps(u.d.as_mut_ptr().add(b * ROWS), d);
            let m = _mm512_cvtph_ps(_mm256_loadu_si256(m.as_ptr() as *const __m256i));
            _mm512_storeu_ps(u.m.as_mut_ptr().add(b * ROWS), m);
        }
    }
}

/// `C = 0; A = weights block; B = activations block; C += A · B`, C
/// stored to `c` with a row stride of `c_stride` bytes, on tiles 0-2
/// (`SET` 0) or 3-5 (`SET` 1): consecutive blocks alternate, so one block's
/// product runs while the last one's result is stored and scaled.
///
/// # Safety
/// Tiles configured by [`TileConfig`]; the pointers cover the configured
/// rows at their strides.
#[inline(always)]
unsafe fn tile_product<const SIGNED: bool>(
    set: usize,
    (a, a_stride): (*const u8, usize),
    (b, b_stride): (*const i8, usize),
    (c, c_stride): (*mut i32, usize),
) {
    macro_rules! product {
        ($c:literal, $a:literal, $b:literal) => {
            asm!(concat!("tilezero ", $c), options(nostack, nomem));
            asm!(concat!("tileloadd ", $a, ", [{0} + {1}]"), in(reg) a, in(reg) a_stride, options(nostack, readonly));
            asm!(concat!("tileloadd ", $b, ", [{0} + {1}]"), in(reg) b, in(reg) b_stride, options(nostack, readonly));
            if SIGNED {
                asm!(concat!("tdpbssd ", $c, ", ", $a, ", ", $b), options(nostack, nomem));
            } else {
                asm!(concat!("tdpbusd ", $c, ", ", $a, ", ", $b), options(nostack, nomem));
            }
            asm!(concat!("tilestored [{0} + {1}], ", $c), in(reg) c, in(reg) c_stride, options(nostack));
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

/// Weight rows `w` (the first `rows` real) against every activation row of
/// `acts`: `out[a * n + col[i]]` for activation row a and weight row i.
///
/// # Safety
/// [`available`] is true; every row of `w` is `k / 32` whole blocks of
/// `KIND`; the output indices are inside `out` and written by no other
/// thread.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn rows<const KIND: u8>(
    w: [&[u8]; ROWS],
    rows: usize,
    acts: &AmxActs,
    (out, n, col): (OutPtr, usize, &[usize; ROWS]),
) {
    let signed = matches!(KIND, 0 | 2 | 4);
    let min = matches!(KIND, 1 | 3);
    UNPACKED.with_borrow_mut(|u| {
        // SAFETY: forwarded contract.
        unsafe {
            unpack_rows::<KIND>(&w, acts.k, u);
            for g in 0..acts.groups() {
                let g = acts.group(g);
                let cfg = TileConfig::new(g.n);
                asm!("ldtilecfg [{0}]", in(reg) &cfg, options(nostack, readonly));
                let v = match (g.n, signed) {
                    (1, true) => one::<true>(u, acts.k, &g, min),
                    (1, false) => one::<false>(u, acts.k, &g, min),
                    (_, true) => many::<true>(u, acts.k, &g, min),
                    (_, false) => many::<false>(u, acts.k, &g, min),
                };
                for (v, &c) in v.iter().zip(col).take(rows) {
                    for (j, &v) in v.iter().enumerate().take(g.n) {
                        out.write((g.first + j) * n + c, v);
                    }
                }
            }
            asm!("tilerelease", options(nostack, nomem));
        }
    });
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
    (out, col): (OutPtr, &[usize; ROWS]),
) {
    let signed = matches!(KIND, 0 | 2 | 4);
    let min = matches!(KIND, 1 | 3);
    let nb = x.d.len().min(w[0].len() / block_bytes(KIND));
    // SAFETY: block b of every row and of `x` is in bounds (caller contract).
    unsafe {
        let mut acc = _mm512_setzero_ps();
        for b in 0..nb {
            let xv = _mm256_loadu_si256(x.qs.as_ptr().add(32 * b) as *const __m256i);
            let mut v = [_mm256_setzero_si256(); ROWS];
            let (mut d, mut m) = ([0u16; ROWS], [0u16; ROWS]);
            for i in 0..ROWS {
                let p = w[i].as_ptr().add(b * block_bytes(KIND));
                prefetch_ahead::<64>(p, PREFETCH_BYTES);
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
        let mut lanes = [0f32; ROWS];
        _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
        for i in 0..rows {
            out.write(col[i], lanes[i]);
        }
    }
}

/// One activation row: lanes are weight rows.
///
/// # Safety
/// As [`rows`], tiles configured for one row.
#[inline(always)]
unsafe fn one<const SIGNED: bool>(
    u: &Unpacked,
    k: usize,
    g: &Group<'_>,
    min: bool,
) -> [[f32; COLS]; ROWS] {
    let nb = k / 32;
    let mut c = [[0i32; ROWS]; 2];
    // SAFETY: in-bounds block reads of the unpacked rows and the group.
    unsafe {
        let product = |b: usize, c: &mut [i32; ROWS]| {
            let a = (u.q.as_ptr().add(32 * b), k);
            tile_product::<SIGNED>(b & 1, a, (g.b.as_ptr().add(32 * b), 4), (c.as_mut_ptr(), 4));
        };
        let mut acc = _mm512_setzero_ps();
        product(0, &mut c[0]);
        for b in 0..nb {
            // Block b + 1's product runs while block b is scaled.
            if b + 1 < nb {
                product(b + 1, &mut c[(b + 1) & 1]);
            }
            let t = _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_loadu_si512(c[b & 1].as_ptr() as *const _)),
                _mm512_set1_ps(*g.d.get_unchecked(b * COLS)),
            );
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(u.d.as_ptr().add(b * ROWS)), t, acc);
            if min {
                let s = _mm512_set1_ps(*g.s.get_unchecked(b * COLS));
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(u.m.as_ptr().add(b * ROWS)), s, acc);
            }
        }
        let mut lanes = [0f32; ROWS];
        _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
        let mut v = [[0f32; COLS]; ROWS];
        for i in 0..ROWS {
            v[i][0] = lanes[i];
        }
        v
    }
}

/// Two to 16 activation rows: lanes are activation rows.
///
/// # Safety
/// As [`rows`], tiles configured for `g.n` rows.
#[inline(always)]
unsafe fn many<const SIGNED: bool>(
    u: &Unpacked,
    k: usize,
    g: &Group<'_>,
    min: bool,
) -> [[f32; COLS]; ROWS] {
    let nb = k / 32;
    let mut c = [[[0i32; COLS]; ROWS]; 2];
    // SAFETY: in-bounds block reads of the unpacked rows and the group.
    unsafe {
        let product = |b: usize, c: &mut [[i32; COLS]; ROWS]| {
            let a = (u.q.as_ptr().add(32 * b), k);
            let x = (g.b.as_ptr().add(32 * b * g.n), 4 * g.n);
            tile_product::<SIGNED>(b & 1, a, x, (c.as_mut_ptr() as *mut i32, 4 * COLS));
        };
        let mut acc = [_mm512_setzero_ps(); ROWS];
        product(0, &mut c[0]);
        for b in 0..nb {
            // Block b + 1's product runs while block b is scaled.
            if b + 1 < nb {
                product(b + 1, &mut c[(b + 1) & 1]);
            }
            let c = &c[b & 1];
            let dx = _mm512_loadu_ps(g.d.as_ptr().add(b * COLS));
            let sx = _mm512_loadu_ps(g.s.as_ptr().add(b * COLS));
            for i in 0..ROWS {
                let t = _mm512_mul_ps(
                    _mm512_cvtepi32_ps(_mm512_loadu_si512(c[i].as_ptr() as *const _)),
                    dx,
                );
                acc[i] =
                    _mm512_fmadd_ps(_mm512_set1_ps(*u.d.get_unchecked(b * ROWS + i)), t, acc[i]);
                if min {
                    acc[i] = _mm512_fmadd_ps(
                        _mm512_set1_ps(*u.m.get_unchecked(b * ROWS + i)),
                        sx,
                        acc[i],
                    );
                }
            }
        }
        let mut v = [[0f32; COLS]; ROWS];
        for i in 0..ROWS {
            _mm512_storeu_ps(v[i].as_mut_ptr(), acc[i]);
        }
        v
    }
}
