//! Statistics for `compare` and `soak`: Welch's unequal-variance t-test,
//! Cohen's d, a cluster bootstrap test for percentiles and the
//! least-squares line.
//!
//! Welch's test (Welch 1947, <https://doi.org/10.1093/biomet/34.1-2.28>)
//! is used rather than Student's because a regression usually changes the
//! spread as well as the mean; it matches
//! `scipy.stats.ttest_ind(a, b, equal_var=False)`. The Student t CDF comes
//! from `statrs` (regularized incomplete beta).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use statrs::distribution::{ContinuousCDF, StudentsT};

/// Mean and sample variance (n - 1); `None` for fewer than two samples.
fn mean_var(x: &[f64]) -> Option<(f64, f64)> {
    if x.len() < 2 {
        return None;
    }
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    Some((mean, var))
}

/// The outcome of Welch's t-test of `b` against `a`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Welch {
    /// t statistic, `(mean(a) - mean(b)) / se` (scipy's sign convention).
    pub t: f64,
    /// Welch–Satterthwaite degrees of freedom.
    pub df: f64,
    /// Two-sided p-value.
    pub p: f64,
}

/// Welch's two-sided t-test; `None` with fewer than two samples on a side.
/// Two constant samples give p = 1 when equal and p = 0 when not (the
/// difference is exact, not noise).
pub fn welch_t_test(a: &[f64], b: &[f64]) -> Option<Welch> {
    let (ma, va) = mean_var(a)?;
    let (mb, vb) = mean_var(b)?;
    let (sa, sb) = (va / a.len() as f64, vb / b.len() as f64);
    let se2 = sa + sb;
    if se2 <= 0.0 {
        let same = ma == mb;
        return Some(Welch {
            t: if same {
                0.0
            } else {
                (ma - mb).signum() * f64::INFINITY
            },
            df: (a.len() + b.len() - 2) as f64,
            p: if same { 1.0 } else { 0.0 },
        });
    }
    let t = (ma - mb) / se2.sqrt();
    let df = se2 * se2 / (sa * sa / (a.len() - 1) as f64 + sb * sb / (b.len() - 1) as f64);
    let dist = StudentsT::new(0.0, 1.0, df).ok()?;
    // 2 * cdf(-|t|) keeps precision for tiny p (1 - cdf(|t|) would round to 0).
    let p = (2.0 * dist.cdf(-t.abs())).min(1.0);
    Some(Welch { t, df, p })
}

/// Cohen's d of `b` against `a`: `(mean(b) - mean(a)) / pooled sd`, the
/// pooled sd weighting each sample variance by its n - 1. Positive when `b`
/// is larger. `None` with fewer than two samples on a side or zero spread.
pub fn cohens_d(a: &[f64], b: &[f64]) -> Option<f64> {
    let (ma, va) = mean_var(a)?;
    let (mb, vb) = mean_var(b)?;
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let pooled = (((na - 1.0) * va + (nb - 1.0) * vb) / (na + nb - 2.0)).sqrt();
    (pooled > 0.0).then(|| (mb - ma) / pooled)
}

/// The `q`-quantile (0..=1) of `v`, interpolating linearly between order
/// statistics like numpy's default (and [`crate::result::Stats`]). Reorders
/// `v`; O(n).
fn quantile(v: &mut [f64], q: f64) -> f64 {
    let pos = q * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let (_, lo_v, upper) = v.select_nth_unstable_by(lo, f64::total_cmp);
    let lo_v = *lo_v;
    let frac = pos - lo as f64;
    if frac == 0.0 || upper.is_empty() {
        return lo_v;
    }
    let hi_v = upper.iter().copied().fold(f64::INFINITY, f64::min);
    lo_v + (hi_v - lo_v) * frac
}

/// Resamples drawn by [`bootstrap_quantile_test`].
pub const BOOTSTRAP_RESAMPLES: usize = 1000;

/// Two-sided p-value that the `q`-quantile of the pooled values of `b`
/// differs from that of `a`, by a cluster bootstrap (Efron & Tibshirani,
/// *An Introduction to the Bootstrap*, 1993, ch. 15–16): each side's
/// clusters (one per request: one TTFT, or all of its inter-token gaps)
/// are resampled with replacement, so correlated values within a request
/// are not counted as independent; the p-value inverts the percentile
/// interval of the difference, `2 * min(P*(d <= 0), P*(d >= 0))` with +1
/// smoothing. Seeded, so a comparison is reproducible. `None` with fewer
/// than two clusters on a side.
pub fn bootstrap_quantile_test(a: &[Vec<f64>], b: &[Vec<f64>], q: f64, seed: u64) -> Option<f64> {
    let nonempty = |c: &[Vec<f64>]| c.iter().filter(|v| !v.is_empty()).count();
    if nonempty(a) < 2 || nonempty(b) < 2 {
        return None;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut pool = Vec::new();
    let mut resampled_quantile = |clusters: &[Vec<f64>], rng: &mut ChaCha8Rng| -> Option<f64> {
        pool.clear();
        for _ in 0..clusters.len() {
            pool.extend_from_slice(&clusters[rng.random_range(0..clusters.len())]);
        }
        (!pool.is_empty()).then(|| quantile(&mut pool, q))
    };
    let (mut below, mut above, mut drawn) = (0usize, 0usize, 0usize);
    for _ in 0..BOOTSTRAP_RESAMPLES {
        let (Some(qa), Some(qb)) = (
            resampled_quantile(a, &mut rng),
            resampled_quantile(b, &mut rng),
        ) else {
            continue; // only empty clusters drawn
        };
        let d = qb - qa;
        below += usize::from(d <= 0.0);
        above += usize::from(d >= 0.0);
        drawn += 1;
    }
    let tail = (below.min(above) + 1) as f64 / (drawn + 1) as f64;
    Some((2.0 * tail).min(1.0))
}

/// A least-squares line `y = intercept + slope * x`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Line {
    /// Value at x = 0.
    pub intercept: f64,
    /// Change of y per unit of x.
    pub slope: f64,
}

