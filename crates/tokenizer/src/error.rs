//! The crate's error type.

use std::path::PathBuf;

/// Why a tokenizer could not be loaded or used, or a chat template not
/// compiled or rendered. Each message is one line meant for the user.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("cannot read {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file was read but its content is not what we expect.
    #[error("invalid {}: {message}", path.display())]
    InvalidFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A GGUF file has no tokenizer, or one of a kind we cannot run.
    #[error(
        "GGUF tokenizer model '{model}' is not supported (supported: 'gpt2' byte-level BPE, \
         'llama' SentencePiece BPE)"
    )]
    UnsupportedModel {
        /// The value of `tokenizer.ggml.model`.
        model: String,
    },
    /// A GGUF byte-level BPE tokenizer names a pre-tokenizer we do not know.
    #[error("GGUF pre-tokenizer '{pre}' (tokenizer.ggml.pre) is not supported: {reason}")]
    UnsupportedPreTokenizer {
        /// The value of `tokenizer.ggml.pre`.
        pre: String,
        /// Why (unknown name, or a custom splitter we do not mirror).
        reason: String,
    },
    /// A required GGUF metadata key is absent.
    #[error("GGUF metadata has no '{key}'")]
    MissingMetadata {
        /// The key.
        key: String,
    },
    /// A GGUF metadata value is inconsistent (wrong length, id out of range).
    #[error("GGUF metadata '{key}' is invalid: {message}")]
    InvalidMetadata {
        /// The key.
        key: String,
        /// What is wrong, with the values involved.
        message: String,
    },
    /// The GGUF file itself could not be read.
    #[error(transparent)]
    Gguf(#[from] ingot_models::gguf::GgufError),
    /// The `tokenizers` library failed to build, encode or decode.
    #[error("tokenizer {action} failed: {message}")]
    Backend {
        /// What we were doing ("build", "encode", "decode").
        action: &'static str,
        /// The library's message.
        message: String,
    },
    /// A chat template does not compile.
    #[error("chat template does not compile: {message}")]
    TemplateSyntax {
        /// minijinja's message, with the line.
        message: String,
    },
    /// The template called `raise_exception(message)`: the conversation is
    /// not one the model supports (e.g. roles that do not alternate).
    #[error("{message}")]
    TemplateException {
        /// The message the template raised, verbatim.
        message: String,
    },
    /// Rendering a chat template failed for another reason.
    #[error("chat template rendering failed: {message}")]
    TemplateRender {
        /// minijinja's message, with the line.
        message: String,
    },
}

impl TokenizerError {
    pub(crate) fn backend(action: &'static str, err: impl std::fmt::Display) -> Self {
        TokenizerError::Backend {
            action,
            message: err.to_string(),
        }
    }
}
