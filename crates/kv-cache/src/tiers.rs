//! The seam between the device pool and the storage below it (host memory,
//! local disk, a store shared by several instances; `crates/kv-tiers`).
//!
//! The pool stays bookkeeping: it asks [`LowerTiers`] which pages exist
//! below and for their bytes, and lists the copies the engine must make
//! ([`PageTransfer`]) in the order they must happen.

use std::sync::Arc;

use crate::{BlockHash, BlockId};

/// A page's name: the prefix its logical block ends, and which layer group
/// and page part of that block it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageKey {
    /// The prefix up to the end of the block.
    pub prefix: BlockHash,
    /// The layer group.
    pub group: u32,
    /// The page of the block within its group.
    pub part: u32,
}

/// A page's contents in host memory, as the runner reads and writes them.
pub type PageData = Arc<[u8]>;

/// Storage of evicted pages below the device pool.
pub trait LowerTiers: Send + Sync {
    /// Whether a page is held (cheap: no bytes are read).
    fn contains(&self, key: &PageKey) -> bool;

    /// The page's contents, checked; `None` when gone or corrupt (a corrupt
    /// page is forgotten, so its block is recomputed).
    fn fetch(&self, key: &PageKey) -> Option<PageData>;
}

/// A copy between the runner's pool and the lower tiers. The engine makes
/// them in the order the pool lists them, before the step's forward pass.
#[derive(Debug, Clone)]
pub enum PageTransfer {
    /// The page leaves the device pool: keep its contents below (unless
    /// they are there already).
    Out {
        /// The page in the runner's pool.
        page: BlockId,
        /// What it holds.
        key: PageKey,
    },
    /// The page takes `data` from below: part of a prefix hit.
    In {
        /// The page in the runner's pool.
        page: BlockId,
        /// What it will hold.
        key: PageKey,
        /// The contents.
        data: PageData,
    },
}
