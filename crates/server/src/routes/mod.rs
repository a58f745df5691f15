//! The router: one module per endpoint family.

mod admin;
mod chat;
mod completions;
mod embeddings;
mod info;
mod send_queue;
mod sse;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use ingot_edge::Caller;
use ingot_protocol::body_json;
use ingot_protocol::sampling::ValidSampling;
use rand::Rng;

use std::time::{Duration, Instant};

pub use send_queue::STREAMS_CUT;

use crate::conn::ConnProbe;
use crate::generate::{Deadlines, Endpoint, Prompts, Submission};
use crate::pipeline::CacheStatus;
use crate::state::CacheControl;
use crate::usage::KeyUsage;
use crate::{ApiError, AppState};

/// The header naming where an answer came from.
const CACHE_HEADER: &str = "x-ingot-cache";

/// The application with every route, limited to `max_body_bytes` per body.
pub fn app(state: AppState, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(info::models))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/tokenize", post(info::tokenize))
        .route("/detokenize", post(info::detokenize))
        .route("/tokenizer_info", get(info::tokenizer_info))
        .route("/health", get(info::health))
        .route("/ready", get(info::ready))
        .route("/metrics", get(info::metrics))
        .route("/admin/flags", get(admin::flags))
        .route("/admin/config", get(admin::config))
        .route("/admin/reload", post(admin::reload))
        .route("/admin/cache/purge", post(admin::purge))
        .route("/admin/models", get(admin::models))
        .route("/admin/slo", get(admin::slo))
        .route("/admin/models/{id}/{action}", post(admin::model_action))
        .fallback(|uri: Uri| async move { ApiError::RouteNotFound(uri.path().to_string()) })
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::MethodNotAllowed(format!("{method} {}", uri.path()))
        })
        .layer(DefaultBodyLimit::max(max_body_bytes))
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
    /// What the answer reports: cache status, tenant, prompt tokens.
    answer: Answer,
    /// Settled when the answer ends.
    usage: KeyUsage,
}

/// What every answer of a started request carries (header, access log).
struct Answer {
    model: String,
    status: CacheStatus,
    tenant: Option<String>,
    prompt_tokens: usize,
}

impl Answer {
    /// Adds `x-ingot-cache` and what the access log reads: `tokens` is
    /// (prompt, completion) of a finished answer, `None` for a stream (whose
    /// head is logged, with the prompt tokens known then).
    fn finish(self, response: Response, tokens: Option<(usize, usize)>) -> Response {
        let access = crate::observe::Access {
            model: Some(self.model),
            tenant: self.tenant,
            prompt_tokens: Some(tokens.map_or(self.prompt_tokens, |t| t.0) as u64),
            completion_tokens: tokens.map(|t| t.1 as u64),
            stream: tokens.is_none(),
            cache: Some(self.status.as_str()),
        };
        crate::observe::with_access(with_cache_status(response, self.status), access)
    }
}

/// Hands `prompts × n` generations to the pipeline: the one path both
/// endpoints take after parsing. With an API key, the key must be allowed
/// the model (else 404, as if it did not exist), its priority ceiling
/// lowers the request's tier, its tenant scopes shared answers, its id is
/// the flag unit (else the `user` field, else the response id), and its
/// tokens-per-minute bucket must hold prompt + max_tokens of every choice.
async fn start(
    state: &AppState,
    lease: &ingot_registry::Lease<crate::models::ServedModel>,
    caller: &Caller,
    headers: &HeaderMap,
    inputs: Prompts<'_>,
    sampling: &ValidSampling,
    endpoint: Endpoint,
) -> Result<Started, ApiError> {
    let prompts = inputs.ids;
    let (model, limits) = (lease.id(), lease.engine()?.limits());
    let id = response_id(match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    });
    let control = CacheControl::parse(
        headers
            .get(axum::http::header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok()),
    );
    let key = caller.key();
    let sampling = &admit(key, sampling);
    let shed = &state.runtime().config.remediation.shed;
    state
        .slo()
        .admit(model, sampling.priority, shed.retry_after.get())?;
    let unit = key
        .map(|k| k.id.as_str())
        .or(sampling.user.as_deref())
        .unwrap_or(&id);
    let tenant = key.and_then(|k| k.tenant.clone());
    let runtime = state.runtime();
    let configured = &runtime.config.limits;
    let submission = Submission {
        model: model.to_string(),
        tenant: tenant.clone(),
        sharing: state.sharing(unit, control),
        limits,
        endpoint,
        max_tokens_cap: configured.max_tokens,
        deadlines: deadlines(configured, key, sampling.priority),
        span: tracing::Span::current(),
    };
    let mut reserved = 0;
    if let Some(k) = key {
        reserved = submission.token_budget(prompts, sampling);
        state
            .edge()
            .reserve_tokens(k, reserved)
            .await
            .map_err(|r| ApiError::RateLimited {
                retry_after: r.retry_after(),
                message: r.message(),
            })?;
    }
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    // From here on the reservation is corrected when `usage` drops, even
    // if submitting fails.
    let usage = KeyUsage::new(
        caller.0.clone(),
        reserved,
        prompt_tokens as u64,
        sampling.n as u64,
    );
    let (jobs, status) = tracing::Instrument::instrument(
        submission.submit(state.pipeline(), inputs, sampling),
        tracing::info_span!("submit"),
    )
    .await?;
    let answer = Answer {
        model: model.to_string(),
        status,
        tenant,
        prompt_tokens,
    };
    Ok(Started {
        id,
        jobs,
        answer,
        usage,
    })
}

