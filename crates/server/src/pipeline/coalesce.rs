//! Coalescing: identical deterministic requests in flight share one
//! generation.
//!
//! The first request with a key starts a *flight*: a task pumps the inner
//! generation's events into a shared log. Later requests with the same key
//! subscribe to it and read the log from the start (a late joiner first
//! gets everything generated so far, then the live tail), so every
//! subscriber sees the identical stream. The pump never waits for a reader:
//! a slow subscriber costs only its own progress; one that stops reading
//! for longer than the stall timeout is cut off with an error, as the
//! engine cuts off a single stalled client. The generation is cancelled
//! (its KV freed) only when its last subscriber is gone, and it runs at the
//! most urgent tier among its subscribers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::stream::{self, StreamExt};
use ingot_core::Priority;
use ingot_engine::{PriorityHandle, TokenEvent};
use metrics::{counter, gauge};
use tokio::sync::{watch, Notify};

use super::{
    CacheStatus, EventStream, GenerateError, GenerateRequest, Generation, Generator, RequestKey,
};

/// The coalescing layer over `G`.
pub struct Coalescer<G> {
    inner: G,
    flights: Arc<Flights>,
    stall_timeout: Duration,
}

type Flights = Mutex<HashMap<RequestKey, Arc<Flight>>>;

/// One shared generation.
struct Flight {
    key: RequestKey,
    state: Mutex<FlightState>,
    /// Bumped on every change (start, event, end) to wake readers.
    changed: watch::Sender<u64>,
    /// Wakes the pump when the last subscriber leaves.
    cancel: Notify,
}

#[derive(Default)]
struct FlightState {
    /// `None` until the inner generator answered.
    started: Option<Result<(), GenerateError>>,
    events: Vec<TokenEvent>,
    /// When each event arrived (a reader is late once one waits unread).
    arrived: Vec<Instant>,
    finished: bool,
    cancelled: bool,
    subscribers: Vec<Arc<Reader>>,
    /// The most urgent tier among subscribers, and the one it was submitted at.
    priority: Priority,
    submitted: Priority,
    priority_handle: Option<PriorityHandle>,
}

/// A subscriber's position, watched by the pump for stalls.
struct Reader {
    cursor: std::sync::atomic::AtomicUsize,
    /// When the reader last took an event (or joined).
    last_read: Mutex<Instant>,
    cut: std::sync::atomic::AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<G: Generator> Coalescer<G> {
    /// Wraps `inner`; a subscriber that stops reading for `stall_timeout`
    /// is cut off.
    pub fn new(inner: G, stall_timeout: Duration) -> Self {
        // Listed from the start, so dashboards and alerts find them at 0.
        counter!("ingot_coalesced_requests_total").increment(0);
        gauge!("ingot_coalesced_subscribers").increment(0.0);
        Self {
            inner,
            flights: Arc::new(Mutex::new(HashMap::new())),
            stall_timeout,
        }
    }

    /// Generations in flight that others may join.
    pub fn in_flight(&self) -> usize {
        lock(&self.flights).len()
    }

    async fn coalesced(
        &self,
        key: RequestKey,
        request: GenerateRequest,
    ) -> Result<Generation, GenerateError> {
        let priority = request.engine.priority;
        let (flight, reader, leader) = {
            let mut flights = lock(&self.flights);
            match flights.get(&key) {
                Some(flight) => {
                    let reader = flight.subscribe(priority);
                    (flight.clone(), reader, false)
                }
                None => {
                    let flight = Flight::new(key, priority);
                    let reader = flight.subscribe(priority);
                    flights.insert(key, flight.clone());
                    (flight, reader, true)
                }
            }
        };
        // From here the reader is counted: dropping `sub` on any path
        // below unsubscribes it.
        let sub = Subscription {
            flight: flight.clone(),
            reader,
            flights: Arc::downgrade(&self.flights),
            rx: flight.changed.subscribe(),
            stall_timeout: self.stall_timeout,
            done: false,
        };
        if leader {
            // Should this future be dropped mid-start, joiners are told.
            let mut starting = Starting {
                flight: Some(&flight),
                flights: &self.flights,
                stall_timeout: self.stall_timeout,
            };
            let started = self.inner.generate(request).await;
            starting.finish(started);
        } else {
            counter!("ingot_coalesced_requests_total").increment(1);
        }
        let mut rx = flight.changed.subscribe();
        loop {
            if let Some(started) = lock(&flight.state).started.clone() {
                started?;
                break;
            }
            if rx.changed().await.is_err() {
                return Err(GenerateError::Unavailable(
                    "the generation was dropped".into(),
                ));
            }
        }
        Ok(Generation {
            status: if leader {
                CacheStatus::Miss
            } else {
                CacheStatus::Coalesced
            },
            events: sub.into_stream(),
            priority: None,
        })
    }
}

impl<G: Generator> Generator for Coalescer<G> {
    fn generate(
        &self,
        request: GenerateRequest,
    ) -> BoxFuture<'_, Result<Generation, GenerateError>> {
        match request.key.filter(|_| request.sharing.coalesce) {
            Some(key) => Box::pin(self.coalesced(key, request)),
            None => self.inner.generate(request),
        }
    }
}

