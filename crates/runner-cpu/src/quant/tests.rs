//! Every format's dot product against dequantize + f64 dot, on random blocks.

use half::f16;

use super::*;

/// xorshift64*: deterministic test data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Offsets of the f16 fields (scales, mins) of one block.
fn f16_fields(kind: QuantKind) -> &'static [usize] {
    match kind {
        QuantKind::Q4_0 | QuantKind::Q5_0 | QuantKind::Q8_0 => &[0],
        QuantKind::Q4_1 | QuantKind::Q5_1 | QuantKind::Q4K | QuantKind::Q5K => &[0, 2],
        QuantKind::Q6K => &[208],
    }
}

/// `blocks` random blocks: random bits, with finite scales of a realistic size.
fn random_blocks(kind: QuantKind, blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let size = kind.ggml().type_size();
    let mut out: Vec<u8> = (0..blocks * size).map(|_| rng.next() as u8).collect();
    for blk in out.chunks_exact_mut(size) {
        for &at in f16_fields(kind) {
            let v = f16::from_f32(rng.unit() * 0.02);
            blk[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    out
}

fn dequant(kind: QuantKind, w: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    dequantize_into(kind.ggml(), w, &mut out).expect("dequantize");
    out
}

/// Checks one kernel on `rows` random rows of `k` weights.
fn check(kind: QuantKind, dot: DotFn, k: usize, rows: usize, seed: u64) {
    let mut rng = Rng(seed);
    let blocks = k / kind.ggml().block_size();
    let x: Vec<f32> = (0..k).map(|_| rng.unit() * 3.0).collect();
    let mut acts = QuantActs::default();
    acts.quantize(&x, 1, k, kind.act());
    let a = acts.row(0);
    let ab = kind.act().block();
    let xq: Vec<f64> = (0..k)
        .map(|i| f64::from(a.qs[i]) * f64::from(a.d[i / ab]))
        .collect();
    for row in 0..rows {
        let wb = random_blocks(kind, blocks, &mut rng);
        let w = dequant(kind, &wb, k);
        // SAFETY: `dot` comes from dot_fn / portable_dot_fn for this CPU;
        // `wb` is `blocks` whole blocks and `a` has k values.
        let got = f64::from(unsafe { dot(&wb, a) });
        // 1. Exactly the product of the dequantized operands, up to f32
        //    rounding of the per-block partial sums: 1e-5 of Σ|w·x|.
        let want: f64 = w.iter().zip(&xq).map(|(&w, &x)| f64::from(w) * x).sum();
        let mag: f64 = w
            .iter()
            .zip(&xq)
            .map(|(&w, &x)| (f64::from(w) * x).abs())
            .sum();
        assert!(
            (got - want).abs() <= 1e-5 * mag + 1e-6,
            "{kind:?} row {row}: {got} vs dequantized {want} (mag {mag})"
        );
        // 2. Against the f32 activations: within the activation rounding,
        //    |x - xq| <= d / 2 per value, so |err| <= Σ|w| d / 2.
        let exact: f64 = w.iter().zip(&x).map(|(&w, &x)| f64::from(w * x)).sum();
        let bound: f64 = w
            .iter()
            .enumerate()
            .map(|(i, &w)| f64::from(w).abs() * f64::from(a.d[i / ab]) / 2.0)
            .sum();
        assert!(
            (got - exact).abs() <= bound * 1.001 + 1e-5 * mag + 1e-6,
            "{kind:?} row {row}: {got} vs f32 {exact} (bound {bound})"
        );
    }
}

#[test]
fn portable_kernels_match_the_dequantized_reference() {
    for (i, kind) in QuantKind::ALL.into_iter().enumerate() {
        check(kind, portable_dot_fn(kind), 1024, 20, 7 + i as u64);
    }
}

#[test]
fn dispatched_kernels_match_the_dequantized_reference() {
    // On x86-64 with AVX2 these are the SIMD kernels.
    for (i, kind) in QuantKind::ALL.into_iter().enumerate() {
        check(kind, dot_fn(kind), 1536, 20, 100 + i as u64);
        check(kind, dot_fn(kind), 256, 5, 200 + i as u64);
    }
}

#[test]
fn simd_and_portable_agree() {
    let mut rng = Rng(99);
    for kind in QuantKind::ALL {
        let k = 512;
        let x: Vec<f32> = (0..k).map(|_| rng.unit()).collect();
        let mut acts = QuantActs::default();
        acts.quantize(&x, 1, k, kind.act());
        let wb = random_blocks(kind, k / kind.ggml().block_size(), &mut rng);
        // SAFETY: both kernels are runnable here; whole blocks, k values.
        let (a, b) = unsafe {
            (
                dot_fn(kind)(&wb, acts.row(0)),
                portable_dot_fn(kind)(&wb, acts.row(0)),
            )
        };
        assert!(
            (a - b).abs() <= 1e-5 * a.abs().max(1.0),
            "{kind:?}: {a} vs {b}"
        );
    }
}

#[test]
fn stacked_matrix_matches_per_row_dots_and_is_batch_invariant() {
    // The two-row, four-row and 4 x 4 tile kernels must equal the one-row
    // kernels bit for bit, for every format (odd row counts leave a weight
    // row to the four-row kernel after the tiles).
    stacked(
        &[
            (QuantKind::Q4_1, 37),
            (QuantKind::Q6K, 20),
            (QuantKind::Q8_0, 300),
        ],
        5,
    );
    stacked(
        &[
            (QuantKind::Q4_0, 9),
            (QuantKind::Q5_0, 11),
            (QuantKind::Q5_1, 40),
        ],
        6,
    );
    stacked(&[(QuantKind::Q4K, 13), (QuantKind::Q5K, 7)], 7);
}

fn stacked(kinds: &[(QuantKind, usize)], seed: u64) {
    let mut rng = Rng(seed);
    let k = 512;
    let mut parts = Vec::new();
    let mut deq = Vec::new();
    for &(kind, rows) in kinds {
        let b = random_blocks(kind, rows * k / kind.ggml().block_size(), &mut rng);
        deq.extend(dequant(kind, &b, rows * k));
        parts.push((kind, BlockData::Owned(b), rows));
    }
    let mat = QuantMatrix::new(parts, k).expect("valid parts");
    let n = mat.rows();
    assert_eq!(n, kinds.iter().map(|k| k.1).sum::<usize>());
    // Tiles and four-row kernels, three rows through them padded, the
    // two-row kernel and the one-row one: 2, 3, 6 = 4 + 2, 9 = 8 + 1.
    for m in [2, 3, 6, 9] {
        rows_match_one_at_a_time(&mat, &deq, k, m, &mut rng);
    }
    let mut row = vec![0.0; k];
    mat.row_into(n - 3, &mut row);
    assert_eq!(row, deq[(n - 3) * k..(n - 2) * k]);
}

/// `m` rows at once equal each row alone, bit for bit, and the float
/// product of the dequantized weights within the activations' rounding.
fn rows_match_one_at_a_time(mat: &QuantMatrix, deq: &[f32], k: usize, m: usize, rng: &mut Rng) {
    let n = mat.rows();
    let x: Vec<f32> = (0..m * k).map(|_| rng.unit()).collect();
    let mut scratch = ActScratch::default();
    let mut full = vec![0.0; m * n];
    mat.linear(&x, &mut full, m, &mut scratch);
    for i in 0..m {
        let mut one = vec![0.0; n];
        mat.linear(&x[i * k..(i + 1) * k], &mut one, 1, &mut scratch);
        assert_eq!(one, full[i * n..(i + 1) * n], "row {i}");
        for j in 0..n {
            let want: f32 = (0..k).map(|t| x[i * k + t] * deq[j * k + t]).sum();
            let mag: f32 = (0..k).map(|t| (x[i * k + t] * deq[j * k + t]).abs()).sum();
            assert!((one[j] - want).abs() <= 0.02 * mag + 1e-4, "{i},{j}");
        }
    }
}

#[test]
fn q8_0_quantization_round_trips_within_half_a_step() {
    let mut rng = Rng(11);
    let x: Vec<f32> = (0..4096).map(|_| rng.unit() * 0.1).collect();
    let blocks = quantize_q8_0(&x);
    assert_eq!(blocks.len(), 4096 / 32 * 34);
    let back = dequant(QuantKind::Q8_0, &blocks, x.len());
    for (i, (a, b)) in x.iter().zip(&back).enumerate() {
        let d = f16::from_le_bytes([blocks[i / 32 * 34], blocks[i / 32 * 34 + 1]]).to_f32();
        assert!((a - b).abs() <= d / 2.0 + 1e-7, "{i}: {a} vs {b}");
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn vnni_and_avx2_kernels_are_bit_identical() {
    // Both paths compute exact integer block sums, then the same float
    // operations: dispatching to either must not change a single bit.
    if !(has_avx2() && has_vnni()) {
        eprintln!("no AVX512-VNNI here: nothing to compare");
        return;
    }
    let mut rng = Rng(5);
    for kind in QuantKind::ALL {
        let (plain, vnni) = (avx2_kernels(kind, false), avx2_kernels(kind, true));
        let k = 1024;
        let x: Vec<f32> = (0..4 * k).map(|_| rng.unit() * 2.0).collect();
        let mut acts = QuantActs::default();
        acts.quantize(&x, 4, k, kind.act());
        let rows = [acts.row(0), acts.row(1), acts.row(2), acts.row(3)];
        let blocks = k / kind.ggml().block_size();
        let (w0, w1) = (
            random_blocks(kind, blocks, &mut rng),
            random_blocks(kind, blocks, &mut rng),
        );
        // SAFETY: AVX2 and VNNI checked above; whole blocks, k values a row.
        unsafe {
            assert_eq!(
                (plain.four)(&w0, &rows),
                (vnni.four)(&w0, &rows),
                "{kind:?}"
            );
            assert_eq!(
                (plain.one)(&w1, rows[2]),
                (vnni.one)(&w1, rows[2]),
                "{kind:?}"
            );
            let two = [rows[1], rows[3]];
            assert_eq!((plain.two)(&w1, &two), (vnni.two)(&w1, &two), "{kind:?}");
            if let (Some(a), Some(b)) = (plain.tile, vnni.tile) {
                let (a2, b2, b1) = (a.two, b.two, b.one);
                let (a, b) = (a.four, b.four);
                let ws: [Vec<u8>; TILE_W] =
                    std::array::from_fn(|_| random_blocks(kind, blocks, &mut rng));
                let tile_w: [&[u8]; TILE_W] = std::array::from_fn(|j| ws[j].as_slice());
                let want: [[f32; 4]; TILE_W] =
                    std::array::from_fn(|j| (plain.four)(tile_w[j], &rows));
                assert_eq!(a(tile_w, &rows), want, "{kind:?} tile");
                assert_eq!(b(tile_w, &rows), want, "{kind:?} vnni tile");
                let two = [rows[0], rows[3]];
                let want2: [[f32; 2]; TILE_W] =
                    std::array::from_fn(|j| (plain.two)(tile_w[j], &two));
                assert_eq!(a2(tile_w, &two), want2, "{kind:?} tile2");
                assert_eq!(b2(tile_w, &two), want2, "{kind:?} vnni tile2");
                let one = [rows[2]];
                let want1: [[f32; 1]; TILE_W] =
                    std::array::from_fn(|j| [(plain.one)(tile_w[j], rows[2])]);
                assert_eq!((b1)(tile_w, &one), want1, "{kind:?} vnni tile1");
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn one_row_tile_equals_the_one_row_kernel() {
    // Batch-1 decode runs four weight rows at once (`Tiles::one`): each
    // result must be the one-row kernel's, bit for bit.
    if !has_avx2() {
        eprintln!("no AVX2 here: no tile kernels to compare");
        return;
    }
    let mut rng = Rng(8);
    for kind in QuantKind::ALL {
        let ks = avx2_kernels(kind, false);
        let Some(tiles) = ks.tile else { continue };
        let k = 768;
        let x: Vec<f32> = (0..k).map(|_| rng.unit() * 3.0).collect();
        let mut acts = QuantActs::default();
        acts.quantize(&x, 1, k, kind.act());
        let blocks = k / kind.ggml().block_size();
        let ws: [Vec<u8>; TILE_W] = std::array::from_fn(|_| random_blocks(kind, blocks, &mut rng));
        let tile_w: [&[u8]; TILE_W] = std::array::from_fn(|j| ws[j].as_slice());
        // SAFETY: AVX2 checked above; whole blocks, k values a row.
        unsafe {
            let want: [[f32; 1]; TILE_W] =
                std::array::from_fn(|j| [(ks.one)(tile_w[j], acts.row(0))]);
            assert_eq!((tiles.one)(tile_w, &[acts.row(0)]), want, "{kind:?}");
        }
    }
}

/// Relative L2 error of `kind`'s quantize → ggml dequantize round trip.
fn round_trip_error(kind: QuantKind, x: &[f32], cols: usize) -> f64 {
    let (got, blocks) = quantize(kind, x, cols).expect("quantizable");
    assert_eq!(got, kind);
    assert_eq!(blocks.len(), got.row_bytes(cols) * x.len() / cols);
    let back = dequant(kind, &blocks, x.len());
    let err: f64 = x
        .iter()
        .zip(&back)
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum();
    let norm: f64 = x.iter().map(|a| f64::from(*a).powi(2)).sum();
    (err / norm).sqrt()
}

#[test]
fn q4_0_quantization_is_within_a_step() {
    let mut rng = Rng(12);
    let x: Vec<f32> = (0..4096).map(|_| rng.unit() * 0.1).collect();
    let blocks = quantize_q4_0(&x);
    let back = dequant(QuantKind::Q4_0, &blocks, x.len());
    for (i, (a, b)) in x.iter().zip(&back).enumerate() {
        let d = f16::from_le_bytes([blocks[i / 32 * 18], blocks[i / 32 * 18 + 1]]).to_f32();
        assert!((a - b).abs() <= d.abs() + 1e-7, "{i}: {a} vs {b}");
    }
    // 16 levels over the block's range: ~0.6 / 16 relative RMS for uniform data.
    let e = round_trip_error(QuantKind::Q4_0, &x, 512);
    assert!(e < 0.08, "q4_0 relative error {e}");
}

#[test]
fn q4_k_quantization_packs_ggml_blocks() {
    // A wrong scale/min packing or nibble order would show as errors of
    // the order of the values themselves.
    let mut rng = Rng(13);
    let x: Vec<f32> = (0..8192).map(|_| rng.unit() * 0.05 + 0.01).collect();
    let e = round_trip_error(QuantKind::Q4K, &x, 1024);
    assert!(e < 0.08, "q4_k relative error {e}");
    let q8 = round_trip_error(QuantKind::Q8_0, &x, 1024);
    assert!(q8 < 0.01 && q8 < e, "q8_0 {q8} vs q4_k {e}");
}

#[test]
fn k_quant_falls_back_to_q8_0_on_rows_256_does_not_divide() {
    let x = vec![0.5f32; 576 * 2];
    let (kind, blocks) = quantize(QuantKind::Q4K, &x, 576).expect("32 divides 576");
    assert_eq!(kind, QuantKind::Q8_0);
    assert_eq!(blocks.len(), 2 * 576 / 32 * 34);
    assert!(quantize(QuantKind::Q4_0, &x, 100).is_none());
}

#[test]
fn amx_tiles_are_batch_invariant_and_close_to_the_avx2_kernels() {
    if !amx_available() {
        eprintln!("skipped: this CPU (or OS) has no AMX-INT8");
        return;
    }
    // Every 32-block format; parts whose rows end mid-tile.
    amx_against_avx2(
        &[
            (QuantKind::Q4_0, 9),
            (QuantKind::Q4_1, 37),
            (QuantKind::Q5_0, 11),
            (QuantKind::Q5_1, 40),
        ],
        11,
    );
    amx_against_avx2(&[(QuantKind::Q8_0, 300)], 12);
}

fn amx_against_avx2(kinds: &[(QuantKind, usize)], seed: u64) {
    let mut rng = Rng(seed);
    let k = 512;
    let (mut parts, mut deq) = (Vec::new(), Vec::new());
    for &(kind, rows) in kinds {
        let b = random_blocks(kind, rows * k / 32, &mut rng);
        deq.extend(dequant(kind, &b, rows * k));
        parts.push((kind, BlockData::Owned(b), rows));
    }
    let avx2 = QuantMatrix::new(parts.clone(), k).expect("valid parts");
    let amx = QuantMatrix::new(parts, k)
        .expect("valid parts")
        .with_amx(true);
    assert!(amx.uses_amx());
    // The AVX512-VNNI kernel (four rows at a time, then the rest) and the
    // tiles (groups of 16, then of one): every row equals itself alone,
    // bit for bit.
    for m in [1, 2, 3, 5, 8, 16, 17, 33] {
        rows_match_one_at_a_time(&amx, &deq, k, m, &mut rng);
    }
    // Exact integer block sums on both: only the f32 rounding differs.
    let (m, n) = (5, amx.rows());
    let x: Vec<f32> = (0..m * k).map(|_| rng.unit()).collect();
    let mut scratch = ActScratch::default();
    let (mut a, mut b) = (vec![0.0; m * n], vec![0.0; m * n]);
    amx.linear(&x, &mut a, m, &mut scratch);
    avx2.linear(&x, &mut b, m, &mut scratch);
    for i in 0..m * n {
        let mag: f32 = (0..k)
            .map(|t| (x[(i / n) * k + t] * deq[(i % n) * k + t]).abs())
            .sum();
        assert!(
            (a[i] - b[i]).abs() <= 1e-5 * mag + 1e-6,
            "{i}: {} vs {}",
            a[i],
            b[i]
        );
    }
}
