//! The local-disk tier: one file per page under a directory of the
//! model's namespace, size-bounded, kept across restarts.
//!
//! Writes go through a background thread (the engine only queues them);
//! until a write lands the page is served from the queue. At start the
//! directory is listed (names and sizes only; a file is checked when read),
//! so pages written by an earlier run of the same model and settings are
//! found, and those of any other namespace are never looked at.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use ingot_kv_cache::{BlockHash, PageData, PageKey};

use crate::entry::{self, HEADER};
use crate::Namespace;

/// Pages in files, at most `capacity` bytes of them.
pub struct DiskTier {
    dir: PathBuf,
    shared: Arc<Shared>,
    writer: Mutex<Sender<(PageKey, PageData)>>,
}

struct Shared {
    state: Mutex<DiskState>,
    /// Signalled when the write queue empties.
    drained: Condvar,
    namespace: Namespace,
}

#[derive(Default)]
struct DiskState {
    capacity: u64,
    bytes: u64,
    /// Page → (file bytes, LRU tick).
    index: HashMap<PageKey, (u64, u64)>,
    lru: BTreeMap<u64, PageKey>,
    tick: u64,
    /// Queued for writing.
    pending: HashMap<PageKey, PageData>,
    /// Failed writes and reads, refused files.
    errors: u64,
}

/// What reading a page from disk found.
pub enum DiskRead {
    /// The page, checked.
    Found(PageData),
    /// Not on disk.
    Missing,
    /// On disk but unreadable, truncated or corrupt (now deleted).
    Refused,
}

impl DiskTier {
    /// Opens (creating) `root/<namespace>` with room for `capacity` bytes,
    /// indexing the pages an earlier run left there.
    pub fn open(root: &Path, namespace: Namespace, capacity: u64) -> std::io::Result<Self> {
        let dir = root.join(namespace.hex());
        std::fs::create_dir_all(&dir)?;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            match (
                name.strip_suffix(".kv").and_then(parse_name),
                entry.metadata(),
            ) {
                (Some(key), Ok(meta)) if meta.is_file() => {
                    let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                    found.push((modified, key, meta.len()));
                }
                // Half-written files of a run that stopped.
                _ if name.ends_with(".tmp") => {
                    let _ = std::fs::remove_file(&path);
                }
                _ => {}
            }
        }
        found.sort();
        let mut state = DiskState {
            capacity,
            ..DiskState::default()
        };
        for (_, key, len) in found {
            state.insert(key, len);
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            drained: Condvar::new(),
            namespace,
        });
        let evicted = shared.lock().evict_over_capacity();
        remove_files(&dir, &evicted);
        let (tx, rx) = channel::<(PageKey, PageData)>();
        let (writer_dir, writer_shared) = (dir.clone(), shared.clone());
        std::thread::Builder::new()
            .name("ingot-kv-disk".into())
            .spawn(move || {
                for (key, data) in rx {
                    writer_shared.write(&writer_dir, key, &data);
                }
            })?;
        Ok(Self {
            dir,
            shared,
            writer: Mutex::new(tx),
        })
    }

    /// The directory of this namespace's pages.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether `key` is on disk or queued for it.
    pub fn contains(&self, key: &PageKey) -> bool {
        let s = self.shared.lock();
        s.pending.contains_key(key) || s.index.contains_key(key)
    }

    /// Queues `data` for writing as `key` (nothing when it is there).
    pub fn put(&self, key: PageKey, data: PageData) {
        {
            let mut s = self.shared.lock();
            if s.pending.contains_key(&key) || s.index.contains_key(&key) {
                return;
            }
            s.pending.insert(key, data.clone());
        }
        let sent = self
            .writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send((key, data));
        if sent.is_err() {
            let mut s = self.shared.lock();
            s.pending.remove(&key);
            s.errors += 1;
        }
    }

    /// Reads and checks `key`.
    pub fn read(&self, key: &PageKey) -> DiskRead {
        {
            let mut s = self.shared.lock();
            if let Some(data) = s.pending.get(key) {
                return DiskRead::Found(data.clone());
            }
            if !s.touch(key) {
                return DiskRead::Missing;
            }
        }
        let path = self.dir.join(file_name(key));
        let checked = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                entry::decode(&self.shared.namespace, key, &b).map_err(|e| e.to_string())
            });
        match checked {
            Ok(data) => DiskRead::Found(data),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "KV page on disk refused; recomputing it");
                let _ = std::fs::remove_file(&path);
                let mut s = self.shared.lock();
                s.forget(key);
                s.errors += 1;
                DiskRead::Refused
            }
        }
    }

    /// Bytes of the files held.
    pub fn bytes(&self) -> u64 {
        self.shared.lock().bytes
    }

    /// Pages held (written or queued).
    pub fn len(&self) -> usize {
        let s = self.shared.lock();
        s.index.len() + s.pending.len()
    }

    /// Whether no page is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Failed writes and refused reads so far.
    pub fn errors(&self) -> u64 {
        self.shared.lock().errors
    }

    /// Waits until every queued page is written (tests, shutdown).
    pub fn flush(&self) {
        let mut s = self.shared.lock();
        while !s.pending.is_empty() {
            s = self
                .shared
                .drained
                .wait(s)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for DiskTier {
    /// Pages queued for writing land before the tier goes (a server that
    /// stops finds them at its next start).
    fn drop(&mut self) {
        self.flush();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes one page (a temporary file renamed into place, so a crash
    /// never leaves a half page under a page's name), then evicts.
    fn write(&self, dir: &Path, key: PageKey, data: &PageData) {
        let bytes = entry::encode(&self.namespace, &key, data);
        let path = dir.join(file_name(&key));
        let tmp = path.with_extension("tmp");
        let written = std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &path));
        let evicted = {
            let mut s = self.lock();
            s.pending.remove(&key);
            match written {
                Ok(()) => s.insert(key, bytes.len() as u64),
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "cannot write a KV page to disk");
                    let _ = std::fs::remove_file(&tmp);
                    s.errors += 1;
                }
            }
            let evicted = s.evict_over_capacity();
            if s.pending.is_empty() {
                self.drained.notify_all();
            }
            evicted
        };
        remove_files(dir, &evicted);
    }
}

