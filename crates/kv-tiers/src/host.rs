//! The host-memory tier: pages in a byte-bounded LRU.

use std::collections::{BTreeMap, HashMap};

use ingot_kv_cache::{PageData, PageKey};

/// Pages by last use, at most `capacity` bytes of payload.
#[derive(Debug, Default)]
pub struct HostTier {
    capacity: u64,
    bytes: u64,
    pages: HashMap<PageKey, (PageData, u64)>,
    lru: BTreeMap<u64, PageKey>,
    tick: u64,
}

impl HostTier {
    /// An empty tier of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            ..Self::default()
        }
    }

    /// Payload bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Pages held.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Whether no page is held.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Whether `key` is held.
    pub fn contains(&self, key: &PageKey) -> bool {
        self.pages.contains_key(key)
    }

    /// The page, marked as just used.
    pub fn get(&mut self, key: &PageKey) -> Option<PageData> {
        let (data, tick) = self.pages.get_mut(key)?;
        self.lru.remove(tick);
        self.tick += 1;
        *tick = self.tick;
        self.lru.insert(self.tick, *key);
        Some(data.clone())
    }

    /// Keeps `data` as `key` and returns the pages pushed out to make room
    /// (least recently used first). A page larger than the whole tier is
    /// returned at once.
    pub fn put(&mut self, key: PageKey, data: PageData) -> Vec<(PageKey, PageData)> {
        if self.get(&key).is_some() {
            return Vec::new();
        }
        let size = data.len() as u64;
        if size > self.capacity {
            return vec![(key, data)];
        }
        let mut out = Vec::new();
        while self.bytes + size > self.capacity {
            let Some((_, old)) = self.lru.pop_first() else {
                break;
            };
            if let Some((d, _)) = self.pages.remove(&old) {
                self.bytes -= d.len() as u64;
                out.push((old, d));
            }
        }
        self.tick += 1;
        self.lru.insert(self.tick, key);
        self.pages.insert(key, (data, self.tick));
        self.bytes += size;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_kv_cache::BlockHash;

    fn key(n: u64) -> PageKey {
        PageKey {
            prefix: BlockHash(n, 0),
            group: 0,
            part: 0,
        }
    }

    #[test]
    fn the_least_recently_used_pages_leave_first_and_bytes_stay_bounded() {
        let mut t = HostTier::new(300);
        let page = || PageData::from(vec![0u8; 100]);
        for n in 0..3 {
            assert!(t.put(key(n), page()).is_empty());
        }
        assert!(t.get(&key(0)).is_some());
        let out = t.put(key(3), page());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, key(1));
        assert_eq!((t.len(), t.bytes()), (3, 300));
        assert!(t.contains(&key(0)) && !t.contains(&key(1)));
        // Too large for the tier: handed straight back.
        assert_eq!(t.put(key(9), PageData::from(vec![0u8; 301])).len(), 1);
        assert!(!t.contains(&key(9)));
    }
}
