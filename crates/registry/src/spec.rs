//! What the registry is configured with.

use std::time::Duration;

/// One configured model, as the registry sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// The id clients name.
    pub id: String,
    /// Other names for it.
    pub aliases: Vec<String>,
    /// Never evicted or unloaded for idleness (an admin unload still works).
    pub pinned: bool,
    /// Loaded at start.
    pub preload: bool,
    /// Unloaded after this long without a request (`None`: never).
    pub idle_timeout: Option<Duration>,
}

impl ModelSpec {
    /// A spec with no aliases, not pinned, not preloaded, never idle.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            aliases: Vec::new(),
            pinned: false,
            preload: false,
            idle_timeout: None,
        }
    }

    /// Whether `name` names this model.
    pub fn answers_to(&self, name: &str) -> bool {
        self.id == name || self.aliases.iter().any(|a| a == name)
    }
}

/// Memory the registry may fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Bytes of loaded models (weights + KV + workspace) on the device.
    pub device_bytes: u64,
    /// Bytes of warm host copies of evicted models (0: none kept).
    pub host_bytes: u64,
    /// Longest a request waits for its model to load.
    pub load_wait: Duration,
}

/// Bringing back into host memory, ahead of their next request, models
/// asked for often lately that hold no warm copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefetch {
    /// How far back demand is counted.
    pub window: Duration,
    /// Requests within the window that make a model worth prefetching.
    pub min_requests: usize,
    /// Models prefetched per window at most (0: never).
    pub max_per_window: usize,
}

impl Default for Prefetch {
    /// Off.
    fn default() -> Self {
        Self {
            window: Duration::from_secs(300),
            min_requests: 2,
            max_per_window: 0,
        }
    }
}
