//! Every failure a client can see, mapped to an HTTP status and the OpenAI
//! error body `{"error": {"message", "type", "param", "code"}}` in one place.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use ingot_engine::SubmitError;
use ingot_protocol::ProtocolError;

/// An error response.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is invalid (400).
    #[error("{0}")]
    BadRequest(ProtocolError),
    /// The named model is not served (404).
    #[error("the model '{0}' does not exist")]
    ModelNotFound(String),
    /// The named model is not configured (404, listing those that are).
    #[error("{message}")]
    UnknownModel {
        /// What was asked for.
        id: String,
        /// The message, with the available models.
        message: String,
    },
    /// The model cannot be loaded now (503 with Retry-After).
    #[error("{message}")]
    ModelUnavailable {
        /// Why.
        message: String,
        /// When to retry.
        retry_after: Duration,
    },
    /// The request conflicts with the current state (409).
    #[error("{0}")]
    Conflict(String),
    /// No such object, e.g. a stored response (404); `param` and `code`
    /// name what was looked up when a request field named it.
    #[error("{message}")]
    NotFound {
        /// What was not found.
        message: String,
        /// The field that named it.
        param: Option<&'static str>,
        /// A machine-readable code.
        code: Option<&'static str>,
    },
    /// No such route (404).
    #[error("no route for {0}")]
    RouteNotFound(String),
    /// The route exists with another method (405).
    #[error("method not allowed: {0}")]
    MethodNotAllowed(String),
    /// The body exceeds the size limit (413).
    #[error("the request body exceeds the limit of {0} bytes")]
    PayloadTooLarge(usize),
    /// The body is declared as something other than JSON (415); holds
    /// the Content-Type sent.
    #[error(
        "the request body must be JSON (Content-Type: application/json), got Content-Type: {0}"
    )]
    UnsupportedMediaType(String),
    /// The queue is full (429).
    #[error("{message}")]
    Overloaded {
        /// What happened.
        message: String,
        /// When to retry.
        retry_after: Duration,
    },
    /// Over the API key's rate or token limit (429).
    #[error("{message}")]
    RateLimited {
        /// What was exceeded.
        message: String,
        /// When a retry can succeed (`None`: never as asked).
        retry_after: Option<Duration>,
    },
    /// Past the request's timeout (504); the generation was cancelled.
    #[error("{}", .0.message())]
    Timeout(Timeout),
    /// Shed by SLO remediation: a more urgent tier misses its SLO (503
    /// with Retry-After).
    #[error("{message}")]
    Shed {
        /// Why.
        message: String,
        /// When to retry.
        retry_after: Duration,
    },
    /// Not ready yet (503).
    #[error("{0}")]
    Unavailable(String),
    /// The preloaded models are still loading (503 `model_loading`).
    #[error("the model is still loading")]
    Loading {
        /// When the load is likely done.
        retry_after: Duration,
    },
    /// Draining for shutdown (503 `shutting_down`); retry once the drain
    /// can have ended.
    #[error("the server is shutting down")]
    ShuttingDown {
        /// The longest the drain can still take.
        retry_after: Duration,
    },
    /// A server-side failure (500); details are logged, not returned.
    #[error("internal error")]
    Internal(String),
    /// The model's finished answer breaks a constraint of its schema the
    /// grammar could not enforce while generating (`uniqueItems`): 422
    /// `invalid_output`, naming the field and the break. Not a 5xx: a
    /// client's retry of the same greedy request would get the same answer.
    #[error("{param}: the model's answer does not validate: {message}")]
    InvalidOutput {
        /// The field that gave the schema.
        param: String,
        /// What breaks it.
        message: String,
    },
}

impl ApiError {
    fn parts(
        &self,
    ) -> (
        StatusCode,
        &'static str,
        Option<String>,
        Option<&'static str>,
    ) {
        match self {
            ApiError::BadRequest(e) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                e.param.clone(),
                e.code,
            ),
            ApiError::ModelNotFound(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model".into()),
                Some("model_not_found"),
            ),
            ApiError::UnknownModel { .. } => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model".into()),
                Some("model_not_found"),
            ),
            ApiError::ModelUnavailable { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                Some("model".into()),
                Some("model_unavailable"),
            ),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "invalid_request_error", None, None),
            ApiError::RouteNotFound(_) => {
                (StatusCode::NOT_FOUND, "invalid_request_error", None, None)
            }
            ApiError::NotFound { param, code, .. } => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                param.map(String::from),
                *code,
            ),
            ApiError::MethodNotAllowed(_) => (
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                None,
                None,
            ),
            ApiError::PayloadTooLarge(_) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                None,
                Some("request_too_large"),
            ),
            ApiError::UnsupportedMediaType(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                None,
                Some("unsupported_media_type"),
            ),
            ApiError::Overloaded { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                None,
                Some("server_overloaded"),
            ),
            ApiError::RateLimited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                None,
                Some("rate_limit_exceeded"),
            ),
            ApiError::Timeout(t) => (
                StatusCode::GATEWAY_TIMEOUT,
                "timeout_error",
                None,
                Some(t.code()),
            ),
            ApiError::Shed { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                None,
                Some("slo_shed"),
            ),
            ApiError::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                None,
                None,
            ),
            ApiError::ShuttingDown { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                None,
                Some("shutting_down"),
            ),
            ApiError::Loading { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                None,
                Some("model_loading"),
            ),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                None,
                None,
            ),
            ApiError::InvalidOutput { param, .. } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request_error",
                Some(param.clone()),
                Some("invalid_output"),
            ),
        }
    }

    /// The JSON error body.
    pub fn body(&self) -> serde_json::Value {
        let (_, kind, param, code) = self.parts();
        serde_json::json!({
            "error": {"message": self.to_string(), "type": kind, "param": param, "code": code}
        })
    }

    /// Maps an engine refusal; `prompt_param` names the prompt field.
    pub fn from_submit(e: SubmitError, prompt_param: &str) -> Self {
        match e {
            SubmitError::Overloaded { retry_after, .. } => ApiError::Overloaded {
                message: e.to_string(),
                retry_after,
            },
            SubmitError::TooLong { .. } => ApiError::BadRequest(
                ProtocolError::field(prompt_param, e.to_string())
                    .with_code("context_length_exceeded"),
            ),
            SubmitError::Sampling(ref s) => {
                ApiError::BadRequest(ProtocolError::field(s.field, e.to_string()))
            }
            SubmitError::Stopped => ApiError::Unavailable(e.to_string()),
            other => ApiError::BadRequest(ProtocolError::field(prompt_param, other.to_string())),
        }
    }
}

