//! Block names for prefix caching: a 128-bit hash chained over blocks.
//!
//! Specified (docs/kv-cache.md, "Block names"), so that a name means the
//! same prefix in every process, after a restart and on every instance of
//! a fleet: the KV tiers key stored pages by it. `chain(parent, tokens)` is
//! the first 16 bytes of BLAKE3 over the parent's 16 bytes (16 zero bytes
//! for the first block) followed by each token id as 4 little-endian bytes;
//! the two halves are those bytes read as little-endian `u64`s.

/// Names the prefix ending with one full block. 128 bits, so collisions are
/// negligible at any cache size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64, pub u64);

impl BlockHash {
    /// The name of a block holding `tokens` after the prefix named `parent`.
    pub fn chain(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
        let mut h = blake3::Hasher::new();
        h.update(&parent.map_or([0; 16], BlockHash::to_bytes));
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        let digest = h.finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest.as_bytes()[..16]);
        BlockHash::from_bytes(bytes)
    }

    /// The 16 bytes of the name (as `chain` hashes a parent).
    pub fn to_bytes(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.0.to_le_bytes());
        out[8..].copy_from_slice(&self.1.to_le_bytes());
        out
    }

    /// The name of 16 bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> BlockHash {
        let half = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
        BlockHash(half(&bytes[..8]), half(&bytes[8..]))
    }

    /// The names of `tokens`' full blocks of `block_size`, in order.
    pub fn chain_all(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
        let mut parent = None;
        tokens
            .chunks_exact(block_size)
            .map(|chunk| {
                let name = BlockHash::chain(parent, chunk);
                parent = Some(name);
                name
            })
            .collect()
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
        assert_eq!(BlockHash::from_bytes(b.to_bytes()), b);
        assert_eq!(BlockHash::chain_all(&[1, 2, 3, 4, 5, 6, 7], 3), vec![a, b]);
    }

    /// The specification, computed independently: Python's `blake3`
    /// package, `blake3(bytes(16) + b"".join(t.to_bytes(4, "little") for t
    /// in (1, 2, 3))).digest()[:16].hex()`, and the same over the first
    /// name's 16 bytes followed by 4, 5, 6.
    #[test]
    fn names_follow_the_specification() {
        let a = BlockHash::chain(None, &[1, 2, 3]);
        let b = BlockHash::chain(Some(a), &[4, 5, 6]);
        let hex = |h: BlockHash| {
            h.to_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        assert_eq!(hex(a), SPEC_A);
        assert_eq!(hex(b), SPEC_B);
    }

    const SPEC_A: &str = "1ff9c4c4597a95309f94524a3701ebee";
    const SPEC_B: &str = "ce4573e8602ee0550a761a229d65015d";
}
