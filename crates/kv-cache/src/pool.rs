//! The block pool with reference counts and the prefix cache, and the
//! per-sequence block tables.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::layout::{KvLayout, NULL_BLOCK};
use crate::tiers::{LowerTiers, PageData, PageKey, PageTransfer};
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
    name: Option<PageKey>,
    /// LRU key while evictable.
    lru_tick: u64,
}

/// A fixed set of KV pages shared by all sequences and all layer groups
/// (see [`KvLayout`]; with one group, a page is a block of every layer).
#[derive(Clone)]
pub struct BlockPool {
    block_size: usize,
    layout: KvLayout,
    blocks: Vec<Block>,
    /// Unnamed, unreferenced blocks (LIFO: recently freed memory is warm).
    free: Vec<BlockId>,
    /// Named, unreferenced blocks by last use.
    evictable: BTreeMap<u64, BlockId>,
    /// Page name → block holding it.
    named: HashMap<PageKey, BlockId>,
    tick: u64,
    prefix_caching: bool,
    stats: PrefixCacheStats,
    /// Storage below the pool, when configured.
    tiers: Option<Arc<dyn LowerTiers>>,
    /// Copies pages as they are named, not only as they leave (a store
    /// shared with other instances wants them while they are hot).
    write_through: bool,
    /// Copies to make before the next forward pass, in order.
    transfers: Vec<PageTransfer>,
    /// Pages named since last taken (write-through), copied after the pass.
    named_since: Vec<(BlockId, PageKey)>,
}

impl std::fmt::Debug for BlockPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockPool")
            .field("block_size", &self.block_size)
            .field("blocks", &self.blocks.len())
            .field("free", &self.free.len())
            .field("evictable", &self.evictable.len())
            .field("tiers", &self.tiers.is_some())
            .finish_non_exhaustive()
    }
}

