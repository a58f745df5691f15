//! Model architectures, each written once as a forward pass over a small
//! set of block-level operations that every backend implements.
//!
//! - [`bert`]: the BERT-family encoder (sentence embeddings) over
//!   [`bert::EncoderOps`].

pub mod bert;

pub use bert::{Bert, EncoderBatch, EncoderOps};

/// Failures of a forward pass, phrased for the user.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArchError {
    /// The weights could not be read or have the wrong shape.
    #[error(transparent)]
    Model(#[from] ingot_models::ModelError),
    /// The input does not fit the model.
    #[error("{0}")]
    Input(String),
    /// The backend failed.
    #[error("backend error: {0}")]
    Backend(String),
}

/// A loaded embedding model, whatever its architecture and backend.
pub trait Embedder: Send + Sync {
    /// One vector per sequence of token ids (each non-empty and at most
    /// [`Embedder::max_tokens`] long). A sequence's vector does not depend
    /// on the others in the call.
    fn embed(&self, sequences: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ArchError>;
    /// Width of every vector.
    fn dimensions(&self) -> usize;
    /// Longest sequence in tokens.
    fn max_tokens(&self) -> usize;
    /// Token ids are below this.
    fn vocab_size(&self) -> usize;
    /// Where it runs ("cpu", the GPU's name).
    fn device_name(&self) -> &str;
}
