//! Building the key table can fail (a bad key file); a request can be
//! refused. Refusals render in the OpenAI error shape.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The key table cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    /// The key file cannot be read.
    #[error("auth.key_file {path}: cannot read: {message}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        message: String,
    },
    /// The key file is not valid TOML of `[[api_keys]]` entries.
    #[error("auth.key_file {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong (one line).
        message: String,
    },
}

/// Why a request was refused at the edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// No key in `Authorization: Bearer` or `x-api-key` (401).
    MissingKey,
    /// A key that matches none configured (401).
    InvalidKey,
    /// A valid key without `admin` on `/admin/*` (403).
    AdminRequired,
    /// Over a per-minute limit or the concurrency cap (429).
    RateLimited {
        /// What was exceeded, in words.
        message: String,
        /// When a retry can succeed; `None` when it never can as asked.
        retry_after: Option<Duration>,
    },
}

impl Rejection {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::MissingKey | Self::InvalidKey => (
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "invalid_api_key",
            ),
            Self::AdminRequired => (
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                "admin_key_required",
            ),
            Self::RateLimited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                "rate_limit_exceeded",
            ),
        }
    }

    /// The message clients see (never the key).
    pub fn message(&self) -> String {
        match self {
            Self::MissingKey => {
                "missing API key: pass it as Authorization: Bearer <key> or x-api-key".into()
            }
            Self::InvalidKey => "incorrect API key provided".into(),
            Self::AdminRequired => "this endpoint needs an admin API key".into(),
            Self::RateLimited { message, .. } => message.clone(),
        }
    }

    /// When a retry can succeed (`None`: not a rate limit, or never as asked).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The `Retry-After` value: whole seconds, rounded up, at least 1.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::RateLimited {
                retry_after: Some(d),
                ..
            } => Some(ceil_secs(*d)),
            _ => None,
        }
    }
}

/// Whole seconds, rounded up, at least 1 (a client retrying sooner fails).
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    let whole = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    whole.max(1)
}

/// Refusals by reason, the series the server counts its own in.
const REJECTIONS: &str = "ingot_rejections_total";

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        let (status, kind, code) = self.parts();
        let reason = match self {
            Self::RateLimited { .. } => "rate_limit",
            _ => "auth",
        };
        metrics::counter!(REJECTIONS, "reason" => reason).increment(1);
        let body = serde_json::json!({
            "error": {"message": self.message(), "type": kind, "param": null, "code": code}
        });
        let mut response = (status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after_secs() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn retry_after_rounds_up_to_at_least_one_second() {
        assert_eq!(ceil_secs(Duration::ZERO), 1);
        assert_eq!(ceil_secs(Duration::from_millis(10)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1000)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ceil_secs(Duration::from_secs(59)), 59);
    }

    #[test]
    fn rejections_render_the_openai_shape() {
        let r = Rejection::InvalidKey.into_response();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        let r = Rejection::RateLimited {
            message: "slow down".into(),
            retry_after: Some(Duration::from_millis(1500)),
        }
        .into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        assert_eq!(Rejection::AdminRequired.parts().2, "admin_key_required");
    }
}
