//! The router: one module per endpoint family.

mod admin;
mod anthropic;
mod chat;
mod completions;
mod dialect;
mod embeddings;
mod info;
mod live;
mod ollama;
pub(crate) mod responses;
pub(crate) mod send_queue;
pub(crate) mod sse;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use ingot_protocol::body_json;
use rand::Rng;

pub use send_queue::STREAMS_CUT;

use crate::pipeline::CacheStatus;
use crate::{ApiError, AppState};

/// The header naming where an answer came from.
const CACHE_HEADER: &str = "x-ingot-cache";

/// The application with every route, limited to `max_body_bytes` per body,
/// answering browsers of `server.cors_allowed_origins` (CORS, outermost).
/// The web page's files are served without a key (they are code; the
/// page asks for one when the API wants it).
pub fn app(state: AppState, max_body_bytes: usize) -> Router {
    let origins = state.runtime().config.server.cors_allowed_origins.clone();
    let page = ingot_web::page_routes().method_not_allowed_fallback(method_not_allowed);
    ingot_edge::with_cors(page.merge(routes(state, max_body_bytes)), &origins)
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} {}", uri.path()))
}

/// Declares every API route once: [`api_router`] serves them and
/// [`ROUTES`] lists them, so the OpenAPI description's tests see a route
/// as soon as it is added here.
macro_rules! api_routes {
    ($($path:literal => $first:ident($handler:path) $(.$more:ident($more_handler:path))*;)*) => {
        /// (method, path) of every API route (the web page's files aside).
        pub const ROUTES: &[(&str, &str)] = &[
            $((stringify!($first), $path), $((stringify!($more), $path),)*)*
        ];

        fn api_router() -> Router<Shared> {
            Router::new()$(.route($path, $first($handler)$(.$more($more_handler))*))*
        }
    };
}

api_routes! {
    "/v1/chat/completions" => post(chat::chat_completions);
    "/v1/completions" => post(completions::completions);
    "/v1/models" => get(info::models);
    "/v1/models/{id}" => get(info::model);
    "/v1/embeddings" => post(embeddings::embeddings);
    "/v1/messages" => post(anthropic::messages);
    "/v1/responses" => post(responses::create);
    "/v1/responses/{id}" => get(responses::retrieve).delete(responses::delete);
    "/api/chat" => post(ollama::chat);
    "/api/generate" => post(ollama::generate);
    "/api/embed" => post(ollama::embed);
    "/api/tags" => get(ollama::tags);
    "/api/show" => post(ollama::show);
    "/api/version" => get(ollama::version);
    "/tokenize" => post(info::tokenize);
    "/detokenize" => post(info::detokenize);
    "/tokenizer_info" => get(info::tokenizer_info);
    "/health" => get(info::health);
    "/ready" => get(info::ready);
    "/metrics" => get(info::metrics);
    "/openapi.json" => get(crate::openapi::serve);
    "/admin/flags" => get(admin::flags);
    "/admin/config" => get(admin::config);
    "/admin/reload" => post(admin::reload);
    "/admin/cache/purge" => post(admin::purge);
    "/admin/models" => get(admin::models);
    "/admin/slo" => get(admin::slo);
    "/admin/models/{id}/{action}" => post(admin::model_action);
    "/ui/live" => get(live::live);
}

/// Every route under the edge layers.
fn routes(state: AppState, max_body_bytes: usize) -> Router {
    api_router()
        .fallback(|uri: Uri| async move { ApiError::RouteNotFound(uri.path().to_string()) })
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        // Inside the key check: a caller without a key learns nothing
        // about how bodies are read.
        .layer(axum::middleware::from_fn(json_only))
        .layer(axum::middleware::from_fn_with_state(
            state.edge().clone(),
            ingot_edge::authenticate,
        ))
        // Outside the key check: every body is read (within the limit)
        // before any answer, so an early refusal (401, 429) does not leave
        // unread bytes that make hyper close a keep-alive connection the
        // client is about to reuse.
        .layer(axum::middleware::from_fn_with_state(
            max_body_bytes,
            crate::conn::limit_body,
        ))
        // Outside every refusal (auth, body limit, handler): Anthropic's
        // and Ollama's paths answer errors in their own shape.
        .layer(axum::middleware::from_fn(dialect::shape_errors))
        .layer(axum::middleware::from_fn(crate::http_metrics::track))
        .layer(axum::middleware::from_fn(crate::observe::access_log))
        .layer(tower_http::request_id::PropagateRequestIdLayer::new(
            crate::observe::REQUEST_ID,
        ))
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                .make_span_with(crate::observe::request_span)
                .on_request(())
                .on_response(())
                .on_body_chunk(())
                .on_eos(())
                .on_failure(()),
        )
        .layer(axum::middleware::from_fn(crate::observe::assign_id))
        .with_state((state, max_body_bytes))
}

/// Shared state as the router carries it.
type Shared = (AppState, usize);

/// Middleware: a body declared as something other than JSON is refused
/// with 415 rather than parsed as JSON anyway. A body without a
/// Content-Type is read as JSON, and so is
/// `application/x-www-form-urlencoded`: `curl -d` sends that by default,
/// and Ollama's documented examples rely on it.
async fn json_only(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use axum::body::HttpBody;
    use axum::response::IntoResponse;

    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .filter(|_| req.body().size_hint().exact() != Some(0));
    if let Some(declared) = declared {
        if !read_as_json(declared) {
            let shown = String::from_utf8_lossy(declared.as_bytes()).into_owned();
            return ApiError::UnsupportedMediaType(shown).into_response();
        }
    }
    next.run(req).await
}

/// Whether a body of this Content-Type is read as JSON: `application/json`,
/// any `+json` type, or a form type (see [`json_only`]).
fn read_as_json(content_type: &HeaderValue) -> bool {
    let Ok(value) = content_type.to_str() else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
        || essence == "application/x-www-form-urlencoded"
}

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

/// What the OpenAI endpoints do with a field they do not know
/// (`server.ignore_unknown_fields`, read per request).
fn unknown_fields(state: &AppState) -> ingot_protocol::fields::UnknownFields {
    if state.runtime().config.server.ignore_unknown_fields {
        ingot_protocol::fields::UnknownFields::Ignore
    } else {
        ingot_protocol::fields::UnknownFields::Refuse
    }
}

/// `prefix-<24 hex digits>`.
pub(crate) fn response_id(prefix: &str) -> String {
    let n: u128 = rand::rng().random();
    format!("{prefix}-{:024x}", n & ((1u128 << 96) - 1))
}

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Adds `x-ingot-cache`.
pub(crate) fn with_cache_status(mut response: Response, status: CacheStatus) -> Response {
    response
        .headers_mut()
        .insert(CACHE_HEADER, HeaderValue::from_static(status.as_str()));
    response
}
