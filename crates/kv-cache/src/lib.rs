//! Paged KV-cache bookkeeping: a pool of fixed-size blocks and per-sequence
//! block tables. Pure CPU state: no tensors, no clocks, no threads. The
//! runner owns the memory; this crate only decides which block holds which
//! positions (PagedAttention, <https://arxiv.org/abs/2309.06180>).
//!
//! Invariants: a block id is either in the free list or owned by exactly one
//! table; `allocate`/`free` are O(1).

mod pool;

pub use pool::{BlockId, BlockPool, BlockTable, OutOfBlocks};
