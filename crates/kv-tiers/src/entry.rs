//! A stored page: the bytes a disk file or a shared-store value holds.
//!
//! ```text
//! magic "INGOTKV1" (8) | namespace (32) | prefix (16) | group u32 LE |
//! part u32 LE | payload length u64 LE | BLAKE3 of the payload (32) | payload
//! ```
//!
//! The header names what the page is (so a file or value that landed under
//! the wrong name is never used) and the checksum catches a corrupt or
//! truncated one.

use ingot_kv_cache::{BlockHash, PageData, PageKey};

use crate::Namespace;

const MAGIC: &[u8; 8] = b"INGOTKV1";
/// Bytes before the payload.
pub const HEADER: usize = 8 + 32 + 16 + 4 + 4 + 8 + 32;

/// Why stored bytes were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// Shorter than its header says, or not an entry at all.
    #[error("truncated or not a KV page")]
    Truncated,
    /// Another model's, layout's or page's entry.
    #[error("the entry holds another page")]
    Mismatch,
    /// The payload does not match its checksum.
    #[error("checksum mismatch")]
    Corrupt,
}

/// The stored form of `data` as page `key` of `namespace`.
pub fn encode(namespace: &Namespace, key: &PageKey, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(namespace.as_bytes());
    out.extend_from_slice(&key.prefix.to_bytes());
    out.extend_from_slice(&key.group.to_le_bytes());
    out.extend_from_slice(&key.part.to_le_bytes());
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    out.extend_from_slice(blake3::hash(data).as_bytes());
    out.extend_from_slice(data);
    out
}

/// The payload of `bytes`, checked to be page `key` of `namespace`, whole.
pub fn decode(namespace: &Namespace, key: &PageKey, bytes: &[u8]) -> Result<PageData, EntryError> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return Err(EntryError::Truncated);
    }
    let (head, payload) = bytes.split_at(HEADER);
    let u32_at = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().unwrap_or_default());
    let mut prefix = [0u8; 16];
    prefix.copy_from_slice(&head[40..56]);
    let stored = PageKey {
        prefix: BlockHash::from_bytes(prefix),
        group: u32_at(56),
        part: u32_at(60),
    };
    if &head[8..40] != namespace.as_bytes() || stored != *key {
        return Err(EntryError::Mismatch);
    }
    let len = u64::from_le_bytes(head[64..72].try_into().unwrap_or_default());
    if len != payload.len() as u64 {
        return Err(EntryError::Truncated);
    }
    if blake3::hash(payload).as_bytes() != &head[72..104] {
        return Err(EntryError::Corrupt);
    }
    Ok(PageData::from(payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u64) -> PageKey {
        PageKey {
            prefix: BlockHash(n, n + 1),
            group: 1,
            part: 2,
        }
    }

    #[test]
    fn an_entry_decodes_to_its_payload_and_refuses_damage() {
        let ns = Namespace::of(&[("model", b"a")]);
        let bytes = encode(&ns, &key(7), &[1, 2, 3, 4]);
        assert_eq!(bytes.len(), HEADER + 4);
        assert_eq!(&*decode(&ns, &key(7), &bytes).unwrap(), &[1, 2, 3, 4]);
        assert_eq!(
            decode(&ns, &key(7), &bytes[..bytes.len() - 1]),
            Err(EntryError::Truncated)
        );
        assert_eq!(
            decode(&ns, &key(7), &bytes[..10]),
            Err(EntryError::Truncated)
        );
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(decode(&ns, &key(7), &flipped), Err(EntryError::Corrupt));
        assert_eq!(decode(&ns, &key(8), &bytes), Err(EntryError::Mismatch));
        let other = Namespace::of(&[("model", b"b")]);
        assert_eq!(decode(&other, &key(7), &bytes), Err(EntryError::Mismatch));
    }
}