impl Line {
    /// The fitted value at `x`.
    pub fn at(&self, x: f64) -> f64 {
        self.intercept + self.slope * x
    }
}

/// Ordinary least squares over finite points; `None` with fewer than two
/// distinct x.
pub fn least_squares(points: &[(f64, f64)]) -> Option<Line> {
    let pts: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    if pts.len() < 2 {
        return None;
    }
    let n = pts.len() as f64;
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    Some(Line {
        intercept: my - slope * mx,
        slope,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) {
        assert!(
            (a - b).abs() <= rel * b.abs().max(1e-300),
            "{a} vs {b} (rel {rel})"
        );
    }

    // Reference values: scipy 1.x, `ttest_ind(a, b, equal_var=False)` and
    // `(mean(b) - mean(a)) / pooled_sd` with ddof=1 variances.
    const A: [f64; 8] = [12.1, 14.3, 11.8, 13.5, 12.9, 15.2, 13.1, 12.4];
    const B: [f64; 10] = [14.8, 16.1, 15.3, 13.9, 17.2, 15.8, 16.4, 14.6, 15.9, 16.7];

    #[test]
    fn welch_matches_scipy() {
        let w = welch_t_test(&A, &B).unwrap();
        close(w.t, -4.841180122270645, 1e-12);
        close(w.df, 14.232920161866744, 1e-12);
        close(w.p, 0.0002497435344956431, 1e-7);

        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        let b = [1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 100.0];
        let w = welch_t_test(&a, &b).unwrap();
        close(w.t, -1.070311610474777, 1e-12);
        close(w.df, 6.031809082228656, 1e-12);
        close(w.p, 0.32542672107622733, 1e-7);
    }

    #[test]
    fn student_t_cdf_matches_scipy() {
        // scipy.stats.t.cdf(-2.5, 3.7) and t.sf(40, 2.2).
        let t = StudentsT::new(0.0, 1.0, 3.7).unwrap();
        close(t.cdf(-2.5), 0.03591101145591339, 1e-7);
        let t = StudentsT::new(0.0, 1.0, 2.2).unwrap();
        close(t.cdf(-40.0), 0.00017115773828230282, 1e-6);
    }

    #[test]
    fn cohens_d_matches_hand_computation() {
        close(cohens_d(&A, &B).unwrap(), 2.3281709824784502, 1e-12);
        assert!(cohens_d(&[1.0, 1.0], &[1.0, 1.0]).is_none());
    }

    #[test]
    fn degenerate_samples() {
        assert!(welch_t_test(&[1.0], &[1.0, 2.0]).is_none());
        assert_eq!(welch_t_test(&[2.0, 2.0], &[2.0, 2.0]).unwrap().p, 1.0);
        assert_eq!(welch_t_test(&[2.0, 2.0], &[3.0, 3.0]).unwrap().p, 0.0);
        let same = welch_t_test(&A, &A).unwrap();
        assert_eq!((same.t, same.p), (0.0, 1.0));
    }

    #[test]
    fn quantile_interpolates_like_numpy() {
        // numpy.percentile([5, 1, 4, 2, 3], [0, 25, 50, 90, 99, 100])
        for (q, want) in [
            (0.0, 1.0),
            (0.25, 2.0),
            (0.5, 3.0),
            (0.9, 4.6),
            (0.99, 4.96),
            (1.0, 5.0),
        ] {
            let mut v = [5.0, 1.0, 4.0, 2.0, 3.0];
            close(quantile(&mut v, q), want, 1e-12);
        }
    }

    #[test]
    fn bootstrap_separates_shifts_from_noise() {
        let single = |xs: &[f64]| xs.iter().map(|x| vec![*x]).collect::<Vec<_>>();
        let a = single(&A);
        let b = single(&B);
        // Clearly apart: every resampled median of B is above A's.
        let p = bootstrap_quantile_test(&a, &b, 0.5, 1).unwrap();
        assert!(p < 0.01, "{p}");
        // The same sample against itself: no evidence.
        assert!(bootstrap_quantile_test(&a, &a, 0.5, 1).unwrap() > 0.5);
        // Reproducible with the seed.
        assert_eq!(
            bootstrap_quantile_test(&a, &b, 0.99, 7),
            bootstrap_quantile_test(&a, &b, 0.99, 7)
        );
        // One request's gaps are one cluster: two requests with many equal
        // gaps each are still only two draws, so a tail made by one request
        // is not significant.
        let a = vec![vec![10.0; 50], vec![10.0; 50]];
        let b = vec![vec![10.0; 50], vec![30.0; 50]];
        assert!(bootstrap_quantile_test(&a, &b, 0.99, 1).unwrap() > 0.05);
        assert!(bootstrap_quantile_test(&a, &b[..1], 0.5, 1).is_none());
    }

    #[test]
    fn least_squares_recovers_a_line() {
        let pts: Vec<(f64, f64)> = (0..5).map(|i| (i as f64, 3.0 - 0.5 * i as f64)).collect();
        let l = least_squares(&pts).unwrap();
        close(l.slope, -0.5, 1e-12);
        close(l.intercept, 3.0, 1e-12);
        close(l.at(10.0), -2.0, 1e-12);
        assert!(least_squares(&[(1.0, 1.0), (1.0, 2.0)]).is_none());
        assert!(least_squares(&[(1.0, 1.0)]).is_none());
    }
}
