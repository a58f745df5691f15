//! The connection slots: who holds one, whether a request is in flight on
//! it, and since when it has been idle. At the cap, a new connection takes
//! the slot of the connection idle longest (a client trickling its request
//! head, or an idle keep-alive connection) instead of being refused, so a
//! handful of slow sockets cannot lock every other client out for a whole
//! header timeout. A connection with a request in flight is never taken.
//! Optionally one client address may hold at most so many slots.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// A connection idle for less than this keeps its slot: a new client sends
/// its request head within milliseconds, and a burst of new connections
/// must not take each other's slots before any of them is heard.
pub const MIN_IDLE_TO_TAKE: Duration = Duration::from_millis(250);

/// Slots handed over at the cap (`ingot_connections_taken_over_total`).
pub const TAKEN_OVER: &str = "ingot_connections_taken_over_total";

/// One connection's activity, shared by its requests.
#[derive(Debug)]
pub struct Activity {
    /// Requests whose head has come and whose response has not ended.
    in_flight: AtomicUsize,
    /// When it last had no request in flight, in ms after `Slots::epoch`.
    idle_since_ms: AtomicU64,
    epoch: Instant,
    /// Told to close: its slot was handed to a new connection.
    pub evicted: Notify,
}

impl Activity {
    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// Counts a request in flight until the guard drops (its response
    /// ended or was abandoned).
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Busy(self.clone())
    }

    /// How long it has been idle at `now`; `None` while a request is in
    /// flight.
    fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let since = self.idle_since_ms.load(Ordering::SeqCst);
        Some(Duration::from_millis(self.ms(now).saturating_sub(since)))
    }
}

/// A request in flight on a connection.
#[derive(Debug)]
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let a = &self.0;
        // Idle from now; stored before the count drops so that a reader
        // seeing no request in flight sees this instant.
        a.idle_since_ms
            .store(a.ms(Instant::now()), Ordering::SeqCst);
        a.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What `Slots::admit` decided for a new connection.
#[derive(Debug)]
pub enum Admission {
    /// Served, holding this slot (released when the guard drops).
    Admitted(SlotGuard),
    /// Over `max_connections`, and no connection idle long enough to take.
    Full,
    /// Its address already holds `max_per_client` slots.
    ClientFull,
}

/// Every held slot.
#[derive(Debug, Default)]
pub struct Slots {
    inner: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    held: HashMap<u64, Held>,
}

#[derive(Debug)]
struct Held {
    peer: IpAddr,
    activity: Arc<Activity>,
    /// Its slot was handed over; it is closing.
    evicted: bool,
}

impl Slots {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides for a connection from `peer` at `now`: `max` slots in all
    /// and `max_per_client` per address (0: no bound).
    pub fn admit(
        self: &Arc<Self>,
        peer: IpAddr,
        max: usize,
        max_per_client: usize,
        now: Instant,
    ) -> Admission {
        let mut t = self.lock();
        if max_per_client > 0
            && t.held
                .values()
                .filter(|h| h.peer == peer && !h.evicted)
                .count()
                >= max_per_client
        {
            return Admission::ClientFull;
        }
        let live = t.held.values().filter(|h| !h.evicted).count();
        if max > 0 && live >= max {
            let idlest = t
                .held
                .values_mut()
                .filter(|h| !h.evicted)
                .filter_map(|h| Some((h.activity.idle_for(now)?, h)))
                .filter(|(idle, _)| *idle >= MIN_IDLE_TO_TAKE)
                .max_by_key(|(idle, _)| *idle);
            let Some((idle, taken)) = idlest else {
                return Admission::Full;
            };
            taken.evicted = true;
            taken.activity.evicted.notify_one();
            metrics::counter!(TAKEN_OVER).increment(1);
            tracing::debug!(
                idle_ms = idle.as_millis() as u64,
                "connection cap: the idlest connection's slot handed to a new one"
            );
        }
        let id = t.next;
        t.next += 1;
        let activity = Arc::new(Activity {
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            epoch: now,
            evicted: Notify::new(),
        });
        t.held.insert(
            id,
            Held {
                peer,
                activity: activity.clone(),
                evicted: false,
            },
        );
        Admission::Admitted(SlotGuard {
            slots: self.clone(),
            id,
            activity,
        })
    }
}

/// A held slot; released on drop.
#[derive(Debug)]
pub struct SlotGuard {
    slots: Arc<Slots>,
    id: u64,
    /// The connection's activity.
    pub activity: Arc<Activity>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.slots.lock().held.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    fn admitted(a: Admission) -> SlotGuard {
        match a {
            Admission::Admitted(g) => g,
            other => panic!("not admitted: {other:?}"),
        }
    }

    #[test]
    fn at_the_cap_the_idlest_connection_gives_up_its_slot_and_busy_ones_never_do() {
        let slots = Arc::new(Slots::default());
        let t0 = Instant::now();
        let busy = admitted(slots.admit(A, 3, 0, t0));
        let _request = busy.activity.busy();
        let older = admitted(slots.admit(A, 3, 0, t0));
        let newer = admitted(slots.admit(B, 3, 0, t0 + Duration::from_millis(100)));
        // Nobody idle long enough yet: refused.
        let at = t0 + Duration::from_millis(200);
        assert!(matches!(slots.admit(B, 3, 0, at), Admission::Full));
        // Later the idlest (the older idle one) is taken, not the busy one.
        let at = t0 + Duration::from_secs(2);
        let new = admitted(slots.admit(B, 3, 0, at));
        assert!(slots
            .lock()
            .held
            .values()
            .any(|h| h.evicted && Arc::ptr_eq(&h.activity, &older.activity)));
        assert!(!slots
            .lock()
            .held
            .values()
            .any(|h| h.evicted && Arc::ptr_eq(&h.activity, &busy.activity)));
        // The next one takes the other idle connection; with requests in
        // flight on every live connection, the cap is full.
        let _sent = new.activity.busy();
        let next = admitted(slots.admit(B, 3, 0, at + Duration::from_secs(1)));
        let _sent_too = next.activity.busy();
        assert!(slots
            .lock()
            .held
            .values()
            .any(|h| h.evicted && Arc::ptr_eq(&h.activity, &newer.activity)));
        assert!(matches!(
            slots.admit(B, 3, 0, at + Duration::from_secs(1)),
            Admission::Full
        ));
        drop(older);
        drop(newer);
        assert_eq!(slots.lock().held.len(), 3);
    }

    #[test]
    fn one_address_holds_at_most_its_share() {
        let slots = Arc::new(Slots::default());
        let now = Instant::now();
        let _a1 = admitted(slots.admit(A, 0, 2, now));
        let _a2 = admitted(slots.admit(A, 0, 2, now));
        assert!(matches!(slots.admit(A, 0, 2, now), Admission::ClientFull));
        let _b = admitted(slots.admit(B, 0, 2, now));
    }

    #[test]
    fn a_connection_is_idle_again_once_its_request_ends() {
        let slots = Arc::new(Slots::default());
        let t0 = Instant::now();
        let g = admitted(slots.admit(A, 0, 0, t0));
        let request = g.activity.busy();
        assert_eq!(g.activity.idle_for(Instant::now()), None);
        drop(request);
        assert!(g.activity.idle_for(Instant::now()).is_some());
    }
}
