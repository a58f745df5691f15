//! `ingot-stats`: the statistics shared by `ingot bench compare` and the
//! router's A/B experiments and canaries, so a regression gate and a live
//! rollback decide with the same arithmetic.
//!
//! - [`welch_t_test`]: Welch's unequal-variance t-test (Welch 1947,
//!   <https://doi.org/10.1093/biomet/34.1-2.28>): t, the Welch–Satterthwaite
//!   degrees of freedom and the two-sided p-value. Welch rather than Student
//!   because a regression usually changes the spread as well as the mean. It
//!   matches `scipy.stats.ttest_ind(a, b, equal_var=False)` to 1e-9
//!   (`tests/suite/scipy.rs`, fixture from `tests/suite/reference/scipy_reference.py`).
//!   The Student t CDF comes from `statrs` (regularized incomplete beta).
//! - [`quantile`]: the linear definition (Hyndman & Fan type 7), the default
//!   of numpy's `percentile` and scipy's `mstats`/`scoreatpercentile`:
//!   position `q·(n−1)` between the order statistics.
//! - [`Summary`] and [`compare`]: per-arm sizes, means, variances, p50/p95/p99
//!   and a [`Verdict`] at a significance level with a minimum sample size.
//! - [`cohens_d`], [`coefficient_of_variation`] and [`least_squares`] for
//!   the bench's comparison and soak. `ingot bench compare` runs Welch's
//!   test over per-run values (each run's mean or percentile), not over the
//!   requests of one run: requests of a run share its luck on a busy
//!   machine, so they are not the independent samples the test assumes.

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

/// The `q`-quantile (0..=1) of `v` by the linear definition (module docs),
/// reordering `v` in place; O(n). `NaN` for an empty `v`.
pub fn quantile_in_place(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
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

/// The `q`-quantile (0..=1) of `sorted` (ascending) by the linear
/// definition; `NaN` when empty.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return f64::NAN;
    };
    let pos = q.clamp(0.0, 1.0) * last as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// The `q`-quantile (0..=1) of `x` by the linear definition; `None` when
/// empty. Copies `x`.
pub fn quantile(x: &[f64], q: f64) -> Option<f64> {
    (!x.is_empty()).then(|| quantile_in_place(&mut x.to_vec(), q))
}

/// Holm's step-down adjustment of `p` (the family-wise error of the whole
/// set held at alpha when each adjusted value is compared with alpha), as
/// `statsmodels.stats.multitest.multipletests(p, method="holm")[1]`, in the
/// input's order.
pub fn holm_adjust(p: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut adjusted = vec![0.0; p.len()];
    let mut running = 0.0_f64;
    for (rank, &i) in order.iter().enumerate() {
        running = running.max(((p.len() - rank) as f64 * p[i]).min(1.0));
        adjusted[i] = running;
    }
    adjusted
}

/// The arithmetic mean; `None` when empty.
pub fn mean(x: &[f64]) -> Option<f64> {
    (!x.is_empty()).then(|| x.iter().sum::<f64>() / x.len() as f64)
}

/// The sample variance (divisor n − 1, numpy's `ddof=1`); `None` for fewer
/// than two samples.
pub fn variance(x: &[f64]) -> Option<f64> {
    mean_var(x).map(|(_, v)| v)
}

/// The coefficient of variation, sample sd (n − 1) over |mean|, as
/// `scipy.stats.variation(x, ddof=1)` for a positive mean; `None` for
/// fewer than two samples or a zero mean.
pub fn coefficient_of_variation(x: &[f64]) -> Option<f64> {
    let (m, v) = mean_var(x)?;
    (m != 0.0).then(|| v.sqrt() / m.abs())
}

/// What one arm's samples look like.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    /// Sample size.
    pub n: usize,
    /// Mean (`NaN` when empty).
    pub mean: f64,
    /// Sample variance, n − 1 (`NaN` below two samples).
    pub variance: f64,
    /// Median (linear quantile).
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Summary {
    /// The summary of `x` (non-finite values are left out).
    pub fn of(x: &[f64]) -> Summary {
        let mut v: Vec<f64> = x.iter().copied().filter(|v| v.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        Summary {
            n: v.len(),
            mean: mean(&v).unwrap_or(f64::NAN),
            variance: variance(&v).unwrap_or(f64::NAN),
            p50: quantile_sorted(&v, 0.5),
            p95: quantile_sorted(&v, 0.95),
            p99: quantile_sorted(&v, 0.99),
        }
    }
}

/// The decision of a two-sample comparison at a significance level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Fewer than the minimum samples on a side: no decision yet.
    InsufficientSamples,
    /// p ≥ alpha: no evidence that the means differ.
    NotSignificant,
    /// p < alpha and `b`'s mean is higher.
    BHigher,
    /// p < alpha and `b`'s mean is lower.
    BLower,
}

impl Verdict {
    /// Whether the difference is significant (either way).
    pub fn is_significant(self) -> bool {
        matches!(self, Verdict::BHigher | Verdict::BLower)
    }
}

/// Two arms side by side: their summaries, Welch's test of `b` against `a`
/// and the verdict.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Comparison {
    /// Arm a.
    pub a: Summary,
    /// Arm b.
    pub b: Summary,
    /// Welch's test (`None` below two samples on a side).
    pub welch: Option<Welch>,
    /// The significance level the verdict used.
    pub alpha: f64,
    /// Welch's p after Holm's correction over the comparisons judged with
    /// this one ([`holm_correct`]); the verdict then rests on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p_holm: Option<f64>,
    /// The decision.
    pub verdict: Verdict,
}

