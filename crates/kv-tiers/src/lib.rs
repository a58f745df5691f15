//! KV cache pages below the device pool (docs/kv-cache.md, "Tiers").
//!
//! When the pool evicts a named page (a full block of some prefix), the
//! engine copies it here instead of dropping it; when a later prompt
//! starts with that prefix, the pool takes the page back into a fresh
//! device page before the step runs, so its prefill is skipped.
//!
//! - [`HostTier`]: host memory, least recently used out first; what it
//!   pushes out goes to the disk tier when there is one.
//! - [`DiskTier`]: one checked file per page under a directory named by
//!   the [`Namespace`], so a restart of the same model and settings finds
//!   its pages again.
//! - [`SharedKv`]: a store several instances reach (Redis through
//!   `ingot-fleet`; any [`SharedKvStore`]): pages are published as they
//!   are computed, and a request whose prefix another instance computed
//!   fetches them before it is scheduled, when that is cheaper than
//!   recomputing them.
//!
//! Every stored page carries its namespace, name and a BLAKE3 checksum
//! ([`entry`]): a page of another model, dtype, layout or tokenizer is
//! never used, and a corrupt one is dropped and recomputed.

mod disk;
pub mod entry;
mod host;
mod shared;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use ingot_kv_cache::{LowerTiers, PageData, PageKey};

pub use disk::{file_bytes, DiskRead, DiskTier};
pub use host::HostTier;
pub use shared::{BoxFuture, Prefetched, SharedKv, SharedKvStore, StoreError};

/// `ingot_kv_tier_hits_total{model,tier}`: pages restored from a tier.
pub const HITS: &str = "ingot_kv_tier_hits_total";
/// `ingot_kv_tier_hit_bytes_total{model,tier}`: their bytes.
pub const HIT_BYTES: &str = "ingot_kv_tier_hit_bytes_total";
/// `ingot_kv_tier_stored_bytes{model,tier}`: bytes held now.
pub const STORED_BYTES: &str = "ingot_kv_tier_stored_bytes";
/// `ingot_kv_tier_copy_seconds{model,direction}` (histogram, per step):
/// time copying pages between the device pool and host memory (`out`:
/// device to host, `in`: back).
pub const COPY_SECONDS: &str = "ingot_kv_tier_copy_seconds";
/// `ingot_kv_tier_copy_bytes_total{model,direction}`: bytes copied.
pub const COPY_BYTES: &str = "ingot_kv_tier_copy_bytes_total";
/// `ingot_kv_tier_errors_total{model,tier}`: failed writes, refused
/// (corrupt, truncated) pages, failed or timed-out store commands.
pub const ERRORS: &str = "ingot_kv_tier_errors_total";

/// What a stored page belongs to: a hash of everything that decides a
/// page's bytes (the model's weights and config, the tokenizer, the
/// backend's page format, block size and layer layout, the tensor-parallel
/// split). Pages are only ever used under the namespace they were stored
/// with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Namespace([u8; 32]);

impl Namespace {
    /// BLAKE3 over labelled parts (each label and value length-prefixed,
    /// so no two lists hash alike by shifting bytes between parts).
    pub fn of(parts: &[(&str, &[u8])]) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"ingot-kv-namespace-1");
        for (label, value) in parts {
            h.update(&(label.len() as u64).to_le_bytes());
            h.update(label.as_bytes());
            h.update(&(value.len() as u64).to_le_bytes());
            h.update(value);
        }
        Self(*h.finalize().as_bytes())
    }

    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// 64 hex digits (directory and key names).
    pub fn hex(&self) -> String {
        disk::hex(&self.0)
    }
}

/// Sizes and places of the tiers (`[kv_tiers]`).
#[derive(Debug, Clone, Default)]
pub struct TierSettings {
    /// Host-memory tier bytes (0: none).
    pub host_bytes: u64,
    /// Disk tier directory (the namespace's pages go in a subdirectory).
    pub disk_path: Option<PathBuf>,
    /// Disk tier bytes.
    pub disk_bytes: u64,
}

impl TierSettings {
    /// Whether any tier is configured.
    pub fn enabled(&self) -> bool {
        self.host_bytes > 0 || (self.disk_path.is_some() && self.disk_bytes > 0)
    }
}

/// The tiers of one model.
pub struct KvTiers {
    namespace: Namespace,
    model: String,
    host: Mutex<HostTier>,
    disk: Option<DiskTier>,
    /// Write-through copies for the shared store, when there is one.
    publisher: OnceLock<tokio::sync::mpsc::Sender<(PageKey, PageData)>>,
    counters: Counters,
    /// Measured prefill cost, seconds per token (f64 bits; 0: unknown).
    prefill_per_token: AtomicU64,
}

