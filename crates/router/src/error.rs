//! Errors the router answers itself, in the OpenAI error shape
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

/// A request the router could not place or forward.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// The body is not JSON or too large.
    #[error("{0}")]
    BadRequest(String),
    /// No worker serves the requested model.
    #[error("the model `{0}` does not exist on any worker")]
    ModelNotFound(String),
    /// No worker can take the request now (all down, open or draining):
    /// why, and when one may again (`Retry-After`).
    #[error("no worker available{detail}")]
    NoWorker {
        /// The last attempt's failure, if any (` (last attempt: …)`).
        detail: String,
        /// When a worker is likely to take requests again.
        retry_after: std::time::Duration,
    },
    /// No such route.
    #[error("no route for {0}")]
    RouteNotFound(String),
    /// The route exists with another method.
    #[error("method not allowed: {0}")]
    MethodNotAllowed(String),
}

impl RouteError {
    /// Its HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::ModelNotFound(_) | Self::RouteNotFound(_) => StatusCode::NOT_FOUND,
            Self::NoWorker { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// The stable `type` and `code` of the body.
    pub fn kind(&self) -> (&'static str, &'static str) {
        match self {
            Self::BadRequest(_) => ("invalid_request_error", "invalid_request"),
            Self::ModelNotFound(_) => ("invalid_request_error", "model_not_found"),
            Self::NoWorker { .. } => ("server_error", "no_worker_available"),
            Self::RouteNotFound(_) => ("invalid_request_error", "not_found"),
            Self::MethodNotAllowed(_) => ("invalid_request_error", "method_not_allowed"),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        let (kind, code) = self.kind();
        serde_json::json!({
            "error": {"message": self.to_string(), "type": kind, "param": null, "code": code}
        })
    }
}

impl IntoResponse for RouteError {
    fn into_response(self) -> Response {
        let mut r = (self.status(), axum::Json(self.body())).into_response();
        if let Self::NoWorker { retry_after, .. } = &self {
            // Whole seconds, rounded up: a client never comes back early.
            let secs = retry_after.as_millis().div_ceil(1000).max(1);
            r.headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from(secs as u64));
        }
        r
    }
}

/// The SSE an interrupted stream ends with: an error event in the OpenAI
/// shape, then `[DONE]`, so clients stop reading instead of hanging.
pub fn sse_interrupted(worker: &str) -> Bytes {
    let body = serde_json::json!({
        "error": {
            "message": format!("the worker {worker} failed while streaming this response; it was not retried because tokens had already been sent"),
            "type": "server_error",
            "param": null,
            "code": "worker_failed_mid_stream",
        }
    });
    Bytes::from(format!("\n\ndata: {body}\n\ndata: [DONE]\n\n"))
}
