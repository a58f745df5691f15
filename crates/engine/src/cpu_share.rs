//! Shares the CPU between decode steps and embedding work, by turns.
//!
//! Decode steps of CPU engines and embedding slices never run at the same
//! time: a decode step waits while an embedding slice holds the CPU, and an
//! embedding slice starts only between decode steps. While decode is
//! active the embedding side may take at most `share` of the time decode
//! steps took (its credit), in slices that end at the first checkpoint
//! after the credit is spent, so each inter-token gap grows by at most
//! about `share` of a step (plus one overrun of a checkpoint interval,
//! repaid from later credit). When no decode step has run for a while the
//! embedding side runs freely, and a decode step that arrives then waits
//! at most one checkpoint interval.
//!
//! The CPU is one per process, like the global rayon pool the CPU decoders
//! share, so the arbiter is too ([`CpuArbiter::process`]).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Decode counts as active this long after its last step ended, at least:
/// an engine's own work between two steps (scheduling, sending tokens)
/// is far shorter.
const MIN_IDLE_GAP: Duration = Duration::from_millis(2);

/// How far a longer step moves the step estimate up (a shorter one moves
/// it all the way down): a prefill step among decode steps must not size
/// the next slices by its own length.
const STEP_RISE: f64 = 0.1;

/// The turn-taker between CPU decode steps and embedding slices.
#[derive(Debug, Default)]
pub struct CpuArbiter {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Decode steps running now.
    decoding: usize,
    /// Decode steps waiting for an embedding slice to end.
    decode_waiting: usize,
    /// An embedding slice holds the CPU.
    embedding: bool,
    /// The embedding side has credit and waits for the next gap; decode
    /// steps let it go first (otherwise a decode engine that steps again
    /// at once would never leave it a gap).
    embedding_waits: bool,
    /// Total time of every decode step so far (credit is a share of it).
    decode_total: Duration,
    /// A decode step's duration: falls at once to a shorter step, rises
    /// slowly towards longer ones.
    step: Duration,
    last_step_end: Option<Instant>,
}

impl State {
    fn note_step(&mut self, took: Duration) {
        self.decode_total += took;
        self.step = if self.step.is_zero() || took < self.step {
            took
        } else {
            self.step + (took - self.step).mul_f64(STEP_RISE)
        };
    }

    fn decode_active(&self, now: Instant) -> bool {
        let gap = self.step.max(MIN_IDLE_GAP);
        self.decoding + self.decode_waiting > 0
            || self
                .last_step_end
                .is_some_and(|t| now.saturating_duration_since(t) < gap)
    }
}

/// Held by a decode step while it runs; ending it lets embedding slices in.
#[must_use = "the step holds the CPU only while this lives"]
pub struct DecodeTurn<'a> {
    arbiter: &'a CpuArbiter,
    started: Instant,
}

impl Drop for DecodeTurn<'_> {
    fn drop(&mut self) {
        let now = Instant::now();
        let took = now.saturating_duration_since(self.started);
        let mut s = self.arbiter.lock();
        s.decoding -= 1;
        s.note_step(took);
        s.last_step_end = Some(now);
        drop(s);
        self.arbiter.changed.notify_all();
    }
}

