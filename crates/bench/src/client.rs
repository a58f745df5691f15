//! The HTTP side of `ingot bench`: a pooled keep-alive HTTP/1.1 client
//! (hyper 1 and hyper-util's legacy client over plain TCP) that sends one
//! streaming OpenAI request and times its server-sent events as they arrive.
//!
//! The client must not distort what it measures, so the per-chunk path is
//! short: one `Instant::now()` per body frame, SSE framing parsed in place
//! from the frame's bytes ([`SseParser`]; only a line split across frames is
//! copied), chunk JSON parsed into borrowed strings, and no task switch or
//! channel per token. The per-request timeout and Ctrl-C are raced once
//! against the whole exchange rather than per frame. Its overhead is
//! measured by `load.rs`'s tests against a local SSE responder.
//!
//! What counts (as in vLLM's `benchmark_serving`): TTFT is the time to the
//! first chunk with non-empty `text` / `delta.content` (or reasoning
//! content); ITL are the gaps between such chunks; output tokens are
//! `usage.completion_tokens` when the server sends usage, else the number of
//! content chunks.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use tokio::sync::watch;

use crate::result::{FailureKind, RequestRecord};
use crate::BenchError;

/// Largest error body read (the rest is dropped).
const ERROR_BODY_LIMIT: usize = 64 << 10;

/// How ingot's response cache served a response (`hit`, `coalesced`,
/// `miss`, `bypass`); other servers do not send it.
pub const CACHE_HEADER: HeaderName = HeaderName::from_static("x-ingot-cache");

/// A pooled HTTP/1.1 client for one server. Cheap to clone (shares the pool).
#[derive(Clone, Debug)]
pub struct HttpClient {
    inner: Client<HttpConnector, Full<Bytes>>,
    base: String,
    /// Sent with every request (`--header`), replacing ours of the same name.
    headers: HeaderMap,
}

/// Why a plain GET failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GetError {
    /// No response (refused, reset, timed out).
    #[error("{0}")]
    Transport(String),
    /// A non-2xx status, with the server's message.
    #[error("HTTP {0}: {1}")]
    Status(u16, String),
    /// A 2xx response that is not JSON.
    #[error("{0}")]
    Body(String),
}

/// One streaming request to send.
#[derive(Debug, Clone)]
pub struct StreamRequest {
    /// Path under the base URL, e.g. `/v1/completions`.
    pub path: String,
    /// The JSON body (with `"stream": true`).
    pub body: Bytes,
    /// Limit for the whole exchange.
    pub timeout: Duration,
    /// Prompt tokens as the client counted them (the server's usage wins).
    pub prompt_tokens: usize,
    /// Keep the generated text (multi-turn needs it for the next prompt).
    pub keep_text: bool,
    /// Turn within its conversation, copied into the record.
    pub turn: usize,
}

/// What one streaming request produced.
#[derive(Debug, Clone, Default)]
pub struct StreamOutcome {
    /// Timings, counts and errors.
    pub record: RequestRecord,
    /// The generated text when [`StreamRequest::keep_text`] was set.
    pub text: String,
}

/// A failed exchange: kind and one-line message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Failure {
    kind: FailureKind,
    message: String,
}

impl Failure {
    fn new(kind: FailureKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
        }
    }

    fn protocol(message: impl Into<String>) -> Failure {
        Failure::new(FailureKind::Protocol, message)
    }
}