#[derive(Default)]
struct Counters {
    host_hits: AtomicU64,
    disk_hits: AtomicU64,
    shared_hits: AtomicU64,
    errors: AtomicU64,
}

/// Which tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Host memory.
    Host,
    /// Local disk.
    Disk,
    /// The store shared by instances.
    Shared,
}

impl Tier {
    /// The `tier` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Host => "host",
            Tier::Disk => "disk",
            Tier::Shared => "shared",
        }
    }
}

/// Tier use now, for `/admin` and the dashboard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierUse {
    /// Host tier: bytes held, capacity, pages.
    pub host_bytes: u64,
    /// Host tier capacity.
    pub host_capacity: u64,
    /// Pages in host memory.
    pub host_pages: usize,
    /// Disk tier bytes (files), `None` without a disk tier.
    pub disk_bytes: Option<u64>,
    /// Pages on disk.
    pub disk_pages: usize,
    /// Pages restored from host memory, disk, the shared store.
    pub hits: [u64; 3],
    /// Refused pages and failed writes or commands.
    pub errors: u64,
}

impl std::fmt::Debug for KvTiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvTiers")
            .field("namespace", &self.namespace.hex())
            .field("usage", &self.usage())
            .finish_non_exhaustive()
    }
}

/// HELP text of the tier series (Prometheus' lint wants it on every one).
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(HITS, "KV pages restored into the pool from a tier (host, disk) or fetched from the shared store.");
    describe_counter!(
        HIT_BYTES,
        Unit::Bytes,
        "Bytes of the KV pages counted in ingot_kv_tier_hits_total."
    );
    describe_gauge!(
        STORED_BYTES,
        Unit::Bytes,
        "Bytes of KV pages a tier holds now."
    );
    describe_histogram!(
        COPY_SECONDS,
        Unit::Seconds,
        "Time per engine step copying KV pages between the pool and host memory."
    );
    describe_counter!(
        COPY_BYTES,
        Unit::Bytes,
        "Bytes of KV pages copied between the pool and host memory."
    );
    describe_counter!(ERRORS, "KV tier failures: refused (corrupt, truncated) pages, failed writes, failed or timed-out store commands, dropped publications.");
}

impl KvTiers {
    /// The tiers of `settings` for pages of `namespace`; `model` labels
    /// the metrics.
    pub fn open(
        settings: &TierSettings,
        namespace: Namespace,
        model: &str,
    ) -> std::io::Result<Self> {
        describe();
        let disk = match &settings.disk_path {
            Some(path) if settings.disk_bytes > 0 => {
                Some(DiskTier::open(path, namespace, settings.disk_bytes)?)
            }
            _ => None,
        };
        Ok(Self {
            namespace,
            model: model.to_string(),
            host: Mutex::new(HostTier::new(settings.host_bytes)),
            disk,
            publisher: OnceLock::new(),
            counters: Counters::default(),
            prefill_per_token: AtomicU64::new(0),
        })
    }

    /// The namespace of the pages.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// The disk tier, when configured.
    pub fn disk(&self) -> Option<&DiskTier> {
        self.disk.as_ref()
    }

    /// Waits until the pages queued for disk are written (an engine that
    /// stops, so the next start finds them).
    pub fn flush(&self) {
        if let Some(disk) = &self.disk {
            disk.flush();
        }
    }

    fn host(&self) -> MutexGuard<'_, HostTier> {
        self.host.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps a page that left the device pool: host memory, and what that
    /// pushes out goes to disk. (The stored-bytes gauges follow once per
    /// batch: [`KvTiers::record_copy`].)
    pub fn keep(&self, key: PageKey, data: PageData) {
        let pushed = self.host().put(key, data);
        if let Some(disk) = &self.disk {
            for (k, d) in pushed {
                disk.put(k, d);
            }
        }
    }

    /// Keeps a page as it is computed (write-through): on disk at once, so
    /// a restart (or a crash) finds it, and queued for the shared store.
    pub fn publish(&self, key: PageKey, data: PageData) {
        if let Some(tx) = self.publisher.get() {
            // A full queue (the store is slower than the engine) drops the
            // copy: the page stays local, other instances recompute it.
            if tx.try_send((key, data.clone())).is_err() {
                self.error(Tier::Shared);
            }
        }
        if let Some(disk) = &self.disk {
            disk.put(key, data.clone());
        }
        self.keep(key, data);
    }

    pub(crate) fn set_publisher(&self, tx: tokio::sync::mpsc::Sender<(PageKey, PageData)>) {
        let _ = self.publisher.set(tx);
    }

