//! Prefix-cache-aware: send a request to the worker that most likely still
//! holds its prompt prefix in its KV cache, unless that would unbalance load.
//!
//! Design choice: SMG's approach (an approximate index over request *text*
//! per worker, fed only by the router's own decisions, with a load-imbalance
//! threshold falling back to least-load) rather than llm-d's index of the
//! engines' KV block hashes fed by their events. Text needs no tokenizer in
//! the router, no event stream from the workers and no hash function shared
//! with the engine, so it works with any worker and costs nothing on them;
//! its error (a worker evicted a prefix the router still attributes to it)
//! only costs a cache miss. Instead of a character radix tree the index keys
//! chained hashes of fixed-size text chunks (blake3 of parent hash + chunk):
//! a lookup walks the chain and stops at the first unknown chunk, which is
//! the same longest-prefix match at chunk granularity with flat, bounded
//! memory (oldest entries are evicted past `capacity`).
//!
//! With `[redis]` (`share_prefix_index`), the proxy also looks the chunks
//! up in the fleet's shared index and records its choices there
//! (`RequestInfo::holders`): a chunk counts as held by a worker when this
//! router or any other sent it there, so routers agree on where a prefix
//! lives. Without Redis (or while it is down) the local index alone
//! decides, as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{LeastOutstandingPolicy, Policy, RequestInfo};
use crate::worker::{Worker, WorkerId};

/// Characters per chunk: shorter matches are not worth routing for.
const CHUNK_CHARS: usize = 64;
/// Entries kept (chunk hash, worker) before the oldest are evicted.
const CAPACITY: usize = 200_000;
/// Matching chunks must be at least this fraction of the request's chunks.
const MIN_MATCH: f64 = 0.5;
/// The cache-holding worker is skipped when its queue depth (in flight from
/// this router plus other routers' scraped requests) exceeds the least
/// loaded one's by this much.
const MAX_IMBALANCE: f64 = 4.0;

/// Longest cached prefix, balanced against load.
#[derive(Debug, Default)]
pub struct PrefixCachePolicy {
    index: Mutex<Index>,
}

/// (chain hash, worker) → last use, and the entry count per worker.
#[derive(Debug, Default)]
struct Index {
    entries: HashMap<([u8; 16], WorkerId), u64>,
    per_worker: HashMap<WorkerId, usize>,
    tick: u64,
}

impl Index {
    fn touch(&mut self, key: ([u8; 16], WorkerId)) {
        self.tick += 1;
        if self.entries.insert(key, self.tick).is_none() {
            *self.per_worker.entry(key.1).or_default() += 1;
        }
        if self.entries.len() > CAPACITY {
            // Drop the oldest tenth in one sweep (rare: amortised O(1)).
            let mut ticks: Vec<u64> = self.entries.values().copied().collect();
            let cut = CAPACITY / 10;
            ticks.select_nth_unstable(cut);
            let limit = ticks[cut];
            let per_worker = &mut self.per_worker;
            self.entries.retain(|(_, w), t| {
                let keep = *t > limit;
                if !keep {
                    per_worker
                        .entry(*w)
                        .and_modify(|n| *n = n.saturating_sub(1));
                }
                keep
            });
        }
    }

    /// Entries attributed to `worker`: how much of the text seen it caches.
    fn size(&self, worker: WorkerId) -> usize {
        self.per_worker.get(&worker).copied().unwrap_or(0)
    }
}

/// The chained hashes of `text`'s full chunks.
pub fn chunk_hashes(text: &str) -> Vec<[u8; 16]> {
    let chars: Vec<char> = text.chars().collect();
    let mut parent = [0u8; 16];
    let mut out = Vec::with_capacity(chars.len() / CHUNK_CHARS);
    for chunk in chars.chunks_exact(CHUNK_CHARS) {
        let mut h = blake3::Hasher::new();
        h.update(&parent);
        h.update(chunk.iter().collect::<String>().as_bytes());
        let mut next = [0u8; 16];
        next.copy_from_slice(&h.finalize().as_bytes()[..16]);
        out.push(next);
        parent = next;
    }
    out
}