impl HttpClient {
    /// A client for `base_url`: `http://host:port`, optionally with a path
    /// prefix that every request path is appended to. No TLS.
    pub fn new(base_url: &str) -> Result<HttpClient, BenchError> {
        let base = base_url.trim_end_matches('/').to_string();
        let bad = |why: String| BenchError::Options(format!("--base-url {base_url:?}: {why}"));
        let uri: Uri = base.parse().map_err(|e| bad(format!("{e}")))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => return Err(bad(format!("only http:// is supported, not {other}://"))),
            None => return Err(bad("give the scheme, e.g. http://127.0.0.1:8000".into())),
        }
        if uri.host().is_none() {
            return Err(bad("no host".into()));
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(10)));
        let inner = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Ok(HttpClient {
            inner,
            base,
            headers: HeaderMap::new(),
        })
    }

    /// The same client, sending `headers` with every request. They replace
    /// the client's own headers of the same name (`Accept`, ...).
    pub fn with_headers(self, headers: HeaderMap) -> HttpClient {
        HttpClient { headers, ..self }
    }

    /// The base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn uri(&self, path: &str) -> Result<Uri, String> {
        let url = format!("{}{path}", self.base);
        url.parse().map_err(|e| format!("invalid URL {url}: {e}"))
    }

    /// `GET path` and parse the body as JSON, within `timeout`.
    pub async fn get_json(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<serde_json::Value, GetError> {
        let uri = self.uri(path).map_err(GetError::Transport)?;
        let mut request = Request::get(uri)
            .body(Full::default())
            .map_err(|e| GetError::Transport(format!("cannot build the request: {e}")))?;
        request.headers_mut().extend(self.headers.clone());
        let exchange = async {
            let resp = self
                .inner
                .request(request)
                .await
                .map_err(|e| GetError::Transport(error_chain(&e)))?;
            let status = resp.status();
            let body = read_limited(resp.into_body(), ERROR_BODY_LIMIT)
                .await
                .map_err(GetError::Transport)?;
            if !status.is_success() {
                return Err(GetError::Status(status.as_u16(), error_message(&body)));
            }
            serde_json::from_str(&body)
                .map_err(|e| GetError::Body(format!("not JSON ({e}): {}", snippet(&body))))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(GetError::Transport(format!(
                    "no answer within {} s",
                    timeout.as_secs_f64()
                )))
            })
    }

    /// Sends `req` and reads its SSE stream to the end, timing every content
    /// chunk. Never fails: what went wrong is in the record. `run_start` is
    /// the origin of [`RequestRecord::start_s`]; when `cancel` turns true
    /// the request is dropped and recorded as cancelled.
    pub async fn stream(
        &self,
        req: &StreamRequest,
        run_start: Instant,
        cancel: &mut watch::Receiver<bool>,
    ) -> StreamOutcome {
        let sent = Instant::now();
        let mut st = StreamState::new(sent, req.keep_text);
        let deadline = tokio::time::Instant::from_std(sent + req.timeout);
        // The exchange borrows `st`, so what it measured survives a timeout
        // or a cancel that drops it midway.
        let result = tokio::select! {
            biased;
            r = self.exchange(req, &mut st) => r,
            () = tokio::time::sleep_until(deadline) => Err(Failure::new(
                FailureKind::Timeout,
                format!("no complete response within {} s", req.timeout.as_secs_f64()),
            )),
            () = cancelled(cancel) => Err(Failure::new(
                FailureKind::Cancelled,
                "cancelled before it finished",
            )),
        };
        st.into_outcome(req, run_start, result)
    }

    async fn exchange(&self, req: &StreamRequest, st: &mut StreamState) -> Result<(), Failure> {
        let uri = self.uri(&req.path).map_err(Failure::protocol)?;
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(Full::new(req.body.clone()))
            .map_err(|e| Failure::protocol(format!("cannot build the request: {e}")))?;
        request.headers_mut().extend(self.headers.clone());
        let resp = match self.inner.request(request.clone()).await {
            // A pooled keep-alive connection the server had just closed:
            // nothing was processed, so send once more on a fresh one.
            Err(e) if closed_before_response(&e) => self.inner.request(request).await,
            other => other,
        }
        .map_err(|e| Failure::new(FailureKind::Transport, error_chain(&e)))?;
        let status = resp.status();
        st.status = Some(status.as_u16());
        st.cache = resp
            .headers()
            .get(CACHE_HEADER)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_string());
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        if !status.is_success() {
            let body = read_limited(resp.into_body(), ERROR_BODY_LIMIT)
                .await
                .unwrap_or_else(|e| format!("(body unreadable: {e})"));
            return Err(Failure::new(
                FailureKind::Status,
                format!("HTTP {}: {}", status.as_u16(), error_message(&body)),
            ));
        }
        if let Some(ct) = content_type.filter(|ct| !ct.starts_with("text/event-stream")) {
            let body = read_limited(resp.into_body(), ERROR_BODY_LIMIT)
                .await
                .unwrap_or_default();
            return Err(Failure::protocol(format!(
                "expected an SSE stream (text/event-stream), got {ct}: {}",
                snippet(&body)
            )));
        }
        let mut body = resp.into_body();
        let mut parser = SseParser::default();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                Failure::new(
                    FailureKind::Transport,
                    format!("the stream broke: {}", error_chain(&e)),
                )
            })?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            let now = Instant::now();
            parser.feed(&data, |event| st.on_event(event, now))?;
            if st.done {
                break;
            }
        }
        if st.done {
            // Read the end of the chunked body so the connection goes back
            // to the pool; it normally came with `[DONE]`.
            let drain = async { while let Some(Ok(_)) = body.frame().await {} };
            let _ = tokio::time::timeout(Duration::from_millis(100), drain).await;
        } else {
            let now = Instant::now();
            parser.finish(|event| st.on_event(event, now))?;
        }
        st.end.get_or_insert_with(Instant::now);
        if st.events == 0 && !st.done {
            return Err(Failure::protocol(match parser.unknown {
                Some(line) => format!("not an SSE stream: {line}"),
                None => "the response body is empty".into(),
            }));
        }
        if st.finish.is_none() {
            return Err(Failure::protocol(if st.done {
                "the stream ended ([DONE]) without a finish_reason"
            } else {
                "the stream ended early: no finish_reason and no [DONE]"
            }));
        }
        Ok(())
    }
}

