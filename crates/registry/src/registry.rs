//! The registry: which models are resident, and who holds them.
//!
//! All decisions (what to evict, what to reserve) are made under one lock
//! and are cheap; everything slow (reading a model's size, loading,
//! unloading) runs on blocking threads outside it. A load first unloads
//! the models it evicted, so on a GPU the old weights are gone before the
//! new ones arrive.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::error::RegistryError;
use crate::lease::Lease;
use crate::loader::{describe, Loader};
use crate::metrics;
use crate::spec::{Budget, ModelSpec, Prefetch};

/// When a refusal for lack of room suggests retrying: busy models finish
/// their requests in seconds, and an idle one frees room at once.
const NO_ROOM_RETRY: Duration = Duration::from_secs(2);

/// Where a model is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelState {
    /// Not on the device (a warm host copy may exist).
    Unloaded,
    /// Being loaded.
    Loading,
    /// Ready to serve.
    Loaded,
}

impl ModelState {
    /// Lower-case name (metrics, JSON).
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Unloaded => "unloaded",
            ModelState::Loading => "loading",
            ModelState::Loaded => "loaded",
        }
    }
}

/// One model's state, for `/v1/models` and the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelStatus {
    /// The id.
    pub id: String,
    /// Other names.
    pub aliases: Vec<String>,
    /// Where it is.
    pub state: ModelState,
    /// Never evicted.
    pub pinned: bool,
    /// Requests holding it.
    pub in_flight: usize,
    /// Device bytes it holds (reserved while loading).
    pub device_bytes: u64,
    /// Bytes of its warm host copy.
    pub host_bytes: u64,
    /// Since its last request ended (or it loaded).
    pub idle_for: Duration,
}

/// Every configured model and the memory they hold. Cheap to clone.
pub struct Registry<L: Loader> {
    inner: Arc<Inner<L>>,
}

impl<L: Loader> Clone for Registry<L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<L: Loader> {
    loader: Arc<L>,
    budget: Budget,
    prefetch: Prefetch,
    state: Mutex<State<L>>,
}

struct State<L: Loader> {
    entries: Vec<Entry<L>>,
    /// Device bytes of loaded and loading models.
    device_used: u64,
    /// Bytes of warm host copies.
    host_used: u64,
}

struct Entry<L: Loader> {
    spec: ModelSpec,
    id: Arc<str>,
    slot: Slot<L>,
    /// The loader's answer, asked once.
    footprint: Option<u64>,
    pinned: bool,
    last_used: Arc<Mutex<Instant>>,
    warm: Option<(L::Warm, u64)>,
    /// When it was asked for, within the prefetch window.
    demand: VecDeque<Instant>,
    /// When it was last prefetched.
    prefetched: Option<Instant>,
    /// Its front, once built (kept across loads and unloads). The mutex is
    /// held while building, so concurrent first requests build it once.
    front: FrontSlot<L>,
}

/// A model's front, built on first use.
type FrontSlot<L> = Arc<Mutex<Option<Arc<<L as Loader>::Front>>>>;

/// The result of a load as waiters see it (`None` while it runs).
type LoadDone = Option<Result<(), String>>;

enum Slot<L: Loader> {
    Unloaded,
    Loading(watch::Receiver<LoadDone>),
    Loaded(Arc<L::Model>),
}

/// What `acquire` does next, decided under the lock.
enum Step<M> {
    Ready(Lease<M>),
    Wait(watch::Receiver<LoadDone>),
    Measure(Arc<str>),
}

/// A model taken off the device, to be unloaded outside the lock.
struct Victim<M> {
    id: Arc<str>,
    model: Arc<M>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn idle_for(last_used: &Mutex<Instant>) -> Duration {
    lock(last_used).elapsed()
}

impl<L: Loader> Registry<L> {
    /// A registry of `specs` (all unloaded) under `budget`.
    pub fn new(loader: L, specs: Vec<ModelSpec>, budget: Budget) -> Self {
        let entries = specs
            .into_iter()
            .map(|spec| Entry {
                id: Arc::from(spec.id.as_str()),
                pinned: spec.pinned,
                spec,
                slot: Slot::Unloaded,
                footprint: None,
                last_used: Arc::new(Mutex::new(Instant::now())),
                warm: None,
                demand: VecDeque::new(),
                prefetched: None,
                front: Arc::default(),
            })
            .collect();
        Self {
            inner: Arc::new(Inner {
                loader: Arc::new(loader),
                budget,
                prefetch: Prefetch::default(),
                state: Mutex::new(State {
                    entries,
                    device_used: 0,
                    host_used: 0,
                }),
            }),
        }
    }

