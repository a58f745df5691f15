//! Ollama's model endpoints: `/api/tags` (the models), `/api/show` (one
//! model), `/api/version`, and `/api/embed` (on the embeddings route's
//! path).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::{Extension, Json};
use ingot_edge::Caller;
use ingot_protocol::models::ModelCard;
use ingot_protocol::ollama::{parse_embed, parse_show};
use serde_json::{json, Value};

use super::super::{embeddings, info, json_body, Shared};
use super::nanos;
use crate::ApiError;

/// The version `/api/version` reports: ingot's own (clients that check
/// Ollama's version numbers compare against Ollama's releases, which this
/// is not).
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `GET /api/version`.
pub async fn version() -> Json<Value> {
    Json(json!({ "version": VERSION }))
}

/// `GET /api/tags`: the models the caller may use. ingot keeps no
/// Ollama-style blobs, so `size` is 0 and `digest` empty.
pub async fn tags(
    State((state, _)): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Json<Value> {
    let models: Vec<Value> = info::cards(&state, &caller)
        .iter()
        .map(|c| {
            json!({
                "name": c.id,
                "model": c.id,
                "modified_at": rfc3339(c.created),
                "size": 0,
                "digest": "",
                "details": details(),
            })
        })
        .collect();
    Json(json!({ "models": models }))
}

/// `POST /api/show`: one model's template, capabilities and context
/// length; 404 for a model that is not served (or not the caller's).
pub async fn show(
    State((state, limit)): State<Shared>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let name = parse_show(&json_body(body, limit)?)?;
    let card = card(&state, &caller, &name)?;
    let front = crate::prepare::front(&state, &caller, Some(name.as_str())).await?;
    let template = front.chat_template().ok();
    let mut capabilities = Vec::new();
    if card.endpoints.contains(&"/v1/embeddings") {
        capabilities.push("embedding");
    } else {
        capabilities.push("completion");
    }
    if template.is_some() {
        capabilities.push("tools");
    }
    Ok(Json(json!({
        "modelfile": "",
        "parameters": "",
        "template": template.map(|t| t.source().to_string()).unwrap_or_default(),
        "details": details(),
        "model_info": {"context_length": front.max_context()},
        "capabilities": capabilities,
        "modified_at": rfc3339(card.created),
    })))
}

/// The card of `name` (an alias names its model) if the caller may use it.
fn card(state: &crate::AppState, caller: &Caller, name: &str) -> Result<ModelCard, ApiError> {
    let not_found = || ApiError::ModelNotFound(name.to_string());
    let id = state.models().resolve(name).map_err(|_| not_found())?;
    info::cards(state, caller)
        .into_iter()
        .find(|c| c.id == *id)
        .ok_or_else(not_found)
}

/// `details` of a model: ingot does not describe its files in Ollama's
/// terms, so every field is empty.
fn details() -> Value {
    json!({"format": "", "family": "", "families": null, "parameter_size": "", "quantization_level": ""})
}

/// Unix seconds in RFC 3339.
fn rfc3339(secs: u64) -> String {
    let at = UNIX_EPOCH + Duration::from_secs(secs);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// `POST /api/embed`: the embeddings route's path, in Ollama's shape.
pub async fn embed(
    State((state, limit)): State<Shared>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let started = Instant::now();
    let req = parse_embed(&json_body(body, limit)?)?;
    let out = embeddings::embed(&state, &caller, req).await?;
    Ok(Json(json!({
        "model": out.model,
        "embeddings": out.vectors,
        "total_duration": nanos(started.elapsed()),
        "load_duration": 0,
        "prompt_eval_count": out.prompt_tokens,
    })))
}

/// The current time (for lines that carry it).
pub(super) fn now_rfc3339() -> String {
    humantime::format_rfc3339_nanos(SystemTime::now()).to_string()
}
