//! Models, tokenizer endpoints, health, readiness and metrics.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use ingot_edge::Caller;
use ingot_protocol::chat::ValidChatRequest;
use ingot_protocol::models::{ModelCard, ModelList};
use ingot_protocol::tokenize::{
    DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse,
};
use ingot_protocol::{parse_json, ProtocolError};

use super::{json_body, Shared};
use crate::ApiError;

/// `GET /v1/models`: the served model, unless the caller's API key may not
/// use it (it then does not exist for them).
pub async fn models(
    State((state, _)): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Json<ModelList> {
    let max_model_len = state.loaded_engine().map_or(0, |e| e.max_context());
    let visible = caller
        .key()
        .is_none_or(|k| k.allows_model(state.model_name()));
    let card = ModelCard {
        id: state.model_name().to_string(),
        object: "model",
        created: state.created(),
        owned_by: "ingot",
        max_model_len,
    };
    Json(ModelList {
        object: "list",
        data: visible.then_some(card).into_iter().collect(),
    })
}

/// `POST /tokenize`: text, or messages through the chat template.
pub async fn tokenize(
    State((state, limit)): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let engine = state
        .loaded_engine()
        .ok_or_else(|| ApiError::Unavailable("the model is still loading".into()))?;
    let body = json_body(body, limit)?;
    let req: TokenizeRequest = parse_json(&body)?;
    state.check_model(req.model.as_deref())?;
    let tokenizer = engine.tokenizer().clone();
    let tokens = match (req.prompt, req.messages) {
        (Some(text), None) => tokenizer
            .encode(&text, req.add_special_tokens.unwrap_or(true))
            .map_err(|e| ApiError::Internal(e.to_string()))?,
        (None, Some(_)) => {
            // The same rendering and encoding as a chat request.
            let chat = ValidChatRequest::parse(&body)?;
            super::chat::prompt_ids(&chat, &*state.chat_template()?, &tokenizer)?
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
        max_model_len: engine.max_context(),
    }))
}

/// `POST /detokenize`.
pub async fn detokenize(
    State((state, limit)): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let engine = state
        .loaded_engine()
        .ok_or_else(|| ApiError::Unavailable("the model is still loading".into()))?;
    let body = json_body(body, limit)?;
    let req: DetokenizeRequest = parse_json(&body)?;
    state.check_model(req.model.as_deref())?;
    let vocab = engine.model_config().vocab_size;
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::BadRequest(ProtocolError::bound(
            "tokens",
            &format!("ids below the vocabulary size {vocab}"),
            bad,
        )));
    }
    let prompt = engine
        .tokenizer()
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(DetokenizeResponse { prompt }))
}

/// `GET /health`: the process serves.
pub async fn health() -> StatusCode {
    StatusCode::OK
}

/// `GET /ready`: 200 once the model is loaded, 503 before and while draining.
pub async fn ready(State((state, _)): State<Shared>) -> Response {
    match state.engine() {
        Ok(_) => (StatusCode::OK, "ready").into_response(),
        Err(e) => e.into_response(),
    }
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
