//! Server-sent events in OpenAI's framing: `data: <json>\n\n` per chunk and
//! a final `data: [DONE]`.

use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{BoxStream, StreamExt};
use serde::Serialize;

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