/// A streamed chunk, as much of it as is read: completions (`text`) and
/// chat (`delta.content`) alike, usage, and error events.
#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    choices: Vec<ChunkChoice<'a>>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
    /// `"error"` in vLLM's older error shape `{"object":"error","message":..}`.
    #[serde(default, borrow)]
    object: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ChunkChoice<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    delta: Option<ChunkDelta<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ChunkDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: Option<usize>,
    #[serde(default)]
    completion_tokens: Option<usize>,
}

impl ChunkChoice<'_> {
    /// The generated text of this chunk, if any.
    fn piece(&self) -> Option<&str> {
        if let Some(t) = self.text.as_deref() {
            return Some(t);
        }
        let d = self.delta.as_ref()?;
        [&d.content, &d.reasoning_content, &d.reasoning]
            .into_iter()
            .find_map(|c| c.as_deref().filter(|s| !s.is_empty()))
    }
}

/// What one stream has shown so far.
struct StreamState {
    sent: Instant,
    status: Option<u16>,
    cache: Option<String>,
    first: Option<Instant>,
    last: Option<Instant>,
    end: Option<Instant>,
    itl: Vec<f64>,
    content_chunks: usize,
    events: usize,
    done: bool,
    finish: Option<String>,
    usage_prompt: Option<usize>,
    usage_completion: Option<usize>,
    text: Option<String>,
}

impl StreamState {
    fn new(sent: Instant, keep_text: bool) -> StreamState {
        StreamState {
            sent,
            status: None,
            cache: None,
            first: None,
            last: None,
            end: None,
            itl: Vec::new(),
            content_chunks: 0,
            events: 0,
            done: false,
            finish: None,
            usage_prompt: None,
            usage_completion: None,
            text: keep_text.then(String::new),
        }
    }

    /// One SSE event's data, received at `now`.
    fn on_event(&mut self, data: &str, now: Instant) -> Result<(), Failure> {
        if data.trim() == "[DONE]" {
            self.done = true;
            self.end = Some(now);
            return Ok(());
        }
        self.events += 1;
        let chunk: Chunk<'_> = serde_json::from_str(data).map_err(|e| {
            Failure::protocol(format!("an SSE event is not JSON ({e}): {}", snippet(data)))
        })?;
        if let Some(err) = &chunk.error {
            return Err(Failure::protocol(format!(
                "error event in the stream: {}",
                error_value_message(err)
            )));
        }
        if chunk.object.as_deref() == Some("error") {
            return Err(Failure::protocol(format!(
                "error event in the stream: {}",
                chunk.message.as_deref().unwrap_or("(no message)")
            )));
        }
        let mut content = false;
        for choice in &chunk.choices {
            if let Some(piece) = choice.piece().filter(|p| !p.is_empty()) {
                content = true;
                if let Some(text) = &mut self.text {
                    text.push_str(piece);
                }
            }
            if let Some(reason) = &choice.finish_reason {
                self.finish = Some(reason.to_string());
            }
        }
        if content {
            match self.last {
                None => self.first = Some(now),
                Some(prev) => self.itl.push((now - prev).as_secs_f64()),
            }
            self.last = Some(now);
            self.content_chunks += 1;
        }
        if let Some(usage) = chunk.usage {
            self.usage_prompt = usage.prompt_tokens.or(self.usage_prompt);
            self.usage_completion = usage.completion_tokens.or(self.usage_completion);
        }
        self.end = Some(now);
        Ok(())
    }

    fn into_outcome(
        self,
        req: &StreamRequest,
        run_start: Instant,
        result: Result<(), Failure>,
    ) -> StreamOutcome {
        let secs = |t: Instant| t.saturating_duration_since(self.sent).as_secs_f64();
        let end = match &result {
            Ok(()) => self.end.unwrap_or_else(Instant::now),
            Err(_) => Instant::now(),
        };
        let (ok, failure, error) = match result {
            Ok(()) => (true, None, None),
            Err(f) => (false, Some(f.kind), Some(f.message)),
        };
        let record = RequestRecord {
            ok,
            status: self.status,
            error,
            prompt_tokens: self.usage_prompt.unwrap_or(req.prompt_tokens),
            output_tokens: self.usage_completion.unwrap_or(self.content_chunks),
            start_s: self.sent.saturating_duration_since(run_start).as_secs_f64(),
            ttft_s: self.first.map(secs),
            e2e_s: secs(end),
            itl_s: self.itl,
            failure,
            finish_reason: self.finish,
            turn: req.turn,
            cache: self.cache,
            run: 0,
        };
        StreamOutcome {
            record,
            text: self.text.unwrap_or_default(),
        }
    }
}

