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

/// Unix milliseconds now: the page plots against the server's clock, and
/// the SLO reports and canaries stamp their events with it.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