impl Policy for PrefixCachePolicy {
    fn select(&self, request: &RequestInfo, workers: &[Arc<Worker>]) -> Option<WorkerId> {
        let chunks = chunk_hashes(&request.text);
        if chunks.is_empty() {
            return LeastOutstandingPolicy.select(request, workers);
        }
        let min_load = workers
            .iter()
            .map(|w| w.queue_depth())
            .min_by(f64::total_cmp)?;
        let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        // No usable match: the least loaded, and among those the one caching
        // the least, so new prefixes spread over the workers' caches.
        let fallback = workers
            .iter()
            .min_by(|a, b| {
                a.queue_depth()
                    .total_cmp(&b.queue_depth())
                    .then(index.size(a.id).cmp(&index.size(b.id)))
            })
            .map(|w| w.id)?;
        let best = workers
            .iter()
            .filter(|w| w.queue_depth() <= min_load + MAX_IMBALANCE)
            .map(|w| {
                // Only read (allocated) when the shared index answered.
                let url = if request.holders.is_empty() {
                    String::new()
                } else {
                    w.url()
                };
                let matched = chunks
                    .iter()
                    .enumerate()
                    .take_while(|(i, c)| {
                        index.entries.contains_key(&(**c, w.id))
                            || request.holders.get(*i).is_some_and(|h| h.contains(&url))
                    })
                    .count();
                // Longest match; ties: the less loaded, then the lower id.
                (
                    matched,
                    std::cmp::Reverse(w.outstanding()),
                    std::cmp::Reverse(w.id),
                )
            })
            .max();
        let chosen = match best {
            Some((matched, _, std::cmp::Reverse(id)))
                if matched as f64 >= MIN_MATCH * chunks.len() as f64 =>
            {
                id
            }
            _ => fallback,
        };
        for c in chunks {
            index.touch((c, chosen));
        }
        Some(chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_workers::{scraped, with_load};

    fn req(text: &str) -> RequestInfo {
        RequestInfo {
            text: text.to_string(),
            ..RequestInfo::default()
        }
    }

    #[test]
    fn chunks_chain_so_equal_chunks_after_different_prefixes_differ() {
        let a = chunk_hashes(&("x".repeat(64) + &"y".repeat(64)));
        let b = chunk_hashes(&("z".repeat(64) + &"y".repeat(64)));
        assert_eq!(a.len(), 2);
        assert_ne!(a[1], b[1]);
        assert!(chunk_hashes("short").is_empty());
    }

    #[test]
    fn a_shared_prefix_goes_back_to_the_same_worker() {
        let (w, _g) = with_load(&[0, 0, 0]);
        let p = PrefixCachePolicy::default();
        let system = "You are a helpful assistant for tenant A. ".repeat(10);
        let first = p
            .select(&req(&format!("{system} question one")), &w)
            .unwrap();
        // Load elsewhere is equal, so least-load alone would pick worker 0.
        let _busy = w[0].begin();
        for q in ["two", "three", "four"] {
            let pick = p
                .select(&req(&format!("{system} question {q}")), &w)
                .unwrap();
            assert_eq!(pick, first, "same system prompt, same worker");
        }
    }

    #[test]
    fn imbalance_beyond_the_threshold_falls_back_to_least_load() {
        let (w, _g) = with_load(&[0, 0]);
        let p = PrefixCachePolicy::default();
        let text = "shared prefix ".repeat(20);
        assert_eq!(p.select(&req(&text), &w), Some(0));
        let _busy: Vec<_> = (0..=MAX_IMBALANCE as usize).map(|_| w[0].begin()).collect();
        assert_eq!(p.select(&req(&text), &w), Some(1));
    }

    #[test]
    fn another_routers_load_on_the_cache_holder_counts_in_the_balance() {
        let (w, _g) = with_load(&[0, 0]);
        let p = PrefixCachePolicy::default();
        let text = "shared prefix ".repeat(20);
        assert_eq!(p.select(&req(&text), &w), Some(0));
        w[0].set_load(scraped(MAX_IMBALANCE + 1.0), true);
        assert_eq!(p.select(&req(&text), &w), Some(1));
        w[0].set_load(scraped(MAX_IMBALANCE), true);
        assert_eq!(p.select(&req(&text), &w), Some(0), "within the threshold");
    }

    #[test]
    fn another_routers_choice_from_the_shared_index_is_followed() {
        let cfg = crate::config::BreakerConfig {
            failure_threshold: 1,
            cooldown: std::time::Duration::from_secs(1),
        };
        let w: Vec<Arc<Worker>> = (0..2)
            .map(|i| {
                let url = format!("http://10.0.0.{i}:8000");
                Arc::new(Worker::new(i, url.clone(), url, false, cfg))
            })
            .collect();
        let p = PrefixCachePolicy::default();
        let text = "a prefix another router placed ".repeat(10);
        let chunks = chunk_hashes(&text);
        // This router has never seen it; the fleet says worker 1 holds it.
        let mut request = req(&text);
        request.holders = vec![vec![w[1].url()]; chunks.len()];
        assert_eq!(p.select(&request, &w), Some(1));
        // Without the shared index the fallback (least loaded, lowest id) wins.
        let q = PrefixCachePolicy::default();
        assert_eq!(q.select(&req(&text), &w), Some(0));
    }

    #[test]
    fn new_prefixes_spread_over_idle_workers() {
        let (w, _g) = with_load(&[0, 0]);
        let p = PrefixCachePolicy::default();
        let a = p.select(&req(&"tenant A ".repeat(20)), &w);
        let b = p.select(&req(&"tenant B ".repeat(20)), &w);
        assert_ne!(a, b);
        assert_eq!(p.select(&req(&"tenant A ".repeat(20)), &w), a);
    }
}