/// Incremental parser of `text/event-stream` framing: `field: value` lines,
/// events ended by a blank line, `:` comments. Lines end in `\n` or `\r\n`.
/// Bytes may be split anywhere across [`SseParser::feed`] calls.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// The unfinished last line of the previous feed.
    partial: Vec<u8>,
    /// `data` lines of the event being read, joined by `\n`.
    data: String,
    has_data: bool,
    /// The first line that is not SSE (for the error message).
    pub(crate) unknown: Option<String>,
}

impl SseParser {
    /// Parses `bytes`; `on_event` gets each completed event's data.
    pub(crate) fn feed(
        &mut self,
        bytes: &[u8],
        mut on_event: impl FnMut(&str) -> Result<(), Failure>,
    ) -> Result<(), Failure> {
        let mut rest = bytes;
        if !self.partial.is_empty() {
            let Some(i) = rest.iter().position(|&b| b == b'\n') else {
                self.partial.extend_from_slice(rest);
                return Ok(());
            };
            self.partial.extend_from_slice(&rest[..=i]);
            rest = &rest[i + 1..];
            let line = std::mem::take(&mut self.partial);
            self.line(&line, &mut on_event)?;
            self.partial = line;
            self.partial.clear();
        }
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            self.line(&rest[..=i], &mut on_event)?;
            rest = &rest[i + 1..];
        }
        self.partial.extend_from_slice(rest);
        Ok(())
    }

    /// End of the body: an event missing its final blank line still counts.
    pub(crate) fn finish(
        &mut self,
        mut on_event: impl FnMut(&str) -> Result<(), Failure>,
    ) -> Result<(), Failure> {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(&line, &mut on_event)?;
        }
        self.line(b"\n", &mut on_event)
    }

    fn line(
        &mut self,
        raw: &[u8],
        on_event: &mut impl FnMut(&str) -> Result<(), Failure>,
    ) -> Result<(), Failure> {
        let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.is_empty() {
            if self.has_data {
                self.has_data = false;
                let result = on_event(&self.data);
                self.data.clear();
                result?;
            }
            return Ok(());
        }
        let line = std::str::from_utf8(raw)
            .map_err(|_| Failure::protocol("the event stream is not valid UTF-8"))?;
        if line.starts_with(':') {
            return Ok(()); // comment / keep-alive
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" | "id" | "retry" => {}
            _ => {
                self.unknown.get_or_insert_with(|| snippet(line));
            }
        }
        Ok(())
    }
}

