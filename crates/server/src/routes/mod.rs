//! The router: one module per endpoint family.

mod admin;
mod chat;
mod completions;
mod info;
mod sse;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use ingot_protocol::body_json;
use ingot_protocol::sampling::ValidSampling;
use rand::Rng;

use crate::generate::{Endpoint, Submission};
use crate::pipeline::CacheStatus;
use crate::state::CacheControl;
use crate::{ApiError, AppState};

/// The header naming where an answer came from.
const CACHE_HEADER: &str = "x-ingot-cache";

/// The application with every route, limited to `max_body_bytes` per body.
pub fn app(state: AppState, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(info::models))
        .route("/tokenize", post(info::tokenize))
        .route("/detokenize", post(info::detokenize))
        .route("/health", get(info::health))
        .route("/ready", get(info::ready))
        .route("/metrics", get(info::metrics))
        .route("/admin/flags", get(admin::flags))
        .route("/admin/config", get(admin::config))
        .route("/admin/reload", post(admin::reload))
        .route("/admin/cache/purge", post(admin::purge))
        .fallback(|uri: Uri| async move { ApiError::RouteNotFound(uri.path().to_string()) })
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::MethodNotAllowed(format!("{method} {}", uri.path()))
        })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::middleware::from_fn(crate::http_metrics::track))
        .with_state((state, max_body_bytes))
}

/// Shared state as the router carries it.
type Shared = (AppState, usize);

/// The body as a JSON object; 413 over the limit, 400 when malformed.
fn json_body(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<serde_json::Value, ApiError> {
    let bytes = body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(limit)
        } else {
            ApiError::BadRequest(ingot_protocol::ProtocolError {
                message: format!("cannot read the request body: {r}"),
                param: None,
                code: None,
            })
        }
    })?;
    Ok(body_json(&bytes)?)
}

/// `prefix-<24 hex digits>`.
fn response_id(prefix: &str) -> String {
    let n: u128 = rand::rng().random();
    format!("{prefix}-{:024x}", n & ((1u128 << 96) - 1))
}

/// Unix seconds now.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A request's generations, started through the pipeline.
struct Started {
    /// The response id (`<prefix>-…`), also the flag unit without `user`.
    id: String,
    jobs: Vec<crate::generate::Job>,
    status: CacheStatus,
}

/// Hands `prompts × n` generations to the pipeline: the one path both
/// endpoints take after parsing. The flag unit is the `user` field, else
/// the response id (API keys will come first once they exist).
async fn start(
    state: &AppState,
    headers: &HeaderMap,
    limits: ingot_engine::RequestLimits,
    prompts: &[Vec<ingot_core::TokenId>],
    sampling: &ValidSampling,
    endpoint: Endpoint,
) -> Result<Started, ApiError> {
    let id = response_id(match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    });
    let control = CacheControl::parse(
        headers
            .get(axum::http::header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok()),
    );
    let submission = Submission {
        model: state.model_name().to_string(),
        tenant: None,
        sharing: state.sharing(sampling.user.as_deref().unwrap_or(&id), control),
        limits,
        endpoint,
    };
    let (jobs, status) = submission
        .submit(state.pipeline(), prompts, sampling)
        .await?;
    Ok(Started { id, jobs, status })
}

/// Adds `x-ingot-cache`.
fn with_cache_status(mut response: Response, status: CacheStatus) -> Response {
    response
        .headers_mut()
        .insert(CACHE_HEADER, HeaderValue::from_static(status.as_str()));
    response
}
