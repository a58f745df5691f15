//! Models, tokenizer endpoints, health, readiness and metrics.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use ingot_edge::Caller;
use ingot_protocol::chat::ValidChatRequest;
use ingot_protocol::fields::UnknownFields;
use ingot_protocol::models::{ModelCard, ModelList};
use ingot_protocol::tokenize::{
    DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse, TokenizerInfo,
};
use ingot_protocol::{parse_json, ProtocolError};

use super::{json_body, Shared};
use crate::ApiError;

/// `GET /v1/models`: every configured model with its state, except those
/// the caller's API key may not use (they do not exist for them).
pub async fn models(
    State((state, _)): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: cards(&state, &caller),
    })
}

/// `GET /v1/models/{id}`: one model's card (an alias answers with the
/// model it names); 404 `model_not_found` for a model that is not served or
/// that the caller's key may not use, as the list would not show it.
pub async fn model(
    State((state, _)): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    let resolved = state
        .models()
        .resolve(&id)
        .map_err(|_| ApiError::ModelNotFound(id.clone()))?;
    cards(&state, &caller)
        .into_iter()
        .find(|c| c.id == *resolved)
        .map(Json)
        .ok_or(ApiError::ModelNotFound(id))
}

/// The cards of the models `caller` may use.
pub(super) fn cards(state: &crate::AppState, caller: &Caller) -> Vec<ModelCard> {
    state
        .models()
        .status()
        .into_iter()
        .filter(|s| caller.key().is_none_or(|k| k.allows_model(&s.id)))
        .map(|s| ModelCard {
            max_model_len: state.max_model_len(&s.id),
            endpoints: state.endpoints(&s.id),
            id: s.id,
            object: "model",
            created: state.created(),
            owned_by: "ingot",
            state: s.state.as_str(),
        })
        .collect()
}

/// `POST /tokenize`: text, or messages through the chat template.
pub async fn tokenize(
    State((state, limit)): State<Shared>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let body = json_body(body, limit)?;
    let req: TokenizeRequest = parse_json(&body)?;
    let front = crate::prepare::front(&state, &caller, req.model.as_deref()).await?;
    let tokenizer = front.tokenizer()?;
    let tokens = match (req.prompt, req.messages) {
        (Some(text), None) => tokenizer
            .encode(&text, req.add_special_tokens.unwrap_or(true))
            .map_err(|e| ApiError::Internal(e.to_string()))?,
        (None, Some(_)) => {
            // The same rendering and encoding as a chat request.
            // The tokenize fields (prompt, add_special_tokens) are not chat's.
            let chat = ValidChatRequest::parse_with(&body, UnknownFields::Ignore)?;
            super::chat::prompt_ids(&chat, &*front.chat_template()?, tokenizer)?
        }
        _ => {
            return Err(ApiError::BadRequest(ProtocolError::field(
                "prompt",
                "give exactly one of prompt or messages",
            )))
        }
    };
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        tokens,
        max_model_len: front.limits()?.max_context,
    }))
}

/// `POST /detokenize`.
pub async fn detokenize(
    State((state, limit)): State<Shared>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let body = json_body(body, limit)?;
    let req: DetokenizeRequest = parse_json(&body)?;
    let front = crate::prepare::front(&state, &caller, req.model.as_deref()).await?;
    let vocab = front.limits()?.vocab_size;
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::BadRequest(ProtocolError::bound(
            "tokens",
            &format!("ids below the vocabulary size {vocab}"),
            bad,
        )));
    }
    let prompt = front
        .tokenizer()?
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(DetokenizeResponse { prompt }))
}

/// `GET /tokenizer_info`: the default model's special tokens.
pub async fn tokenizer_info(
    State((state, _)): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<TokenizerInfo>, ApiError> {
    let front = crate::prepare::front(&state, &caller, None).await?;
    let tokenizer = front.tokenizer()?;
    let special = tokenizer.special_tokens();
    let text = |t: &Option<ingot_tokenizer::TokenInfo>| {
        t.as_ref()
            .and_then(|t| tokenizer.decode(&[t.id], false).ok())
    };
    Ok(Json(TokenizerInfo {
        eos_token: text(&special.eos),
        bos_token: text(&special.bos),
        pad_token: text(&special.pad),
        unk_token: text(&special.unk),
        add_bos_token: special.add_bos,
        add_eos_token: special.add_eos,
        model_max_length: front.limits()?.max_context,
        tokenizer_class: tokenizer.kind().to_string(),
    }))
}

/// `GET /health`: the process serves.
pub async fn health() -> StatusCode {
    StatusCode::OK
}

/// `GET /ready`: 200 once the preloaded models are in, 503 before and
/// while draining.
pub async fn ready(State((state, _)): State<Shared>) -> Response {
    if state.is_ready() {
        return (StatusCode::OK, "ready").into_response();
    }
    state
        .shutting_down()
        .unwrap_or_else(|| state.still_loading())
        .uncounted()
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State((state, _)): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.render_metrics(),
    )
        .into_response()
}