/// Whole seconds, rounded up, at least 1 (retrying sooner fails again).
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

impl From<ProtocolError> for ApiError {
    fn from(e: ProtocolError) -> Self {
        ApiError::BadRequest(e)
    }
}

/// Refusals by reason (`ingot_rejections_total{reason}`).
pub const REJECTIONS: &str = "ingot_rejections_total";

/// Counts one refusal.
pub fn count_rejection(reason: &'static str) {
    metrics::counter!(REJECTIONS, "reason" => reason).increment(1);
}

/// Which timeout a request ran past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    /// `limits.first_token_timeout`.
    FirstToken(Duration),
    /// `limits.request_timeout`.
    Request(Duration),
}

impl Timeout {
    /// The error code.
    pub fn code(self) -> &'static str {
        match self {
            Timeout::FirstToken(_) => "first_token_timeout",
            Timeout::Request(_) => "request_timeout",
        }
    }

    /// What the client reads.
    pub fn message(self) -> String {
        match self {
            Timeout::FirstToken(d) => format!(
                "no token was generated within the first-token timeout of {:.3} s; the request was cancelled",
                d.as_secs_f64()
            ),
            Timeout::Request(d) => format!(
                "the request did not finish within its timeout of {:.3} s; it was cancelled",
                d.as_secs_f64()
            ),
        }
    }
}

impl ApiError {
    /// Why the request was refused, as the `reason` label; `None` for a
    /// server-side failure, which is an error rather than a refusal, and
    /// for a path or method no endpoint serves: that concerns no model
    /// (the series carry one), and `ingot_http_requests_total` counts it
    /// (`route="other"` for a path).
    fn rejection_reason(&self) -> Option<&'static str> {
        match self {
            ApiError::BadRequest(_) | ApiError::UnsupportedMediaType(_) => Some("validation"),
            ApiError::ModelNotFound(_)
            | ApiError::UnknownModel { .. }
            | ApiError::NotFound { .. } => Some("not_found"),
            ApiError::RouteNotFound(_) | ApiError::MethodNotAllowed(_) => None,
            ApiError::PayloadTooLarge(_) => Some("too_large"),
            ApiError::Overloaded { .. } => Some("admission"),
            ApiError::RateLimited { .. } => Some("rate_limit"),
            ApiError::Timeout(_) => Some("timeout"),
            ApiError::Unavailable(_)
            | ApiError::ShuttingDown { .. }
            | ApiError::Loading { .. }
            | ApiError::ModelUnavailable { .. } => Some("unavailable"),
            ApiError::Conflict(_) => Some("validation"),
            ApiError::Shed { .. } => Some("slo_shed"),
            ApiError::Internal(_) | ApiError::InvalidOutput { .. } => None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Some(reason) = self.rejection_reason() {
            count_rejection(reason);
        }
        self.uncounted()
    }
}

impl ApiError {
    /// The answer without counting a refusal: for a probe (`/ready`), whose
    /// 503 while loading or draining turns no request away.
    pub fn uncounted(self) -> Response {
        let (status, ..) = self.parts();
        if let ApiError::Internal(detail) = &self {
            tracing::error!(detail, "internal error");
        }
        let mut response = (status, axum::Json(self.body())).into_response();
        let retry = match &self {
            ApiError::Overloaded { retry_after, .. } => Some(ceil_secs(*retry_after)),
            ApiError::RateLimited { retry_after, .. } => retry_after.map(ceil_secs),
            ApiError::Unavailable(_) => Some(1),
            ApiError::ShuttingDown { retry_after } | ApiError::Loading { retry_after } => {
                Some(ceil_secs(*retry_after))
            }
            ApiError::Shed { retry_after, .. } => Some(ceil_secs(*retry_after)),
            ApiError::ModelUnavailable { retry_after, .. } => Some(ceil_secs(*retry_after)),
            _ => None,
        };
        if let Some(secs) = retry {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
