//! Errors that stop a benchmark command.

/// A benchmark could not run (bad options, unreadable files, no server).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// Invalid options.
    #[error("{0}")]
    Options(String),
    /// A file could not be read or written.
    #[error("{}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A result file is not valid JSON of the expected shape.
    #[error("{path}: invalid result file: {message}")]
    BadResult {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The server cannot be used at all (unreachable, not OpenAI-compatible).
    #[error("{0}")]
    Server(String),
}
