//! `POST /v1/embeddings`: texts or token ids in, one vector each out,
//! batched with other embedding requests by the model's embedding engine.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use ingot_edge::Caller;
use ingot_engine::{EmbeddingError, EmbeddingHandle};
use ingot_protocol::embeddings::{
    embedding_response, parse_embedding_request_with, EmbeddingInput, ValidEmbedding,
};
use ingot_protocol::ProtocolError;
use serde_json::Value;

use super::{json_body, Shared};
use crate::http_metrics::ServedBy;
use crate::ApiError;

/// `POST /v1/embeddings`.
pub async fn embeddings(
    State((state, limit)): State<Shared>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = json_body(body, limit)?;
    let req = parse_embedding_request_with(&body, super::unknown_fields(&state))?;
    let format = req.format;
    let out = embed(&state, &caller, req).await?;
    let mut response = Json::<Value>(embedding_response(
        &out.model,
        &out.vectors,
        format,
        out.prompt_tokens,
    ))
    .into_response();
    response.extensions_mut().insert(ServedBy(out.model));
    Ok(response)
}

/// What an embedding request got.
pub(super) struct Embedded {
    /// The model's id.
    pub model: String,
    /// One vector per input.
    pub vectors: Vec<Vec<f32>>,
    /// Input tokens over every input.
    pub prompt_tokens: usize,
}

/// Embeds `req`'s inputs with its model (the one path of `/v1/embeddings`
/// and Ollama's `/api/embed`).
pub(super) async fn embed(
    state: &crate::AppState,
    caller: &Caller,
    req: ValidEmbedding,
) -> Result<Embedded, ApiError> {
    let name = crate::prepare::allowed_model(state, caller, req.model.as_deref())?;
    let model = state.models().acquire(name).await?;
    let engine = model.embedder(model.id())?.clone();
    check_dimensions(&req, engine.dimensions())?;
    let _guard = state.track();
    let sequences = tokenized(&engine, req.input).await?;
    let prompt_tokens = sequences.iter().map(Vec::len).sum();
    let vectors = engine.embed(sequences).await.map_err(api_error)?;
    Ok(Embedded {
        model: model.id().to_string(),
        vectors,
        prompt_tokens,
    })
}

/// The model cannot truncate its vectors (it was not trained for it), so
/// only its own width is accepted.
fn check_dimensions(req: &ValidEmbedding, native: usize) -> Result<(), ApiError> {
    match req.dimensions {
        Some(d) if d != native => Err(ApiError::BadRequest(ProtocolError::field(
            "dimensions",
            format!(
                "this model cannot shorten its embeddings: dimensions must be its native \
                 {native} or absent, got {d}"
            ),
        ))),
        _ => Ok(()),
    }
}

/// Token ids of every input (texts through the model's tokenizer, off the
/// async threads).
async fn tokenized(
    engine: &EmbeddingHandle,
    input: EmbeddingInput,
) -> Result<Vec<Vec<u32>>, ApiError> {
    match input {
        EmbeddingInput::Tokens(ids) => Ok(ids),
        EmbeddingInput::Texts(texts) => {
            let engine = engine.clone();
            tokio::task::spawn_blocking(move || {
                texts
                    .iter()
                    .map(|t| engine.tokenize(t))
                    .collect::<Result<Vec<_>, _>>()
            })
            .await
            .map_err(|e| ApiError::Internal(format!("tokenizing failed: {e}")))?
            .map_err(api_error)
        }
    }
}

fn api_error(e: EmbeddingError) -> ApiError {
    match e {
        EmbeddingError::Input(message) => {
            ApiError::BadRequest(ProtocolError::field("input", message))
        }
        EmbeddingError::Stopped => ApiError::Unavailable(e.to_string()),
        other => ApiError::Internal(other.to_string()),
    }
}
