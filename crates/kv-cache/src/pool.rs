//! The block pool with reference counts and the prefix cache, and the
//! per-sequence block tables.

use std::collections::{BTreeMap, HashMap};

use crate::BlockHash;

/// Index of a KV block in the runner's pool.
pub type BlockId = u32;

/// Not enough free blocks for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("KV cache out of blocks: need {needed}, {free} free")]
pub struct OutOfBlocks {
    /// Blocks the operation needed.
    pub needed: usize,
    /// Blocks that were available (free or evictable).
    pub free: usize,
}

/// Prefix-cache counters, in tokens (as vLLM reports them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Prompt tokens looked up.
    pub queries: u64,
    /// Prompt tokens found cached.
    pub hits: u64,
}

#[derive(Debug, Clone, Default)]
struct Block {
    ref_count: u32,
    name: Option<BlockHash>,
    /// LRU key while evictable.
    lru_tick: u64,
}

/// A fixed set of KV blocks shared by all sequences.
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    blocks: Vec<Block>,
    /// Unnamed, unreferenced blocks (LIFO: recently freed memory is warm).
    free: Vec<BlockId>,
    /// Named, unreferenced blocks by last use.
    evictable: BTreeMap<u64, BlockId>,
    /// Prefix name → block holding it.
    named: HashMap<BlockHash, BlockId>,
    tick: u64,
    prefix_caching: bool,
    stats: PrefixCacheStats,
}

impl BlockPool {
    /// `num_blocks` blocks of `block_size` token slots each.
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        Self {
            block_size,
            blocks: vec![Block::default(); num_blocks],
            free: (0..num_blocks as BlockId).rev().collect(),
            evictable: BTreeMap::new(),
            named: HashMap::new(),
            tick: 0,
            prefix_caching,
            stats: PrefixCacheStats::default(),
        }
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks that can be handed out now (free or evictable).
    pub fn num_available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks referenced by some sequence.
    pub fn num_in_use(&self) -> usize {
        self.blocks.len() - self.num_available()
    }

    /// Fraction of blocks referenced by some sequence, in [0, 1].
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            0.0
        } else {
            self.num_in_use() as f64 / self.blocks.len() as f64
        }
    }

    /// Blocks needed to hold `tokens` positions.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Prefix-cache counters so far.
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Starts `table` (empty) with the longest cached prefix of `tokens` and
    /// returns how many tokens it covers. At least one token is always left
    /// to compute, since the last prompt token's logits are needed.
    pub fn reuse_prefix(&mut self, table: &mut BlockTable, tokens: &[u32]) -> usize {
        debug_assert!(table.blocks.is_empty());
        if !self.prefix_caching {
            return 0;
        }
        let bs = self.block_size;
        let usable = tokens.len().saturating_sub(1) / bs;
        let mut parent = None;
        for chunk in tokens.chunks_exact(bs).take(usable) {
            let name = BlockHash::chain(parent, chunk);
            let Some(&id) = self.named.get(&name) else {
                break;
            };
            self.take_ref(id);
            table.blocks.push(id);
            table.names.push(name);
            parent = Some(name);
        }
        let hit = table.blocks.len() * bs;
        self.stats.queries += tokens.len() as u64;
        self.stats.hits += hit as u64;
        hit
    }

    fn take_ref(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        if b.ref_count == 0 {
            self.evictable.remove(&b.lru_tick);
        }
        b.ref_count += 1;
    }

    /// One block for new contents: a free one, else the least recently used
    /// evictable one (forgetting its name).
    fn pop_block(&mut self) -> Option<BlockId> {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let (_, id) = self.evictable.pop_first()?;
                if let Some(name) = self.blocks[id as usize].name.take() {
                    self.named.remove(&name);
                }
                id
            }
        };
        self.blocks[id as usize].ref_count = 1;
        Some(id)
    }

    /// Grows `table` to hold `num_tokens` positions; all or nothing.
    pub fn reserve(
        &mut self,
        table: &mut BlockTable,
        num_tokens: usize,
    ) -> Result<(), OutOfBlocks> {
        let needed = self
            .blocks_for(num_tokens)
            .saturating_sub(table.blocks.len());
        if needed > self.num_available() {
            return Err(OutOfBlocks {
                needed,
                free: self.num_available(),
            });
        }
        for _ in 0..needed {
            let id = self
                .pop_block()
                .expect("availability checked above. This is a bug.");
            table.blocks.push(id);
        }
        Ok(())
    }

    /// Names every full block of `table` whose `tokens` are computed, so
    /// later sequences can reuse them. `tokens` are the sequence's tokens;
    /// `computed` how many of them are in the cache.
    pub fn publish_full_blocks(&mut self, table: &mut BlockTable, tokens: &[u32], computed: usize) {
        if !self.prefix_caching {
            return;
        }
        let bs = self.block_size;
        let full = (computed.min(tokens.len()) / bs).min(table.blocks.len());
        while table.names.len() < full {
            let i = table.names.len();
            let parent = table.names.last().copied();
            let name = BlockHash::chain(parent, &tokens[i * bs..(i + 1) * bs]);
            table.names.push(name);
            let id = table.blocks[i];
            // The same prefix computed twice concurrently: keep the first
            // copy named; this one is freed normally.
            if !self.named.contains_key(&name) && self.blocks[id as usize].name.is_none() {
                self.named.insert(name, id);
                self.blocks[id as usize].name = Some(name);
            }
        }
    }

    /// Forgets every cached prefix (their blocks become free): for a KV
    /// pool whose contents were lost. Blocks in use keep their names.
    pub fn forget_cached(&mut self) {
        for (_, id) in std::mem::take(&mut self.evictable) {
            let b = &mut self.blocks[id as usize];
            if let Some(name) = b.name.take() {
                self.named.remove(&name);
            }
            self.free.push(id);
        }
    }

    /// Returns every block of `table` to the pool. Named blocks stay cached
    /// (evictable) until their memory is needed.
    pub fn release(&mut self, table: &mut BlockTable) {
        // Release the tail first so that, under LRU, a prefix's deeper blocks
        // are evicted before the shallower ones they depend on.
        for id in table.blocks.drain(..).rev() {
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.ref_count > 0, "double free of block {id}");
            b.ref_count -= 1;
            if b.ref_count > 0 {
                continue;
            }
            if b.name.is_some() {
                self.tick += 1;
                b.lru_tick = self.tick;
                self.evictable.insert(self.tick, id);
            } else {
                self.free.push(id);
            }
        }
        table.names.clear();
    }
}

