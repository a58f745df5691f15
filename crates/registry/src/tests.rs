#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{Budget, Loader, ModelSpec, ModelState, Registry, RegistryError};

/// Models named by id with fixed footprints; counts every call, keeps a
/// warm copy of half the footprint, fails models named `broken*`.
#[derive(Default)]
struct Fake {
    sizes: HashMap<String, u64>,
    loads: AtomicUsize,
    warm_loads: AtomicUsize,
    unloads: AtomicUsize,
    prefetches: Mutex<Vec<String>>,
    fronts: AtomicUsize,
    live: Arc<Mutex<Vec<String>>>,
}

struct FakeModel {
    id: String,
    live: Arc<Mutex<Vec<String>>>,
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.live.lock().unwrap().retain(|m| m != &self.id);
    }
}

fn fail(message: String) -> std::io::Error {
    std::io::Error::other(message)
}

impl Loader for Fake {
    /// The front is the id, upper-cased (what a tokenizer would be).
    type Front = String;
    type Model = FakeModel;
    type Warm = String;
    type Error = std::io::Error;

    fn front(&self, id: &str) -> Result<String, std::io::Error> {
        std::thread::sleep(Duration::from_millis(5));
        self.fronts.fetch_add(1, Ordering::SeqCst);
        Ok(id.to_uppercase())
    }

    fn footprint(&self, id: &str) -> Result<u64, std::io::Error> {
        self.sizes
            .get(id)
            .copied()
            .ok_or_else(|| fail(format!("no size for {id}")))
    }

    fn load(
        &self,
        id: &str,
        front: &String,
        warm: Option<String>,
    ) -> Result<FakeModel, std::io::Error> {
        assert_eq!(
            front,
            &id.to_uppercase(),
            "loaded with another model's front"
        );
        std::thread::sleep(Duration::from_millis(20));
        if id.starts_with("broken") {
            return Err(fail("bad file".into()));
        }
        self.loads.fetch_add(1, Ordering::SeqCst);
        if let Some(w) = warm {
            assert_eq!(w, id);
            self.warm_loads.fetch_add(1, Ordering::SeqCst);
        }
        let mut live = self.live.lock().unwrap();
        assert!(!live.contains(&id.to_string()), "{id} loaded twice");
        live.push(id.to_string());
        Ok(FakeModel {
            id: id.to_string(),
            live: self.live.clone(),
        })
    }

    fn prefetch(&self, id: &str) -> Result<u64, std::io::Error> {
        self.prefetches.lock().unwrap().push(id.to_string());
        Ok(self.sizes[id])
    }

    fn unload(&self, id: &str, model: FakeModel) -> Option<(String, u64)> {
        self.unloads.fetch_add(1, Ordering::SeqCst);
        drop(model);
        Some((id.to_string(), self.sizes[id] / 2))
    }
}

fn registry(models: &[(&str, u64)], device: u64, host: u64) -> Registry<Fake> {
    let fake = Fake {
        sizes: models.iter().map(|(m, s)| (m.to_string(), *s)).collect(),
        ..Fake::default()
    };
    let specs = models.iter().map(|(m, _)| ModelSpec::new(*m)).collect();
    Registry::new(
        fake,
        specs,
        Budget {
            device_bytes: device,
            host_bytes: host,
            load_wait: Duration::from_secs(5),
        },
    )
}

fn state(r: &Registry<Fake>, id: &str) -> ModelState {
    r.status().into_iter().find(|s| s.id == id).unwrap().state
}

#[tokio::test]
async fn loads_on_demand_and_evicts_the_least_recently_used() {
    let r = registry(&[("a", 40), ("b", 40), ("c", 40)], 100, 0);
    drop(r.acquire("a").await.unwrap());
    tokio::time::sleep(Duration::from_millis(5)).await;
    drop(r.acquire("b").await.unwrap());
    assert_eq!(r.used().0, 80);
    // c needs room: a was used longest ago.
    drop(r.acquire("c").await.unwrap());
    assert_eq!(state(&r, "a"), ModelState::Unloaded);
    assert_eq!(state(&r, "b"), ModelState::Loaded);
    assert_eq!(state(&r, "c"), ModelState::Loaded);
    assert_eq!(r.used().0, 80);
}

#[tokio::test]
async fn a_leased_model_is_never_evicted_and_no_room_is_an_error() {
    let r = registry(&[("a", 60), ("b", 60)], 100, 0);
    let held = r.acquire("a").await.unwrap();
    match r.acquire("b").await {
        Err(RegistryError::NoRoom { retry_after, .. }) => {
            assert!(retry_after >= Duration::from_secs(1))
        }
        other => panic!(
            "expected NoRoom, got {:?}",
            other.map(|l| l.id().to_string())
        ),
    }
    assert_eq!(state(&r, "a"), ModelState::Loaded);
    drop(held);
    assert_eq!(r.acquire("b").await.unwrap().id(), "b");
    assert_eq!(state(&r, "a"), ModelState::Unloaded);
}