impl BlockPool {
    /// `num_blocks` blocks of `block_size` token slots each, one layer
    /// group (every layer global).
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        Self::with_layout(num_blocks, block_size, KvLayout::single(1), prefix_caching)
    }

    /// `num_pages` pages of `block_size` token slots shared by the groups
    /// of `layout`.
    pub fn with_layout(
        num_pages: usize,
        block_size: usize,
        layout: KvLayout,
        prefix_caching: bool,
    ) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        assert!(
            num_pages < NULL_BLOCK as usize,
            "page ids must stay below NULL_BLOCK"
        );
        Self {
            block_size,
            layout,
            blocks: vec![Block::default(); num_pages],
            free: (0..num_pages as BlockId).rev().collect(),
            evictable: BTreeMap::new(),
            named: HashMap::new(),
            tick: 0,
            prefix_caching,
            stats: PrefixCacheStats::default(),
            tiers: None,
            write_through: false,
            transfers: Vec::new(),
            named_since: Vec::new(),
        }
    }

    /// Keeps evicted pages in `tiers` and resumes prefixes from them; with
    /// `write_through`, pages are also listed for copying as they are named
    /// ([`BlockPool::take_named`]).
    pub fn set_lower_tiers(&mut self, tiers: Arc<dyn LowerTiers>, write_through: bool) {
        self.tiers = Some(tiers);
        self.write_through = write_through;
    }

    /// The copies to make before the next forward pass, in order.
    pub fn take_transfers(&mut self) -> Vec<PageTransfer> {
        std::mem::take(&mut self.transfers)
    }

    /// Up to `max` evictable pages, the next to be evicted first, that
    /// `below` does not hold: what an idle engine copies down ahead of
    /// their eviction.
    pub fn cold_pages(
        &self,
        max: usize,
        below: impl Fn(&PageKey) -> bool,
    ) -> Vec<(BlockId, PageKey)> {
        self.evictable
            .values()
            .filter_map(|&id| Some((id, self.blocks[id as usize].name?)))
            .filter(|(_, key)| !below(key))
            .take(max)
            .collect()
    }

    /// Pages named since the last call (write-through only): their
    /// contents exist once the step that named them has run.
    pub fn take_named(&mut self) -> Vec<(BlockId, PageKey)> {
        std::mem::take(&mut self.named_since)
    }

    /// The layer groups.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Empty block tables for a new sequence, one per layer group.
    pub fn new_tables(&self) -> Vec<BlockTable> {
        (0..self.layout.groups().len())
            .map(|g| BlockTable {
                pages_per_block: self.layout.pages_per_block(g),
                ..BlockTable::default()
            })
            .collect()
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Total blocks (pages).
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

    /// Blocks needed to hold `tokens` positions in a one-group pool.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Pages a sequence holds while computing positions `start..end`, all
    /// groups counted (a sliding group only its window's blocks).
    pub fn pages_for(&self, start: usize, end: usize) -> usize {
        self.layout.pages_for(start, end, self.block_size)
    }

    /// Prefix-cache counters so far.
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// [`BlockPool::reuse_prefix_groups`] for a one-group pool.
    pub fn reuse_prefix(&mut self, table: &mut BlockTable, tokens: &[u32]) -> usize {
        self.reuse_prefix_groups(std::slice::from_mut(table), tokens)
    }

    /// Starts `tables` (empty, one per group) with the longest cached
    /// prefix of `tokens` that every group can resume from, and returns how
    /// many tokens it covers. At least one token is always left to compute,
    /// since the last prompt token's logits are needed.
    ///
    /// A global group needs every block of the prefix; a sliding group only
    /// the blocks its window still sees from the prefix's end. So the hit
    /// is the longest prefix the global groups hold, shortened to the
    /// latest block boundary where every sliding group holds its window.
    pub fn reuse_prefix_groups(&mut self, tables: &mut [BlockTable], tokens: &[u32]) -> usize {
        debug_assert!(tables.iter().all(|t| t.blocks.is_empty()));
        debug_assert_eq!(tables.len(), self.layout.groups().len());
        if !self.prefix_caching {
            return 0;
        }
        let bs = self.block_size;
        let usable = tokens.len().saturating_sub(1) / bs;
        let global: Vec<usize> = (0..self.layout.groups().len())
            .filter(|&g| self.layout.groups()[g].window.is_none())
            .collect();
        let mut names = Vec::new();
        let mut parent = None;
        for chunk in tokens.chunks_exact(bs).take(usable) {
            let name = BlockHash::chain(parent, chunk);
            if !global.iter().all(|&g| self.is_cached(name, g)) {
                break;
            }
            names.push(name);
            parent = Some(name);
        }
        let mut hit_blocks = self.sliding_resume_point(&names);
        // Pages held only below are read now; a hit stops before the
        // first that is gone, corrupt or has no free page to go to.
        let mut below = HashMap::new();
        while let Err(short) = self.fetch_below(&names[..hit_blocks], &mut below) {
            hit_blocks = self.sliding_resume_point(&names[..short]);
        }
        let names = &names[..hit_blocks];
        // Take the resident pages first, so fresh pages for the ones
        // coming from below never evict them.
        for (_, key) in self.live_pages(names) {
            if let Some(&id) = self.named.get(&key) {
                self.take_ref(id);
            }
        }
        for (g, table) in tables.iter_mut().enumerate() {
            let first = self.layout.first_live_block(g, hit_blocks * bs, bs);
            for (b, &name) in names.iter().enumerate() {
                for part in 0..table.pages_per_block() {
                    let key = page_key(name, g, part);
                    let id = if b < first {
                        NULL_BLOCK
                    } else if let Some(&id) = self.named.get(&key) {
                        id
                    } else {
                        self.restore_page(key, below.remove(&key))
                    };
                    table.blocks.push(id);
                }
                table.names.push(name);
            }
            table.dropped = first.min(hit_blocks);
        }
        let hit = hit_blocks * bs;
        self.stats.queries += tokens.len() as u64;
        self.stats.hits += hit as u64;
        hit
    }

    /// (block, key) of every page a hit over `names` holds.
    fn live_pages(&self, names: &[BlockHash]) -> Vec<(usize, PageKey)> {
        let (bs, end) = (self.block_size, names.len() * self.block_size);
        let mut out = Vec::new();
        for g in 0..self.layout.groups().len() {
            let first = self.layout.first_live_block(g, end, bs);
            for (b, &name) in names.iter().enumerate().skip(first) {
                for part in 0..self.layout.pages_per_block(g) {
                    out.push((b, page_key(name, g, part)));
                }
            }
        }
        out
    }

    /// Reads into `below` every page of a hit over `names` that is held
    /// only below the pool. `Err(b)`: block `b` cannot be restored (a page
    /// is gone or corrupt, or the pool has no page left for it).
    fn fetch_below(
        &self,
        names: &[BlockHash],
        below: &mut HashMap<PageKey, PageData>,
    ) -> Result<(), usize> {
        let Some(tiers) = &self.tiers else {
            return Ok(());
        };
        let pages = self.live_pages(names);
        // Resident pages nobody holds leave the evictable list when taken.
        let resident_idle = pages
            .iter()
            .filter(|(_, k)| {
                self.named
                    .get(k)
                    .is_some_and(|&id| self.blocks[id as usize].ref_count == 0)
            })
            .count();
        let room = self.num_available().saturating_sub(resident_idle);
        let mut short = usize::MAX;
        let mut needed = 0;
        for (b, key) in pages {
            if self.named.contains_key(&key) {
                continue;
            }
            needed += 1;
            if needed > room {
                short = short.min(b);
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(slot) = below.entry(key) {
                match tiers.fetch(&key) {
                    Some(data) => {
                        slot.insert(data);
                    }
                    None => short = short.min(b),
                }
            }
        }
        if short == usize::MAX {
            Ok(())
        } else {
            Err(short)
        }
    }

    /// A fresh page named `key`, listed to take `data` before the step.
    fn restore_page(&mut self, key: PageKey, data: Option<PageData>) -> BlockId {
        let id = self
            .pop_block()
            .expect("room for restored pages checked in fetch_below. This is a bug.");
        let data = data.expect("restored pages fetched in fetch_below. This is a bug.");
        self.blocks[id as usize].name = Some(key);
        self.named.insert(key, id);
        self.transfers.push(PageTransfer::In {
            page: id,
            key,
            data,
        });
        id
    }

    /// Whether every page of group `g`'s block named `name` is cached.
    /// Pages held below the pool count.
    fn is_cached(&self, name: BlockHash, g: usize) -> bool {
        (0..self.layout.pages_per_block(g)).all(|p| {
            let key = page_key(name, g, p);
            self.named.contains_key(&key) || self.tiers.as_ref().is_some_and(|t| t.contains(&key))
        })
    }

    /// The largest `k <= names.len()` such that every sliding group holds
    /// the blocks a query at position `k * block_size` sees.
    fn sliding_resume_point(&self, names: &[BlockHash]) -> usize {
        let bs = self.block_size;
        let sliding: Vec<usize> = (0..self.layout.groups().len())
            .filter(|&g| self.layout.groups()[g].window.is_some())
            .collect();
        // run[g][b]: cached blocks of group g in a row ending at block b.
        let runs: Vec<Vec<usize>> = sliding
            .iter()
            .map(|&g| {
                let mut run = 0;
                names
                    .iter()
                    .map(|&n| {
                        run = if self.is_cached(n, g) { run + 1 } else { 0 };
                        run
                    })
                    .collect()
            })
            .collect();
        let resumable = |k: usize| {
            k == 0
                || sliding.iter().zip(&runs).all(|(&g, run)| {
                    let first = self.layout.first_live_block(g, k * bs, bs);
                    run[k - 1] >= k - first
                })
        };
        (0..=names.len()).rev().find(|&k| resumable(k)).unwrap_or(0)
    }

    fn take_ref(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        if b.ref_count == 0 {
            self.evictable.remove(&b.lru_tick);
        }
        b.ref_count += 1;
    }

    /// Drops one reference; a block nobody holds becomes evictable when
    /// named, else free.
    fn unref(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        debug_assert!(b.ref_count > 0, "double free of block {id}");
        b.ref_count -= 1;
        if b.ref_count > 0 {
            return;
        }
        if b.name.is_some() {
            self.tick += 1;
            b.lru_tick = self.tick;
            self.evictable.insert(self.tick, id);
        } else {
            self.free.push(id);
        }
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
                    if self.tiers.is_some() {
                        self.transfers.push(PageTransfer::Out {
                            page: id,
                            key: name,
                        });
                    }
                }
                id
            }
        };
        self.blocks[id as usize].ref_count = 1;
        Some(id)
    }

    /// [`BlockPool::reserve_groups`] for a one-group pool, from position 0.
    pub fn reserve(
        &mut self,
        table: &mut BlockTable,
        num_tokens: usize,
    ) -> Result<(), OutOfBlocks> {
        self.reserve_groups(std::slice::from_mut(table), 0, num_tokens)
    }

    /// Readies `tables` for computing positions `start..end`: first gives
    /// back every sliding-group block that no query at `start` or later
    /// sees (kept cached when named), then grows each table to hold `end`
    /// positions; the growth is all or nothing.
    pub fn reserve_groups(
        &mut self,
        tables: &mut [BlockTable],
        start: usize,
        end: usize,
    ) -> Result<(), OutOfBlocks> {
        debug_assert_eq!(tables.len(), self.layout.groups().len());
        let bs = self.block_size;
        let blocks = end.div_ceil(bs);
        let mut needed = 0;
        for (g, table) in tables.iter_mut().enumerate() {
            let first = self.layout.first_live_block(g, start, bs);
            self.drop_blocks_before(table, first);
            let fresh = blocks.saturating_sub(table.num_blocks().max(first));
            needed += fresh * table.pages_per_block();
        }
        if needed > self.num_available() {
            return Err(OutOfBlocks {
                needed,
                free: self.num_available(),
            });
        }
        for (g, table) in tables.iter_mut().enumerate() {
            let first = self.layout.first_live_block(g, start, bs);
            while table.num_blocks() < blocks {
                let live = table.num_blocks() >= first;
                for _ in 0..table.pages_per_block() {
                    let id = if live {
                        self.pop_block()
                            .expect("availability checked above. This is a bug.")
                    } else {
                        NULL_BLOCK
                    };
                    table.blocks.push(id);
                }
                if !live {
                    table.dropped = table.num_blocks();
                }
            }
        }
        Ok(())
    }

    /// Gives back the pages of `table`'s logical blocks before `first`.
    fn drop_blocks_before(&mut self, table: &mut BlockTable, first: usize) {
        let ppb = table.pages_per_block();
        let upto = first.min(table.num_blocks());
        for i in table.dropped * ppb..upto * ppb {
            let id = std::mem::replace(&mut table.blocks[i], NULL_BLOCK);
            if id != NULL_BLOCK {
                self.unref(id);
            }
        }
        table.dropped = table.dropped.max(upto);
    }

    /// [`BlockPool::publish_groups`] for a one-group pool.
    pub fn publish_full_blocks(&mut self, table: &mut BlockTable, tokens: &[u32], computed: usize) {
        self.publish_groups(std::slice::from_mut(table), tokens, computed);
    }

    /// Names every full block of `tables` whose `tokens` are computed, so
    /// later sequences can reuse them. `tokens` are the sequence's tokens;
    /// `computed` how many of them are in the cache.
    pub fn publish_groups(&mut self, tables: &mut [BlockTable], tokens: &[u32], computed: usize) {
        if !self.prefix_caching {
            return;
        }
        let bs = self.block_size;
        let full = computed.min(tokens.len()) / bs;
        // The chain of names is the same for every group: hash it once.
        let mut chain = tables.first().map(|t| t.names.clone()).unwrap_or_default();
        while chain.len() < full {
            let i = chain.len();
            let parent = chain.last().copied();
            chain.push(BlockHash::chain(parent, &tokens[i * bs..(i + 1) * bs]));
        }
        for (g, table) in tables.iter_mut().enumerate() {
            let upto = full.min(table.num_blocks());
            while table.names.len() < upto {
                let b = table.names.len();
                let name = chain[b];
                table.names.push(name);
                for part in 0..table.pages_per_block() {
                    let id = table.blocks[b * table.pages_per_block() + part];
                    self.name_page(id, page_key(name, g, part));
                }
            }
        }
    }

    /// Names page `id` unless it is a dropped entry, already named, or the
    /// same contents are cached already (a prefix computed twice at once:
    /// the first copy keeps the name, this one is freed normally).
    fn name_page(&mut self, id: BlockId, name: PageKey) {
        if id == NULL_BLOCK || self.named.contains_key(&name) {
            return;
        }
        let block = &mut self.blocks[id as usize];
        if block.name.is_none() {
            block.name = Some(name);
            self.named.insert(name, id);
            if self.write_through {
                self.named_since.push((id, name));
            }
        }
    }

    /// Forgets every cached prefix (their blocks become free): for a KV
    /// pool whose contents were lost. Blocks in use keep their names.
    pub fn forget_cached(&mut self) {
        // Pages not yet copied are gone with the memory.
        self.transfers.clear();
        self.named_since.clear();
        for (_, id) in std::mem::take(&mut self.evictable) {
            let b = &mut self.blocks[id as usize];
            if let Some(name) = b.name.take() {
                self.named.remove(&name);
            }
            self.free.push(id);
        }
    }

    /// [`BlockPool::release_groups`] for a one-group pool.
    pub fn release(&mut self, table: &mut BlockTable) {
        self.release_groups(std::slice::from_mut(table));
    }

    /// Returns every block of `tables` to the pool. Named blocks stay
    /// cached (evictable) until their memory is needed.
    pub fn release_groups(&mut self, tables: &mut [BlockTable]) {
        for table in tables {
            // Release the tail first so that, under LRU, a prefix's deeper
            // blocks are evicted before the shallower ones they depend on.
            for id in table.blocks.drain(..).rev() {
                if id != NULL_BLOCK {
                    self.unref(id);
                }
            }
            table.names.clear();
            table.dropped = 0;
        }
    }
}