impl Flight {
    fn new(key: RequestKey, priority: Priority) -> Arc<Self> {
        Arc::new(Flight {
            key,
            state: Mutex::new(FlightState {
                priority,
                submitted: priority,
                ..FlightState::default()
            }),
            changed: watch::channel(0).0,
            cancel: Notify::new(),
        })
    }

    /// Adds a reader at the start of the log; raises the generation's tier
    /// when the newcomer is more urgent.
    fn subscribe(&self, priority: Priority) -> Arc<Reader> {
        let reader = Arc::new(Reader {
            cursor: 0.into(),
            last_read: Mutex::new(Instant::now()),
            cut: false.into(),
        });
        let mut st = lock(&self.state);
        st.subscribers.push(reader.clone());
        if priority < st.priority {
            st.priority = priority;
            if let Some(h) = &st.priority_handle {
                h.set(priority);
            }
        }
        gauge!("ingot_coalesced_subscribers").increment(1.0);
        reader
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// Records the inner generator's answer and starts pumping its events.
    fn start(
        self: &Arc<Self>,
        started: Result<Generation, GenerateError>,
        flights: &Arc<Flights>,
        stall_timeout: Duration,
    ) {
        let generation = {
            let mut map = lock(flights);
            let mut st = lock(&self.state);
            match started {
                Ok(g) => {
                    // A more urgent subscriber joined while it started.
                    if let Some(h) = g.priority.as_ref().filter(|_| st.priority < st.submitted) {
                        h.set(st.priority);
                    }
                    st.priority_handle = g.priority.clone();
                    st.started = Some(Ok(()));
                    Some(g)
                }
                Err(e) => {
                    st.started = Some(Err(e));
                    st.finished = true;
                    remove(&mut map, self);
                    None
                }
            }
        };
        self.bump();
        if let Some(g) = generation {
            let flight = self.clone();
            let flights = flights.clone();
            tokio::spawn(async move { flight.pump(g.events, &flights, stall_timeout).await });
        }
    }

    /// Moves inner events into the log until the end or the last reader
    /// leaves (dropping `events` then aborts the engine request).
    async fn pump(&self, mut events: EventStream, flights: &Flights, stall_timeout: Duration) {
        loop {
            let cancelled = self.cancel.notified();
            if lock(&self.state).cancelled {
                return;
            }
            let event = tokio::select! {
                e = events.next() => e,
                () = cancelled => return,
            };
            let event =
                event.unwrap_or_else(|| TokenEvent::Error("the engine dropped the request".into()));
            let last = event.is_terminal();
            {
                let mut map = lock(flights);
                let mut st = lock(&self.state);
                st.events.push(event);
                st.arrived.push(Instant::now());
                if last {
                    st.finished = true;
                    remove(&mut map, self);
                } else {
                    self.cut_stalled(&mut map, &mut st, stall_timeout);
                }
            }
            self.bump();
            if last {
                return;
            }
        }
    }

    /// Cuts off readers that are behind and have not read for the stall
    /// timeout; cancels the flight when none is left.
    fn cut_stalled(
        &self,
        map: &mut HashMap<RequestKey, Arc<Flight>>,
        st: &mut FlightState,
        stall_timeout: Duration,
    ) {
        let now = Instant::now();
        let before = st.subscribers.len();
        let arrived = &st.arrived;
        st.subscribers.retain(|r| {
            // Stalled: an event has waited unread for the whole timeout and
            // the reader took nothing meanwhile. A reader waiting for a
            // first event that took long (a long prefill) is not behind.
            let cursor = r.cursor.load(std::sync::atomic::Ordering::SeqCst);
            let waiting_since = arrived.get(cursor).map(|&at| at.max(*lock(&r.last_read)));
            if waiting_since.is_some_and(|t| now.saturating_duration_since(t) > stall_timeout) {
                r.cut.store(true, std::sync::atomic::Ordering::SeqCst);
                tracing::warn!(key = %self.key, "coalesced subscriber stalled; cut off");
                return false;
            }
            true
        });
        let cut = before - st.subscribers.len();
        if cut > 0 {
            gauge!("ingot_coalesced_subscribers").decrement(cut as f64);
            if st.subscribers.is_empty() {
                self.cancel_locked(map, st);
            }
        }
    }

    fn cancel_locked(&self, map: &mut HashMap<RequestKey, Arc<Flight>>, st: &mut FlightState) {
        if !st.finished {
            st.cancelled = true;
            remove(map, self);
            self.cancel.notify_one();
        }
    }
}

/// The leader's start in progress.
struct Starting<'a> {
    flight: Option<&'a Arc<Flight>>,
    flights: &'a Arc<Flights>,
    stall_timeout: Duration,
}

