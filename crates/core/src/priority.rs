//! Request priority tiers.

use std::str::FromStr;

/// Five scheduling tiers, most urgent first. The order of the variants is
/// the scheduling order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Interactive traffic that must not wait.
    Critical,
    /// Above normal.
    High,
    /// The default.
    #[default]
    Normal,
    /// Below normal; shed before normal traffic.
    Low,
    /// Batch work; shed first, but never starved.
    Background,
}

impl Priority {
    /// All tiers, most urgent first.
    pub const ALL: [Priority; 5] = [
        Priority::Critical,
        Priority::High,
        Priority::Normal,
        Priority::Low,
        Priority::Background,
    ];

    /// 0 for critical … 4 for background.
    pub fn rank(self) -> usize {
        self as usize
    }

    /// The tier with the given rank (clamped to background).
    pub fn from_rank(rank: usize) -> Priority {
        Priority::ALL[rank.min(4)]
    }

    /// The lowercase name used in the API and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
            Priority::Background => "background",
        }
    }
}

impl FromStr for Priority {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown priority '{s}' (expected critical, high, normal, low or background)"
                )
            })
    }
}