/// The request's deadlines from now: the tier's timeouts, or the key's
/// overrides (zero: none).
fn deadlines(
    limits: &ingot_config::LimitsSection,
    key: Option<&ingot_edge::Key>,
    priority: ingot_core::Priority,
) -> Deadlines {
    let tier = priority.rank();
    let pick = |overridden: Option<Duration>, tiered: Option<Duration>| {
        overridden.map_or(tiered, |d| (!d.is_zero()).then_some(d))
    };
    let first = pick(
        key.and_then(|k| k.first_token_timeout),
        limits.first_token_timeout.get(tier),
    );
    let total = pick(
        key.and_then(|k| k.request_timeout),
        limits.request_timeout.get(tier),
    );
    Deadlines::after(Instant::now(), first, total)
}

/// A lease on the model `requested` names (the default when absent). With
/// an API key, a model the key may not use is a 404 as if it did not
/// exist, decided before anything loads.
async fn lease(
    state: &AppState,
    caller: &Caller,
    requested: Option<&str>,
) -> Result<ingot_registry::Lease<crate::models::ServedModel>, ApiError> {
    if let (Some(key), Some(models)) = (caller.key(), state.models()) {
        let name = requested.unwrap_or(state.model_name());
        let id = models.resolve(name)?;
        if !key.allows_model(&id) && !key.allows_model(name) {
            return Err(ApiError::ModelNotFound(name.to_string()));
        }
    }
    state.model(requested).await
}

/// `sampling` with its tier lowered to `key`'s ceiling.
fn admit(key: Option<&ingot_edge::Key>, sampling: &ValidSampling) -> ValidSampling {
    let mut sampling = sampling.clone();
    if let Some(key) = key {
        sampling.priority = key.clamp(sampling.priority);
    }
    sampling
}

/// Records how long the request took from its head to the engine
/// (`ingot_request_prepare_seconds`).
fn note_prepared(received: Instant, jobs: &[crate::generate::Job]) {
    if let Some(job) = jobs.first() {
        let took = job.submitted().saturating_duration_since(received);
        metrics::histogram!(crate::http_metrics::PREPARE_SECONDS).record(took.as_secs_f64());
    }
}

/// What a stream of this connection holds and where it goes, under the
/// running config's slow-client policy; `received` is when its request's
/// head came.
fn delivery(
    state: &AppState,
    probe: Option<axum::Extension<ConnProbe>>,
    guard: crate::state::InflightGuard,
    usage: KeyUsage,
    received: Instant,
) -> sse::Delivery {
    let runtime = state.runtime();
    let c = &runtime.config;
    let out = sse::Output {
        probe: probe.map(|p| p.0),
        settings: send_queue::Settings {
            stall_timeout: c.engine.stall_timeout.get(),
            flush_interval: c.server.stream_flush_interval.get(),
            max_pending: usize::try_from(c.server.max_stream_pending_bytes.bytes())
                .unwrap_or(usize::MAX),
        },
    };
    sse::Delivery {
        guard,
        usage,
        out,
        received,
    }
}

/// Adds `x-ingot-cache`.
fn with_cache_status(mut response: Response, status: CacheStatus) -> Response {
    response
        .headers_mut()
        .insert(CACHE_HEADER, HeaderValue::from_static(status.as_str()));
    response
}