/// The blocks of one sequence, in position order, with the names of its
/// full computed blocks.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
    names: Vec<BlockHash>,
}

impl BlockTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Block ids in position order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Positions the table can hold.
    pub fn capacity(&self, block_size: usize) -> usize {
        self.blocks.len() * block_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(n: usize, offset: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i + offset).collect()
    }

    #[test]
    fn reserve_grows_by_whole_blocks_and_release_returns_them() {
        let mut pool = BlockPool::new(4, 16, false);
        let mut t = BlockTable::new();
        pool.reserve(&mut t, 1).unwrap();
        assert_eq!(t.blocks().len(), 1);
        pool.reserve(&mut t, 16).unwrap();
        assert_eq!(t.blocks().len(), 1);
        pool.reserve(&mut t, 17).unwrap();
        assert_eq!(t.blocks().len(), 2);
        assert_eq!(pool.num_available(), 2);
        pool.release(&mut t);
        assert_eq!(pool.num_available(), 4);
        assert!(t.blocks().is_empty());
    }

    #[test]
    fn reserve_is_all_or_nothing() {
        let mut pool = BlockPool::new(2, 4, true);
        let mut t = BlockTable::new();
        let err = pool.reserve(&mut t, 9).unwrap_err();
        assert_eq!(err, OutOfBlocks { needed: 3, free: 2 });
        assert_eq!(pool.num_available(), 2);
        assert!(t.blocks().is_empty());
    }

    #[test]
    fn tables_never_share_fresh_blocks() {
        let mut pool = BlockPool::new(8, 2, true);
        let (mut a, mut b) = (BlockTable::new(), BlockTable::new());
        pool.reserve(&mut a, 7).unwrap();
        pool.reserve(&mut b, 8).unwrap();
        let mut all: Vec<_> = a.blocks().iter().chain(b.blocks()).copied().collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 8);
        assert_eq!(pool.num_available(), 0);
    }

    /// Runs a sequence to completion: reuse, reserve, publish, release.
    fn run_seq(pool: &mut BlockPool, tokens: &[u32]) -> (usize, Vec<BlockId>) {
        let mut t = BlockTable::new();
        let hit = pool.reuse_prefix(&mut t, tokens);
        pool.reserve(&mut t, tokens.len()).unwrap();
        pool.publish_full_blocks(&mut t, tokens, tokens.len());
        let blocks = t.blocks().to_vec();
        pool.release(&mut t);
        (hit, blocks)
    }

    #[test]
    fn shared_prefix_is_reused_after_release() {
        let mut pool = BlockPool::new(16, 4, true);
        let first = toks(10, 0); // blocks [0..4) [4..8) full, [8..10) partial
        let (hit, blocks) = run_seq(&mut pool, &first);
        assert_eq!(hit, 0);
        let mut second = toks(8, 0);
        second.extend([99, 98, 97]);
        let mut t = BlockTable::new();
        assert_eq!(pool.reuse_prefix(&mut t, &second), 8);
        assert_eq!(t.blocks(), &blocks[..2]);
        assert_eq!(
            pool.prefix_cache_stats(),
            PrefixCacheStats {
                queries: 21,
                hits: 8
            }
        );
        pool.release(&mut t);
    }

    #[test]
    fn whole_prompt_hit_leaves_the_last_token_to_compute() {
        let mut pool = BlockPool::new(16, 4, true);
        let p = toks(8, 0);
        run_seq(&mut pool, &p);
        let mut t = BlockTable::new();
        // 8 tokens = 2 full blocks, but only the first may be reused.
        assert_eq!(pool.reuse_prefix(&mut t, &p), 4);
        pool.release(&mut t);
    }

    #[test]
    fn different_prefix_misses_even_with_equal_later_blocks() {
        let mut pool = BlockPool::new(16, 4, true);
        let mut a = toks(4, 100);
        a.extend(toks(5, 0));
        run_seq(&mut pool, &a);
        let mut b = toks(4, 200);
        b.extend(toks(5, 0));
        let mut t = BlockTable::new();
        assert_eq!(pool.reuse_prefix(&mut t, &b), 0);
    }

    #[test]
    fn running_sequences_share_named_blocks() {
        let mut pool = BlockPool::new(8, 4, true);
        let p = toks(9, 0);
        let mut a = BlockTable::new();
        pool.reserve(&mut a, 9).unwrap();
        pool.publish_full_blocks(&mut a, &p, 9);
        let mut b = BlockTable::new();
        assert_eq!(pool.reuse_prefix(&mut b, &p), 8);
        assert_eq!(&b.blocks()[..2], &a.blocks()[..2]);
        // 3 blocks for a + 0 new for b so far.
        assert_eq!(pool.num_in_use(), 3);
        pool.release(&mut a);
        // b still holds the two shared blocks.
        assert_eq!(pool.num_in_use(), 2);
        pool.release(&mut b);
        assert_eq!(pool.num_in_use(), 0);
    }

    #[test]
    fn eviction_is_lru_and_only_under_pressure() {
        let mut pool = BlockPool::new(4, 2, true);
        run_seq(&mut pool, &toks(3, 0)); // names one block (tokens 0,1)
        run_seq(&mut pool, &toks(3, 10)); // names one block (10,11)
        assert_eq!(pool.num_available(), 4);
        // Touch the first prefix again so the second becomes the LRU.
        run_seq(&mut pool, &toks(3, 0));
        // Need all 4 blocks: both cached blocks must be evicted.
        let mut big = BlockTable::new();
        pool.reserve(&mut big, 8).unwrap();
        pool.release(&mut big);
        let mut t = BlockTable::new();
        assert_eq!(pool.reuse_prefix(&mut t, &toks(3, 0)), 0);
        pool.release(&mut t);

        // Under light pressure only the least recently used name goes.
        let mut pool = BlockPool::new(4, 2, true);
        run_seq(&mut pool, &toks(3, 0));
        run_seq(&mut pool, &toks(3, 10));
        run_seq(&mut pool, &toks(3, 0));
        let mut some = BlockTable::new();
        pool.reserve(&mut some, 6).unwrap(); // 3 blocks: 2 free + the LRU one
        let mut t = BlockTable::new();
        assert_eq!(
            pool.reuse_prefix(&mut t, &toks(3, 0)),
            2,
            "recent prefix kept"
        );
        pool.release(&mut t);
        let mut t = BlockTable::new();
        assert_eq!(
            pool.reuse_prefix(&mut t, &toks(3, 10)),
            0,
            "LRU prefix evicted"
        );
    }

    #[test]
    fn forgotten_prefixes_miss_and_their_blocks_are_free() {
        let mut pool = BlockPool::new(8, 4, true);
        // 12 tokens: two full blocks are cached (the last token is always computed).
        let prompt = toks(12, 0);
        run_seq(&mut pool, &prompt);
        assert_eq!(run_seq(&mut pool, &prompt).0, 8);
        pool.forget_cached();
        assert_eq!(pool.num_available(), 8);
        assert_eq!(run_seq(&mut pool, &prompt).0, 0);
        // and the pool caches again afterwards
        assert_eq!(run_seq(&mut pool, &prompt).0, 8);
    }

    #[test]
    fn disabled_prefix_caching_never_hits() {
        let mut pool = BlockPool::new(8, 2, false);
        run_seq(&mut pool, &toks(5, 0));
        let mut t = BlockTable::new();
        assert_eq!(pool.reuse_prefix(&mut t, &toks(5, 0)), 0);
    }
}
