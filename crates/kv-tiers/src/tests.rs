use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ingot_kv_cache::{BlockHash, LowerTiers, PageData, PageKey};

use crate::*;

fn key(name: BlockHash) -> PageKey {
    PageKey {
        prefix: name,
        group: 0,
        part: 0,
    }
}

fn page(n: u8) -> PageData {
    PageData::from(vec![n; 100])
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ingot-kv-tiers-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn pages_pushed_out_of_host_memory_land_on_disk_and_come_back() {
    let root = temp_dir("spill");
    let settings = TierSettings {
        host_bytes: 200,
        disk_path: Some(root.clone()),
        disk_bytes: 1 << 20,
    };
    let tiers = KvTiers::open(&settings, Namespace::of(&[("m", b"1")]), "m").unwrap();
    let names = BlockHash::chain_all(&[1, 2, 3, 4, 5, 6], 2);
    for (i, &n) in names.iter().enumerate() {
        tiers.keep(key(n), page(i as u8));
    }
    // Two fit in host memory; the oldest went to disk.
    let u = tiers.usage();
    assert_eq!((u.host_pages, u.disk_pages), (2, 1));
    assert!(names.iter().all(|&n| tiers.contains(&key(n))));
    tiers.disk().unwrap().flush();
    assert_eq!(&*tiers.fetch(&key(names[0])).unwrap(), &*page(0));
    assert_eq!(&*tiers.fetch(&key(names[2])).unwrap(), &*page(2));
    assert_eq!(tiers.usage().hits, [1, 1, 0]);
    assert!(tiers.fetch(&key(BlockHash(1, 1))).is_none());
    let _ = std::fs::remove_dir_all(&root);
}

/// A store in memory, counting commands; `down` makes every command fail.
#[derive(Default)]
struct MemoryStore {
    values: Mutex<HashMap<String, Vec<u8>>>,
    commands: Mutex<usize>,
    down: std::sync::atomic::AtomicBool,
}

impl MemoryStore {
    fn call(&self) -> Result<(), StoreError> {
        *self.commands.lock().unwrap() += 1;
        if self.down.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(StoreError("down".into()));
        }
        Ok(())
    }
}

impl SharedKvStore for MemoryStore {
    fn present(&self, keys: Vec<String>) -> BoxFuture<'_, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            self.call()?;
            let v = self.values.lock().unwrap();
            Ok(keys.iter().map(|k| v.contains_key(k)).collect())
        })
    }

    fn get(&self, keys: Vec<String>) -> BoxFuture<'_, Result<Vec<Option<Vec<u8>>>, StoreError>> {
        Box::pin(async move {
            self.call()?;
            let v = self.values.lock().unwrap();
            Ok(keys.iter().map(|k| v.get(k).cloned()).collect())
        })
    }

    fn put(&self, entries: Vec<(String, Vec<u8>)>) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            self.call()?;
            self.values.lock().unwrap().extend(entries);
            Ok(())
        })
    }
}

fn host_tiers(ns: &[u8]) -> Arc<KvTiers> {
    let settings = TierSettings {
        host_bytes: 1 << 20,
        ..TierSettings::default()
    };
    Arc::new(KvTiers::open(&settings, Namespace::of(&[("m", ns)]), "m").unwrap())
}

async fn published(store: &MemoryStore, n: usize) {
    for _ in 0..1000 {
        if store.values.lock().unwrap().len() >= n {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{n} pages were not published");
}

#[tokio::test(flavor = "current_thread")]
async fn an_instance_fetches_what_another_published() {
    let store = Arc::new(MemoryStore::default());
    let (a, b) = (host_tiers(b"x"), host_tiers(b"x"));
    let _share_a = SharedKv::start(store.clone(), a.clone(), 2, vec![1], 100);
    let share_b = SharedKv::start(store.clone(), b.clone(), 2, vec![1], 100);
    let prompt = [1, 2, 3, 4, 5, 6, 7];
    let names = BlockHash::chain_all(&prompt, 2);
    for (i, &n) in names.iter().enumerate() {
        a.publish(key(n), page(i as u8));
    }
    published(&store, 3).await;
    let got = share_b.prefetch(&prompt).await;
    assert_eq!(
        (got.local_blocks, got.offered_blocks, got.fetched_blocks),
        (0, 3, 3)
    );
    assert_eq!(&*b.fetch(&key(names[1])).unwrap(), &*page(1));
    assert_eq!(b.usage().hits[2], 3);
    // Held locally now: nothing more is asked of the store.
    let before = *store.commands.lock().unwrap();
    assert_eq!(share_b.prefetch(&prompt).await.local_blocks, 3);
    assert_eq!(*store.commands.lock().unwrap(), before);
}

#[tokio::test(flavor = "current_thread")]
async fn another_namespace_a_corrupt_value_and_a_dead_store_cost_only_recomputation() {
    let store = Arc::new(MemoryStore::default());
    let a = host_tiers(b"x");
    let _share_a = SharedKv::start(store.clone(), a.clone(), 2, vec![1], 100);
    let prompt = [1, 2, 3, 4, 5, 6, 7];
    let names = BlockHash::chain_all(&prompt, 2);
    for (i, &n) in names.iter().enumerate() {
        a.publish(key(n), page(i as u8));
    }
    published(&store, 3).await;
    // Another model's instance finds nothing under its namespace.
    let other = host_tiers(b"y");
    let share_other = SharedKv::start(store.clone(), other.clone(), 2, vec![1], 100);
    assert_eq!(share_other.prefetch(&prompt).await.offered_blocks, 0);
    // A flipped byte in the second block: only the first is fetched.
    {
        let mut v = store.values.lock().unwrap();
        let k = v
            .keys()
            .find(|k| k.ends_with(&format!("{}-0-0", disk::hex(&names[1].to_bytes()))))
            .cloned()
            .unwrap();
        if let Some(b) = v.get_mut(&k).unwrap().last_mut() {
            *b ^= 1;
        }
    }
    let b = host_tiers(b"x");
    let share_b = SharedKv::start(store.clone(), b.clone(), 2, vec![1], 100);
    assert_eq!(share_b.prefetch(&prompt).await.fetched_blocks, 1);
    assert_eq!(b.usage().errors, 1);
    // The store down: nothing fetched, nothing fails.
    store.down.store(true, std::sync::atomic::Ordering::Relaxed);
    let c = host_tiers(b"x");
    let share_c = SharedKv::start(store.clone(), c.clone(), 2, vec![1], 100);
    assert_eq!(share_c.prefetch(&prompt).await, Prefetched::default());
    c.publish(key(BlockHash(5, 5)), page(9));
    assert!(c.contains(&key(BlockHash(5, 5))));
}

#[tokio::test(flavor = "current_thread")]
async fn a_prefix_cheaper_to_recompute_is_not_fetched() {
    let store = Arc::new(MemoryStore::default());
    let a = host_tiers(b"x");
    let _share_a = SharedKv::start(store.clone(), a.clone(), 2, vec![1], 100);
    let prompt = [1, 2, 3, 4, 5];
    for &n in &BlockHash::chain_all(&prompt, 2) {
        a.publish(key(n), page(1));
    }
    published(&store, 2).await;
    let b = host_tiers(b"x");
    // A prefill of a nanosecond per token beats any store.
    b.note_prefill(1000, std::time::Duration::from_micros(1));
    let share_b = SharedKv::start(store.clone(), b.clone(), 2, vec![1], 100);
    let got = share_b.prefetch(&prompt).await;
    assert_eq!((got.offered_blocks, got.fetched_blocks), (2, 0));
}
