//! Batch-1 products streamed from memory, as decode reads them: ~300 MB of
//! matrices per format (well past the last-level cache) each taken once per
//! pass at one activation row, in GB/s of weights, beside the machine's
//! read bandwidth (AVX2 loads, one and two threads):
//! `K=1024 N=3072 cargo run --release -p ingot-runner-cpu --example stream_speed`.

mod common;

use std::time::Instant;

use ingot_models::BlockData;
use ingot_runner_cpu::quant::{ActScratch, QuantKind, QuantMatrix};
use rayon::prelude::*;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (k, n) = (env("K", 1024), env("N", 3072));
    let count = (300_000_000 / (n * k)).max(1);
    for kind in QuantKind::ALL {
        let mats: Vec<QuantMatrix> = (0..count)
            .map(|s| {
                let data = BlockData::Owned(common::blocks(kind, n, k, s));
                QuantMatrix::new(vec![(kind, data, n)], k).expect("valid blocks")
            })
            .collect();
        let total: usize = mats.iter().map(|m| m.bytes()).sum();
        let x: Vec<f32> = (0..k).map(|i| (i % 17) as f32 * 0.01 - 0.08).collect();
        let mut out = vec![0.0; n];
        let mut scratch = ActScratch::default();
        let mut pass = || {
            let t = Instant::now();
            for m in &mats {
                m.linear(&x, &mut out, 1, &mut scratch);
            }
            t.elapsed().as_secs_f64()
        };
        pass();
        let mut times: Vec<f64> = (0..15).map(|_| pass()).collect();
        times.sort_by(f64::total_cmp);
        println!(
            "{kind:?} {count} x {n}x{k}: {:.0} MB a pass, median {:.2} GB/s",
            total as f64 / 1e6,
            total as f64 / times[7] / 1e9
        );
    }
    read_bandwidth();
}

/// Best of five passes over 400 MB, split in contiguous halves per thread.
fn read_bandwidth() {
    let buf = vec![1u8; 400_000_000];
    for threads in [1, 2] {
        let best = (0..5)
            .map(|_| {
                let t = Instant::now();
                let x: u64 = buf
                    .par_chunks(buf.len() / threads)
                    .with_max_len(1)
                    .map(|c| {
                        c.chunks_exact(32)
                            .fold([0u64; 4], |mut a, b| {
                                for (a, b) in a.iter_mut().zip(b.chunks_exact(8)) {
                                    *a ^= u64::from_le_bytes(b.try_into().expect("8 bytes"));
                                }
                                a
                            })
                            .iter()
                            .fold(0, |a, b| a ^ b)
                    })
                    .reduce(|| 0, |a, b| a ^ b);
                std::hint::black_box(x);
                t.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min);
        println!(
            "read, {threads} thread(s): {:.2} GB/s",
            buf.len() as f64 / best / 1e9
        );
    }
}
