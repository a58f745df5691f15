//! Issuing a run's requests: the arrival process, the concurrency cap,
//! multi-turn sequencing, the duration limit and Ctrl-C.
//!
//! Arrivals follow vLLM's `benchmark_serving`: with `--request-rate R` the
//! gaps between conversation starts are exponential with mean 1/R (a
//! Poisson process, seeded), measured from the run start so a late start
//! does not shift later ones; with R = inf everything starts at once. A
//! `--max-concurrency` semaphore (FIFO) caps requests in flight; a request's
//! `start_s` is when it is sent, after waiting for its permit. The turns of
//! a conversation run one after another, each taking a permit for its own
//! request only.
//!
//! The first Ctrl-C stops issuing, waits up to [`GRACE`] for requests in
//! flight, then cancels the rest (recorded as `cancelled`); a second Ctrl-C
//! cancels at once. With a duration, issuing stops when it is over and the
//! requests in flight finish (each within its timeout).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use indicatif::ProgressBar;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::client::{cancelled, HttpClient, StreamRequest};
use crate::dataset::Conversation;
use crate::result::{FailureKind, RequestRecord};

/// How long requests in flight may finish after the first Ctrl-C.
pub(crate) const GRACE: Duration = Duration::from_secs(3);

/// Salt so the arrival RNG differs from the dataset's with the same seed.
const ARRIVAL_SALT: u64 = 0x5eed_a771_7a15_0001;

/// What every request of a run shares in its body.
#[derive(Debug, Clone)]
pub(crate) struct RequestTemplate {
    /// Endpoint path, e.g. `/v1/completions`.
    pub path: String,
    /// Chat format (`messages`) rather than `prompt`.
    pub chat: bool,
    /// The `model` field.
    pub model: String,
    /// Send `"ignore_eos": true`.
    pub ignore_eos: bool,
    /// The `temperature` field.
    pub temperature: f64,
    /// Extra fields, overriding the above.
    pub extra: Map<String, Value>,
    /// Per-request limit.
    pub timeout: Duration,
}

impl RequestTemplate {
    /// A streaming request body for `prompt` (a string or a message list).
    fn body(&self, prompt: Value, max_tokens: usize) -> Bytes {
        let mut m = Map::new();
        m.insert("model".into(), Value::String(self.model.clone()));
        m.insert(if self.chat { "messages" } else { "prompt" }.into(), prompt);
        m.insert("max_tokens".into(), max_tokens.into());
        m.insert("temperature".into(), json!(self.temperature));
        m.insert("stream".into(), true.into());
        m.insert("stream_options".into(), json!({"include_usage": true}));
        if self.ignore_eos {
            m.insert("ignore_eos".into(), true.into());
        }
        for (k, v) in &self.extra {
            m.insert(k.clone(), v.clone());
        }
        Bytes::from(Value::Object(m).to_string())
    }
}

/// How requests are issued.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrival {
    /// Conversations started per second (Poisson); infinite: all at once.
    pub rate: f64,
    /// Requests in flight at most.
    pub max_concurrency: Option<usize>,
    /// Stop issuing after this long.
    pub duration: Option<Duration>,
    /// Seeds the arrival times.
    pub seed: u64,
}

/// Where conversations come from.
pub(crate) enum Source {
    /// Made before the run.
    Fixed(std::vec::IntoIter<Conversation>),
    /// Made on another thread while the run goes (`--duration`).
    Stream(mpsc::Receiver<Conversation>),
}

impl Source {
    async fn next(&mut self) -> Option<Conversation> {
        match self {
            Source::Fixed(it) => it.next(),
            Source::Stream(rx) => rx.recv().await,
        }
    }
}

/// What a run produced.
#[derive(Debug, Default)]
pub(crate) struct LoadOutcome {
    /// Every request sent, in order of sending.
    pub records: Vec<RequestRecord>,
    /// From the first request to the end of the last, seconds.
    pub duration_s: f64,
    /// Stopped by Ctrl-C.
    pub interrupted: bool,
}

/// State the request tasks share.
struct Shared {
    client: HttpClient,
    template: RequestTemplate,
    run_start: Instant,
    semaphore: Option<Arc<Semaphore>>,
    records: Mutex<Vec<RequestRecord>>,
    progress: ProgressBar,
    /// True: start no new turns.
    draining: watch::Receiver<bool>,
    /// True: drop requests in flight.
    cancel: watch::Receiver<bool>,
}

