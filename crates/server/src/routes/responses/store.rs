//! Stored responses (`store: true`, the default): what `GET
//! /v1/responses/{id}` answers and what `previous_response_id` continues.
//! Held in memory, bounded twice: in all (`MAX_BYTES`) and per scope (an
//! API key's tenant, else the key, else everyone when auth is off:
//! `SCOPE_BYTES`), so one tenant's traffic cannot push out every other's.
//! Past a bound the least recently used response of the scope (or of all)
//! goes. A scope sees only its own responses.
//!
//! moka (the response cache's store) bounds one cache; a bound per scope
//! over a shared total needs the two orders kept here.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::Value;

/// Most bytes of stored responses in all.
pub const MAX_BYTES: usize = 256 << 20;
/// Most bytes of stored responses per scope.
pub const SCOPE_BYTES: usize = 64 << 20;

/// A stored response.
#[derive(Debug)]
pub struct Stored {
    /// The response object as answered.
    pub response: Value,
    /// The conversation up to and including its output, as chat messages
    /// (what a response continuing it puts first).
    pub context: Vec<Value>,
}

impl Stored {
    /// Its size: the JSON it holds.
    fn bytes(&self) -> usize {
        let size = |v: &Value| serde_json::to_vec(v).map_or(0, |b| b.len());
        size(&self.response) + self.context.iter().map(size).sum::<usize>()
    }
}

/// The bounded store.
#[derive(Debug)]
pub struct ResponseStore {
    max_bytes: usize,
    scope_bytes: usize,
    inner: Mutex<Inner>,
}

type Key = (String, String);

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    /// Use order over all (oldest first).
    order: BTreeMap<u64, Key>,
    /// Per scope: bytes and use order.
    scopes: HashMap<String, Scope>,
    bytes: usize,
    clock: u64,
}

#[derive(Debug)]
struct Entry {
    stored: Arc<Stored>,
    bytes: usize,
    used: u64,
}

#[derive(Debug, Default)]
struct Scope {
    bytes: usize,
    order: BTreeMap<u64, String>,
}

impl Default for ResponseStore {
    fn default() -> Self {
        Self::new(MAX_BYTES, SCOPE_BYTES)
    }
}

impl ResponseStore {
    /// A store of at most `max_bytes`, `scope_bytes` per scope.
    pub fn new(max_bytes: usize, scope_bytes: usize) -> Self {
        Self {
            max_bytes,
            scope_bytes: scope_bytes.min(max_bytes),
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic under the lock leaves consistent maps: go on with them.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores `stored` as `id` of `scope`, making room; a response larger
    /// than a scope's bound is not kept (false).
    pub fn insert(&self, scope: &str, id: &str, stored: Stored) -> bool {
        let bytes = stored.bytes();
        if bytes > self.scope_bytes {
            return false;
        }
        let mut inner = self.lock();
        let key = (scope.to_string(), id.to_string());
        inner.remove(&key);
        while inner
            .scopes
            .get(scope)
            .is_some_and(|s| s.bytes + bytes > self.scope_bytes)
        {
            let oldest = inner
                .scopes
                .get(scope)
                .and_then(|s| s.order.values().next().cloned());
            match oldest {
                Some(old) => inner.remove(&(scope.to_string(), old)),
                None => break,
            };
        }
        while inner.bytes + bytes > self.max_bytes {
            let Some(oldest) = inner.order.values().next().cloned() else {
                break;
            };
            inner.remove(&oldest);
        }
        let used = inner.tick();
        inner.order.insert(used, key.clone());
        let s = inner.scopes.entry(scope.to_string()).or_default();
        s.bytes += bytes;
        s.order.insert(used, id.to_string());
        inner.bytes += bytes;
        let stored = Arc::new(stored);
        inner.entries.insert(
            key,
            Entry {
                stored,
                bytes,
                used,
            },
        );
        true
    }

    /// The response `id` of `scope` (now the most recently used).
    pub fn get(&self, scope: &str, id: &str) -> Option<Arc<Stored>> {
        let mut inner = self.lock();
        let key = (scope.to_string(), id.to_string());
        let old = inner.entries.get(&key)?.used;
        let used = inner.tick();
        inner.order.remove(&old);
        inner.order.insert(used, key.clone());
        if let Some(s) = inner.scopes.get_mut(scope) {
            s.order.remove(&old);
            s.order.insert(used, id.to_string());
        }
        let entry = inner.entries.get_mut(&key)?;
        entry.used = used;
        Some(entry.stored.clone())
    }

    /// Removes `id` of `scope`; whether it was there.
    pub fn remove(&self, scope: &str, id: &str) -> bool {
        self.lock()
            .remove(&(scope.to_string(), id.to_string()))
            .is_some()
    }

    /// Bytes held in all.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

impl Inner {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn remove(&mut self, key: &Key) -> Option<Arc<Stored>> {
        let entry = self.entries.remove(key)?;
        self.order.remove(&entry.used);
        self.bytes -= entry.bytes;
        if let Some(s) = self.scopes.get_mut(&key.0) {
            s.bytes -= entry.bytes;
            s.order.remove(&entry.used);
            if s.order.is_empty() {
                self.scopes.remove(&key.0);
            }
        }
        Some(entry.stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A response of about `n` bytes.
    fn sized(n: usize) -> Stored {
        Stored {
            response: json!("x".repeat(n.saturating_sub(2))),
            context: Vec::new(),
        }
    }

    #[test]
    fn scopes_see_only_their_own() {
        let store = ResponseStore::new(1000, 1000);
        assert!(store.insert("a", "resp_1", sized(10)));
        assert!(store.get("a", "resp_1").is_some());
        assert!(store.get("b", "resp_1").is_none());
        assert!(!store.remove("b", "resp_1"));
        assert!(store.remove("a", "resp_1"));
        assert!(store.get("a", "resp_1").is_none());
        assert_eq!(store.bytes(), 0);
    }

    #[test]
    fn a_scope_over_its_bound_loses_its_least_recently_used() {
        let store = ResponseStore::new(1000, 300);
        for id in ["1", "2", "3"] {
            store.insert("a", id, sized(100));
        }
        store.insert("b", "1", sized(100));
        // Reading 1 makes 2 the oldest of a.
        assert!(store.get("a", "1").is_some());
        store.insert("a", "4", sized(100));
        assert!(store.get("a", "2").is_none());
        for id in ["1", "3", "4"] {
            assert!(store.get("a", id).is_some(), "{id}");
        }
        assert!(store.get("b", "1").is_some(), "another scope keeps its own");
        assert_eq!(store.bytes(), 400);
    }

    #[test]
    fn the_total_bound_evicts_across_scopes() {
        let store = ResponseStore::new(300, 300);
        store.insert("a", "1", sized(100));
        store.insert("b", "1", sized(100));
        store.insert("c", "1", sized(100));
        store.insert("c", "2", sized(100));
        assert!(store.get("a", "1").is_none());
        assert!(store.get("b", "1").is_some());
        assert_eq!(store.bytes(), 300);
        assert!(!store.insert("a", "big", sized(301)), "too big to keep");
    }
}
