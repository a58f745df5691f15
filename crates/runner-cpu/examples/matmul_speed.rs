//! Times the batch-invariant matmul at prefill and decode shapes:
//! `cargo run -p ingot-runner-cpu --example matmul_speed`.

use std::time::Instant;

fn main() {
    for (m, k, n) in [
        (512, 576, 1536),
        (128, 576, 3072),
        (1, 576, 3072),
        (16, 576, 3072),
    ] {
        let x: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 * 0.01).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i % 13) as f32 * 0.01).collect();
        let mut out = vec![0.0; m * n];
        ingot_runner_cpu::matmul::linear(&x, &w, &mut out, m, k, n);
        let reps = (2_000_000_000 / (m * k * n)).clamp(3, 2000);
        let t = Instant::now();
        for _ in 0..reps {
            ingot_runner_cpu::matmul::linear(&x, &w, &mut out, m, k, n);
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        println!(
            "{m}x{k}x{n}: {:.3} ms, {:.1} GFLOP/s, {:.1} GB/s weights",
            s * 1e3,
            2.0 * (m * k * n) as f64 / s / 1e9,
            (n * k * 4) as f64 / s / 1e9
        );
    }
}