/// Resolves when the Ctrl-C count reaches `n`.
async fn pressed(interrupts: &mut watch::Receiver<u32>, n: u32) {
    if interrupts.wait_for(|c| *c >= n).await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn join_all(tasks: &mut JoinSet<()>) {
    while tasks.join_next().await.is_some() {}
}

/// Runs `source` against the server. `interrupts` counts Ctrl-C presses
/// (run-wide); presses from before this call do not count.
pub(crate) async fn drive(
    client: &HttpClient,
    template: RequestTemplate,
    mut source: Source,
    arrival: Arrival,
    progress: ProgressBar,
    interrupts: &mut watch::Receiver<u32>,
) -> LoadOutcome {
    let base = *interrupts.borrow_and_update();
    let (drain_tx, draining) = watch::channel(false);
    let (cancel_tx, cancel) = watch::channel(false);
    let run_start = Instant::now();
    let shared = Arc::new(Shared {
        client: client.clone(),
        template,
        run_start,
        semaphore: arrival
            .max_concurrency
            .map(|c| Arc::new(Semaphore::new(c.max(1)))),
        records: Mutex::new(Vec::new()),
        progress,
        draining,
        cancel,
    });
    let mut rng = ChaCha8Rng::seed_from_u64(arrival.seed ^ ARRIVAL_SALT);
    let mut offset = 0.0_f64;
    let end = async {
        match arrival.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(end);
    let mut tasks = JoinSet::new();
    let mut interrupted = false;
    loop {
        let conv = tokio::select! {
            biased;
            () = pressed(interrupts, base + 1) => { interrupted = true; break }
            () = &mut end => break,
            c = source.next() => match c { Some(c) => c, None => break },
        };
        if arrival.rate.is_finite() {
            // Exponential gap; 1 − u is in (0, 1], so the log is finite.
            offset += -(1.0 - rng.random::<f64>()).ln() / arrival.rate;
            let at = run_start + Duration::from_secs_f64(offset);
            tokio::select! {
                biased;
                () = pressed(interrupts, base + 1) => { interrupted = true; break }
                () = &mut end => break,
                () = tokio::time::sleep_until(at.into()) => {}
            }
        }
        let permit = match &shared.semaphore {
            None => None,
            Some(sem) => tokio::select! {
                biased;
                () = pressed(interrupts, base + 1) => { interrupted = true; break }
                () = &mut end => break,
                p = sem.clone().acquire_owned() => p.ok(),
            },
        };
        tasks.spawn(conversation_task(shared.clone(), conv, permit));
        while tasks.try_join_next().is_some() {}
    }
    // No new conversations; with a duration or Ctrl-C, no new turns either.
    drop(source);
    if arrival.duration.is_some() || interrupted {
        let _ = drain_tx.send(true);
    }
    if !interrupted {
        tokio::select! {
            () = join_all(&mut tasks) => {}
            () = pressed(interrupts, base + 1) => interrupted = true,
        }
    }
    if interrupted {
        let _ = drain_tx.send(true);
        tokio::select! {
            () = join_all(&mut tasks) => {}
            () = tokio::time::sleep(GRACE) => {}
            () = pressed(interrupts, base + 2) => {}
        }
        let _ = cancel_tx.send(true);
        join_all(&mut tasks).await;
    }
    let duration_s = run_start.elapsed().as_secs_f64();
    let mut records = std::mem::take(
        &mut *shared
            .records
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    records.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    LoadOutcome {
        records,
        duration_s,
        interrupted,
    }
}

/// Sends a conversation's turns in order. `permit` is the first turn's.
async fn conversation_task(
    shared: Arc<Shared>,
    conv: Conversation,
    mut permit: Option<OwnedSemaphorePermit>,
) {
    let mut cancel = shared.cancel.clone();
    let mut draining = shared.draining.clone();
    let t = &shared.template;
    let multi = conv.turns.len() > 1;
    // Completions: the previous prompt and response; chat: the messages.
    let mut history = String::new();
    let mut messages: Vec<Value> = Vec::new();
    let mut history_tokens = 0;
    for (i, turn) in conv.turns.iter().enumerate() {
        if i > 0 {
            if *draining.borrow() {
                return;
            }
            if let Some(sem) = &shared.semaphore {
                permit = tokio::select! {
                    p = sem.clone().acquire_owned() => p.ok(),
                    () = cancelled(&mut draining) => return,
                };
            }
        }
        let prompt = if t.chat {
            messages.push(json!({"role": "user", "content": turn.text}));
            Value::Array(messages.clone())
        } else {
            history.push_str(&turn.text);
            Value::String(history.clone())
        };
        let req = StreamRequest {
            path: t.path.clone(),
            body: t.body(prompt, turn.output_len),
            timeout: t.timeout,
            prompt_tokens: history_tokens + turn.tokens,
            keep_text: multi,
            turn: i,
        };
        let out = shared
            .client
            .stream(&req, shared.run_start, &mut cancel)
            .await;
        drop(permit.take());
        let stop = out.record.failure == Some(FailureKind::Cancelled);
        history_tokens = out.record.prompt_tokens + out.record.output_tokens;
        if multi {
            if t.chat {
                messages.push(json!({"role": "assistant", "content": out.text}));
            } else {
                history.push_str(&out.text);
            }
        }
        shared
            .records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(out.record);
        shared.progress.inc(1);
        if stop {
            return;
        }
    }
}

/// Counts Ctrl-C presses into `tx` until the runtime ends.
pub(crate) async fn count_interrupts(tx: watch::Sender<u32>) {
    while tokio::signal::ctrl_c().await.is_ok() {
        tx.send_modify(|n| *n += 1);
    }
}

#[cfg(test)]
pub(crate) mod fake {
    //! A trivial local OpenAI SSE responder on std threads (one per
    //! connection, sleeping to absolute deadlines), for client tests.

    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// How POSTs are answered.
    #[derive(Debug, Clone, Copy)]
    pub enum Mode {
        /// `max_tokens` chunks, one per `interval`, then usage and `[DONE]`.
        Stream(Duration),
        /// Five chunks, each written in 3-byte pieces.
        Split,
        /// This status with an OpenAI error body.
        Status(u16),
        /// 200 with a plain JSON completion.
        Json,
        /// Two chunks, then an error event.
        ErrorMidStream,
        /// Two chunks, then the connection closes.
        Truncate,
        /// Headers, then nothing for 5 s.
        Stall,
    }

    /// A running responder.
    pub struct FakeServer {
        /// `http://127.0.0.1:PORT`.
        pub url: String,
        /// Gaps between consecutive chunks of a stream as written, seconds.
        pub gaps: Arc<Mutex<Vec<f64>>>,
    }

    impl FakeServer {
        pub fn start(mode: Mode) -> FakeServer {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let gaps = Arc::new(Mutex::new(Vec::new()));
            let g = gaps.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    let Ok(conn) = conn else { return };
                    let g = g.clone();
                    std::thread::spawn(move || serve(conn, mode, &g));
                }
            });
            FakeServer { url, gaps }
        }
    }

    fn chunked(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
        let mut out = format!("{:x}\r\n", data.len()).into_bytes();
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
        s.write_all(&out)
    }

    fn event(json: &str) -> Vec<u8> {
        format!("data: {json}\n\n").into_bytes()
    }

    fn token(finish: Option<&str>) -> Vec<u8> {
        let (text, finish) = match finish {
            Some(f) => ("", format!("\"{f}\"")),
            None => (" tok", "null".into()),
        };
        event(&format!(
            r#"{{"id":"cmpl-1","object":"text_completion","created":0,"model":"fake","choices":[{{"index":0,"text":"{text}","logprobs":null,"finish_reason":{finish}}}]}}"#
        ))
    }

    fn serve(conn: TcpStream, mode: Mode, gaps: &Mutex<Vec<f64>>) {
        conn.set_nodelay(true).unwrap();
        let mut s = conn.try_clone().unwrap();
        let mut reader = BufReader::new(conn);
        loop {
            let mut head = String::new();
            if reader.read_line(&mut head).unwrap_or(0) == 0 {
                return;
            }
            let mut len = 0;
            let mut cache = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                if line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
                // Echoed as ingot's x-ingot-cache, to test --header and
                // the recording of the response header at once.
                if let Some(v) = lower.strip_prefix("x-fake-cache:") {
                    cache = format!("x-ingot-cache: {}\r\n", v.trim());
                }
            }
            let mut body = vec![0; len];
            reader.read_exact(&mut body).unwrap();
            if head.starts_with("GET /v1/models") {
                let doc = r#"{"object":"list","data":[{"id":"fake","object":"model"}]}"#;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{doc}",
                    doc.len()
                );
                s.write_all(resp.as_bytes()).unwrap();
                continue;
            }
            let req: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let n = req["max_tokens"].as_u64().unwrap() as u32;
            if respond(&mut s, mode, n, &cache, gaps).is_err() {
                return;
            }
        }
    }

    fn respond(
        s: &mut TcpStream,
        mode: Mode,
        n: u32,
        cache: &str,
        gaps: &Mutex<Vec<f64>>,
    ) -> std::io::Result<()> {
        let plain = |s: &mut TcpStream, status: &str, ct: &str, body: &str| {
            s.write_all(
                format!(
                    "HTTP/1.1 {status}\r\ncontent-type: {ct}\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
        };
        match mode {
            Mode::Status(code) => {
                let body = r#"{"error":{"message":"fake overload","type":"rate_limit_error","param":null,"code":null}}"#;
                return plain(s, &format!("{code} Whatever"), "application/json", body);
            }
            Mode::Json => {
                let body =
                    r#"{"id":"x","choices":[{"index":0,"text":"hi","finish_reason":"stop"}]}"#;
                return plain(s, "200 OK", "application/json", body);
            }
            _ => {}
        }
        let head = format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n{cache}transfer-encoding: chunked\r\n\r\n");
        s.write_all(head.as_bytes())?;
        let usage = event(&format!(
            r#"{{"id":"cmpl-1","object":"text_completion","created":0,"model":"fake","choices":[],"usage":{{"prompt_tokens":3,"completion_tokens":{n},"total_tokens":{}}}}}"#,
            n + 3
        ));
        match mode {
            Mode::Stream(interval) => {
                let start = Instant::now();
                let mut last = None;
                let mut mine = Vec::with_capacity(n as usize);
                for k in 1..=n {
                    let due = start + interval * k;
                    std::thread::sleep(due.saturating_duration_since(Instant::now()));
                    chunked(s, &token(None))?;
                    let now = Instant::now();
                    if let Some(prev) = last.replace(now) {
                        mine.push((now - prev).as_secs_f64());
                    }
                }
                gaps.lock().unwrap().extend(mine);
                chunked(s, &token(Some("length")))?;
                chunked(s, &usage)?;
                chunked(s, &event("[DONE]"))?;
                s.write_all(b"0\r\n\r\n")
            }
            Mode::Split => {
                let mut all = Vec::new();
                for _ in 0..n {
                    all.extend(token(None));
                }
                all.extend(token(Some("length")));
                all.extend(usage);
                all.extend(event("[DONE]"));
                for piece in all.chunks(3) {
                    chunked(s, piece)?;
                    std::thread::sleep(Duration::from_micros(100));
                }
                s.write_all(b"0\r\n\r\n")
            }
            Mode::ErrorMidStream => {
                chunked(s, &token(None))?;
                chunked(s, &token(None))?;
                chunked(
                    s,
                    &event(
                        r#"{"error":{"message":"engine exploded","type":"internal_error","param":null,"code":null}}"#,
                    ),
                )?;
                chunked(s, &event("[DONE]"))?;
                s.write_all(b"0\r\n\r\n")
            }
            Mode::Truncate => {
                chunked(s, &token(None))?;
                chunked(s, &token(None))?;
                s.shutdown(std::net::Shutdown::Both)?;
                Err(std::io::ErrorKind::ConnectionAborted.into())
            }
            Mode::Stall => {
                std::thread::sleep(Duration::from_secs(5));
                Err(std::io::ErrorKind::TimedOut.into())
            }
            Mode::Status(_) | Mode::Json => unreachable!(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{FakeServer, Mode};
    use super::*;
    use crate::result::Stats;
    use crate::serve::{run_once, ServeArgs};

    fn args(server: &FakeServer, prompts: usize, output_len: usize) -> ServeArgs {
        ServeArgs {
            base_url: Some(server.url.clone()),
            num_prompts: prompts,
            input_len: 16,
            output_len,
            ignore_eos: true,
            ..ServeArgs::default()
        }
    }

    /// On-CPU seconds of the calling thread (the client: its runtime is
    /// single-threaded and runs inside `run_once`'s `block_on`).
    fn thread_cpu_s() -> f64 {
        let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
        stat.split_whitespace()
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap()
            / 1e9
    }

    fn server_gaps(server: &FakeServer) -> Stats {
        Stats::from_seconds(server.gaps.lock().unwrap().iter().copied())
    }

    /// One stream, a chunk per millisecond: the ITL the client reports is
    /// the gap the server wrote, within a millisecond.
    #[test]
    fn client_itl_matches_a_1ms_stream() {
        let server = FakeServer::start(Mode::Stream(Duration::from_millis(1)));
        let r = run_once(&args(&server, 1, 1000), false).unwrap();
        let s = &r.summary;
        assert_eq!(
            (s.completed, s.failed, s.output_tokens),
            (1, 0, 1000),
            "{:?}",
            r.requests[0].error
        );
        let sent = server_gaps(&server);
        eprintln!(
            "1 stream @ 1 ms: server gap median {:.3} ms mean {:.3} p99 {:.3}; \
             client ITL median {:.3} mean {:.3} p99 {:.3} ms",
            sent.median, sent.mean, sent.p99, s.itl.median, s.itl.mean, s.itl.p99
        );
        assert_eq!(s.itl.count, 999);
        assert!(
            (s.itl.median - sent.median).abs() < 1.0,
            "{:?} vs {:?}",
            s.itl,
            sent
        );
        assert!((s.itl.median - 1.0).abs() < 1.0, "{:?}", s.itl);
        assert!(
            (s.itl.mean - sent.mean).abs() < 0.5,
            "{:?} vs {:?}",
            s.itl,
            sent
        );
    }

    /// 50 streams at 100 tokens/s each (5,000 tokens/s): the client keeps
    /// up, spends well under a core, and reports the ITL the server wrote.
    #[test]
    fn client_keeps_up_with_5000_tokens_per_second() {
        let server = FakeServer::start(Mode::Stream(Duration::from_millis(10)));
        let cpu = thread_cpu_s();
        let r = run_once(&args(&server, 50, 200), false).unwrap();
        let cpu = thread_cpu_s() - cpu;
        let s = &r.summary;
        assert_eq!((s.completed, s.failed, s.output_tokens), (50, 0, 10_000));
        let sent = server_gaps(&server);
        let per_core = s.output_tokens as f64 / cpu;
        eprintln!(
            "50 streams @ 10 ms: {:.0} tok/s received over {:.2} s; client CPU {:.3} s = {:.0} tok/s per core; \
             server gap median {:.3} ms mean {:.3} p99 {:.3}; client ITL median {:.3} mean {:.3} p99 {:.3} ms",
            s.output_tok_s, s.duration_s, cpu, per_core, sent.median, sent.mean, sent.p99,
            s.itl.median, s.itl.mean, s.itl.p99
        );
        assert!(s.output_tok_s > 4_000.0, "{}", s.output_tok_s);
        assert!(per_core > 2_000.0, "{per_core}");
        assert!(
            (s.itl.median - sent.median).abs() < 1.0,
            "{:?} vs {:?}",
            s.itl,
            sent
        );
    }

    fn failing(mode: Mode, timeout: f64) -> crate::result::BenchResult {
        let server = FakeServer::start(mode);
        let a = ServeArgs {
            timeout,
            ..args(&server, 3, 4)
        };
        run_once(&a, false).unwrap()
    }

    #[test]
    fn failures_are_recorded_by_kind_with_their_message() {
        let cases = [
            (Mode::Status(429), 30.0, "429", "fake overload"),
            (Mode::Json, 30.0, "protocol", "expected an SSE stream"),
            (Mode::ErrorMidStream, 30.0, "protocol", "engine exploded"),
            (Mode::Truncate, 30.0, "transport", "the stream broke"),
            (Mode::Stall, 0.3, "timeout", "within 0.3 s"),
        ];
        for (mode, timeout, key, needle) in cases {
            let r = failing(mode, timeout);
            let s = &r.summary;
            assert_eq!((s.completed, s.failed), (0, 3), "{mode:?}");
            assert_eq!(s.errors.get(key), Some(&3), "{mode:?}: {:?}", s.errors);
            let e = r.requests[0].error.as_deref().unwrap();
            assert!(e.contains(needle), "{mode:?}: {e}");
        }
    }

    #[test]
    fn events_split_into_3_byte_frames_parse() {
        let server = FakeServer::start(Mode::Split);
        let r = run_once(&args(&server, 2, 5), false).unwrap();
        let s = &r.summary;
        assert_eq!(
            (s.completed, s.output_tokens, s.itl.count),
            (2, 10, 8),
            "{:?}",
            r.requests
        );
        assert_eq!(r.requests[0].finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn header_flags_are_sent_and_the_cache_header_recorded() {
        let server = FakeServer::start(Mode::Stream(Duration::ZERO));
        let r = run_once(&args(&server, 2, 3), false).unwrap();
        assert!(r.requests.iter().all(|q| q.cache.is_none()));
        assert_eq!((r.summary.cache, r.summary.cache_hit_rate), (None, None));
        let a = ServeArgs {
            headers: vec![crate::serve::parse_header("X-Fake-Cache: hit").unwrap()],
            ..args(&server, 2, 3)
        };
        let r = run_once(&a, false).unwrap();
        assert!(r.requests.iter().all(|q| q.cache.as_deref() == Some("hit")));
        assert_eq!(r.summary.cache.map(|c| c.hits), Some(2));
        assert_eq!(r.summary.cache_hit_rate, Some(1.0));
    }

    #[test]
    fn unreachable_server_is_one_clear_error() {
        let a = ServeArgs {
            base_url: Some("http://127.0.0.1:1".into()),
            ..ServeArgs::default()
        };
        let e = run_once(&a, false).unwrap_err().to_string();
        assert!(e.contains("cannot reach http://127.0.0.1:1"), "{e}");
    }

    #[test]
    fn duration_runs_issue_until_it_is_over() {
        let server = FakeServer::start(Mode::Stream(Duration::from_millis(10)));
        let a = ServeArgs {
            duration: Some(0.5),
            max_concurrency: Some(3),
            dataset: crate::dataset::DatasetKind::Multiturn,
            turns: 2,
            ..args(&server, 1, 5)
        };
        let r = run_once(&a, false).unwrap();
        let s = &r.summary;
        // About 0.5 s / 50 ms per request × 3 in flight.
        assert!((15..=45).contains(&s.completed), "{s:?}");
        assert_eq!(s.failed, 0);
        assert!(r.requests.iter().any(|q| q.turn == 1));
        assert!(r.requests.iter().all(|q| q.start_s < 0.5));
        assert!((0.5..1.0).contains(&s.duration_s), "{}", s.duration_s);
    }

    #[test]
    fn poisson_arrivals_and_concurrency_cap() {
        let server = FakeServer::start(Mode::Stream(Duration::from_millis(5)));
        let a = ServeArgs {
            request_rate: 50.0,
            max_concurrency: Some(2),
            ..args(&server, 20, 4)
        };
        let r = run_once(&a, false).unwrap();
        assert_eq!(r.summary.completed, 20);
        // At most 2 in flight: each request starts after all but one of
        // those before it ended.
        let spans: Vec<(f64, f64)> = r
            .requests
            .iter()
            .map(|q| (q.start_s, q.start_s + q.e2e_s))
            .collect();
        for (i, &(start, _)) in spans.iter().enumerate() {
            let open = spans[..i]
                .iter()
                .filter(|&&(_, end)| end > start + 1e-4)
                .count();
            assert!(open < 2, "request {i} started with {open} in flight");
        }
        // 20 arrivals at 50/s take about 0.4 s.
        let last = spans.last().unwrap().0;
        assert!((0.15..1.5).contains(&last), "{last}");
    }

    #[test]
    fn bodies_carry_the_openai_fields_and_extras_override() {
        let mut t = RequestTemplate {
            path: "/v1/completions".into(),
            chat: false,
            model: "m".into(),
            ignore_eos: true,
            temperature: 0.0,
            extra: Map::new(),
            timeout: Duration::from_secs(1),
        };
        let v: Value = serde_json::from_slice(&t.body("hi".into(), 8)).unwrap();
        assert_eq!(
            v,
            json!({"model": "m", "prompt": "hi", "max_tokens": 8, "temperature": 0.0,
                   "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true})
        );
        t.chat = true;
        t.ignore_eos = false;
        t.extra.insert("temperature".into(), json!(0.7));
        let v: Value =
            serde_json::from_slice(&t.body(json!([{"role": "user", "content": "hi"}]), 4)).unwrap();
        assert_eq!(v["messages"][0]["content"], "hi");
        assert_eq!(v["temperature"], 0.7);
        assert!(v.get("ignore_eos").is_none() && v.get("prompt").is_none());
    }
}
