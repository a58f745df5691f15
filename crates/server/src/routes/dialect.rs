//! Error bodies in the dialect of the API a path belongs to. Every error
//! is made once, OpenAI-shaped (`ApiError`), whichever layer refuses the
//! request (auth, the body limit, the handler); this edge layer reshapes
//! the body for Anthropic's routes (`{"type": "error", "error": {"type",
//! "message"}}`) and Ollama's (`{"error": "..."}`), keeping the status and
//! headers (Retry-After).

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::Value;

/// Error bodies are small; a larger one is passed on as it is.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The API family of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    OpenAi,
    Anthropic,
    Ollama,
}

impl Dialect {
    fn of(path: &str) -> Self {
        if path == "/v1/messages" || path.starts_with("/v1/messages/") {
            Self::Anthropic
        } else if path.starts_with("/api/") {
            Self::Ollama
        } else {
            Self::OpenAi
        }
    }
}

/// The middleware: reshapes error answers of Anthropic's and Ollama's paths.
pub async fn shape_errors(request: Request, next: Next) -> Response {
    let dialect = Dialect::of(request.uri().path());
    let response = next.run(request).await;
    let failed = response.status().is_client_error() || response.status().is_server_error();
    if dialect == Dialect::OpenAi || !failed {
        return response;
    }
    reshape(dialect, response).await
}

async fn reshape(dialect: Dialect, response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_ERROR_BODY).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let message = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| error_field(&v, "message").map(String::from))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
    let body = match dialect {
        Dialect::Anthropic => {
            let kind = ingot_protocol::anthropic::error_type(parts.status.as_u16());
            ingot_protocol::anthropic::error_body(kind, &message)
        }
        Dialect::Ollama | Dialect::OpenAi => serde_json::json!({ "error": message }),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(body.to_string()))
}

/// A string field of an OpenAI error body (`{"error": {field: ...}}`).
pub(super) fn error_field<'a>(body: &'a Value, field: &str) -> Option<&'a str> {
    body.get("error")?.get(field)?.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_pick_their_dialect() {
        assert_eq!(Dialect::of("/v1/messages"), Dialect::Anthropic);
        assert_eq!(Dialect::of("/api/chat"), Dialect::Ollama);
        assert_eq!(Dialect::of("/v1/chat/completions"), Dialect::OpenAi);
        assert_eq!(Dialect::of("/v1/messagesx"), Dialect::OpenAi);
    }
}
