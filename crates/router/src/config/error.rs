//! Why a `router.toml` cannot run.

use std::path::PathBuf;

/// A config that cannot run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouterConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for these types.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (it names the key and line).
        message: String,
    },
    /// A value is out of bounds.
    #[error("{key}: {message} (got {value})")]
    Invalid {
        /// The dotted key.
        key: &'static str,
        /// What is expected.
        message: &'static str,
        /// What was given.
        value: String,
    },
}

/// An out-of-bounds `key`: `message` says what is expected.
pub(crate) fn invalid(
    key: &'static str,
    message: &'static str,
    value: impl std::fmt::Display,
) -> RouterConfigError {
    RouterConfigError::Invalid {
        key,
        message,
        value: value.to_string(),
    }
}
