//! A stream's own send queue: backpressure that works over real sockets.
//!
//! A task (the pump) pulls the stream's frames as the engine makes them and
//! appends them to a per-stream queue; the response body hands everything
//! queued to hyper as one write each time hyper asks for more. Whether the
//! client is keeping up is judged from the socket itself: the bytes the
//! body handed over minus the bytes the peer has not acknowledged
//! (`SIOCOUTQ`, through [`ConnProbe`]) is what the client's TCP stack took.
//! When that has not grown for the stall timeout while something is
//! outstanding (queued, or unacknowledged), the client is stalled: the pump
//! is told ([`Cut`]): the stream ends its generations at once (freeing their
//! KV), what waited for the client is dropped, and the stream's closing
//! events (an error in the endpoint's own format, then its terminator) are
//! the last bytes queued, so a client that reads again sees a well-formed
//! end. Only if the client takes nothing for another stall timeout does the
//! body end with an error (the connection is aborted). Kernel buffers
//! (which held ~900 tokens for a reader that stopped) no longer hide a
//! stall.
//!
//! While a client lags (nothing acknowledged for a flush interval), what is
//! pending goes out as one frame per `stream_flush_interval` rather than a
//! frame per token: fewer, larger writes for a slow reader, which it can
//! catch up on. A queue past `max_stream_pending_bytes` is cut off at once.
//! Where the probe cannot read the socket (not Linux), progress is the body
//! taking bytes, which still bounds a stall by the kernel buffers.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::{Body, Bytes};
use bytes::BytesMut;
use futures_util::stream::{BoxStream, StreamExt};
use http_body::Frame;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::conn::ConnProbe;

/// How a stream treats a slow client.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// No progress for this long while bytes are outstanding: cut off.
    pub stall_timeout: Duration,
    /// While lagging, at most one frame per this interval.
    pub flush_interval: Duration,
    /// Most bytes queued for the client.
    pub max_pending: usize,
}

/// Cut-off streams by reason.
pub const STREAMS_CUT: &str = "ingot_streams_cut_total";

/// Why a stream is cut off for its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Nothing taken for the stall timeout while bytes were outstanding.
    Stall,
    /// More than the pending-bytes bound waited.
    Overflow,
}

impl Cut {
    /// The metric label and log field.
    pub fn reason(self) -> &'static str {
        match self {
            Cut::Stall => "stall",
            Cut::Overflow => "overflow",
        }
    }
}

/// Where the pump says that the stream is cut: the source of `frames`
/// then yields its closing frames and ends.
pub type CutSender = tokio::sync::watch::Sender<Option<Cut>>;

/// The body of a stream whose frames `frames` yields (each item one write's
/// worth of SSE bytes); `probe` reads the connection's socket. On a cut the
/// pump sends it on `cut` and keeps taking frames: the source's closing
/// frames, then its end.
pub fn body(
    frames: BoxStream<'static, Bytes>,
    probe: Option<ConnProbe>,
    s: Settings,
    cut: CutSender,
) -> Body {
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue::default()),
        body_gone: Notify::new(),
    });
    let now = Instant::now();
    let progress = Progress {
        probe: probe.unwrap_or_default(),
        acked: 0,
        last: now,
        outstanding: false,
    };
    tokio::spawn(pump(frames, shared.clone(), progress, s, cut));
    Body::new(QueueBody {
        shared,
        flush_interval: s.flush_interval,
        last_frame: None,
        wait: None,
    })
}

struct Shared {
    queue: Mutex<Queue>,
    /// The body was dropped (connection closed): the pump stops.
    body_gone: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Default)]
struct Queue {
    pending: BytesMut,
    /// Bytes the body has handed to hyper.
    handed: u64,
    /// No more frames will come.
    ended: bool,
    /// The client took nothing of its closing frames either: the body
    /// ends with an error.
    aborted: Option<Cut>,
    /// The client is behind (no progress for a flush interval).
    lagging: bool,
    body_gone: bool,
    waker: Option<Waker>,
}