    /// The registry with prefetching configured (off by default). Call
    /// before the registry is cloned.
    pub fn with_prefetch(mut self, prefetch: Prefetch) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.prefetch = prefetch;
        }
        self
    }

    /// Describes the registry's series and exports every model's state and
    /// bytes and the budget. Call once the metrics recorder is installed
    /// (until then the facade drops everything).
    pub fn publish(&self) {
        metrics::describe();
        metrics::budget(self.inner.budget.device_bytes);
        for s in self.status() {
            metrics::zero(&s.id);
            metrics::state(&s.id, s.state);
            metrics::bytes(&s.id, s.device_bytes, s.host_bytes);
        }
    }

    /// The model `name` (an id or alias), loaded if need be while the
    /// caller waits (at most the budget's `load_wait`).
    pub async fn acquire(&self, name: &str) -> Result<Lease<L::Model>, RegistryError> {
        self.acquire_within(name, Some(self.inner.budget.load_wait))
            .await
    }

    /// [`Self::acquire`], waiting for a load at most `wait` (`None`: until
    /// it ends, as start-up does: a large model may take minutes).
    async fn acquire_within(
        &self,
        name: &str,
        wait: Option<Duration>,
    ) -> Result<Lease<L::Model>, RegistryError> {
        let started = Instant::now();
        let mut waited = false;
        loop {
            let step = self.step(name)?;
            match step {
                Step::Ready(lease) => {
                    if waited {
                        metrics::waited(lease.id(), started.elapsed());
                    }
                    return Ok(lease);
                }
                Step::Measure(id) => self.measure(&id).await?,
                Step::Wait(mut done) => {
                    waited = true;
                    let id = self.resolve(name)?;
                    let loaded = done.wait_for(Option::is_some);
                    let finished = match wait {
                        Some(wait) => {
                            tokio::time::timeout(wait.saturating_sub(started.elapsed()), loaded)
                                .await
                        }
                        None => Ok(loaded.await),
                    };
                    match finished {
                        Err(_) => {
                            return Err(RegistryError::LoadTimeout {
                                id: id.to_string(),
                                waited: started.elapsed(),
                            })
                        }
                        Ok(Ok(result)) => {
                            if let Some(Err(message)) = result.as_ref() {
                                return Err(RegistryError::LoadFailed {
                                    id: id.to_string(),
                                    message: message.clone(),
                                });
                            }
                        }
                        // The load task is gone without an answer; the
                        // slot says what happened.
                        Ok(Err(_)) => {}
                    }
                }
            }
        }
    }

    /// The front of the model `name` (an id or alias) and its id: built on
    /// first use (on a blocking thread), then shared. Never loads, wakes or
    /// touches the model's engine.
    pub async fn front(&self, name: &str) -> Result<(Arc<str>, Arc<L::Front>), RegistryError> {
        let (id, slot) = {
            let st = lock(&self.inner.state);
            let e = &st.entries[st.index(name)?];
            (e.id.clone(), e.front.clone())
        };
        // Never wait on the slot here: a build holds it on a blocking thread.
        if let Some(front) = slot.try_lock().ok().and_then(|f| f.clone()) {
            return Ok((id, front));
        }
        let loader = self.inner.loader.clone();
        let key = id.clone();
        let built = tokio::task::spawn_blocking(move || build_front(&*loader, &key, &slot))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        let front = built.map_err(|message| RegistryError::LoadFailed {
            id: id.to_string(),
            message,
        })?;
        Ok((id, front))
    }

    /// The front of `name` if one was built already (never builds one).
    pub fn built_front(&self, name: &str) -> Option<Arc<L::Front>> {
        let slot = {
            let st = lock(&self.inner.state);
            st.entries[st.index(name).ok()?].front.clone()
        };
        // Held only while a front is being built: then there is none yet.
        let front = slot.try_lock().ok()?.clone();
        front
    }

    /// Counts a client request for `name` (an unknown name is ignored):
    /// the demand prefetching follows. Call once per request, whatever
    /// number of leases it takes.
    pub fn note_request(&self, name: &str) {
        if self.inner.prefetch.max_per_window == 0 {
            return;
        }
        let mut st = lock(&self.inner.state);
        if let Ok(i) = st.index(name) {
            st.entries[i].note_demand(Instant::now(), self.inner.prefetch.window);
        }
    }

    /// Loads `name` now (the admin API and preload).
    pub async fn load(&self, name: &str) -> Result<(), RegistryError> {
        self.acquire(name).await.map(drop)
    }

    /// Loads every model marked `preload`, each for as long as its load
    /// takes (never the requests' `load_wait`); returns the failures.
    pub async fn preload(&self) -> Vec<RegistryError> {
        let ids: Vec<String> = lock(&self.inner.state)
            .entries
            .iter()
            .filter(|e| e.spec.preload)
            .map(|e| e.spec.id.clone())
            .collect();
        let mut failed = Vec::new();
        for id in ids {
            if let Err(e) = self.acquire_within(&id, None).await.map(drop) {
                tracing::error!(model = %id, error = %e, "preload failed");
                failed.push(e);
            }
        }
        failed
    }

    /// Unloads `name` unless requests hold it (the admin API).
    pub async fn unload(&self, name: &str) -> Result<(), RegistryError> {
        let victim = {
            let mut st = lock(&self.inner.state);
            let i = st.index(name)?;
            let e = &st.entries[i];
            match &e.slot {
                Slot::Unloaded => return Ok(()),
                Slot::Loading(_) => {
                    return Err(RegistryError::InUse {
                        id: e.spec.id.clone(),
                        in_flight: 0,
                    })
                }
                Slot::Loaded(m) if Arc::strong_count(m) > 1 => {
                    return Err(RegistryError::InUse {
                        id: e.spec.id.clone(),
                        in_flight: Arc::strong_count(m) - 1,
                    })
                }
                Slot::Loaded(_) => st.take(i, "admin"),
            }
        };
        if let Some(victim) = victim {
            let this = self.clone();
            let _ = tokio::task::spawn_blocking(move || this.release(victim)).await;
        }
        Ok(())
    }

    /// Pins or unpins `name`.
    pub fn set_pinned(&self, name: &str, pinned: bool) -> Result<(), RegistryError> {
        let mut st = lock(&self.inner.state);
        let i = st.index(name)?;
        st.entries[i].pinned = pinned;
        Ok(())
    }

    /// Unloads every unpinned model idle past its idle timeout; returns
    /// how many.
    pub async fn sweep_idle(&self) -> usize {
        let victims: Vec<_> = {
            let mut st = lock(&self.inner.state);
            let idle: Vec<usize> = st
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| {
                    let expired = e
                        .spec
                        .idle_timeout
                        .is_some_and(|t| idle_for(&e.last_used) > t);
                    expired && !e.pinned && e.evictable()
                })
                .map(|(i, _)| i)
                .collect();
            idle.into_iter()
                .filter_map(|i| st.take(i, "idle"))
                .collect()
        };
        let n = victims.len();
        if n > 0 {
            let this = self.clone();
            let _ = tokio::task::spawn_blocking(move || {
                for v in victims {
                    this.release(v);
                }
            })
            .await;
        }
        n
    }

    /// Runs [`Self::sweep_idle`] and [`Self::prefetch_demanded`] every
    /// `period` until the registry is dropped.
    pub fn spawn_idle_sweeper(&self, period: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner<L>> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let registry = Registry { inner };
                registry.sweep_idle().await;
                registry.prefetch_demanded().await;
            }
        })
    }

    /// Prefetches the models most asked for within the window (at least
    /// `min_requests` times) that are unloaded with no warm copy and were
    /// not prefetched within it: at most `max_per_window` per window.
    /// Returns the ids prefetched.
    pub async fn prefetch_demanded(&self) -> Vec<String> {
        let p = self.inner.prefetch;
        if p.max_per_window == 0 {
            return Vec::new();
        }
        let chosen: Vec<Arc<str>> = {
            let mut st = lock(&self.inner.state);
            let now = Instant::now();
            let recent = st
                .entries
                .iter()
                .filter(|e| {
                    e.prefetched
                        .is_some_and(|t| now.duration_since(t) < p.window)
                })
                .count();
            let mut wanted: Vec<(usize, usize)> = st
                .entries
                .iter_mut()
                .enumerate()
                .filter_map(|(i, e)| {
                    e.note_demand_expiry(now, p.window);
                    let cold = matches!(e.slot, Slot::Unloaded) && e.warm.is_none();
                    let fresh = e
                        .prefetched
                        .is_some_and(|t| now.duration_since(t) < p.window);
                    (cold && !fresh && e.demand.len() >= p.min_requests)
                        .then_some((i, e.demand.len()))
                })
                .collect();
            wanted.sort_by_key(|w| std::cmp::Reverse(w.1));
            wanted
                .into_iter()
                .take(p.max_per_window.saturating_sub(recent))
                .map(|(i, _)| {
                    st.entries[i].prefetched = Some(now);
                    st.entries[i].id.clone()
                })
                .collect()
        };
        let mut done = Vec::new();
        for id in chosen {
            let loader = self.inner.loader.clone();
            let key = id.clone();
            let result = tokio::task::spawn_blocking(move || loader.prefetch(&key)).await;
            match result {
                Ok(Ok(bytes)) => {
                    metrics::prefetched(&id);
                    tracing::info!(model = %id, bytes, "model prefetched into host memory");
                    done.push(id.to_string());
                }
                Ok(Err(e)) => {
                    tracing::warn!(model = %id, error = %describe(&e), "prefetch failed")
                }
                Err(e) => tracing::warn!(model = %id, error = %e, "prefetch task failed"),
            }
        }
        done
    }

    /// Every model's state, in configuration order.
    pub fn status(&self) -> Vec<ModelStatus> {
        let st = lock(&self.inner.state);
        st.entries
            .iter()
            .map(|e| {
                let (state, in_flight) = match &e.slot {
                    Slot::Unloaded => (ModelState::Unloaded, 0),
                    Slot::Loading(_) => (ModelState::Loading, 0),
                    Slot::Loaded(m) => (ModelState::Loaded, Arc::strong_count(m) - 1),
                };
                let device_bytes = match state {
                    ModelState::Unloaded => 0,
                    _ => e.footprint.unwrap_or(0),
                };
                ModelStatus {
                    id: e.spec.id.clone(),
                    aliases: e.spec.aliases.clone(),
                    state,
                    pinned: e.pinned,
                    in_flight,
                    device_bytes,
                    host_bytes: e.warm.as_ref().map_or(0, |w| w.1),
                    idle_for: idle_for(&e.last_used),
                }
            })
            .collect()
    }

    /// Device bytes held by loaded and loading models; host bytes of warm
    /// copies.
    pub fn used(&self) -> (u64, u64) {
        let st = lock(&self.inner.state);
        (st.device_used, st.host_used)
    }

    /// The loader.
    pub fn loader(&self) -> &L {
        &self.inner.loader
    }

    /// The budget.
    pub fn budget(&self) -> Budget {
        self.inner.budget
    }

    /// The id `name` resolves to.
    pub fn resolve(&self, name: &str) -> Result<Arc<str>, RegistryError> {
        let st = lock(&self.inner.state);
        let i = st.index(name)?;
        Ok(st.entries[i].id.clone())
    }

    /// Decides the next step of `acquire` under the lock.
    fn step(&self, name: &str) -> Result<Step<L::Model>, RegistryError> {
        let mut st = lock(&self.inner.state);
        let i = st.index(name)?;
        let e = &st.entries[i];
        match &e.slot {
            Slot::Loaded(m) => {
                *lock(&e.last_used) = Instant::now();
                return Ok(Step::Ready(Lease::new(
                    m.clone(),
                    e.id.clone(),
                    e.last_used.clone(),
                )));
            }
            Slot::Loading(done) => return Ok(Step::Wait(done.clone())),
            Slot::Unloaded => {}
        }
        let Some(needed) = e.footprint else {
            return Ok(Step::Measure(e.id.clone()));
        };
        let budget = self.inner.budget.device_bytes;
        if needed > budget {
            return Err(RegistryError::TooLarge {
                id: e.spec.id.clone(),
                needed,
                budget,
            });
        }
        let victims = st.make_room(i, needed, budget)?;
        let (tx, rx) = watch::channel(None);
        let entry = &mut st.entries[i];
        entry.slot = Slot::Loading(rx.clone());
        metrics::state(&entry.spec.id, ModelState::Loading);
        metrics::bytes(&entry.spec.id, needed, 0);
        st.device_used += needed;
        let this = self.clone();
        let id = st.entries[i].id.clone();
        tokio::task::spawn_blocking(move || this.run_load(id, victims, tx));
        Ok(Step::Wait(rx))
    }

    /// Asks the loader for `id`'s footprint (outside the lock).
    async fn measure(&self, id: &Arc<str>) -> Result<(), RegistryError> {
        let loader = self.inner.loader.clone();
        let key = id.clone();
        let measured =
            tokio::task::spawn_blocking(move || loader.footprint(&key).map_err(|e| describe(&e)))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
        let bytes = measured.map_err(|message| RegistryError::LoadFailed {
            id: id.to_string(),
            message,
        })?;
        let mut st = lock(&self.inner.state);
        let i = st.index(id)?;
        st.entries[i].footprint = Some(bytes);
        Ok(())
    }

    /// The load task: takes `id`'s warm copy, unloads the evicted models,
    /// then loads `id` (from the copy when there is one) and tells the
    /// waiters.
    fn run_load(
        &self,
        id: Arc<str>,
        victims: Vec<Victim<L::Model>>,
        done: watch::Sender<LoadDone>,
    ) {
        // Its own warm copy first: the victims' copies may push it out.
        let warm = {
            let mut st = lock(&self.inner.state);
            let taken = st.index(&id).ok().and_then(|i| st.entries[i].warm.take());
            if let Some((_, bytes)) = &taken {
                st.host_used -= bytes;
            }
            taken
        };
        for v in victims {
            self.release(v);
        }
        let from_warm = warm.is_some();
        let started = Instant::now();
        let slot = {
            let st = lock(&self.inner.state);
            st.index(&id).map(|i| st.entries[i].front.clone())
        };
        let loader = &*self.inner.loader;
        let result = slot
            .map_err(|e| e.to_string())
            .and_then(|slot| build_front(loader, &id, &slot))
            .and_then(|front| {
                loader
                    .load(&id, &front, warm.map(|w| w.0))
                    .map_err(|e| describe(&e))
            });
        let took = started.elapsed();
        metrics::loaded(&id, result.is_ok(), from_warm, took);
        let mut st = lock(&self.inner.state);
        let answer = match (st.index(&id), result) {
            (Ok(i), Ok(model)) => {
                let e = &mut st.entries[i];
                e.slot = Slot::Loaded(Arc::new(model));
                *lock(&e.last_used) = Instant::now();
                metrics::state(&id, ModelState::Loaded);
                tracing::info!(model = %id, took_ms = took.as_millis() as u64, from_warm, "model loaded");
                Ok(())
            }
            (Ok(i), Err(message)) => {
                let needed = st.entries[i].footprint.unwrap_or(0);
                st.entries[i].slot = Slot::Unloaded;
                st.device_used = st.device_used.saturating_sub(needed);
                metrics::state(&id, ModelState::Unloaded);
                metrics::bytes(&id, 0, 0);
                tracing::error!(model = %id, error = %message, "model load failed");
                Err(message)
            }
            (Err(e), _) => Err(e.to_string()),
        };
        drop(st);
        let _ = done.send(Some(answer));
    }

    /// Unloads a model taken off the device and keeps its warm copy if the
    /// host budget allows (evicting older copies first). Blocking.
    fn release(&self, victim: Victim<L::Model>) {
        let Victim { id, model } = victim;
        let model = match Arc::try_unwrap(model) {
            Ok(m) => m,
            // Cannot happen: victims are taken only when no lease exists,
            // and leases are made only under the lock from the slot.
            Err(_) => {
                tracing::error!(model = %id, "evicted model still shared; dropped without unloading");
                return;
            }
        };
        let Some((warm, bytes)) = self.inner.loader.unload(&id, model) else {
            return;
        };
        let dropped = {
            let mut st = lock(&self.inner.state);
            st.keep_warm(&id, warm, bytes, self.inner.budget.host_bytes)
        };
        for w in dropped {
            self.inner.loader.discard(w);
        }
    }
}