fn page_key(prefix: BlockHash, group: usize, part: usize) -> PageKey {
    PageKey {
        prefix,
        group: group as u32,
        part: part as u32,
    }
}

/// The blocks of one sequence in one layer group, in position order, with
/// the names of its full computed blocks. A group of several pages per
/// block lists them block by block; entries of blocks that left a sliding
/// window are [`NULL_BLOCK`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
    names: Vec<BlockHash>,
    /// Pages per logical block (0 reads as 1: a table from `new`).
    pages_per_block: usize,
    /// Leading logical blocks given back (their entries are `NULL_BLOCK`).
    dropped: usize,
}

impl BlockTable {
    /// An empty table of one page per block.
    pub fn new() -> Self {
        Self::default()
    }

    /// Page ids in position order ([`NULL_BLOCK`] where given back).
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Pages per logical block.
    pub fn pages_per_block(&self) -> usize {
        self.pages_per_block.max(1)
    }

    /// Logical blocks (positions / block size, rounded up) the table spans.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len() / self.pages_per_block()
    }

    /// Pages the table holds (not given back).
    pub fn num_live_pages(&self) -> usize {
        self.blocks.iter().filter(|&&b| b != NULL_BLOCK).count()
    }

    /// Positions the table can hold.
    pub fn capacity(&self, block_size: usize) -> usize {
        self.num_blocks() * block_size
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

    /// Layer 0 global; layers 1 and 2 through a window of 8: one page
    /// layer, 1 page per global block, 2 per sliding block.
    fn two_groups(pages: usize) -> BlockPool {
        let layout = KvLayout::from_windows(&[None, Some(8), Some(8)]);
        BlockPool::with_layout(pages, 4, layout, true)
    }

    /// Runs `tokens` through `pool` in chunks of `chunk` (from its cached
    /// prefix), publishing as it goes; returns the hit and the most pages
    /// held at once.
    fn run_chunked(pool: &mut BlockPool, tokens: &[u32], chunk: usize) -> (usize, usize) {
        let mut t = pool.new_tables();
        let hit = pool.reuse_prefix_groups(&mut t, tokens);
        let (mut pos, mut peak) = (hit, 0);
        while pos < tokens.len() {
            let end = (pos + chunk).min(tokens.len());
            pool.reserve_groups(&mut t, pos, end).unwrap();
            peak = peak.max(pool.num_in_use());
            pool.publish_groups(&mut t, tokens, end);
            pos = end;
        }
        pool.release_groups(&mut t);
        (hit, peak)
    }

    #[test]
    fn sliding_blocks_leave_with_the_window() {
        let mut pool = two_groups(64);
        let mut t = pool.new_tables();
        pool.reserve_groups(&mut t, 0, 20).unwrap();
        assert_eq!(pool.num_in_use(), 5 + 5 * 2);
        // A query at 20 sees 13..=20: sliding blocks 0..3 go back.
        pool.reserve_groups(&mut t, 20, 21).unwrap();
        assert_eq!(t[1].blocks()[..6], [NULL_BLOCK; 6]);
        assert_eq!(t[1].num_live_pages(), 3 * 2);
        assert_eq!(pool.num_in_use(), 6 + 3 * 2);
        // Decoding on: the sliding group never holds more than 3 blocks.
        for pos in 21..200 {
            pool.reserve_groups(&mut t, pos, pos + 1).unwrap();
            assert!(t[1].num_live_pages() <= 3 * 2, "at {pos}");
            assert_eq!(t[0].num_live_pages(), (pos + 1).div_ceil(4));
        }
        pool.release_groups(&mut t);
        assert_eq!(pool.num_in_use(), 0);
        assert_eq!(pool.num_available(), 64);
    }

    #[test]
    fn chunked_prefill_frees_behind_the_chunk_and_admission_counts_groups() {
        // One table of 200 tokens would be 50 blocks of 3 pages: 150 pages.
        let mut pool = two_groups(64);
        let (_, peak) = run_chunked(&mut pool, &toks(200, 0), 8);
        // 50 global + at most (8 + 8) / 4 + 1 sliding blocks of 2 pages.
        assert!(peak <= 50 + 5 * 2, "peak {peak}");
        assert_eq!(pool.pages_for(0, 20), 5 + 5 * 2);
        assert_eq!(pool.pages_for(192, 200), 50 + 4 * 2);
        // A pool too small for the step refuses it whole.
        let mut small = two_groups(10);
        let mut t = small.new_tables();
        let err = small.reserve_groups(&mut t, 0, 16).unwrap_err();
        assert_eq!(
            err,
            OutOfBlocks {
                needed: 12,
                free: 10
            }
        );
        assert_eq!(small.num_in_use(), 0);
    }

    #[test]
    fn a_prefix_hit_resumes_both_groups_with_the_window_cached() {
        let mut pool = two_groups(256);
        let first = toks(40, 0);
        assert_eq!(run_chunked(&mut pool, &first, 8).0, 0);
        let mut second = toks(36, 0);
        second.extend([900, 901, 902]);
        let mut t = pool.new_tables();
        assert_eq!(pool.reuse_prefix_groups(&mut t, &second), 36);
        // The global group holds all 9 blocks; the sliding one only what a
        // query at 36 sees (29..36: blocks 7 and 8), the rest are null.
        assert_eq!(t[0].num_live_pages(), 9);
        assert_eq!(t[1].num_blocks(), 9);
        assert_eq!(t[1].blocks()[..14], [NULL_BLOCK; 14]);
        assert_eq!(t[1].num_live_pages(), 2 * 2);
        pool.reserve_groups(&mut t, 36, second.len()).unwrap();
        pool.publish_groups(&mut t, &second, second.len());
        pool.release_groups(&mut t);
        assert_eq!(pool.num_in_use(), 0);
    }

    #[test]
    fn a_prefix_whose_window_was_evicted_falls_back() {
        let mut pool = two_groups(60);
        run_chunked(&mut pool, &toks(40, 0), 8);
        // 30 pages stay cached. The oldest are the sliding blocks 0..6
        // that left the window while the sequence ran (12 pages): taking
        // 42 pages evicts exactly those.
        let mut other = pool.new_tables();
        pool.reserve_groups(&mut other, 0, 14 * 4).unwrap();
        pool.release_groups(&mut other);
        let mut t = pool.new_tables();
        // Resuming at 40 or 32 needs sliding blocks 8, 9 or 6, 7: cached.
        assert_eq!(pool.reuse_prefix_groups(&mut t, &toks(41, 0)), 40);
        pool.release_groups(&mut t);
        let mut at_32 = toks(33, 0);
        at_32.push(77);
        assert_eq!(pool.reuse_prefix_groups(&mut t, &at_32), 32);
        pool.release_groups(&mut t);
        // Resuming at 28 needs block 5, evicted, and so does every earlier
        // point: nothing is reused though the global group holds it all.
        let mut at_28 = toks(29, 0);
        at_28.push(77);
        assert_eq!(pool.reuse_prefix_groups(&mut t, &at_28), 0);
        assert!(t.iter().all(|t| t.blocks().is_empty()));
    }

    #[test]
    fn one_group_pools_behave_as_before() {
        let mut pool = BlockPool::new(8, 4, true);
        assert_eq!(pool.layout().groups().len(), 1);
        let mut t = pool.new_tables();
        pool.reserve_groups(&mut t, 30, 32).unwrap();
        assert_eq!(t[0].num_live_pages(), 8, "nothing is windowed");
        pool.release_groups(&mut t);
    }

    /// Storage below the pool: keeps what the engine would copy down.
    #[derive(Default)]
    struct Below {
        pages: std::sync::Mutex<HashMap<PageKey, PageData>>,
        corrupt: std::sync::Mutex<Vec<PageKey>>,
    }

    impl LowerTiers for Below {
        fn contains(&self, key: &PageKey) -> bool {
            self.pages.lock().unwrap().contains_key(key)
        }

        fn fetch(&self, key: &PageKey) -> Option<PageData> {
            if self.corrupt.lock().unwrap().contains(key) {
                self.pages.lock().unwrap().remove(key);
                return None;
            }
            self.pages.lock().unwrap().get(key).cloned()
        }
    }

    /// Plays the engine: pages are "copied" as their ids' bytes; an `In`
    /// must bring back what the page held when it went `Out`.
    fn apply(pool: &mut BlockPool, below: &Below, memory: &mut HashMap<BlockId, PageKey>) -> usize {
        let mut restored = 0;
        for t in pool.take_transfers() {
            match t {
                PageTransfer::Out { page, key } => {
                    assert_eq!(memory.get(&page), Some(&key), "page {page} holds {key:?}");
                    below
                        .pages
                        .lock()
                        .unwrap()
                        .entry(key)
                        .or_insert_with(|| Arc::from(format!("{key:?}").into_bytes()));
                }
                PageTransfer::In { page, key, data } => {
                    assert_eq!(&*data, format!("{key:?}").as_bytes());
                    memory.insert(page, key);
                    restored += 1;
                }
            }
        }
        restored
    }

    /// Runs a sequence to completion and records which page holds what.
    fn run_tiered(
        pool: &mut BlockPool,
        below: &Below,
        memory: &mut HashMap<BlockId, PageKey>,
        tokens: &[u32],
    ) -> (usize, usize) {
        let mut t = BlockTable::new();
        let hit = pool.reuse_prefix(&mut t, tokens);
        pool.reserve(&mut t, tokens.len()).unwrap();
        let restored = apply(pool, below, memory);
        pool.publish_full_blocks(&mut t, tokens, tokens.len());
        for (b, name) in BlockHash::chain_all(tokens, pool.block_size())
            .into_iter()
            .enumerate()
        {
            memory.insert(t.blocks()[b], page_key(name, 0, 0));
        }
        pool.release(&mut t);
        (hit, restored)
    }

    fn tiered(pages: usize) -> (BlockPool, Arc<Below>) {
        let below = Arc::new(Below::default());
        let mut pool = BlockPool::new(pages, 4, true);
        pool.set_lower_tiers(below.clone(), false);
        (pool, below)
    }

    #[test]
    fn evicted_pages_go_below_and_come_back_on_a_hit() {
        let (mut pool, below) = tiered(4);
        let mut memory = HashMap::new();
        let a = toks(13, 0);
        assert_eq!(run_tiered(&mut pool, &below, &mut memory, &a), (0, 0));
        // Another prompt takes every page: a's three named pages go below.
        assert_eq!(
            run_tiered(&mut pool, &below, &mut memory, &toks(16, 100)).0,
            0
        );
        assert_eq!(below.pages.lock().unwrap().len(), 3);
        assert_eq!(pool.prefix_cache_stats().hits, 0);
        // a again: its 12 cached positions come back from below (3 pages).
        assert_eq!(run_tiered(&mut pool, &below, &mut memory, &a), (12, 3));
        assert_eq!(pool.prefix_cache_stats().hits, 12);
    }

    #[test]
    fn a_resident_prefix_continues_below() {
        let (mut pool, below) = tiered(6);
        let mut memory = HashMap::new();
        let a = toks(17, 0);
        run_tiered(&mut pool, &below, &mut memory, &a);
        // Four pages more: a's two deepest blocks are evicted (tail first).
        run_tiered(&mut pool, &below, &mut memory, &toks(16, 100));
        assert_eq!(below.pages.lock().unwrap().len(), 2);
        let (hit, restored) = run_tiered(&mut pool, &below, &mut memory, &a);
        assert_eq!((hit, restored), (16, 2));
    }

    #[test]
    fn a_corrupt_page_below_ends_the_hit_before_it() {
        let (mut pool, below) = tiered(4);
        let mut memory = HashMap::new();
        let a = toks(13, 0);
        run_tiered(&mut pool, &below, &mut memory, &a);
        run_tiered(&mut pool, &below, &mut memory, &toks(16, 100));
        let names = BlockHash::chain_all(&a, 4);
        below.corrupt.lock().unwrap().push(page_key(names[1], 0, 0));
        assert_eq!(run_tiered(&mut pool, &below, &mut memory, &a), (4, 1));
        assert!(!below.contains(&page_key(names[1], 0, 0)));
    }

    #[test]
    fn a_hit_from_below_stops_where_the_pool_has_no_page() {
        let (mut pool, below) = tiered(4);
        let mut memory = HashMap::new();
        let a = toks(13, 0);
        run_tiered(&mut pool, &below, &mut memory, &a);
        run_tiered(&mut pool, &below, &mut memory, &toks(16, 100));
        // Two pages held by a running sequence leave room for two.
        let mut held = BlockTable::new();
        pool.reserve(&mut held, 8).unwrap();
        apply(&mut pool, &below, &mut memory);
        let mut t = BlockTable::new();
        assert_eq!(pool.reuse_prefix(&mut t, &a), 8);
        assert_eq!(apply(&mut pool, &below, &mut memory), 2);
    }

    #[test]
    fn write_through_lists_pages_as_they_are_named() {
        let mut pool = BlockPool::new(4, 4, true);
        pool.set_lower_tiers(Arc::new(Below::default()), true);
        let mut t = BlockTable::new();
        pool.reserve(&mut t, 10).unwrap();
        pool.publish_full_blocks(&mut t, &toks(10, 0), 10);
        let named = pool.take_named();
        assert_eq!(named.len(), 2);
        assert_eq!(named[0].0, t.blocks()[0]);
        assert!(pool.take_named().is_empty());
        // Without tiers nothing is listed.
        let mut plain = BlockPool::new(4, 4, true);
        let mut t = BlockTable::new();
        plain.reserve(&mut t, 10).unwrap();
        plain.publish_full_blocks(&mut t, &toks(10, 0), 10);
        assert!(plain.take_named().is_empty() && plain.take_transfers().is_empty());
    }

    /// What the engine would copy down: every listed `Out` kept below.
    fn keep_outs(pool: &mut BlockPool, below: &Below) {
        for t in pool.take_transfers() {
            if let PageTransfer::Out { key, .. } = t {
                let data = Arc::from(format!("{key:?}").into_bytes());
                below.pages.lock().unwrap().entry(key).or_insert(data);
            }
        }
    }

    #[test]
    fn a_sliding_window_prefix_comes_back_from_below_in_both_groups() {
        let below = Arc::new(Below::default());
        let mut pool = two_groups(40);
        pool.set_lower_tiers(below.clone(), false);
        let first = toks(40, 0);
        run_chunked(&mut pool, &first, 8);
        keep_outs(&mut pool, &below);
        // A second sequence takes the pages: the first's go below.
        run_chunked(&mut pool, &toks(40, 500), 8);
        keep_outs(&mut pool, &below);
        let mut second = toks(36, 0);
        second.extend([900, 901, 902]);
        let mut t = pool.new_tables();
        assert_eq!(pool.reuse_prefix_groups(&mut t, &second), 36);
        let restored = pool
            .take_transfers()
            .into_iter()
            .filter(|t| matches!(t, PageTransfer::In { .. }))
            .count();
        assert!(restored > 0);
        // Every live page of both groups holds its block's name; the
        // sliding group's blocks before its window are null.
        let names = BlockHash::chain_all(&second[..36], 4);
        for (g, table) in t.iter().enumerate() {
            let ppb = table.pages_per_block();
            for (i, &id) in table.blocks().iter().enumerate() {
                if id != NULL_BLOCK {
                    let want = page_key(names[i / ppb], g, i % ppb);
                    assert_eq!(
                        pool.blocks[id as usize].name,
                        Some(want),
                        "group {g} entry {i}"
                    );
                }
            }
        }
        assert_eq!(t[1].num_live_pages(), 2 * 2);
        pool.release_groups(&mut t);
        assert_eq!(pool.num_in_use(), 0);
    }

    #[test]
    fn cold_pages_are_the_next_evicted_not_yet_below() {
        let (mut pool, below) = tiered(8);
        let mut memory = HashMap::new();
        run_tiered(&mut pool, &below, &mut memory, &toks(13, 0));
        // Released tail first: the deepest block is the next evicted.
        let names = BlockHash::chain_all(&toks(13, 0), 4);
        let cold = pool.cold_pages(2, |k| below.contains(k));
        let keys: Vec<_> = cold.iter().map(|c| c.1.prefix).collect();
        assert_eq!(keys, [names[2], names[1]]);
        below
            .pages
            .lock()
            .unwrap()
            .insert(cold[0].1, Arc::from(vec![0u8]));
        assert_eq!(pool.cold_pages(8, |k| below.contains(k)).len(), 2);
    }
}
