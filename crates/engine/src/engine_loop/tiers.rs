//! Copies between the runner's KV pool and the tiers below it
//! (`crates/kv-tiers`): pages the pool evicted go down, pages of a prefix
//! hit held below come back, both before the step's forward pass reads or
//! overwrites them; with a shared store, pages are copied out as they are
//! computed, after the pass that wrote them.

use std::sync::Arc;
use std::time::Instant;

use ingot_kv_cache::{BlockId, LowerTiers, PageData, PageKey, PageTransfer};
use ingot_runner::RunnerError;
use ingot_scheduler::ScheduledChunk;

use super::EngineLoop;

/// Bytes an idle engine copies down between two looks at its commands.
const COLD_BATCH_BYTES: usize = 64 << 20;

impl EngineLoop {
    /// Makes the pool's pending copies, in its order (a page may leave and
    /// be refilled in one step). A page that cannot be restored fails the
    /// step: its sequences would read garbage.
    pub(super) fn move_pages(&mut self, chunks: &[ScheduledChunk]) -> bool {
        let transfers = self.scheduler.take_transfers();
        let mut rest = transfers.as_slice();
        while let Some(first) = rest.first() {
            let out = matches!(first, PageTransfer::Out { .. });
            let run = rest
                .iter()
                .take_while(|t| matches!(t, PageTransfer::Out { .. }) == out)
                .count();
            let (now, later) = rest.split_at(run);
            rest = later;
            if out {
                let pages = now.iter().filter_map(|t| match t {
                    PageTransfer::Out { page, key } => Some((*page, *key)),
                    PageTransfer::In { .. } => None,
                });
                self.copy_out(pages.collect(), false);
            } else if let Err(e) = self.copy_in(now) {
                self.fail_step(chunks, &e);
                return false;
            }
        }
        true
    }

    /// While idle: copies the pool's next-evicted pages to host memory
    /// ahead of their eviction, one batch per call, so a later burst that
    /// evicts them copies nothing before its step. Never pushes a page out
    /// of the host tier (no churn when it is smaller than the pool). True
    /// when it copied something (call again after checking for commands).
    pub(super) fn copy_cold_pages(&mut self) -> bool {
        let Some(tiers) = self.tiers.clone() else {
            return false;
        };
        let size = self.runner.kv_page_bytes().max(1);
        let room = usize::try_from(tiers.host_room() / size as u64).unwrap_or(usize::MAX);
        let max = room.min(COLD_BATCH_BYTES / size).max(usize::from(room > 0));
        if max == 0 {
            return false;
        }
        let pages = self.scheduler.cold_pages(max, |k| tiers.contains(k));
        if pages.is_empty() {
            return false;
        }
        self.copy_out(pages, false)
    }

    /// Write-through: the pages this step computed, to the tiers and the
    /// shared store.
    pub(super) fn publish_pages(&mut self) {
        let named = self.scheduler.take_named();
        if !named.is_empty() {
            self.copy_out(named, true);
        }
    }

    /// Reads `pages` (those not held below already) and keeps them below.
    /// False when the runner could not read them.
    fn copy_out(&mut self, pages: Vec<(BlockId, PageKey)>, publish: bool) -> bool {
        let Some(tiers) = self.tiers.clone() else {
            return false;
        };
        let pages: Vec<_> = pages
            .into_iter()
            .filter(|(_, k)| !tiers.contains(k))
            .collect();
        if pages.is_empty() {
            return true;
        }
        let started = Instant::now();
        let size = self.runner.kv_page_bytes();
        let ids: Vec<BlockId> = pages.iter().map(|p| p.0).collect();
        // Each page is read straight into the memory the tiers keep.
        let mut datas: Vec<PageData> = ids.iter().map(|_| zeroed_page(size)).collect();
        let mut outs: Vec<&mut [u8]> = datas.iter_mut().filter_map(Arc::get_mut).collect();
        if let Err(e) = self.runner.read_kv_pages(&ids, &mut outs) {
            tracing::warn!(error = %e, "cannot copy KV pages out; they are recomputed when needed");
            return false;
        }
        for ((_, key), data) in pages.iter().zip(datas) {
            if publish {
                tiers.publish(*key, data);
            } else {
                tiers.keep(*key, data);
            }
        }
        tiers.record_copy(true, ids.len() * size, started.elapsed());
        true
    }

    fn copy_in(&mut self, transfers: &[PageTransfer]) -> Result<(), RunnerError> {
        let started = Instant::now();
        let (mut ids, mut data) = (Vec::new(), Vec::new());
        for t in transfers {
            if let PageTransfer::In { page, data: d, .. } = t {
                ids.push(*page);
                data.push(&d[..]);
            }
        }
        self.runner.write_kv_pages(&ids, &data)?;
        if let Some(tiers) = &self.tiers {
            let bytes = data.iter().map(|d| d.len()).sum();
            tiers.record_copy(false, bytes, started.elapsed());
        }
        Ok(())
    }
}

/// A page of `size` zero bytes, owned once (so it can be written).
fn zeroed_page(size: usize) -> PageData {
    // SAFETY: all-zero bytes are valid `u8`s.
    unsafe { Arc::<[u8]>::new_zeroed_slice(size).assume_init() }
}