/// Resolves when `cancel` turns true (never if its sender is gone).
pub(crate) async fn cancelled(cancel: &mut watch::Receiver<bool>) {
    if cancel.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Reads a body up to `limit` bytes as (lossy) UTF-8.
async fn read_limited(mut body: Incoming, limit: usize) -> Result<String, String> {
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| error_chain(&e))?;
        if let Ok(data) = frame.into_data() {
            let room = limit.saturating_sub(bytes.len());
            bytes.extend_from_slice(&data[..data.len().min(room)]);
            if bytes.len() >= limit {
                break;
            }
        }
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The message of an error body: OpenAI's `{"error":{"message":..}}`,
/// vLLM's older `{"message":..}`, FastAPI's `{"detail":..}`, else the text.
pub(crate) fn error_message(body: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(body) {
        Ok(v) => error_value_message(&v),
        Err(_) if body.trim().is_empty() => "(empty body)".into(),
        Err(_) => snippet(body.trim()),
    }
}

fn error_value_message(v: &serde_json::Value) -> String {
    let found = [
        v.pointer("/error/message"),
        v.get("message"),
        v.get("detail"),
        v.get("error"),
    ]
    .into_iter()
    .flatten()
    .find(|m| !m.is_null());
    match found {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => snippet(&other.to_string()),
        None => snippet(&v.to_string()),
    }
}

/// An error and its sources on one line ("client error (Connect): tcp
/// connect error: Connection refused (os error 111)").
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// At most 200 characters of `s`, marked when cut.
pub(crate) fn snippet(s: &str) -> String {
    const MAX: usize = 200;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// True when the server closed a reused connection before any response
/// (hyper's "connection closed before message completed").
fn closed_before_response(e: &hyper_util::client::legacy::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            return h.is_incomplete_message();
        }
        source = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events_of(pieces: &[&[u8]]) -> Vec<String> {
        let mut parser = SseParser::default();
        let mut out = Vec::new();
        for p in pieces {
            parser
                .feed(p, |e| {
                    out.push(e.to_string());
                    Ok(())
                })
                .unwrap();
        }
        parser
            .finish(|e| {
                out.push(e.to_string());
                Ok(())
            })
            .unwrap();
        out
    }

    #[test]
    fn sse_events_split_anywhere_parse_the_same() {
        let stream = b": keep-alive\n\ndata: {\"a\":1}\n\ndata: x\r\ndata: y\r\n\r\nevent: e\nid: 3\ndata:[DONE]\n\n";
        let whole = events_of(&[stream]);
        assert_eq!(whole, ["{\"a\":1}", "x\ny", "[DONE]"]);
        for cut in 0..stream.len() {
            assert_eq!(events_of(&[&stream[..cut], &stream[cut..]]), whole, "{cut}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(events_of(&bytes), whole);
    }

    #[test]
    fn sse_last_event_without_blank_line_counts_and_junk_is_noted() {
        assert_eq!(events_of(&[b"data: a\n\ndata: b"]), ["a", "b"]);
        let mut parser = SseParser::default();
        parser
            .feed(b"{\"error\": \"nope\"}\n", |_| panic!("no event"))
            .unwrap();
        assert_eq!(parser.unknown.as_deref(), Some("{\"error\": \"nope\"}"));
    }

    #[test]
    fn chunks_give_ttft_itl_usage_and_errors() {
        let t0 = Instant::now();
        let mut st = StreamState::new(t0, true);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let chat = |c: &str| {
            format!(
                r#"{{"choices":[{{"index":0,"delta":{{"content":"{c}"}},"finish_reason":null}}]}}"#
            )
        };
        st.on_event(
            r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            at(5),
        )
        .unwrap();
        st.on_event(&chat("Hel"), at(10)).unwrap();
        st.on_event(&chat("lo\\n"), at(13)).unwrap();
        st.on_event(
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
            at(14),
        )
        .unwrap();
        st.on_event(
            r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#,
            at(15),
        )
        .unwrap();
        st.on_event("[DONE]", at(16)).unwrap();
        let req = StreamRequest {
            path: "/v1/chat/completions".into(),
            body: Bytes::new(),
            timeout: Duration::from_secs(1),
            prompt_tokens: 5,
            keep_text: true,
            turn: 2,
        };
        let out = st.into_outcome(&req, t0, Ok(()));
        let r = &out.record;
        assert_eq!(out.text, "Hello\n");
        assert!(r.ok && r.failure.is_none());
        assert_eq!((r.prompt_tokens, r.output_tokens, r.turn), (7, 3, 2));
        assert_eq!(r.finish_reason.as_deref(), Some("length"));
        assert!((r.ttft_s.unwrap() - 0.010).abs() < 1e-9);
        assert!((r.e2e_s - 0.016).abs() < 1e-9);
        assert_eq!(r.itl_s.len(), 1);
        assert!((r.itl_s[0] - 0.003).abs() < 1e-9);

        let mut st = StreamState::new(t0, false);
        let err = st
            .on_event(
                r#"{"error":{"message":"engine died","type":"internal_error"}}"#,
                at(1),
            )
            .unwrap_err();
        assert_eq!(err.kind, FailureKind::Protocol);
        assert!(err.message.contains("engine died"), "{}", err.message);
        let err = st.on_event("not json", at(1)).unwrap_err();
        assert!(err.message.contains("not JSON"), "{}", err.message);
    }

    #[test]
    fn error_bodies_give_their_message() {
        assert_eq!(
            error_message(r#"{"error":{"message":"too many","type":"x"}}"#),
            "too many"
        );
        assert_eq!(error_message(r#"{"object":"error","message":"m"}"#), "m");
        assert_eq!(error_message(r#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(error_message("  "), "(empty body)");
        assert_eq!(error_message("plain text"), "plain text");
        assert_eq!(snippet(&"é".repeat(300)).chars().count(), 203);
    }
}