impl Queue {
    fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

/// What the client has taken, and when it last took more.
struct Progress {
    probe: ConnProbe,
    /// Bytes the client's side acknowledged (handed − unacknowledged).
    acked: u64,
    /// When `acked` last grew, or nothing was outstanding.
    last: Instant,
    /// Something was queued or unacknowledged at the last look: only then
    /// does the pump need to look again before the next frame.
    outstanding: bool,
}

impl Progress {
    /// Updates from the queue and `unacked`, the socket's bytes not yet
    /// acknowledged (read before the queue's lock: see `pump`); returns how
    /// long the client has made no progress while something was outstanding.
    fn observe(&mut self, q: &Queue, unacked: Option<usize>, now: Instant) -> Duration {
        // Without a probe, the kernel taking bytes is the only sign.
        let acked = q.handed.saturating_sub(unacked.unwrap_or(0) as u64);
        let outstanding = !q.pending.is_empty() || unacked.is_some_and(|n| n > 0);
        // The clock runs only while something is outstanding: a stream
        // that was all taken and then waited (a long prefill before the
        // first token) starts it now, when its next frame comes.
        if acked > self.acked || !outstanding || !self.outstanding {
            self.last = now;
        }
        self.outstanding = outstanding;
        self.acked = self.acked.max(acked);
        now.saturating_duration_since(self.last)
    }
}

/// Moves frames into the queue and watches the client.
async fn pump(
    mut frames: BoxStream<'static, Bytes>,
    shared: Arc<Shared>,
    mut progress: Progress,
    s: Settings,
    cut_tx: CutSender,
) {
    // Looks only while something is outstanding: a client that keeps up
    // costs no timer wake-ups between tokens.
    let period = (s.flush_interval / 2).clamp(Duration::from_millis(5), Duration::from_millis(50));
    let mut more = true;
    // After a cut: why, and until when the closing frames may wait.
    let mut cut: Option<(Cut, Instant)> = None;
    loop {
        let body_gone = shared.body_gone.notified();
        let give_up = cut.map_or_else(Instant::now, |(_, until)| until);
        tokio::select! {
            frame = frames.next(), if more => {
                let mut q = shared.lock();
                match frame {
                    Some(bytes) => q.pending.extend_from_slice(&bytes),
                    None => {
                        q.ended = true;
                        more = false;
                    }
                }
                q.wake();
            }
            () = tokio::time::sleep(period), if progress.outstanding && cut.is_none() => {}
            () = tokio::time::sleep_until(give_up), if cut.is_some() => {}
            () = body_gone => {}
        }
        // The socket is probed before the queue is locked, never under it:
        // closing a connection holds the probe's write lock while it drops
        // the body, whose drop takes the queue's lock (the other order
        // deadlocked a server under load).
        let unacked = progress.probe.unacked();
        let mut q = shared.lock();
        if q.body_gone {
            return;
        }
        if q.ended && q.pending.is_empty() {
            return;
        }
        let now = Instant::now();
        if let Some((why, until)) = cut {
            if now >= until {
                // Not even the closing frames were taken: abort.
                q.aborted = Some(why);
                q.wake();
                return;
            }
            continue;
        }
        let idle = progress.observe(&q, unacked, now);
        q.lagging = idle >= s.flush_interval;
        let why = if q.pending.len() > s.max_pending {
            Cut::Overflow
        } else if idle > s.stall_timeout {
            Cut::Stall
        } else {
            continue;
        };
        tracing::warn!(
            reason = why.reason(),
            pending_bytes = q.pending.len(),
            idle_ms = idle.as_millis() as u64,
            "client not reading; stream cut off"
        );
        metrics::counter!(STREAMS_CUT, "reason" => why.reason()).increment(1);
        // What waited is dropped: the closing frames come next, and a
        // client that reads again gets them at once.
        q.pending.clear();
        q.lagging = false;
        cut = Some((why, now + s.stall_timeout));
        drop(q);
        // The source ends its generations (their KV is freed now) and
        // yields its closing frames.
        let _ = cut_tx.send(Some(why));
    }
}

/// The response body: takes everything queued at each poll.
struct QueueBody {
    shared: Arc<Shared>,
    flush_interval: Duration,
    last_frame: Option<Instant>,
    /// While lagging, the next frame waits for this.
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl http_body::Body for QueueBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let mut q = this.shared.lock();
        if let Some(why) = q.aborted {
            return Poll::Ready(Some(Err(std::io::Error::other(format!(
                "stream cut off: {}",
                why.reason()
            )))));
        }
        if q.pending.is_empty() {
            if q.ended {
                return Poll::Ready(None);
            }
            q.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        if q.lagging {
            if let Some(last) = this.last_frame {
                let at = last + this.flush_interval;
                if Instant::now() < at {
                    let wait = this
                        .wait
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                    wait.as_mut().reset(at);
                    if wait.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
            }
        }
        let bytes = q.pending.split().freeze();
        q.handed += bytes.len() as u64;
        this.last_frame = Some(Instant::now());
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }
}

impl Drop for QueueBody {
    fn drop(&mut self) {
        self.shared.lock().body_gone = true;
        self.shared.body_gone.notify_one();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use http_body::Body as _;

    use super::*;

    /// Every frame of `body`, and the error that ended it, if any.
    async fn collect(mut body: Body) -> (Vec<Bytes>, Option<String>) {
        let mut frames = Vec::new();
        loop {
            let next = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
            match next {
                Some(Ok(f)) => frames.push(f.into_data().unwrap()),
                Some(Err(e)) => return (frames, Some(e.to_string())),
                None => return (frames, None),
            }
        }
    }

    fn settings(stall_ms: u64) -> Settings {
        Settings {
            stall_timeout: Duration::from_millis(stall_ms),
            flush_interval: Duration::from_millis(20),
            max_pending: 1 << 20,
        }
    }

    /// A source like a stream's: `frames` until the pump cuts it, then its
    /// closing frame `CLOSING` and its end, dropping `frames` (and so
    /// setting `dropped`) at the cut, as a stream cancels its generations
    /// (`listens`); or `frames` only, never closing (`!listens`).
    fn source(
        frames: BoxStream<'static, Bytes>,
        listens: bool,
        dropped: Arc<std::sync::atomic::AtomicBool>,
    ) -> (BoxStream<'static, Bytes>, CutSender) {
        struct Dropped(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        async fn cut(rx: &mut tokio::sync::watch::Receiver<Option<Cut>>, listens: bool) {
            if !listens || rx.wait_for(Option::is_some).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        let (tx, rx) = tokio::sync::watch::channel(None);
        let live = Some((frames, Dropped(dropped)));
        let frames =
            futures_util::stream::unfold((live, rx), move |(mut live, mut rx)| async move {
                let (frames, _) = live.as_mut()?;
                tokio::select! {
                    biased;
                    () = cut(&mut rx, listens) => Some((Bytes::from_static(CLOSING), (None, rx))),
                    b = frames.next() => Some((b?, (live, rx))),
                }
            });
        (frames.boxed(), tx)
    }

    const CLOSING: &[u8] = b"data: closing\n\n";

    fn flag() -> Arc<std::sync::atomic::AtomicBool> {
        Arc::new(std::sync::atomic::AtomicBool::new(false))
    }

    /// Polls `done` until it holds, for at most 5 s.
    async fn until(done: impl Fn() -> bool) {
        let started = std::time::Instant::now();
        while !done() {
            assert!(started.elapsed() < Duration::from_secs(5), "never happened");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn ticking() -> BoxStream<'static, Bytes> {
        futures_util::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Some((Bytes::from_static(b"data: x\n\n"), ()))
        })
        .boxed()
    }

    #[tokio::test]
    async fn a_reading_client_gets_every_byte_in_order() {
        let frames = futures_util::stream::iter((0..50).map(|i| Bytes::from(format!("{i};"))));
        let (frames, cut) = source(frames.boxed(), true, flag());
        let (got, err) = collect(body(frames, None, settings(1000), cut)).await;
        assert!(err.is_none());
        let text: String = got.iter().map(|b| String::from_utf8_lossy(b)).collect();
        let want: String = (0..50).map(|i| format!("{i};")).collect();
        assert_eq!(text, want);
    }

    #[tokio::test]
    async fn a_stalled_client_is_cut_off_and_then_gets_the_closing_frame_and_a_clean_end() {
        let dropped = flag();
        let (frames, cut) = source(ticking(), true, dropped.clone());
        let started = std::time::Instant::now();
        let b = body(frames, None, settings(200), cut);
        until(|| dropped.load(std::sync::atomic::Ordering::SeqCst)).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
        // What waited for the client is gone; the closing frame is all.
        let (got, err) = collect(b).await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(got.concat(), CLOSING);
    }

    #[tokio::test]
    async fn a_wait_longer_than_the_stall_timeout_between_frames_is_no_stall() {
        // The first frame is taken at once; the next comes after three
        // stall timeouts (a long prefill): nothing was outstanding meanwhile.
        let frames = futures_util::stream::unfold(0, |i| async move {
            if i == 1 {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            (i < 3).then(|| (Bytes::from(format!("{i};")), i + 1))
        });
        let (frames, cut) = source(frames.boxed(), true, flag());
        let (got, err) = collect(body(frames, None, settings(100), cut)).await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(got.concat(), b"0;1;2;");
    }

    #[tokio::test]
    async fn closing_frames_never_taken_end_in_an_error_after_another_stall_timeout() {
        let (frames, cut) = source(ticking(), false, flag());
        let b = body(frames, None, settings(100), cut);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let (_, err) = collect(b).await;
        assert!(err.unwrap().contains("stall"));
    }

    #[tokio::test]
    async fn an_overflowing_queue_is_cut_off_at_once_and_closed() {
        let frames = futures_util::stream::repeat(Bytes::from(vec![b'x'; 4096])).take(1000);
        let s = Settings {
            max_pending: 64 * 1024,
            ..settings(60_000)
        };
        let dropped = flag();
        let (frames, cut) = source(frames.boxed(), true, dropped.clone());
        let b = body(frames, None, s, cut);
        until(|| dropped.load(std::sync::atomic::Ordering::SeqCst)).await;
        let (got, err) = collect(b).await;
        assert!(err.is_none(), "{err:?}");
        assert!(got.concat().ends_with(CLOSING));
    }
}
