//! Server-sent events in OpenAI's framing: `data: <json>\n\n` per chunk and
//! a final `data: [DONE]`.

use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{BoxStream, StreamExt};
use ingot_engine::{Completion, GeneratedToken};
use ingot_protocol::usage::Usage;
use serde::Serialize;

use crate::generate::{self, ChoiceEvent, Job};
use crate::state::InflightGuard;

/// One `data:` event holding `value` as JSON.
pub fn data<T: Serialize>(value: &T) -> Event {
    Event::default().data(serde_json::to_string(value).unwrap_or_else(|e| {
        format!(r#"{{"error":{{"message":"cannot serialise chunk: {e}","type":"internal_error","param":null,"code":null}}}}"#)
    }))
}

/// The terminating event.
pub fn done() -> Event {
    Event::default().data("[DONE]")
}

/// An error event (after the stream has started, status is already 200).
pub fn error(message: &str) -> Event {
    data(&serde_json::json!({
        "error": {"message": message, "type": "internal_error", "param": null, "code": null}
    }))
}

/// Wraps batches of events into an SSE response.
pub fn response(events: BoxStream<'static, Vec<Event>>) -> Response {
    let flat = events
        .flat_map(futures_util::stream::iter)
        .map(Ok::<_, Infallible>);
    Sse::new(flat).into_response()
}

/// How an endpoint renders its stream chunks.
pub trait ChunkFormat: Send + 'static {
    /// A token of choice `index`; `None` when there is nothing to send.
    fn token(&mut self, index: usize, token: GeneratedToken) -> Option<Event>;
    /// Choice `index` ended.
    fn finish(&mut self, index: usize, completion: &Completion) -> Event;
    /// The final usage chunk (sent when `include_usage` is set).
    fn usage(&self, usage: Usage) -> Event;
}

/// Streams `head`, then every choice's chunks as they come, then the usage
/// chunk (when asked) and `[DONE]`. The guard lives as long as the stream;
/// dropping the stream (client gone) aborts every unfinished choice.
pub fn stream_choices<F: ChunkFormat>(
    head: Vec<Event>,
    jobs: Vec<Job>,
    format: F,
    include_usage: bool,
    guard: InflightGuard,
) -> Response {
    let state = StreamState {
        events: generate::merge(jobs),
        done: Vec::new(),
        finished: false,
        format,
        include_usage,
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
    response(body)
}

struct StreamState<F> {
    events: BoxStream<'static, ChoiceEvent>,
    /// Finished choices (prompt index, completion), for the usage chunk.
    done: Vec<(usize, Completion)>,
    finished: bool,
    format: F,
    include_usage: bool,
    _guard: InflightGuard,
    /// Open while the stream lives (a child of the request's span).
    span: tracing::Span,
}

impl<F: ChunkFormat> StreamState<F> {
    async fn next_events(&mut self) -> Vec<Event> {
        match self.events.next().await {
            Some(ChoiceEvent::Token { index, token }) => {
                self.format.token(index, token).into_iter().collect()
            }
            Some(ChoiceEvent::Done {
                index,
                prompt_index,
                completion,
            }) => {
                self.done.push((prompt_index, completion));
                vec![self.format.finish(index, &completion)]
            }
            Some(ChoiceEvent::Failed(message)) => {
                self.finished = true;
                vec![error(&message), done()]
            }
            None => {
                self.finished = true;
                let mut out = Vec::new();
                if self.include_usage {
                    let usage = generate::usage_of(self.done.iter().map(|(p, c)| (*p, c)));
                    out.push(self.format.usage(usage));
                }
                out.push(done());
                out
            }
        }
    }
}
