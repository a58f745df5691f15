//! `GET /v1/models`.

use serde::Serialize;

/// One served model.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct ModelCard {
    /// The name clients pass as `model`.
    pub id: String,
    /// "model".
    pub object: &'static str,
    /// Unix seconds when it was loaded.
    pub created: u64,
    /// "ingot".
    pub owned_by: &'static str,
    /// Longest prompt + output (absent while the model was never loaded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<usize>,
    /// `loaded`, `loading` or `unloaded` (ingot's extra field: a request
    /// for an unloaded model loads it).
    pub state: &'static str,
    /// The endpoints it serves (ingot's extra field): an embedding model
    /// serves `/v1/embeddings`, a generative one the completion endpoints.
    pub endpoints: &'static [&'static str],
}

/// The model list.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct ModelList {
    /// "list".
    pub object: &'static str,
    /// The models.
    pub data: Vec<ModelCard>,
}
