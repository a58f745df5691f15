//! Pages shared by several instances through a store they all reach.
//!
//! Publishing: with a shared store the pool lists pages as they are named
//! (write-through); the engine copies them out after the step that
//! computed them, and a background task writes them to the store in
//! batches. A full queue or a failing store drops copies (counted): the
//! page stays local and other instances recompute it.
//!
//! Fetching: before a request is scheduled, [`SharedKv::prefetch`] looks
//! for the blocks of its prompt that no local tier holds, asks the store
//! which of them it has (one round trip), and fetches the leading run of
//! them into the host tier when the measured transfer time is below the
//! measured time to prefill those tokens. Everything it does is bounded by
//! that estimate: a slow or dead store costs at most what recomputing
//! would have, and nothing fails.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ingot_kv_cache::{BlockHash, LowerTiers, PageData, PageKey};

use crate::{entry, KvTiers, Tier};

/// A boxed, sendable future (the store's methods are called through `dyn`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A failed store command.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(pub String);

/// A key-value store several instances reach (Redis; an object store or a
/// dedicated KV server could implement it too). Values are [`entry`]
/// bytes; keys are opaque strings.
pub trait SharedKvStore: Send + Sync + 'static {
    /// Whether each key is stored.
    fn present(&self, keys: Vec<String>) -> BoxFuture<'_, Result<Vec<bool>, StoreError>>;
    /// Each key's value, `None` where missing.
    fn get(&self, keys: Vec<String>) -> BoxFuture<'_, Result<Vec<Option<Vec<u8>>>, StoreError>>;
    /// Stores the values (the store bounds its size and expires old ones).
    fn put(&self, entries: Vec<(String, Vec<u8>)>) -> BoxFuture<'_, Result<(), StoreError>>;
}

/// Pages queued for publishing before copies are dropped.
const QUEUE: usize = 4096;
/// Bytes per store command (one command stays well inside its timeout).
const BATCH_BYTES: usize = 4 << 20;
/// Assumed until measured: a store on the local network.
const INITIAL_BANDWIDTH: f64 = 200e6;
const INITIAL_ROUND_TRIP: f64 = 1e-3;
/// The longest a prefetch waits when the prefill cost is not measured yet.
const UNMEASURED_BUDGET: Duration = Duration::from_secs(2);

/// The shared tier of one model.
pub struct SharedKv {
    store: Arc<dyn SharedKvStore>,
    tiers: Arc<KvTiers>,
    block_size: usize,
    /// Pages per logical block of each layer group.
    pages_per_block: Vec<u32>,
    /// `kv:<namespace hex>:`, the start of every key.
    key_prefix: String,
    page_bytes: usize,
    /// Measured read bandwidth (bytes/s) and round trip (s).
    rates: Mutex<(f64, f64)>,
}

/// What one prefetch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Prefetched {
    /// Leading prompt blocks held locally already.
    pub local_blocks: usize,
    /// Blocks after them the store holds.
    pub offered_blocks: usize,
    /// Blocks fetched into the host tier.
    pub fetched_blocks: usize,
}

impl std::fmt::Debug for SharedKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedKv")
            .field("block_size", &self.block_size)
            .field("page_bytes", &self.page_bytes)
            .finish_non_exhaustive()
    }
}

impl SharedKv {
    /// Shares `tiers`' pages through `store`: a task (on the current Tokio
    /// runtime) publishes what the engine copies out. Pages are
    /// `page_bytes` long, `pages_per_block[g]` per block of group `g`.
    pub fn start(
        store: Arc<dyn SharedKvStore>,
        tiers: Arc<KvTiers>,
        block_size: usize,
        pages_per_block: Vec<u32>,
        page_bytes: usize,
    ) -> Arc<Self> {
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
        tiers.set_publisher(tx);
        let shared = Arc::new(Self {
            store,
            key_prefix: format!("kv:{}:", tiers.namespace().hex()),
            tiers,
            block_size: block_size.max(1),
            pages_per_block,
            page_bytes,
            rates: Mutex::new((INITIAL_BANDWIDTH, INITIAL_ROUND_TRIP)),
        });
        tokio::spawn(publish(Arc::downgrade(&shared), rx));
        shared
    }

    /// `kv:<namespace>:<page stem>`.
    fn key(&self, k: &PageKey) -> String {
        format!("{}{}", self.key_prefix, crate::disk::page_stem(k))
    }