#[tokio::test]
async fn a_model_larger_than_the_budget_is_refused_and_others_still_load() {
    let r = registry(&[("huge", 500), ("a", 10)], 100, 0);
    assert!(matches!(
        r.acquire("huge").await,
        Err(RegistryError::TooLarge { needed: 500, .. })
    ));
    assert!(r.acquire("a").await.is_ok());
}

#[tokio::test]
async fn unknown_names_list_what_exists_and_aliases_resolve() {
    let fake = Fake {
        sizes: HashMap::from([("a".to_string(), 1)]),
        ..Fake::default()
    };
    let mut spec = ModelSpec::new("a");
    spec.aliases = vec!["alpha".into()];
    let r = Registry::new(
        fake,
        vec![spec],
        Budget {
            device_bytes: 10,
            host_bytes: 0,
            load_wait: Duration::from_secs(5),
        },
    );
    assert_eq!(r.acquire("alpha").await.unwrap().id(), "a");
    let e = r.acquire("nope").await.err().unwrap();
    assert_eq!(
        e.to_string(),
        "the model 'nope' does not exist; available: a"
    );
}

#[tokio::test]
async fn concurrent_requests_share_one_load() {
    let r = registry(&[("a", 10)], 100, 0);
    let leases = futures_join(&r, "a", 8).await;
    assert!(leases.iter().all(|l| l.is_ok()));
    assert_eq!(r.inner_loads(), 1);
    assert_eq!(r.status()[0].in_flight, 8);
}

