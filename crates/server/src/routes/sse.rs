//! Streamed answers, written through the stream's own send queue
//! (`send_queue`), which cuts off a client that stops reading: server-sent
//! events in OpenAI's framing (`data: <json>\n\n` per chunk and a final
//! `data: [DONE]`) by default; a [`ChunkFormat`] may frame its own
//! (Anthropic's named events, Ollama's NDJSON lines).

use axum::body::Bytes;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use futures_util::stream::{BoxStream, StreamExt};
use ingot_engine::{Completion, GeneratedToken, PromptLogprob};
use ingot_protocol::usage::Usage;
use serde::Serialize;
use std::collections::HashMap;
use std::time::Instant;

use super::send_queue::{self, Cut, CutSender, Settings};
use crate::conn::ConnProbe;
use crate::generate::{self, ChoiceEvent, Job};
use crate::state::InflightGuard;
use crate::usage::KeyUsage;

/// One SSE event, framed.
pub struct Event(Bytes);

/// One `data:` event holding `value` as JSON (serialised JSON has no raw
/// newline, so one `data:` line always holds it).
pub fn data<T: Serialize>(value: &T) -> Event {
    let json = serde_json::to_string(value).unwrap_or_else(|e| {
        format!(r#"{{"error":{{"message":"cannot serialise chunk: {e}","type":"internal_error","param":null,"code":null}}}}"#)
    });
    Event(Bytes::from(format!("data: {json}\n\n")))
}

/// One event named `name` (`event: <name>`), holding `value` as JSON: the
/// framing of Anthropic's streams.
pub fn named<T: Serialize>(name: &str, value: &T) -> Event {
    let json = serde_json::to_string(value).unwrap_or_else(|e| {
        format!(r#"{{"type":"error","error":{{"type":"api_error","message":"cannot serialise event: {e}"}}}}"#)
    });
    Event(Bytes::from(format!("event: {name}\ndata: {json}\n\n")))
}

/// One NDJSON line holding `value` (Ollama's streams).
pub fn ndjson<T: Serialize>(value: &T) -> Event {
    let json = serde_json::to_string(value)
        .unwrap_or_else(|e| format!(r#"{{"error":"cannot serialise a line: {e}"}}"#));
    Event(Bytes::from(format!("{json}\n")))
}

/// Several events sent as one (`None` when there are none).
pub fn concat(events: Vec<Event>) -> Option<Event> {
    match events.len() {
        0 => None,
        1 => events.into_iter().next(),
        _ => {
            let mut bytes = Vec::with_capacity(events.iter().map(|e| e.0.len()).sum());
            for e in events {
                bytes.extend_from_slice(&e.0);
            }
            Some(Event(Bytes::from(bytes)))
        }
    }
}

/// The terminating event.
pub fn done() -> Event {
    Event(Bytes::from_static(b"data: [DONE]\n\n"))
}

/// The OpenAI error body of a failure inside a stream.
fn internal_error(message: &str) -> serde_json::Value {
    serde_json::json!({
        "error": {"message": message, "type": "internal_error", "param": null, "code": null}
    })
}

/// The OpenAI error body of a stream cut off for its client.
fn cut_error(why: Cut) -> serde_json::Value {
    let (message, code) = match why {
        Cut::Stall => (
            "stream cut off: the client read nothing for longer than engine.stall_timeout",
            "stream_stalled",
        ),
        Cut::Overflow => (
            "stream cut off: more than server.max_stream_pending_bytes waited for the client",
            "stream_overflow",
        ),
    };
    serde_json::json!({
        "error": {"message": message, "type": "timeout_error", "param": null, "code": code}
    })
}

/// The OpenAI error body of a stream the server ends at shutdown.
fn shutdown_error() -> serde_json::Value {
    serde_json::json!({
        "error": {
            "message": "the server is shutting down: its shutdown timeout passed with this stream open",
            "type": "service_unavailable",
            "param": null,
            "code": "shutting_down"
        }
    })
}

/// The value `rx` holds once `ready` accepts it; never resolves if the
/// sender is gone first (a queue that ended without a cut, a server that
/// never closed its streams).
async fn once_ready<T: Clone>(
    rx: &mut tokio::sync::watch::Receiver<T>,
    ready: impl FnMut(&T) -> bool,
) -> T {
    // The value is cloned out first: the borrow it comes in is not Send.
    let value = rx.wait_for(ready).await.ok().map(|v| v.clone());
    match value {
        Some(value) => value,
        None => std::future::pending().await,
    }
}

/// Where a stream goes: the connection's probe and the slow-client policy.
#[derive(Clone)]
pub struct Output {
    /// Reads the socket (absent in in-process tests).
    pub probe: Option<ConnProbe>,
    /// Stall timeout, flush interval, queue bound.
    pub settings: Settings,
}

/// What a stream holds until it ends, and where it goes.
pub struct Delivery {
    /// Counts the request in flight (a graceful drain waits for it).
    pub guard: InflightGuard,
    /// Counts generated tokens; settled when the stream is dropped.
    pub usage: KeyUsage,
    /// The connection's probe and the slow-client policy.
    pub out: Output,
    /// When the request's head came (the start of its HTTP TTFT).
    pub received: Instant,
    /// The prompt tokens, when every chunk carries the usage so far
    /// (`stream_options.continuous_usage_stats`).
    pub continuous: Option<usize>,
    /// What each finished choice's text is checked against.
    pub check: Option<crate::prepare::AnswerCheck>,
}

/// The `usage` a stream chunk carries: absent, null until the closing
/// usage chunk (`include_usage`), or the usage so far
/// (`continuous_usage_stats`, vLLM's extension).
#[derive(Debug, Clone, Copy, Default)]
pub struct ChunkUsage {
    /// A closing usage chunk follows (other chunks carry null).
    pub include: bool,
    /// The usage so far, when every chunk carries it.
    pub running: Option<Usage>,
}

impl ChunkUsage {
    /// What the first chunks carry, before any token.
    pub fn at_start(include: bool, delivery: &Delivery) -> Self {
        Self {
            include,
            running: delivery.continuous.map(|prompt| Usage::new(prompt, 0, 0)),
        }
    }

    /// The chunk's `usage` field.
    pub fn field(&self) -> Option<Option<Usage>> {
        match self.running {
            Some(u) => Some(Some(u)),
            None => self.include.then_some(None),
        }
    }
}

/// Wraps batches of events into an SSE response; `cut` tells their source
/// when the send queue cuts the client off.
fn response(events: BoxStream<'static, Vec<Event>>, out: Output, cut: CutSender) -> Response {
    let frames = events
        .map(|batch| {
            let mut bytes = Vec::with_capacity(batch.iter().map(|e| e.0.len()).sum());
            for e in batch {
                bytes.extend_from_slice(&e.0);
            }
            Bytes::from(bytes)
        })
        .boxed();
    let mut response = Response::new(send_queue::body(frames, out.probe, out.settings, cut));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// How an endpoint renders its stream chunks.
pub trait ChunkFormat: Send + 'static {
    /// The prompt logprobs of choice `index` (before its tokens); `None`
    /// when there is nothing to send.
    fn prompt(&mut self, _index: usize, _prompt: Vec<PromptLogprob>) -> Option<Event> {
        None
    }
    /// A token of choice `index`; `None` when there is nothing to send.
    fn token(&mut self, index: usize, token: GeneratedToken) -> Option<Event>;
    /// Choice `index` ended.
    fn finish(&mut self, index: usize, completion: &Completion) -> Event;
    /// The final usage chunk (sent when `include_usage` is set).
    fn usage(&self, usage: Usage) -> Event;
    /// The usage so far, before each chunk of a stream whose chunks carry
    /// it (`continuous_usage_stats`).
    fn running_usage(&mut self, _usage: Usage) {}
    /// An error after the head (the status, 200, is out); `body` is the
    /// OpenAI error body.
    fn error(&self, body: &serde_json::Value) -> Event {
        data(body)
    }
    /// The terminating event, if the format has one.
    fn done(&self) -> Option<Event> {
        Some(done())
    }
}

/// Streams `head`, then every choice's chunks as they come, then the usage
/// chunk (when asked) and `[DONE]`. The guard lives as long as the stream;
/// dropping the stream (client gone) aborts every unfinished choice. A
/// stream the send queue cuts off (a client not reading), or that is still
/// open when the shutdown timeout passes, aborts them too and ends with an
/// error event and the terminator.
pub fn stream_choices<F: ChunkFormat>(
    head: Vec<Event>,
    jobs: Vec<Job>,
    format: F,
    include_usage: bool,
    delivery: Delivery,
) -> Response {
    let Delivery {
        guard,
        usage,
        out,
        received,
        continuous,
        check,
    } = delivery;
    let (cut_tx, cut) = tokio::sync::watch::channel(None);
    let state = StreamState {
        cut,
        closing: guard.closing(),
        received: Some(received),
        usage,
        events: generate::merge(jobs),
        done: Vec::new(),
        finished: false,
        format,
        include_usage,
        running: continuous.map(|prompt| (prompt, 0)),
        check: check.map(|c| (c, Default::default())),
        _guard: guard,
        span: tracing::info_span!("stream"),
    };
    let body = futures_util::stream::once(async move { head })
        .chain(futures_util::stream::unfold(state, |mut st| async move {
            if st.finished {
                return None;
            }
            let span = st.span.clone();
            let events = tracing::Instrument::instrument(st.next_events(), span).await;
            Some((events, st))
        }))
        .boxed();
    response(body, out, cut_tx)
}

struct StreamState<F> {
    events: BoxStream<'static, ChoiceEvent>,
    /// Set when the send queue cuts the client off.
    cut: tokio::sync::watch::Receiver<Option<Cut>>,
    /// Turns true when the server ends every open stream (shutdown).
    closing: tokio::sync::watch::Receiver<bool>,
    /// Finished choices (prompt index, completion), for the usage chunk.
    done: Vec<(usize, Completion)>,
    finished: bool,
    format: F,
    include_usage: bool,
    _guard: InflightGuard,
    /// Counts generated tokens; settled when the stream is dropped.
    usage: KeyUsage,
    /// Open while the stream lives (a child of the request's span).
    span: tracing::Span,
    /// When the request's head came; taken by its first token's chunk.
    received: Option<Instant>,
    /// Prompt and completion tokens so far, when every chunk carries them.
    running: Option<(usize, usize)>,
    /// The answer check and each choice's text so far, when there is one.
    check: Option<(crate::prepare::AnswerCheck, HashMap<usize, String>)>,
}

impl<F: ChunkFormat> StreamState<F> {
    /// Records the HTTP time to first token, once.
    fn note_first_token(&mut self) {
        if let Some(received) = self.received.take() {
            metrics::histogram!(crate::http_metrics::HTTP_TTFT_SECONDS)
                .record(received.elapsed().as_secs_f64());
        }
    }

    /// Ends the stream with an error event and the terminator.
    fn end_with_error(&mut self, body: &serde_json::Value) -> Vec<Event> {
        self.finished = true;
        let error = self.format.error(body);
        std::iter::once(error).chain(self.format.done()).collect()
    }

    async fn next_events(&mut self) -> Vec<Event> {
        let next = tokio::select! {
            biased;
            Some(why) = once_ready(&mut self.cut, Option::is_some) => {
                return self.end_with_error(&cut_error(why));
            }
            true = once_ready(&mut self.closing, |closing| *closing) => {
                metrics::counter!(send_queue::STREAMS_CUT, "reason" => "shutdown").increment(1);
                return self.end_with_error(&shutdown_error());
            }
            next = self.events.next() => next,
        };
        match next {
            Some(ChoiceEvent::Prompt { index, prompt }) => {
                self.format.prompt(index, prompt).into_iter().collect()
            }
            Some(ChoiceEvent::Token { index, token }) => {
                self.usage.add_completion(1);
                if let Some((prompt, completion)) = &mut self.running {
                    *completion += 1;
                    let usage = Usage::new(*prompt, *completion, 0);
                    self.format.running_usage(usage);
                }
                if let Some((_, texts)) = &mut self.check {
                    texts.entry(index).or_default().push_str(&token.text);
                }
                let chunk = self.format.token(index, token);
                if chunk.is_some() {
                    self.note_first_token();
                }
                chunk.into_iter().collect()
            }
            Some(ChoiceEvent::Done {
                index,
                prompt_index,
                completion,
            }) => {
                if let Some((check, texts)) = &self.check {
                    let text = texts.get(&index).map_or("", String::as_str);
                    if let Err(e) = check.judge(text) {
                        return self.end_with_error(&e.body());
                    }
                }
                self.done.push((prompt_index, completion));
                vec![self.format.finish(index, &completion)]
            }
            Some(ChoiceEvent::Failed(message)) => self.end_with_error(&internal_error(&message)),
            Some(ChoiceEvent::TimedOut(timeout)) => {
                // The head (200) is out: the timeout is an error event.
                crate::error::count_rejection("timeout");
                self.end_with_error(&crate::ApiError::Timeout(timeout).body())
            }
            None => {
                self.finished = true;
                let mut out = Vec::new();
                if self.include_usage {
                    let usage = generate::usage_of(self.done.iter().map(|(p, c)| (*p, c)));
                    out.push(self.format.usage(usage));
                }
                out.extend(self.format.done());
                out
            }
        }
    }
}