impl<L: Loader> State<L> {
    /// The index of the model `name` names.
    fn index(&self, name: &str) -> Result<usize, RegistryError> {
        self.entries
            .iter()
            .position(|e| e.spec.answers_to(name))
            .ok_or_else(|| RegistryError::Unknown {
                id: name.to_string(),
                available: self.entries.iter().map(|e| e.spec.id.clone()).collect(),
            })
    }

    /// Evicts least recently used models (unpinned, no leases) until
    /// `needed` more bytes fit; refuses without evicting anything when
    /// they cannot.
    fn make_room(
        &mut self,
        for_entry: usize,
        needed: u64,
        budget: u64,
    ) -> Result<Vec<Victim<L::Model>>, RegistryError> {
        let free = budget.saturating_sub(self.device_used);
        if needed <= free {
            return Ok(Vec::new());
        }
        let mut candidates: Vec<(usize, Duration)> = self
            .entries
            .iter()
            .enumerate()
            .filter(|(i, e)| *i != for_entry && !e.pinned && e.evictable())
            .map(|(i, e)| (i, idle_for(&e.last_used)))
            .collect();
        // Longest idle first.
        candidates.sort_by_key(|c| std::cmp::Reverse(c.1));
        let mut chosen = Vec::new();
        let mut freed = 0;
        for (i, _) in candidates {
            if free + freed >= needed {
                break;
            }
            freed += self.entries[i].footprint.unwrap_or(0);
            chosen.push(i);
        }
        if free + freed < needed {
            return Err(RegistryError::NoRoom {
                id: self.entries[for_entry].spec.id.clone(),
                needed,
                free,
                retry_after: NO_ROOM_RETRY,
            });
        }
        Ok(chosen
            .into_iter()
            .filter_map(|i| self.take(i, "lru"))
            .collect())
    }