    fn pages_of(&self, name: BlockHash) -> impl Iterator<Item = PageKey> + '_ {
        self.pages_per_block
            .iter()
            .enumerate()
            .flat_map(move |(g, &n)| {
                (0..n).map(move |part| PageKey {
                    prefix: name,
                    group: g as u32,
                    part,
                })
            })
    }

    /// Brings the blocks of `prompt` that another instance published into
    /// the host tier, when fetching them beats recomputing them.
    pub async fn prefetch(&self, prompt: &[u32]) -> Prefetched {
        let bs = self.block_size;
        let usable = prompt.len().saturating_sub(1) / bs;
        let names = BlockHash::chain_all(&prompt[..usable * bs], bs);
        let local = names
            .iter()
            .take_while(|&&n| self.pages_of(n).all(|k| self.tiers.contains(&k)))
            .count();
        let mut done = Prefetched {
            local_blocks: local,
            ..Prefetched::default()
        };
        let missing = &names[local..];
        if missing.is_empty() {
            return done;
        }
        let firsts = missing
            .iter()
            .filter_map(|&n| self.pages_of(n).next())
            .map(|k| self.key(&k))
            .collect();
        let present = match self.store.present(firsts).await {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "shared KV store unavailable");
                self.tiers.error(Tier::Shared);
                return done;
            }
        };
        let offered = present.iter().take_while(|&&p| p).count();
        done.offered_blocks = offered;
        if offered == 0 {
            return done;
        }
        let pages: Vec<PageKey> = missing[..offered]
            .iter()
            .flat_map(|&n| self.pages_of(n))
            .collect();
        let recompute = self.tiers.prefill_per_token() * (offered * bs) as f64;
        let (bandwidth, round_trip) = *self.rates.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = pages.len() * self.entry_bytes();
        let commands = pages.len().div_ceil(self.per_batch());
        let fetch = round_trip * commands as f64 + bytes as f64 / bandwidth;
        if recompute > 0.0 && fetch >= recompute {
            tracing::debug!(
                blocks = offered,
                fetch,
                recompute,
                "recomputing: cheaper than fetching"
            );
            return done;
        }
        let budget = if recompute > 0.0 {
            Duration::from_secs_f64(recompute)
        } else {
            UNMEASURED_BUDGET
        };
        let started = Instant::now();
        let mut got_pages = 0;
        let _ = tokio::time::timeout(budget, self.fetch_pages(&pages, &mut got_pages)).await;
        let per_block = self.pages_per_block.iter().sum::<u32>().max(1) as usize;
        done.fetched_blocks = got_pages / per_block;
        if got_pages > 0 {
            self.tiers.publish_use();
            let commands = got_pages.div_ceil(self.per_batch());
            self.measured(got_pages * self.entry_bytes(), started.elapsed(), commands);
        }
        done
    }

    /// Fetches `pages` in order into the host tier, stopping at the first
    /// one missing or refused (the hit ends there anyway).
    async fn fetch_pages(&self, pages: &[PageKey], got: &mut usize) {
        for batch in pages.chunks(self.per_batch()) {
            let keys = batch.iter().map(|k| self.key(k)).collect();
            let values = match self.store.get(keys).await {
                Ok(v) => v,
                Err(e) => {
                    tracing::debug!(error = %e, "shared KV fetch failed");
                    self.tiers.error(Tier::Shared);
                    return;
                }
            };
            for (key, value) in batch.iter().zip(values) {
                let Some(bytes) = value else {
                    return;
                };
                match entry::decode(self.tiers.namespace(), key, &bytes) {
                    Ok(data) => {
                        self.tiers.hit(Tier::Shared, data.len());
                        self.tiers.keep(*key, data);
                        *got += 1;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "shared KV page refused; recomputing it");
                        self.tiers.error(Tier::Shared);
                        return;
                    }
                }
            }
        }
    }

    fn entry_bytes(&self) -> usize {
        self.page_bytes + entry::HEADER
    }

    /// Pages per store command.
    fn per_batch(&self) -> usize {
        (BATCH_BYTES / self.entry_bytes()).max(1)
    }

    fn measured(&self, bytes: usize, took: Duration, commands: usize) {
        let secs = took.as_secs_f64().max(1e-6);
        let mut r = self.rates.lock().unwrap_or_else(|p| p.into_inner());
        let bandwidth = bytes as f64 / secs;
        r.0 = 0.7 * r.0 + 0.3 * bandwidth;
        r.1 = 0.7 * r.1 + 0.3 * (secs / commands as f64).min(r.1 * 4.0);
    }
}

/// Writes queued pages to the store in batches until the tiers are gone.
async fn publish(
    shared: std::sync::Weak<SharedKv>,
    mut rx: tokio::sync::mpsc::Receiver<(PageKey, PageData)>,
) {
    while let Some(first) = rx.recv().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut batch = vec![first];
        let mut bytes = batch[0].1.len();
        while bytes < BATCH_BYTES {
            match rx.try_recv() {
                Ok(p) => {
                    bytes += p.1.len();
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let ns = *shared.tiers.namespace();
        let entries = batch
            .iter()
            .map(|(k, d)| (shared.key(k), entry::encode(&ns, k, d)))
            .collect();
        if let Err(e) = shared.store.put(entries).await {
            tracing::debug!(error = %e, "shared KV publish failed");
            shared.tiers.error(Tier::Shared);
        }
    }
}
