//! The A/A property: two arms drawn from the same distribution are not
//! significant at alpha = 0.05 in at least 95 of 100 seeded repetitions
//! of the analysis, and a real difference is found.

#![allow(clippy::unwrap_used)]

use ingot_stats::{compare, Verdict};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A TTFT-like sample: log-normal around `median_ms` (latencies are skewed,
/// which is what the t-test must survive).
fn ttfts(rng: &mut ChaCha8Rng, n: usize, median_ms: f64) -> Vec<f64> {
    (0..n)
        .map(|_| {
            // Box–Muller: a standard normal from two uniforms.
            let (u1, u2): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            median_ms * (0.35 * z).exp()
        })
        .collect()
}

#[test]
fn identical_arms_are_not_significant_in_95_of_100() {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let significant = (0..100)
        .filter(|_| {
            let a = ttfts(&mut rng, 200, 80.0);
            let b = ttfts(&mut rng, 200, 80.0);
            compare(&a, &b, 0.05, 30).verdict.is_significant()
        })
        .count();
    assert!(
        significant <= 5,
        "{significant} of 100 A/A runs significant"
    );
}

#[test]
fn a_known_ttft_difference_is_significant() {
    let mut rng = ChaCha8Rng::seed_from_u64(18);
    let a = ttfts(&mut rng, 200, 80.0);
    let b = ttfts(&mut rng, 200, 100.0);
    let c = compare(&a, &b, 0.01, 30);
    assert_eq!(c.verdict, Verdict::BHigher, "{c:?}");
    assert!(c.welch.unwrap().p < 0.01);
    // Below the minimum sample size there is no decision.
    let c = compare(&a[..10], &b[..10], 0.01, 30);
    assert_eq!(c.verdict, Verdict::InsufficientSamples);
}
