//! The listener: accepts connections and serves HTTP/1 on each, with what
//! `axum::serve` does not offer:
//!
//! - a header-read timeout: a client that trickles its request head is
//!   closed after `server.header_timeout`; hyper runs the same clock while a
//!   keep-alive connection waits for its next request, so it is also the
//!   idle-connection timeout;
//! - a cap on open connections: at the cap a new connection takes the slot
//!   of the connection idle longest (no request in flight: a client
//!   trickling its head, or an idle keep-alive one; [`slots`]), and only
//!   when every connection is busy is it answered 503 in the OpenAI error
//!   shape and closed, without reading its request; optionally a cap per
//!   client address;
//! - a [`ConnProbe`] in every request's extensions, through which a stream
//!   learns how much of what it wrote the client has not yet acknowledged
//!   (its backpressure signal, see `routes::sse`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::Service;

mod slots;

pub use slots::TAKEN_OVER;
use slots::{Activity, Admission, Busy, Slots};

/// Connection limits.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// See `server.header_timeout`.
    pub header_timeout: Duration,
    /// Most open connections (0: no cap).
    pub max_connections: usize,
    /// Most open connections from one client address (0: no cap).
    pub max_connections_per_client: usize,
}

/// Open connections, as the `ingot_http_connections` gauge reports them.
pub const CONNECTIONS: &str = "ingot_http_connections";

/// Accepts and serves until `stop` turns true; then asks every connection
/// to close after its current request and returns once all have.
pub async fn serve_connections(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) {
    let open = Arc::new(AtomicUsize::new(0));
    let slots = Arc::new(Slots::default());
    let turnover = Arc::new(Mutex::new(Turnover::default()));
    let (closed_tx, mut closed_rx) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let now = Instant::now();
        let slot = match slots.admit(
            peer.ip(),
            limits.max_connections,
            limits.max_connections_per_client,
            now,
        ) {
            Admission::Admitted(slot) => slot,
            refused => {
                let retry_after = lock(&turnover).retry_after(now);
                let per_client = matches!(refused, Admission::ClientFull);
                tokio::spawn(refuse(stream, retry_after, per_client));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let count = OpenGuard::new(open.clone(), turnover.clone(), closed_tx.clone());
        let conn = Connection {
            router: router.clone(),
            header_timeout: limits.header_timeout,
            stop: stop.clone(),
            activity: slot.activity.clone(),
        };
        tokio::spawn(async move {
            conn.run(stream).await;
            drop(slot);
            drop(count);
        });
    }
    drop(closed_tx);
    // Every guard holds a sender: this returns once the last one is gone.
    while closed_rx.recv().await.is_some() {}
}

/// How fast connections close, so a connection refused at the cap is told
/// when a slot is likely free (`Retry-After`) instead of a constant: the
/// time one more close takes at the rate of the last 10 s (1 to 60 s; 10 s
/// when none closed in that window), as the queue-full 429 does with the
/// queue's drain rate.
#[derive(Debug, Default)]
struct Turnover {
    closed: u64,
    meter: ingot_engine::drain::DrainMeter,
}

impl Turnover {
    fn closed(&mut self, now: Instant) {
        self.closed += 1;
        self.meter.record(now, self.closed);
    }

    fn retry_after(&mut self, now: Instant) -> Duration {
        let rate = self.meter.record(now, self.closed);
        ingot_engine::drain::retry_after(1, rate)
    }
}

/// The lock, whether or not a holder panicked (the counts stay usable).
fn lock(turnover: &Mutex<Turnover>) -> std::sync::MutexGuard<'_, Turnover> {
    turnover
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Counts an open connection while it lives.
struct OpenGuard {
    open: Arc<AtomicUsize>,
    turnover: Arc<Mutex<Turnover>>,
    _closed: tokio::sync::mpsc::Sender<()>,
}

impl OpenGuard {
    fn new(
        open: Arc<AtomicUsize>,
        turnover: Arc<Mutex<Turnover>>,
        closed: tokio::sync::mpsc::Sender<()>,
    ) -> Self {
        let n = open.fetch_add(1, Ordering::SeqCst) + 1;
        metrics::gauge!(CONNECTIONS).set(n as f64);
        Self {
            open,
            turnover,
            _closed: closed,
        }
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        let n = self.open.fetch_sub(1, Ordering::SeqCst) - 1;
        metrics::gauge!(CONNECTIONS).set(n as f64);
        lock(&self.turnover).closed(Instant::now());
    }
}

/// One accepted connection.
struct Connection {
    router: Router,
    header_timeout: Duration,
    stop: watch::Receiver<bool>,
    /// Its requests in flight; told when its slot is handed over.
    activity: Arc<Activity>,
}

impl Connection {
    async fn run(mut self, stream: TcpStream) {
        let probe = ConnProbe::of(&stream);
        let socket = probe.clone();
        let router = self.router.clone();
        let activity = self.activity.clone();
        let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            // In flight from its head until its response ends: the
            // connection's slot cannot be handed over meanwhile.
            let busy = activity.busy();
            req.extensions_mut()
                .insert(Received(std::time::Instant::now()));
            req.extensions_mut().insert(probe.clone());
            let mut router = router.clone();
            let response = router.call(req.map(axum::body::Body::new));
            async move {
                let response = response.await?;
                Ok::<_, std::convert::Infallible>(
                    response.map(|inner| axum::body::Body::new(HeldBody { inner, _busy: busy })),
                )
            }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout);
        let mut conn = Box::pin(
            builder.serve_connection(TokioIo::new(ShapedParseErrors::new(stream)), service),
        );
        let ended = tokio::select! {
            r = conn.as_mut() => Some(r),
            _ = self.stop.wait_for(|s| *s) => None,
            // Its slot went to a new connection: it had no request in
            // flight, so closing loses nothing.
            () = self.activity.evicted.notified() => Some(Ok(())),
        };
        let result = match ended {
            Some(r) => r,
            None => {
                conn.as_mut().graceful_shutdown();
                conn.as_mut().await
            }
        };
        if let Err(e) = result {
            // Header timeouts, resets and cut streams end up here; none is
            // the server's fault.
            tracing::debug!(error = %e, "connection closed with an error");
        }
        // The socket closes with `conn`: no probe may read its descriptor
        // number after that (it could be another connection's by then).
        socket.close_with(conn);
    }
}

