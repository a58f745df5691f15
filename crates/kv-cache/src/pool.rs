//! The block pool and block tables.

/// Index of a KV block in the runner's pool.
pub type BlockId = u32;

/// Not enough free blocks for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("KV cache out of blocks: need {needed}, {free} free")]
pub struct OutOfBlocks {
    /// Blocks the operation needed.
    pub needed: usize,
    /// Blocks that were free.
    pub free: usize,
}

/// A fixed set of KV blocks with a LIFO free list (recently freed blocks are
/// reused first, which keeps the working set warm in caches).
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    num_blocks: usize,
    free: Vec<BlockId>,
}

impl BlockPool {
    /// `num_blocks` blocks of `block_size` token slots each.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        let free = (0..num_blocks as BlockId).rev().collect();
        Self {
            block_size,
            num_blocks,
            free,
        }
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Blocks not owned by any table.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Blocks needed to hold `tokens` positions.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    fn allocate(&mut self) -> Option<BlockId> {
        self.free.pop()
    }

    fn release(&mut self, id: BlockId) {
        debug_assert!(!self.free.contains(&id), "double free of block {id}");
        self.free.push(id);
    }
}

/// The blocks of one sequence, in position order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
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

    /// Grows the table to hold `num_tokens` positions; all or nothing.
    pub fn reserve(&mut self, pool: &mut BlockPool, num_tokens: usize) -> Result<(), OutOfBlocks> {
        let needed = pool
            .blocks_for(num_tokens)
            .saturating_sub(self.blocks.len());
        if needed > pool.num_free() {
            return Err(OutOfBlocks {
                needed,
                free: pool.num_free(),
            });
        }
        for _ in 0..needed {
            let id = pool
                .allocate()
                .expect("free count checked above. This is a bug.");
            self.blocks.push(id);
        }
        Ok(())
    }

    /// Returns every block to the pool.
    pub fn release(&mut self, pool: &mut BlockPool) {
        for id in self.blocks.drain(..) {
            pool.release(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_grows_by_whole_blocks_and_release_returns_them() {
        let mut pool = BlockPool::new(4, 16);
        let mut t = BlockTable::new();
        t.reserve(&mut pool, 1).unwrap();
        assert_eq!(t.blocks().len(), 1);
        t.reserve(&mut pool, 16).unwrap();
        assert_eq!(t.blocks().len(), 1);
        t.reserve(&mut pool, 17).unwrap();
        assert_eq!(t.blocks().len(), 2);
        assert_eq!(pool.num_free(), 2);
        t.release(&mut pool);
        assert_eq!(pool.num_free(), 4);
        assert!(t.blocks().is_empty());
    }

    #[test]
    fn reserve_is_all_or_nothing() {
        let mut pool = BlockPool::new(2, 4);
        let mut t = BlockTable::new();
        let err = t.reserve(&mut pool, 9).unwrap_err();
        assert_eq!(err, OutOfBlocks { needed: 3, free: 2 });
        assert_eq!(pool.num_free(), 2);
        assert!(t.blocks().is_empty());
    }

    #[test]
    fn tables_never_share_blocks() {
        let mut pool = BlockPool::new(8, 2);
        let (mut a, mut b) = (BlockTable::new(), BlockTable::new());
        a.reserve(&mut pool, 7).unwrap();
        b.reserve(&mut pool, 8).unwrap();
        let mut all: Vec<_> = a.blocks().iter().chain(b.blocks()).copied().collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 8);
        assert_eq!(pool.num_free(), 0);
    }
}