async fn futures_join(
    r: &Registry<Fake>,
    id: &str,
    n: usize,
) -> Vec<Result<crate::Lease<FakeModel>, RegistryError>> {
    let mut handles = Vec::new();
    for _ in 0..n {
        let r = r.clone();
        let id = id.to_string();
        handles.push(tokio::spawn(async move { r.acquire(&id).await }));
    }
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

impl Registry<Fake> {
    fn inner_loads(&self) -> usize {
        self.loader().loads.load(Ordering::SeqCst)
    }
}

#[tokio::test]
async fn a_failed_load_is_reported_and_frees_its_reservation() {
    let r = registry(&[("broken", 30), ("a", 80)], 100, 0);
    assert!(matches!(
        r.acquire("broken").await,
        Err(RegistryError::LoadFailed { .. })
    ));
    assert_eq!(r.used().0, 0);
    assert_eq!(state(&r, "broken"), ModelState::Unloaded);
    assert!(r.acquire("a").await.is_ok());
}

#[tokio::test]
async fn warm_copies_are_reused_within_the_host_budget() {
    // Warm copies are half the footprint: 20 each; the host holds one.
    let r = registry(&[("a", 40), ("b", 40), ("c", 40)], 50, 25);
    drop(r.acquire("a").await.unwrap());
    drop(r.acquire("b").await.unwrap()); // evicts a: warm copy of a
    assert_eq!(r.used().1, 20);
    drop(r.acquire("c").await.unwrap()); // evicts b: b's copy replaces a's
    assert_eq!(r.used().1, 20);
    drop(r.acquire("b").await.unwrap()); // from b's warm copy
    assert_eq!(r.loader().warm_loads.load(Ordering::SeqCst), 1);
    drop(r.acquire("a").await.unwrap()); // a's copy is gone: from the file
    assert_eq!(r.loader().warm_loads.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn idle_models_unload_unless_pinned_and_admin_unload_respects_leases() {
    let fake = Fake {
        sizes: HashMap::from([("a".to_string(), 10), ("b".to_string(), 10)]),
        ..Fake::default()
    };
    let mut a = ModelSpec::new("a");
    a.idle_timeout = Some(Duration::from_millis(50));
    let mut b = ModelSpec::new("b");
    b.idle_timeout = Some(Duration::from_millis(50));
    b.pinned = true;
    let r = Registry::new(
        fake,
        vec![a, b],
        Budget {
            device_bytes: 100,
            host_bytes: 0,
            load_wait: Duration::from_secs(5),
        },
    );
    drop(r.acquire("a").await.unwrap());
    drop(r.acquire("b").await.unwrap());
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(r.sweep_idle().await, 1);
    assert_eq!(state(&r, "a"), ModelState::Unloaded);
    assert_eq!(state(&r, "b"), ModelState::Loaded);
    let held = r.acquire("b").await.unwrap();
    assert!(matches!(
        r.unload("b").await,
        Err(RegistryError::InUse { in_flight: 1, .. })
    ));
    drop(held);
    r.unload("b").await.unwrap();
    assert_eq!(state(&r, "b"), ModelState::Unloaded);
    assert_eq!(r.used(), (0, 0));
}

#[tokio::test]
async fn a_hundred_switches_leak_nothing() {
    let r = registry(&[("a", 60), ("b", 60), ("c", 60)], 130, 70);
    let before = r.loader().live.lock().unwrap().len();
    for i in 0..100 {
        let id = ["a", "b", "c"][i % 3];
        drop(r.acquire(id).await.unwrap());
    }
    for id in ["a", "b", "c"] {
        r.unload(id).await.unwrap();
    }
    assert_eq!(r.used().0, 0);
    assert_eq!(r.loader().live.lock().unwrap().len(), before);
    assert!(r.used().1 <= 70);
}

#[tokio::test]
async fn models_in_demand_without_a_warm_copy_are_prefetched_once_per_window() {
    // No host budget: evicted models keep no warm copy.
    let r = registry(&[("a", 10), ("b", 10), ("c", 10)], 10, 0).with_prefetch(crate::Prefetch {
        window: Duration::from_secs(60),
        min_requests: 2,
        max_per_window: 1,
    });
    for m in ["a", "b", "a", "b", "c", "a"] {
        r.note_request(m);
        drop(r.acquire(m).await.unwrap());
        drop(r.acquire(m).await.unwrap()); // a second lease is not demand
    }
    // a is loaded; b (asked twice) and c (once) are not: b is prefetched.
    assert_eq!(r.prefetch_demanded().await, vec!["b".to_string()]);
    assert_eq!(
        *r.loader().prefetches.lock().unwrap(),
        vec!["b".to_string()]
    );
    // Not again within the window, and the per-window bound holds.
    for m in ["c", "a"] {
        r.note_request(m);
        drop(r.acquire(m).await.unwrap());
    }
    assert!(r.prefetch_demanded().await.is_empty());
}

#[tokio::test]
async fn prefetch_is_off_by_default() {
    let r = registry(&[("a", 10), ("b", 10)], 10, 0);
    for m in ["b", "a", "b", "a"] {
        r.note_request(m);
        drop(r.acquire(m).await.unwrap());
    }
    assert!(r.prefetch_demanded().await.is_empty());
}

#[tokio::test]
async fn a_front_is_built_once_and_never_loads_the_model() {
    let r = registry(&[("a", 10), ("b", 10)], 100, 0);
    let fronts = concurrent_fronts(&r, "a", 4).await;
    assert!(fronts
        .iter()
        .all(|(id, f)| &**id == "a" && f.as_str() == "A"));
    assert_eq!(r.loader().fronts.load(Ordering::SeqCst), 1);
    assert_eq!(r.loader().loads.load(Ordering::SeqCst), 0);
    assert!(r.status().iter().all(|s| s.state == ModelState::Unloaded));
    // Loading reuses the front built above.
    r.load("a").await.unwrap();
    assert_eq!(r.loader().fronts.load(Ordering::SeqCst), 1);
    assert!(matches!(
        r.front("nope").await,
        Err(RegistryError::Unknown { .. })
    ));
}

/// `n` concurrent `front` calls for `name`.
async fn concurrent_fronts(
    r: &Registry<Fake>,
    name: &str,
    n: usize,
) -> Vec<(Arc<str>, Arc<String>)> {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (r, name) = (r.clone(), name.to_string());
            tokio::spawn(async move { r.front(&name).await })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap().unwrap());
    }
    out
}

/// Start-up waits for a preloaded model however long it loads; a request
/// still waits at most `load_wait`.
#[tokio::test]
async fn preload_outlasts_the_request_wait() {
    let fake = Fake {
        sizes: [("big", 10), ("other", 10)]
            .map(|(m, s)| (m.to_string(), s))
            .into(),
        ..Fake::default()
    };
    let mut big = ModelSpec::new("big");
    big.preload = true;
    let r = Registry::new(
        fake,
        vec![big, ModelSpec::new("other")],
        Budget {
            device_bytes: 100,
            host_bytes: 0,
            // Shorter than the fake's 20 ms load.
            load_wait: Duration::from_millis(2),
        },
    );
    let failed = r.preload().await;
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(state(&r, "big"), ModelState::Loaded);
    assert!(matches!(
        r.acquire("other").await,
        Err(RegistryError::LoadTimeout { .. })
    ));
}
