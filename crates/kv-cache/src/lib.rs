//! Paged KV-cache bookkeeping: a pool of fixed-size blocks, per-sequence
//! block tables and automatic prefix caching. Pure CPU state: no tensors,
//! no clocks, no threads. The runner owns the memory; this crate decides
//! which block holds which positions (PagedAttention,
//! <https://arxiv.org/abs/2309.06180>).
//!
//! Prefix caching (as in vLLM's automatic prefix caching): a *full* block is
//! named by a hash chained over (parent block's hash, its token ids), so a
//! name identifies the whole prefix up to the block's end. When a sequence
//! finishes, its named blocks keep their contents and become *evictable*;
//! a later sequence whose prompt starts with the same tokens takes them back
//! instead of recomputing. Evictable blocks are reclaimed least recently
//! used first, only when a free block is needed.
//!
//! Layer groups (see [`KvLayout`]): the layers of a model with sliding-window
//! attention split into a global group and a sliding group, each with its own
//! block table per sequence, all drawing pages from one pool. A sliding group
//! gives its blocks back as they leave the window (to the prefix cache when
//! named), so a long sequence holds about a window of them.
//!
//! Tiers (see [`LowerTiers`]): with storage below the pool, an evicted
//! named page is listed to be copied down instead of dropped, and a prefix
//! hit continues through the pages held below, which are copied back into
//! fresh pages before the step runs.
//!
//! Invariants: every block is exactly one of free (no name), in use
//! (ref count > 0) or evictable (ref count 0, named, in the LRU); a name maps
//! to at most one block. Allocation, free and lookup are O(1) amortised
//! (LRU removal is O(log n)).

mod hash;
mod layout;
mod pool;
mod tiers;

pub use hash::BlockHash;
pub use layout::{KvGroup, KvLayout, LayerSite, NULL_BLOCK};
pub use pool::{BlockId, BlockPool, BlockTable, OutOfBlocks, PrefixCacheStats};
pub use tiers::{LowerTiers, PageData, PageKey, PageTransfer};