    /// Takes loaded model `i` off the device (its memory is accounted free
    /// now; the caller unloads it outside the lock).
    fn take(&mut self, i: usize, reason: &'static str) -> Option<Victim<L::Model>> {
        let e = &mut self.entries[i];
        if !matches!(e.slot, Slot::Loaded(_)) {
            return None;
        }
        let Slot::Loaded(model) = std::mem::replace(&mut e.slot, Slot::Unloaded) else {
            return None;
        };
        self.device_used = self.device_used.saturating_sub(e.footprint.unwrap_or(0));
        metrics::state(&e.spec.id, ModelState::Unloaded);
        metrics::bytes(&e.spec.id, 0, 0);
        metrics::evicted(&e.spec.id, reason);
        tracing::info!(model = %e.spec.id, reason, "model unloaded");
        Some(Victim {
            id: e.id.clone(),
            model,
        })
    }

    /// Stores a warm copy within `host_budget`, evicting older copies
    /// (least recently used model first). Returns what to drop outside the
    /// lock.
    fn keep_warm(&mut self, id: &str, warm: L::Warm, bytes: u64, host_budget: u64) -> Vec<L::Warm> {
        let mut dropped = Vec::new();
        let Ok(i) = self.index(id) else {
            dropped.push(warm);
            return dropped;
        };
        if bytes > host_budget {
            dropped.push(warm);
            return dropped;
        }
        let mut holders: Vec<(usize, Duration)> = self
            .entries
            .iter()
            .enumerate()
            .filter(|(j, e)| *j != i && e.warm.is_some())
            .map(|(j, e)| (j, idle_for(&e.last_used)))
            .collect();
        holders.sort_by_key(|h| std::cmp::Reverse(h.1));
        for (j, _) in holders {
            if self.host_used + bytes <= host_budget {
                break;
            }
            if let Some((w, b)) = self.entries[j].warm.take() {
                self.host_used -= b;
                metrics::bytes(&self.entries[j].spec.id, 0, 0);
                dropped.push(w);
            }
        }
        if self.host_used + bytes > host_budget {
            dropped.push(warm);
            return dropped;
        }
        if let Some((w, b)) = self.entries[i].warm.replace((warm, bytes)) {
            self.host_used -= b;
            dropped.push(w);
        }
        self.host_used += bytes;
        metrics::bytes(id, 0, bytes);
        dropped
    }
}

