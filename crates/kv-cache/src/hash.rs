//! Block names for prefix caching: a 128-bit hash chained over blocks.

use std::hash::{DefaultHasher, Hash, Hasher};

/// Names the prefix ending with one full block. 128 bits, so collisions are
/// negligible at any cache size (two independently keyed 64-bit hashes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64, pub u64);

impl BlockHash {
    /// The name of a block holding `tokens` after the prefix named `parent`.
    pub fn chain(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
        let half = |salt: u64| {
            let mut h = DefaultHasher::new();
            salt.hash(&mut h);
            parent.hash(&mut h);
            tokens.hash(&mut h);
            h.finish()
        };
        BlockHash(half(0x5eed_0001), half(0x5eed_0002))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_parent_and_tokens() {
        let a = BlockHash::chain(None, &[1, 2, 3]);
        assert_eq!(a, BlockHash::chain(None, &[1, 2, 3]));
        assert_ne!(a, BlockHash::chain(None, &[1, 2, 4]));
        let b = BlockHash::chain(Some(a), &[4, 5, 6]);
        assert_ne!(b, BlockHash::chain(None, &[4, 5, 6]));
        assert_ne!(
            b,
            BlockHash::chain(Some(BlockHash::chain(None, &[9])), &[4, 5, 6])
        );
    }
}