impl CpuArbiter {
    /// The arbiter every engine of this process shares.
    pub fn process() -> Arc<CpuArbiter> {
        static PROCESS: OnceLock<Arc<CpuArbiter>> = OnceLock::new();
        PROCESS.get_or_init(Arc::default).clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until no embedding slice holds the CPU (or is owed the next
    /// gap), then marks a decode step running until the turn drops.
    pub fn decode_step(&self) -> DecodeTurn<'_> {
        let mut s = self.lock();
        s.decode_waiting += 1;
        while s.embedding || s.embedding_waits {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.decode_waiting -= 1;
        s.decoding += 1;
        DecodeTurn {
            arbiter: self,
            started: Instant::now(),
        }
    }

    /// The decode step estimate, or `None` while decode is idle.
    pub fn decode_step_time(&self) -> Option<Duration> {
        let s = self.lock();
        s.decode_active(Instant::now()).then_some(s.step)
    }

    /// A handle for one embedding engine that may take `share` of the
    /// decode steps' time while decode is active.
    pub fn embedding_side(self: &Arc<Self>, share: f64) -> EmbeddingSide {
        let decode_total = self.lock().decode_total;
        EmbeddingSide {
            arbiter: self.clone(),
            share: share.clamp(0.0, 1.0),
            seen_decode: decode_total,
            credit: 0.0,
            slice_start: None,
        }
    }
}

/// The embedding engine's end of the arbiter: takes turns and keeps its
/// credit (seconds of CPU it may still use while decode is active; it goes
/// negative when a slice overruns, and later slices repay it).
#[derive(Debug)]
pub struct EmbeddingSide {
    arbiter: Arc<CpuArbiter>,
    share: f64,
    /// `decode_total` when the credit was last topped up.
    seen_decode: Duration,
    credit: f64,
    /// When the current slice started; `None` while not holding the CPU.
    slice_start: Option<Instant>,
}

impl EmbeddingSide {
    /// Most credit kept: one slice's worth, so a long decode run does not
    /// bank a burst.
    fn cap(&self, s: &State) -> f64 {
        self.share * s.step.as_secs_f64()
    }

    fn top_up(&mut self, s: &State) {
        let earned = s.decode_total.saturating_sub(self.seen_decode);
        self.seen_decode = s.decode_total;
        self.credit = (self.credit + self.share * earned.as_secs_f64()).min(self.cap(s));
    }

    /// Takes the CPU: at once when decode is idle, otherwise in the next
    /// gap between decode steps once the credit is positive.
    pub fn acquire(&mut self) {
        if self.slice_start.is_some() {
            return;
        }
        let arbiter = self.arbiter.clone();
        let mut s = arbiter.lock();
        loop {
            self.top_up(&s);
            let now = Instant::now();
            let idle = !s.decode_active(now);
            if s.decoding == 0 && (idle || self.credit > 0.0) {
                break;
            }
            s.embedding_waits = self.credit > 0.0;
            // Wake on the next step's end, or when decode may have gone idle.
            let timeout = s.step.max(MIN_IDLE_GAP);
            s = arbiter
                .changed
                .wait_timeout(s, timeout)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        s.embedding = true;
        s.embedding_waits = false;
        self.slice_start = Some(Instant::now());
    }

    /// Gives the CPU back (a decode step waiting goes next).
    pub fn release(&mut self) {
        let Some(start) = self.slice_start.take() else {
            return;
        };
        let mut s = self.arbiter.lock();
        if s.decode_active(Instant::now()) {
            self.credit -= start.elapsed().as_secs_f64();
        }
        s.embedding = false;
        drop(s);
        self.arbiter.changed.notify_all();
    }

    /// Between two pieces of embedding work: ends the slice when decode is
    /// active and the credit is spent, and waits for the next turn.
    pub fn checkpoint(&mut self) {
        let Some(start) = self.slice_start else {
            self.acquire();
            return;
        };
        let spent = {
            let s = self.arbiter.lock();
            s.decode_active(Instant::now()) && self.credit - start.elapsed().as_secs_f64() <= 0.0
        };
        if spent {
            self.release();
            self.acquire();
        }
    }

    /// Tokens per batch that keep one piece of work (a checkpoint
    /// interval) inside one slice, given the measured seconds per token
    /// per interval; `None` while decode is idle (no limit).
    pub fn slice_tokens(&self, seconds_per_token: f64) -> Option<usize> {
        let step = self.arbiter.decode_step_time()?;
        let slice = self.share * step.as_secs_f64();
        if seconds_per_token <= 0.0 {
            return Some(usize::MAX);
        }
        Some((slice / seconds_per_token).floor() as usize)
    }
}

impl Drop for EmbeddingSide {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    fn spin(d: Duration) {
        let t = Instant::now();
        while t.elapsed() < d {
            std::hint::spin_loop();
        }
    }

    /// A decode loop of `steps` steps of `step` each; returns the gaps
    /// between step starts.
    fn decode_loop(arbiter: &CpuArbiter, steps: usize, step: Duration) -> Vec<Duration> {
        let mut starts = Vec::new();
        for _ in 0..steps {
            let turn = arbiter.decode_step();
            starts.push(Instant::now());
            spin(step);
            drop(turn);
        }
        starts.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[test]
    fn never_overlaps_and_keeps_to_its_share() {
        let arbiter = Arc::new(CpuArbiter::default());
        let stop = Arc::new(AtomicBool::new(false));
        let overlap = Arc::new(AtomicBool::new(false));
        // Nanoseconds the embedding side has worked (wall clock: a loaded
        // test machine stretches both sides alike).
        let worked = Arc::new(AtomicU64::new(0));
        let embed = {
            let (arbiter, stop) = (arbiter.clone(), stop.clone());
            let (overlap, worked) = (overlap.clone(), worked.clone());
            std::thread::spawn(move || {
                let mut side = arbiter.embedding_side(0.2);
                let (mut pieces, mut longest) = (0u32, Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    side.checkpoint();
                    let t = Instant::now();
                    if arbiter.lock().decoding > 0 {
                        overlap.store(true, Ordering::Relaxed);
                    }
                    spin(Duration::from_micros(300));
                    let took = t.elapsed();
                    worked.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
                    longest = longest.max(took);
                    pieces += 1;
                }
                drop(side);
                (pieces, longest)
            })
        };
        // Warm the step estimate, then measure.
        decode_loop(&arbiter, 5, Duration::from_millis(5));
        let before = (arbiter.lock().decode_total, worked.load(Ordering::Relaxed));
        decode_loop(&arbiter, 60, Duration::from_millis(5));
        let after = (arbiter.lock().decode_total, worked.load(Ordering::Relaxed));
        stop.store(true, Ordering::Relaxed);
        let (pieces, longest) = embed.join().unwrap();
        assert!(
            !overlap.load(Ordering::Relaxed),
            "a slice ran during a step"
        );
        assert!(pieces > 10, "embedding starved: {pieces} pieces");
        // The share of the steps' time, plus the credit banked before
        // (one slice), the last overrun and the pieces straddling the ends.
        let steps = (after.0 - before.0).as_secs_f64();
        let embedded = (after.1 - before.1) as f64 * 1e-9;
        let step = arbiter.lock().step.as_secs_f64();
        let bound = 0.2 * steps + 0.2 * step + 3.0 * longest.as_secs_f64();
        assert!(embedded <= bound, "embedded {embedded:.4} s > {bound:.4} s");
        assert!(embedded > 0.02 * steps, "embedded only {embedded:.4} s");
    }

    #[test]
    fn runs_freely_when_decode_is_idle() {
        let arbiter = Arc::new(CpuArbiter::default());
        let mut side = arbiter.embedding_side(0.1);
        let t = Instant::now();
        for _ in 0..100 {
            side.checkpoint();
        }
        assert!(t.elapsed() < Duration::from_millis(50));
        assert_eq!(side.slice_tokens(1e-4), None, "no decode: no limit");
        // A decode step arriving waits for the slice, which then ends at
        // the next checkpoint.
        let waiter = {
            let arbiter = arbiter.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                drop(arbiter.decode_step());
                t.elapsed()
            })
        };
        while !waiter.is_finished() {
            spin(Duration::from_millis(1));
            side.checkpoint();
        }
        let waited = waiter.join().unwrap();
        assert!(waited < Duration::from_millis(500), "waited {waited:?}");
    }

    #[test]
    fn a_long_prefill_step_barely_moves_the_step_estimate() {
        let mut s = State::default();
        let ms = Duration::from_millis;
        s.note_step(ms(50));
        s.note_step(ms(400));
        assert_eq!(s.step, ms(85));
        s.note_step(ms(40));
        assert_eq!(s.step, ms(40));
        assert_eq!(s.decode_total, ms(490));
    }

    #[test]
    fn slice_size_follows_the_step_time() {
        let arbiter = Arc::new(CpuArbiter::default());
        let side = arbiter.embedding_side(0.1);
        decode_loop(&arbiter, 3, Duration::from_millis(10));
        // Held: decode is active whatever the clock says.
        let turn = arbiter.decode_step();
        let step = arbiter.lock().step.as_secs_f64();
        let tokens = side.slice_tokens(1e-4).unwrap();
        drop(turn);
        // 10% of the step at 0.1 ms per token (10 ms steps: ~10 tokens).
        let want = (0.1 * step / 1e-4).floor() as usize;
        assert_eq!(tokens, want);
        assert!(want >= 10, "{want}");
    }
}