impl<L: Loader> Entry<L> {
    /// Counts a request at `now`, forgetting those older than `window`.
    fn note_demand(&mut self, now: Instant, window: Duration) {
        self.note_demand_expiry(now, window);
        self.demand.push_back(now);
    }

    /// Forgets requests older than `window`.
    fn note_demand_expiry(&mut self, now: Instant, window: Duration) {
        while self
            .demand
            .front()
            .is_some_and(|&t| now.duration_since(t) > window)
        {
            self.demand.pop_front();
        }
    }

    /// Loaded, with no request holding it.
    fn evictable(&self) -> bool {
        matches!(&self.slot, Slot::Loaded(m) if Arc::strong_count(m) == 1)
    }
}

/// `id`'s front from `slot`, built by `loader` if it is not yet (blocking;
/// the slot's lock makes concurrent builders wait for one build).
fn build_front<L: Loader>(
    loader: &L,
    id: &str,
    slot: &Mutex<Option<Arc<L::Front>>>,
) -> Result<Arc<L::Front>, String> {
    let mut held = lock(slot);
    if let Some(front) = held.as_ref() {
        return Ok(front.clone());
    }
    let front = Arc::new(loader.front(id).map_err(|e| describe(&e))?);
    *held = Some(front.clone());
    Ok(front)
}