impl DiskState {
    fn insert(&mut self, key: PageKey, len: u64) {
        self.forget(&key);
        self.tick += 1;
        self.index.insert(key, (len, self.tick));
        self.lru.insert(self.tick, key);
        self.bytes += len;
    }

    fn touch(&mut self, key: &PageKey) -> bool {
        let Some((_, tick)) = self.index.get_mut(key) else {
            return false;
        };
        self.lru.remove(tick);
        self.tick += 1;
        *tick = self.tick;
        self.lru.insert(self.tick, *key);
        true
    }

    fn forget(&mut self, key: &PageKey) {
        if let Some((len, tick)) = self.index.remove(key) {
            self.lru.remove(&tick);
            self.bytes -= len;
        }
    }

    /// Drops the least recently used pages past the capacity; their files
    /// are the caller's to delete.
    fn evict_over_capacity(&mut self) -> Vec<PageKey> {
        let mut out = Vec::new();
        while self.bytes > self.capacity {
            let Some((_, key)) = self.lru.pop_first() else {
                break;
            };
            if let Some((len, _)) = self.index.remove(&key) {
                self.bytes -= len;
            }
            out.push(key);
        }
        out
    }
}

fn remove_files(dir: &Path, keys: &[PageKey]) {
    for key in keys {
        let _ = std::fs::remove_file(dir.join(file_name(key)));
    }
}

/// `<prefix as 32 hex digits>-<group>-<part>`: a page's name in files
/// and in the shared store's keys.
pub(crate) fn page_stem(key: &PageKey) -> String {
    format!("{}-{}-{}", hex(&key.prefix.to_bytes()), key.group, key.part)
}

/// `<page stem>.kv`.
fn file_name(key: &PageKey) -> String {
    format!("{}.kv", page_stem(key))
}

fn parse_name(stem: &str) -> Option<PageKey> {
    let mut parts = stem.split('-');
    let prefix = parts.next().filter(|p| p.len() == 32)?;
    let group = parts.next()?.parse().ok()?;
    let part = parts.next()?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    let mut bytes = [0u8; 16];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(prefix.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(PageKey {
        prefix: BlockHash::from_bytes(bytes),
        group,
        part,
    })
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes a page of `payload` bytes takes on disk.
pub fn file_bytes(payload: usize) -> u64 {
    (HEADER + payload) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u64) -> PageKey {
        PageKey {
            prefix: BlockHash(n, u64::MAX - n),
            group: 1,
            part: 0,
        }
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ingot-kv-disk-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn page(n: u8) -> PageData {
        PageData::from(vec![n; 1000])
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(
            parse_name(file_name(&key(42)).strip_suffix(".kv").unwrap()),
            Some(key(42))
        );
        assert_eq!(parse_name("abc-1-2"), None);
    }

    #[test]
    fn pages_survive_a_restart_and_stay_within_the_budget() {
        let root = temp_dir("restart");
        let ns = Namespace::of(&[("model", b"m")]);
        let room = 3 * file_bytes(1000);
        {
            let disk = DiskTier::open(&root, ns, room).unwrap();
            for n in 0..4 {
                disk.put(key(n), page(n as u8));
            }
            disk.flush();
            assert_eq!(disk.len(), 3);
            assert!(disk.bytes() <= room);
            assert!(!disk.contains(&key(0)));
        }
        let disk = DiskTier::open(&root, ns, room).unwrap();
        assert_eq!(disk.len(), 3);
        match disk.read(&key(3)) {
            DiskRead::Found(d) => assert_eq!(&*d, &*page(3)),
            _ => panic!("page 3 is on disk"),
        }
        // Another namespace sees nothing of it.
        let other = DiskTier::open(&root, Namespace::of(&[("model", b"n")]), room).unwrap();
        assert!(other.is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_damaged_file_is_refused_deleted_and_counted() {
        let root = temp_dir("damaged");
        let ns = Namespace::of(&[("model", b"m")]);
        let disk = DiskTier::open(&root, ns, 1 << 20).unwrap();
        disk.put(key(1), page(1));
        disk.put(key(2), page(2));
        disk.flush();
        let path = disk.dir().join(file_name(&key(1)));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER + 10] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let cut = disk.dir().join(file_name(&key(2)));
        std::fs::write(&cut, &std::fs::read(&cut).unwrap()[..500]).unwrap();
        assert!(matches!(disk.read(&key(1)), DiskRead::Refused));
        assert!(matches!(disk.read(&key(2)), DiskRead::Refused));
        assert!(matches!(disk.read(&key(1)), DiskRead::Missing));
        assert!(!path.exists());
        assert_eq!(disk.errors(), 2);
        let _ = std::fs::remove_dir_all(&root);
    }
}