impl Starting<'_> {
    fn finish(&mut self, started: Result<Generation, GenerateError>) {
        if let Some(flight) = self.flight.take() {
            flight.start(started, self.flights, self.stall_timeout);
        }
    }
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.finish(Err(GenerateError::Unavailable(
            "the request that started this generation was cancelled".into(),
        )));
    }
}

/// Removes `flight` from the map if it is still the entry for its key.
fn remove(map: &mut HashMap<RequestKey, Arc<Flight>>, flight: &Flight) {
    if map
        .get(&flight.key)
        .is_some_and(|f| std::ptr::eq(Arc::as_ptr(f), flight))
    {
        map.remove(&flight.key);
    }
}

/// One subscriber's view of a flight.
struct Subscription {
    flight: Arc<Flight>,
    reader: Arc<Reader>,
    flights: Weak<Flights>,
    rx: watch::Receiver<u64>,
    stall_timeout: Duration,
    done: bool,
}

impl Subscription {
    fn into_stream(self) -> EventStream {
        stream::unfold(self, |mut sub| async move {
            let event = sub.next().await?;
            Some((event, sub))
        })
        .boxed()
    }

    async fn next(&mut self) -> Option<TokenEvent> {
        use std::sync::atomic::Ordering;
        if self.done {
            return None;
        }
        loop {
            if self.reader.cut.load(Ordering::SeqCst) {
                self.done = true;
                return Some(TokenEvent::Error(format!(
                    "the client stopped reading for over {:?}; the stream was cut off",
                    self.stall_timeout
                )));
            }
            let next = {
                let st = lock(&self.flight.state);
                let cursor = self.reader.cursor.load(Ordering::SeqCst);
                match st.events.get(cursor) {
                    Some(event) => Some(event.clone()),
                    None if st.finished || st.cancelled => {
                        // Ended without a terminal event (start failed or
                        // cancelled): nothing more will come.
                        self.done = true;
                        return None;
                    }
                    None => None,
                }
            };
            if let Some(event) = next {
                self.reader.cursor.fetch_add(1, Ordering::SeqCst);
                *lock(&self.reader.last_read) = Instant::now();
                if event.is_terminal() {
                    self.done = true;
                }
                return Some(event);
            }
            if self.rx.changed().await.is_err() {
                self.done = true;
                return None;
            }
        }
    }
}

impl Drop for Subscription {
    /// Leaves the flight; the last one out cancels an unfinished generation.
    fn drop(&mut self) {
        let Some(flights) = self.flights.upgrade() else {
            return;
        };
        let mut map = lock(&flights);
        let mut st = lock(&self.flight.state);
        let before = st.subscribers.len();
        st.subscribers.retain(|r| !Arc::ptr_eq(r, &self.reader));
        if st.subscribers.len() < before {
            gauge!("ingot_coalesced_subscribers").decrement(1.0);
            if st.subscribers.is_empty() {
                self.flight.cancel_locked(&mut map, &mut st);
            }
        }
    }
}
