//! `/admin/*`: feature flags, the effective config, live reload, the
//! response cache and the served models. With API keys on, only an admin
//! key reaches these.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::Json;
use ingot_protocol::{parse_json, ProtocolError};
use serde::Deserialize;
use serde_json::{json, Value};

use super::Shared;
use crate::ApiError;

/// `GET /admin/flags`: every flag, its settings and where each came from.
pub async fn flags(State((state, _)): State<Shared>) -> Json<Value> {
    let runtime = state.runtime();
    let data: Vec<Value> = runtime
        .config
        .flags
        .iter()
        .map(|(name, spec)| {
            let source = |field: &str| runtime.source(&format!("flags.{name}.{field}")).to_string();
            json!({
                "name": name,
                "enabled": spec.enabled,
                "rollout_percent": spec.rollout_percent,
                "allow": spec.allow,
                "deny": spec.deny,
                "sources": {
                    "enabled": source("enabled"),
                    "rollout_percent": source("rollout_percent"),
                    "allow": source("allow"),
                    "deny": source("deny"),
                },
            })
        })
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

/// `GET /admin/slo`: every SLO's last evaluation, each model's remediation
/// state (applied, or what dry-run mode would do) and the recent decisions.
pub async fn slo(State((state, _)): State<Shared>) -> Json<Value> {
    Json(state.slo().report(&state.runtime().config))
}

/// `GET /admin/config`: the effective config, each value with its source,
/// and the API keys in force by id. Key hashes are left out: an unsalted
/// SHA-256 of a weak key can be reversed offline by whoever reads it.
pub async fn config(State((state, _)): State<Shared>) -> Json<Value> {
    let runtime = state.runtime();
    let sources: serde_json::Map<String, Value> = runtime
        .sources
        .iter()
        .map(|(k, s)| (k.clone(), Value::String(s.to_string())))
        .collect();
    let mut config = serde_json::to_value(&runtime.config).unwrap_or(Value::Null);
    without_key_hashes(&mut config);
    let table = state.edge().table();
    let ids: Vec<&str> = table.ids().collect();
    Json(json!({
        "config": config,
        "sources": sources,
        "api_keys": {"count": ids.len(), "ids": ids},
    }))
}

/// What a key hash becomes in the shown config.
const REDACTED: &str = "<redacted>";

/// Replaces every key hash in a serialised config (`auth.api_keys[].sha256`,
/// `auth.api_key_sha256`) with [`REDACTED`].
fn without_key_hashes(config: &mut Value) {
    let Some(auth) = config.get_mut("auth") else {
        return;
    };
    if let Some(keys) = auth.get_mut("api_keys").and_then(Value::as_array_mut) {
        for key in keys {
            if let Some(hash) = key.get_mut("sha256") {
                *hash = Value::from(REDACTED);
            }
        }
    }
    if let Some(hash) = auth.get_mut("api_key_sha256").filter(|h| !h.is_null()) {
        *hash = Value::from(REDACTED);
    }
}

/// `POST /admin/reload`: re-reads the config file and environment; applies
/// the keys that are safe live and lists the ones that need a restart.
pub async fn reload(State((state, _)): State<Shared>) -> Result<Json<Value>, ApiError> {
    let report = crate::reload::reload(&state).map_err(|e| {
        ApiError::BadRequest(ProtocolError {
            message: format!("config not reloaded: {e}"),
            param: None,
            code: Some("invalid_config"),
        })
    })?;
    Ok(Json(json!({
        "applied": report.applied,
        "needs_restart": report.needs_restart,
    })))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PurgeRequest {
    model: Option<String>,
}

/// `POST /admin/cache/purge` with an optional `{"model": "..."}`.
pub async fn purge(
    State((state, limit)): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let empty = body
        .as_ref()
        .is_ok_and(|b| b.iter().all(u8::is_ascii_whitespace));
    let req: PurgeRequest = if empty {
        PurgeRequest::default()
    } else {
        parse_json(&super::json_body(body, limit)?)?
    };
    let purged = state.pipeline().purge(req.model.as_deref());
    Ok(Json(json!({ "purged": purged, "model": req.model })))
}

/// `GET /admin/models`: every configured model, its state and memory, and
/// the registry's budget.
pub async fn models(State((state, _)): State<Shared>) -> Result<Json<Value>, ApiError> {
    let models = state.models();
    let data: Vec<Value> = models
        .status()
        .into_iter()
        .map(|s| {
            let tiers = models
                .built_front(&s.id)
                .and_then(|f| f.engine_watch().kv_tiers());
            json!({
                "id": s.id,
                "aliases": s.aliases,
                "state": s.state.as_str(),
                "pinned": s.pinned,
                "in_flight": s.in_flight,
                "device_bytes": s.device_bytes,
                "host_bytes": s.host_bytes,
                "idle_seconds": s.idle_for.as_secs_f64(),
                "kv_tiers": tiers.map(|t| tier_use(&t)),
            })
        })
        .collect();
    let (device_used, host_used) = models.used();
    let budget = models.budget();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "device_bytes_used": device_used,
        "device_budget_bytes": budget.device_bytes,
        "host_bytes_used": host_used,
        "host_budget_bytes": budget.host_bytes,
    })))
}

/// A model's KV tiers: bytes held and capacity, pages, restored pages by
/// tier and errors.
pub(crate) fn tier_use(t: &ingot_engine::TierUse) -> Value {
    json!({
        "host": { "bytes": t.host_bytes, "capacity_bytes": t.host_capacity, "pages": t.host_pages },
        "disk": t.disk_bytes.map(|b| json!({ "bytes": b, "pages": t.disk_pages })),
        "restored_pages": { "host": t.hits[0], "disk": t.hits[1], "shared": t.hits[2] },
        "errors": t.errors,
    })
}

/// `POST /admin/models/{id}/{action}`: `load` (returns once loaded),
/// `unload` (409 while requests hold it), `pin`, `unpin`.
pub async fn model_action(
    State((state, _)): State<Shared>,
    Path((id, action)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let models = state.models();
    match action.as_str() {
        "load" => models.load(&id).await?,
        "unload" => models.unload(&id).await?,
        "pin" => models.set_pinned(&id, true)?,
        "unpin" => models.set_pinned(&id, false)?,
        other => {
            return Err(ApiError::RouteNotFound(format!(
                "/admin/models/{id}/{other} (actions: load, unload, pin, unpin)"
            )))
        }
    }
    let status = models
        .status()
        .into_iter()
        .find(|s| s.id == id || s.aliases.contains(&id));
    Ok(Json(json!({
        "id": status.as_ref().map_or(id.clone(), |s| s.id.clone()),
        "action": action,
        "state": status.map(|s| s.state.as_str()),
    })))
}