    /// Whether pages are copied out as they are computed (not only when
    /// evicted): with a disk tier (pages outlive the process) or a shared
    /// store (other instances want them while they are hot).
    pub fn writes_through(&self) -> bool {
        self.disk.is_some() || self.publisher.get().is_some()
    }

    /// Bytes the host tier can take without pushing a page out.
    pub fn host_room(&self) -> u64 {
        let h = self.host();
        h.capacity().saturating_sub(h.bytes())
    }

    /// Whether pages are published to a shared store.
    pub fn shares(&self) -> bool {
        self.publisher.get().is_some()
    }

    /// Counts a restored page of `tier`.
    pub(crate) fn hit(&self, tier: Tier, bytes: usize) {
        let c = match tier {
            Tier::Host => &self.counters.host_hits,
            Tier::Disk => &self.counters.disk_hits,
            Tier::Shared => &self.counters.shared_hits,
        };
        c.fetch_add(1, Ordering::Relaxed);
        let (m, t) = (self.model.clone(), tier.as_str());
        metrics::counter!(HITS, "model" => m.clone(), "tier" => t).increment(1);
        metrics::counter!(HIT_BYTES, "model" => m, "tier" => t).increment(bytes as u64);
    }

    /// Counts a failure of `tier`.
    pub(crate) fn error(&self, tier: Tier) {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(ERRORS, "model" => self.model.clone(), "tier" => tier.as_str())
            .increment(1);
    }

    /// Records one step's copies between the device pool and host memory
    /// (and, after copies out, what the tiers now hold).
    pub fn record_copy(&self, out: bool, bytes: usize, took: Duration) {
        if out {
            self.publish_use();
        }
        let direction = if out { "out" } else { "in" };
        let m = self.model.clone();
        metrics::histogram!(COPY_SECONDS, "model" => m.clone(), "direction" => direction)
            .record(took.as_secs_f64());
        metrics::counter!(COPY_BYTES, "model" => m, "direction" => direction)
            .increment(bytes as u64);
    }

    /// The engine's measured prefill cost per token, for deciding whether
    /// a shared prefix is worth fetching.
    pub fn note_prefill(&self, tokens: usize, took: Duration) {
        if tokens < 16 {
            return;
        }
        let now = took.as_secs_f64() / tokens as f64;
        let old = f64::from_bits(self.prefill_per_token.load(Ordering::Relaxed));
        let next = if old == 0.0 {
            now
        } else {
            0.8 * old + 0.2 * now
        };
        self.prefill_per_token
            .store(next.to_bits(), Ordering::Relaxed);
    }

    /// Seconds per prompt token (0: not measured yet).
    pub fn prefill_per_token(&self) -> f64 {
        f64::from_bits(self.prefill_per_token.load(Ordering::Relaxed))
    }

    /// Sets the stored-bytes gauges.
    pub(crate) fn publish_use(&self) {
        let u = self.usage();
        let m = self.model.clone();
        metrics::gauge!(STORED_BYTES, "model" => m.clone(), "tier" => "host")
            .set(u.host_bytes as f64);
        if let Some(d) = u.disk_bytes {
            metrics::gauge!(STORED_BYTES, "model" => m, "tier" => "disk").set(d as f64);
        }
    }

    /// What the tiers hold and did.
    pub fn usage(&self) -> TierUse {
        let (host_bytes, host_capacity, host_pages) = {
            let h = self.host();
            (h.bytes(), h.capacity(), h.len())
        };
        let c = &self.counters;
        TierUse {
            host_bytes,
            host_capacity,
            host_pages,
            disk_bytes: self.disk.as_ref().map(DiskTier::bytes),
            disk_pages: self.disk.as_ref().map_or(0, DiskTier::len),
            hits: [
                c.host_hits.load(Ordering::Relaxed),
                c.disk_hits.load(Ordering::Relaxed),
                c.shared_hits.load(Ordering::Relaxed),
            ],
            errors: c.errors.load(Ordering::Relaxed)
                + self.disk.as_ref().map_or(0, DiskTier::errors),
        }
    }
}

impl LowerTiers for KvTiers {
    fn contains(&self, key: &PageKey) -> bool {
        self.host().contains(key) || self.disk.as_ref().is_some_and(|d| d.contains(key))
    }

    fn fetch(&self, key: &PageKey) -> Option<PageData> {
        if let Some(data) = self.host().get(key) {
            self.hit(Tier::Host, data.len());
            return Some(data);
        }
        match self.disk.as_ref()?.read(key) {
            DiskRead::Found(data) => {
                self.hit(Tier::Disk, data.len());
                Some(data)
            }
            DiskRead::Missing => None,
            DiskRead::Refused => {
                self.error(Tier::Disk);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests;
