//! Host sampling cost per row (`ingot_runner::sampling::sample_row`) on a
//! 49,152-token vocabulary (SmolLM2's): `cargo run --release -p
//! ingot-runner --example sample_speed`.

use ingot_runner::sampling::{sample_row, RowSampling};

fn main() {
    let vocab = 49_152;
    let logits: Vec<f32> = (0..vocab)
        .map(|i| ((i * 7919 % 1000) as f32) * 0.01)
        .collect();
    let base = RowSampling {
        temperature: 1.0,
        ..RowSampling::GREEDY
    };
    let cases = [
        ("temperature 1", base),
        ("top_p 0.9", RowSampling { top_p: 0.9, ..base }),
        ("top_k 50", RowSampling { top_k: 50, ..base }),
        (
            "min_p 0.05",
            RowSampling {
                min_p: 0.05,
                ..base
            },
        ),
    ];
    let mut order = Vec::new();
    let rows = 200u64;
    for (name, row) in cases {
        let started = std::time::Instant::now();
        for i in 0..rows {
            let r = RowSampling {
                random: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                ..row
            };
            let mut l = logits.clone();
            std::hint::black_box(sample_row(&mut l, &r, &mut order));
        }
        let ms = started.elapsed().as_secs_f64() * 1e3 / rows as f64;
        println!("{name:14} {ms:.3} ms/row");
    }
}