/// Compares arm `b` with arm `a` at significance `alpha`, deciding only
/// with at least `min_samples` (and at least two) on each side.
pub fn compare(a: &[f64], b: &[f64], alpha: f64, min_samples: usize) -> Comparison {
    let (sa, sb) = (Summary::of(a), Summary::of(b));
    let finite = |x: &[f64]| {
        x.iter()
            .copied()
            .filter(|v| v.is_finite())
            .collect::<Vec<_>>()
    };
    let welch = welch_t_test(&finite(a), &finite(b));
    let enough = sa.n >= min_samples.max(2) && sb.n >= min_samples.max(2);
    let verdict = match welch {
        Some(w) if enough && w.p < alpha => {
            // scipy's sign: t = (mean(a) - mean(b)) / se.
            if w.t < 0.0 {
                Verdict::BHigher
            } else {
                Verdict::BLower
            }
        }
        Some(_) if enough => Verdict::NotSignificant,
        _ => Verdict::InsufficientSamples,
    };
    Comparison {
        a: sa,
        b: sb,
        welch,
        alpha,
        p_holm: None,
        verdict,
    }
}

/// Holm's step-down correction over comparisons judged together (the
/// metrics of one A/B report: "did anything change?" is one question, and
/// each metric tested at alpha alone would add its own false alarms). Each
/// decided comparison gets its adjusted p and a verdict on it; those
/// without enough samples are left out of the family.
pub fn holm_correct(family: &mut [&mut Comparison]) {
    let decided: Vec<usize> = (0..family.len())
        .filter(|&i| family[i].verdict != Verdict::InsufficientSamples)
        .collect();
    let p: Vec<f64> = decided
        .iter()
        .map(|&i| family[i].welch.map_or(1.0, |w| w.p))
        .collect();
    for (&i, q) in decided.iter().zip(holm_adjust(&p)) {
        let c = &mut *family[i];
        c.p_holm = Some(q);
        c.verdict = match c.welch {
            Some(w) if q < c.alpha && w.t < 0.0 => Verdict::BHigher,
            Some(w) if q < c.alpha && w.t >= 0.0 => Verdict::BLower,
            _ => Verdict::NotSignificant,
        };
    }
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
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn holm_matches_statsmodels() {
        // multipletests([0.01, 0.04, 0.03, 0.005], method="holm")[1]
        let got = holm_adjust(&[0.01, 0.04, 0.03, 0.005]);
        let want = [0.03, 0.06, 0.06, 0.02];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?}");
        }
        assert_eq!(holm_adjust(&[0.5, 0.9]), vec![1.0, 1.0]);
        assert!(holm_adjust(&[]).is_empty());
    }

    #[test]
    fn holm_correct_decides_a_family_on_adjusted_p() {
        let a: Vec<f64> = (0..40).map(|i| 10.0 + f64::from(i % 7)).collect();
        let far: Vec<f64> = a.iter().map(|x| x + 5.0).collect();
        // The smallest shift of b that Welch's test finds alone (p < 0.05).
        let marginal = (1..300)
            .map(|i| {
                let b: Vec<f64> = a.iter().map(|x| x + f64::from(i) * 0.01).collect();
                compare(&a, &b, 0.05, 5)
            })
            .find(|c| c.welch.unwrap().p < 0.05)
            .unwrap();
        assert_eq!(marginal.verdict, Verdict::BHigher, "significant alone");
        // Two marginal metrics together: neither survives (p x 2 > alpha);
        // one without samples stays out of the family.
        let (mut m1, mut m2) = (marginal, marginal);
        let mut none = compare(&a[..3], &far[..3], 0.05, 5);
        holm_correct(&mut [&mut m1, &mut m2, &mut none]);
        assert_eq!(m1.verdict, Verdict::NotSignificant, "{m1:?}");
        assert_eq!(m2.verdict, Verdict::NotSignificant);
        assert!((m1.p_holm.unwrap() - 2.0 * marginal.welch.unwrap().p).abs() < 1e-12);
        assert_eq!(none.verdict, Verdict::InsufficientSamples);
        assert_eq!(none.p_holm, None);
        // Beside a clear difference, the marginal one is the last step of
        // Holm's procedure (p x 1) and stands.
        let (mut clear, mut m3) = (compare(&a, &far, 0.05, 5), marginal);
        holm_correct(&mut [&mut clear, &mut m3]);
        assert_eq!(clear.verdict, Verdict::BHigher);
        assert_eq!(m3.verdict, Verdict::BHigher);
    }

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
            close(quantile_in_place(&mut v, q), want, 1e-12);
            close(quantile(&v, q).unwrap(), want, 1e-12);
            v.sort_by(f64::total_cmp);
            close(quantile_sorted(&v, q), want, 1e-12);
        }
    }

    #[test]
    fn coefficient_of_variation_is_sd_over_mean() {
        // scipy.stats.variation([2, 4, 4, 4, 5, 5, 7, 9], ddof=1)
        let x = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        close(
            coefficient_of_variation(&x).unwrap(),
            0.427617987059879,
            1e-12,
        );
        assert!(coefficient_of_variation(&[1.0]).is_none());
        assert!(coefficient_of_variation(&[-1.0, 1.0]).is_none());
        assert_eq!(coefficient_of_variation(&[3.0, 3.0]), Some(0.0));
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
