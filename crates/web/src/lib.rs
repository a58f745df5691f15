//! The web page of `ingot serve` and `ingot route`: a playground (chat
//! with any served model) and a live dashboard, one page embedded in the
//! binary and served at `/`. The page's data comes from the API it sits
//! beside (`/v1/*` for the chat, `/ui/live` for the dashboard), under the
//! same API keys; the page itself is code and is served without a key.
//!
//! Also here: [`Tally`], the live values of the process's counters and
//! gauges, which `/ui/live` reads instead of parsing `/metrics` text.

mod assets;
mod tally;

pub use assets::{page_routes, ASSETS};
pub use tally::{install_metrics, tally, InstallError, Tally};

/// Quantiles `qs` (each in [0, 1]) of `samples`, nearest-rank on the
/// sorted samples; `None` for none.
pub fn quantiles(mut samples: Vec<f64>, qs: &[f64]) -> Option<Vec<f64>> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_by(f64::total_cmp);
    let last = samples.len() - 1;
    Some(
        qs.iter()
            .map(|q| samples[((q.clamp(0.0, 1.0) * last as f64).round()) as usize])
            .collect(),
    )
}

/// Unix milliseconds now (the page plots against the server's clock).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_samples() {
        let v: Vec<f64> = (1..=101).map(f64::from).rev().collect();
        assert_eq!(
            quantiles(v, &[0.0, 0.5, 0.99, 1.0]),
            Some(vec![1.0, 51.0, 100.0, 101.0])
        );
        assert_eq!(quantiles(Vec::new(), &[0.5]), None);
    }
}
