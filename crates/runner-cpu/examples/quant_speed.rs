//! Times the native quantized matmul (Q4_1, Q8_0, Q4_K, Q6_K weights) at the
//! SmolLM2 prefill, verify and decode shapes, next to the f32 matmul:
//! `cargo run --release -p ingot-runner-cpu --example quant_speed` (`ONLY=8x576x3072`: one shape).
//! Where the CPU has AMX-INT8, the 32-block formats are timed on its tiles
//! too (`model.cpu_weights = "amx"`).

mod common;

use std::time::Instant;

use ingot_models::BlockData;
use ingot_runner_cpu::quant::{amx_available, ActScratch, QuantKind, QuantMatrix};

fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    t.elapsed().as_secs_f64() / reps as f64
}

fn main() {
    for (m, k, n) in [
        (1, 576, 3072),
        (1, 1536, 576),
        (1, 576, 49152),
        // Speculative verify steps: a few rows.
        (2, 576, 3072),
        (4, 576, 3072),
        (8, 576, 3072),
        (16, 576, 3072),
        (128, 576, 3072),
        (128, 1536, 576),
    ] {
        // ONLY=MxKxN times that shape alone (for perf).
        if std::env::var("ONLY").is_ok_and(|o| o != format!("{m}x{k}x{n}")) {
            continue;
        }
        let x: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 * 0.01 - 0.08).collect();
        let mut out = vec![0.0; m * n];
        let reps = (2_000_000_000 / (m * k * n)).clamp(3, 2000);
        let w: Vec<f32> = (0..n * k).map(|i| (i % 13) as f32 * 0.01).collect();
        let s = time(reps, || {
            ingot_runner_cpu::matmul::linear(&x, &w, &mut out, m, k, n)
        });
        let gflops = |s: f64| 2.0 * (m * k * n) as f64 / s / 1e9;
        println!(
            "{m}x{k}x{n} f32:  {:.3} ms, {:.1} GFLOP/s, {:.1} GB/s weights",
            s * 1e3,
            gflops(s),
            (n * k * 4) as f64 / s / 1e9
        );
        for kind in [
            QuantKind::Q4_1,
            QuantKind::Q8_0,
            QuantKind::Q4K,
            QuantKind::Q6K,
        ] {
            if k % kind.ggml().block_size() != 0 {
                continue;
            }
            let mat = || {
                let data = BlockData::Owned(common::blocks(kind, n, k, 0));
                QuantMatrix::new(vec![(kind, data, n)], k).expect("valid blocks")
            };
            let mut mats = vec![("", mat())];
            if amx_available() && kind.ggml().block_size() == 32 {
                mats.push((" amx", mat().with_amx(true)));
            }
            for (tag, mat) in &mats {
                let mut scratch = ActScratch::default();
                let s = time(reps, || mat.linear(&x, &mut out, m, &mut scratch));
                println!(
                    "{m}x{k}x{n} {kind:?}{tag}: {:.3} ms, {:.1} GFLOP/s, {:.1} GB/s weights",
                    s * 1e3,
                    gflops(s),
                    mat.bytes() as f64 / s / 1e9
                );
            }
        }
    }
}
