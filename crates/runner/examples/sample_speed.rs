//! Host sampling cost per row (`ingot_runner::sampling::sample_row`) on a
//! 49,152-token vocabulary (SmolLM2's): `cargo run --release -p
//! ingot-runner --example sample_speed`.

use ingot_core::SamplingParams;
use ingot_runner::sampling::{sample_row, RowSampling};

fn main() {
    let vocab = 49_152;
    let logits: Vec<f32> = (0..vocab)
        .map(|i| ((i * 7919 % 1000) as f32) * 0.01)
        .collect();
    let base = SamplingParams::default();
    let cases = [
        ("temperature 1", base.clone()),
        (
            "top_p 0.9",
            SamplingParams {
                top_p: 0.9,
                ..base.clone()
            },
        ),
        (
            "top_k 50",
            SamplingParams {
                top_k: 50,
                ..base.clone()
            },
        ),
        (
            "min_p 0.05",
            SamplingParams {
                min_p: 0.05,
                ..base
            },
        ),
    ];
    let mut order = Vec::new();
    let rows = 200u64;
    for (name, params) in &cases {
        let started = std::time::Instant::now();
        for i in 0..rows {
            let r = RowSampling {
                params,
                seen: &[],
                random: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            };
            let mut l = logits.clone();
            std::hint::black_box(sample_row(&mut l, &r, &mut order));
        }
        let ms = started.elapsed().as_secs_f64() * 1e3 / rows as f64;
        println!("{name:14} {ms:.3} ms/row");
    }
}