/// A connection's socket, through which hyper's own answers to request
/// heads it cannot parse go out in the API's error shape. hyper answers a
/// malformed head (a Content-Length that is no byte count, a bad header
/// line), a head over its size or an overlong URI itself, before any
/// handler runs, with an empty body. Those answers are recognised as the
/// one write of a whole head of status 400, 414 or 431 with
/// `content-length: 0`, which the app never sends (every error of its has
/// a JSON body), and written with a JSON error body instead.
struct ShapedParseErrors<T> {
    inner: T,
    /// The answer being written in place of the head hyper handed over.
    pending: Option<Reshaped>,
}

/// A rewritten answer: its bytes, how many are out, and the length of
/// the write it replaces (what hyper is told was written).
struct Reshaped {
    bytes: Vec<u8>,
    written: usize,
    replaces: usize,
}

impl<T> ShapedParseErrors<T> {
    fn new(inner: T) -> Self {
        Self {
            inner,
            pending: None,
        }
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> ShapedParseErrors<T> {
    /// Writes the pending answer; done, it stands for the write it
    /// replaced. hyper retries a write that was pending with the same
    /// bytes, so what a retry hands over is not looked at.
    fn poll_pending(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::task::Poll;
        let Some(p) = self.pending.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        while p.written < p.bytes.len() {
            match std::pin::Pin::new(&mut self.inner).poll_write(cx, &p.bytes[p.written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()))
                }
                Poll::Ready(Ok(n)) => p.written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        let replaces = p.replaces;
        self.pending = None;
        Poll::Ready(Ok(replaces))
    }
}

/// hyper's answer to an unparsable head in `head`, with a JSON body;
/// `None` for any other write.
fn reshape(head: &[u8]) -> Option<Vec<u8>> {
    // Every write passes here: refuse the rest cheaply.
    if !head.starts_with(b"HTTP/1.1 4") || !head.ends_with(b"\r\n\r\n") || head.len() > 1024 {
        return None;
    }
    let text = std::str::from_utf8(head).ok()?;
    let rest = text.strip_prefix("HTTP/1.1 ")?.strip_suffix("\r\n\r\n")?;
    let (message, code) = match rest.get(..4)? {
        "400 " => (
            "the request could not be read as HTTP: its head is malformed (e.g. a Content-Length that is not a byte count, or a bad header line)",
            "malformed_request",
        ),
        "414 " => ("the request URI is too long", "uri_too_long"),
        "431 " => ("the request's header fields are too large", "headers_too_large"),
        _ => return None,
    };
    let mut lines = rest.split("\r\n");
    let status = lines.next()?;
    let (empty, headers): (Vec<&str>, Vec<&str>) =
        lines.partition(|h| h.eq_ignore_ascii_case("content-length: 0"));
    if empty.is_empty() {
        return None;
    }
    let body = serde_json::json!({"error": {
        "message": message, "type": "invalid_request_error", "param": null, "code": code,
    }})
    .to_string();
    let mut out = format!("HTTP/1.1 {status}\r\n");
    for h in headers {
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str(&format!(
        "content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ));
    Some(out.into_bytes())
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for ShapedParseErrors<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for ShapedParseErrors<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.is_none() {
            let Some(bytes) = reshape(buf) else {
                return std::pin::Pin::new(&mut this.inner).poll_write(cx, buf);
            };
            this.pending = Some(Reshaped {
                bytes,
                written: 0,
                replaces: buf.len(),
            });
        }
        this.poll_pending(cx)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.is_none() {
            // hyper's answer to an unparsable head is a head alone: one
            // non-empty slice.
            let mut filled = bufs.iter().filter(|b| !b.is_empty());
            let only = match (filled.next(), filled.next()) {
                (Some(head), None) => Some(head),
                _ => None,
            };
            let Some((bytes, replaces)) = only.and_then(|h| Some((reshape(h)?, h.len()))) else {
                return std::pin::Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
            };
            this.pending = Some(Reshaped {
                bytes,
                written: 0,
                replaces,
            });
        }
        this.poll_pending(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// When hyper handed a request over (its head parsed): the start of the
/// server's own latency series (`ingot_request_prepare_seconds`,
/// `ingot_http_time_to_first_token_seconds`).
#[derive(Clone, Copy, Debug)]
pub struct Received(pub std::time::Instant);

impl Received {
    /// The instant of `received`, else now (requests that did not come
    /// through a connection, as in in-process tests).
    pub fn or_now(received: Option<axum::Extension<Received>>) -> std::time::Instant {
        received.map_or_else(std::time::Instant::now, |r| r.0 .0)
    }
}

/// A response body that keeps its request counted in flight until it ends.
struct HeldBody {
    inner: axum::body::Body,
    _busy: Busy,
}

impl http_body::Body for HeldBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Answers 503 to a connection over the cap (or over its address's share,
/// `per_client`) and closes it. The request is not read; the socket is shut
/// for writing first and drained briefly so the client reads the answer
/// instead of a reset.
async fn refuse(mut stream: TcpStream, retry_after: Duration, per_client: bool) {
    crate::error::count_rejection("connections");
    let body = if per_client {
        r#"{"error":{"message":"too many open connections from this client address (server.max_connections_per_client); retry later","type":"server_error","param":null,"code":"too_many_connections"}}"#
    } else {
        r#"{"error":{"message":"too many open connections, all with a request in flight; retry later","type":"server_error","param":null,"code":"too_many_connections"}}"#
    };
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: {}\r\nconnection: close\r\n\r\n",
        body.len(),
        crate::error::ceil_secs(retry_after)
    );
    let answered = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut left: usize = 64 * 1024;
        while left > 0 {
            let n = stream.read(&mut sink).await?;
            if n == 0 {
                break;
            }
            left = left.saturating_sub(n);
        }
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), answered).await;
}

/// Reads a connection's socket state from inside a request: how many bytes
/// written to it the peer has not acknowledged. It holds the socket's
/// descriptor number, never read once the connection has closed (the number
/// could belong to another connection by then): closing takes the write
/// lock, reading the read lock.
#[derive(Clone, Debug, Default)]
pub struct ConnProbe {
    #[cfg(target_os = "linux")]
    fd: Option<Arc<std::sync::RwLock<Option<std::os::fd::RawFd>>>>,
}

impl ConnProbe {
    fn of(stream: &TcpStream) -> Self {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let fd = Some(Arc::new(std::sync::RwLock::new(Some(stream.as_raw_fd()))));
            Self { fd }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = stream;
            Self::default()
        }
    }

    /// Drops `owner` (what owns the socket) with the descriptor marked
    /// closed first, under the write lock.
    fn close_with<T>(&self, owner: T) {
        #[cfg(target_os = "linux")]
        let _closing = self.fd.as_ref().map(|fd| {
            let mut slot = fd
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *slot = None;
            slot
        });
        drop(owner);
    }

    /// Bytes written but not yet acknowledged by the peer (`SIOCOUTQ`);
    /// `None` where the platform cannot tell or the connection is closed.
    pub fn unacked(&self) -> Option<usize> {
        #[cfg(target_os = "linux")]
        {
            let slot = self
                .fd
                .as_ref()?
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let fd = (*slot)?;
            let mut n: libc::c_int = 0;
            // SAFETY: TIOCOUTQ on a socket writes one int through the
            // pointer, which points at `n`; the descriptor is open while the
            // read lock is held (closing takes the write lock).
            let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
            (rc == 0).then(|| usize::try_from(n).unwrap_or(0))
        }
        #[cfg(not(target_os = "linux"))]
        None
    }
}

/// The most bytes of an oversized body read (and discarded) so the client
/// reads its 413 instead of a connection reset, and for how long.
const DRAIN_BYTES: u64 = 64 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(10);

/// Middleware: reads the body up to `limit` bytes and hands it on; a body
/// over the limit gets 413 in the OpenAI error shape. The rest of an
/// oversized body is read and discarded first (up to [`DRAIN_BYTES`]):
/// closing a socket with unread data resets it, and most clients then
/// report the reset rather than the answer. A client that sent
/// `Expect: 100-continue` with a length over the limit is answered at once,
/// before it sends the body.
pub async fn limit_body(
    axum::extract::State(limit): axum::extract::State<usize>,
    req: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    use futures_util::StreamExt;

    let too_large = || {
        let mut r = crate::ApiError::PayloadTooLarge(limit).into_response();
        r.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
        r
    };
    let headers = req.headers();
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let expects_continue = headers
        .get(axum::http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    // Over the limit by its own account: answered at once when the client
    // waits to be told (100-continue) or when the body could never be
    // read to its end anyway (a length past what is drained, such as an
    // absurd one); else read, discarding, as below.
    let declared_over = declared.is_some_and(|n| n > limit as u64);
    if declared_over && (expects_continue || declared.is_some_and(|n| n > DRAIN_BYTES)) {
        return too_large();
    }
    if declared == Some(0) {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let mut chunks = body.into_data_stream();
    let mut kept = bytes::BytesMut::new();
    // Declared over the limit: discarding from the start, within the drain
    // time (a client that never sends the body still gets its 413).
    let mut over = declared_over;
    let mut seen = 0u64;
    let mut drain_until = over.then(|| tokio::time::Instant::now() + DRAIN_TIME);
    loop {
        let next = match drain_until {
            None => chunks.next().await,
            Some(at) => match tokio::time::timeout_at(at, chunks.next()).await {
                Ok(next) => next,
                Err(_) => break,
            },
        };
        let Some(chunk) = next else { break };
        let Ok(chunk) = chunk else {
            // The client went away mid-body: nobody reads an answer.
            return too_large();
        };
        seen += chunk.len() as u64;
        if !over && kept.len() + chunk.len() <= limit {
            kept.extend_from_slice(&chunk);
            continue;
        }
        if !over {
            over = true;
            kept = bytes::BytesMut::new();
            drain_until = Some(tokio::time::Instant::now() + DRAIN_TIME);
        }
        if seen > DRAIN_BYTES {
            break;
        }
    }
    if over {
        return too_large();
    }
    let req = Request::from_parts(parts, axum::body::Body::from(kept.freeze()));
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_at_the_cap_follows_how_fast_connections_close() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // None closed within the window: the window.
        assert_eq!(Turnover::default().retry_after(t0), Duration::from_secs(10));
        // One every 2 s: the next in 2 s.
        let mut slow = Turnover::default();
        for i in 0..=5 {
            slow.closed(at(2_000 * i));
        }
        assert_eq!(slow.retry_after(at(10_000)), Duration::from_secs(2));
        // Two a second: within the second (never less than 1 s).
        let mut fast = Turnover::default();
        for i in 1..=20 {
            fast.closed(at(500 * i));
        }
        assert_eq!(fast.retry_after(at(10_000)), Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_connection_over_the_cap_is_told_when_to_retry() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let limits = ConnLimits {
            header_timeout: Duration::from_secs(5),
            max_connections: 1,
            max_connections_per_client: 0,
        };
        let (stop, stopped) = watch::channel(false);
        let server = tokio::spawn(serve_connections(listener, router, limits, stopped));
        // The holder's request is in flight (its body never comes), so
        // its slot cannot be handed over.
        let mut holder = TcpStream::connect(addr).await.unwrap();
        holder
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n")
            .await
            .unwrap();
        let mut refused = TcpStream::connect(addr).await.unwrap();
        let mut answer = String::new();
        refused.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
        // No connection closed yet: the 10 s window, not a constant 1.
        assert!(answer.contains("\r\nretry-after: 10\r\n"), "{answer}");
        assert!(
            answer.contains(r#""code":"too_many_connections""#),
            "{answer}"
        );
        stop.send_replace(true);
        drop(holder);
        server.await.unwrap();
    }

    /// Sends `request` raw to a server of one route; the whole answer.
    async fn answer_to(request: &str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/", axum::routing::post(|| async { "ok" }));
        let limits = ConnLimits {
            header_timeout: Duration::from_secs(5),
            max_connections: 0,
            max_connections_per_client: 0,
        };
        let (stop, stopped) = watch::channel(false);
        let server = tokio::spawn(serve_connections(listener, router, limits, stopped));
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        stop.send_replace(true);
        server.await.unwrap();
        answer
    }

    #[tokio::test]
    async fn an_unparsable_head_is_answered_in_the_error_shape() {
        let absurd =
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 99999999999999999999999\r\n\r\n";
        let answer = answer_to(absurd).await;
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{answer}"
        );
        assert!(
            answer.contains("\r\ncontent-type: application/json\r\n"),
            "{answer}"
        );
        let (_, body) = answer.split_once("\r\n\r\n").unwrap();
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["code"], "malformed_request", "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        let length = format!("\r\ncontent-length: {}\r\n", body.to_string().len());
        assert!(answer.contains(&length), "{answer}");
        // A parsable request is answered by the app, untouched.
        let fine = "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        let answer = answer_to(fine).await;
        assert!(
            answer.starts_with("HTTP/1.1 200 OK\r\n") && answer.ends_with("ok"),
            "{answer}"
        );
    }

    #[test]
    fn only_hypers_own_bodiless_error_heads_are_reshaped() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: now\r\n\r\n";
        let shaped = String::from_utf8(reshape(head).unwrap()).unwrap();
        assert!(
            shaped.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\ndate: now\r\n"),
            "{shaped}"
        );
        assert!(shaped.contains("headers_too_large"), "{shaped}");
        for other in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{}",
            b"data: {}\n\n",
        ] {
            assert_eq!(reshape(other), None, "{}", String::from_utf8_lossy(other));
        }
    }
}
