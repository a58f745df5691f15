//! The crate's error type.

use ingot_models::ModelError;
use ingot_runner::RunnerError;

/// A failure of the CUDA backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// No driver, no GPU, or no kernels in this build.
    #[error("CUDA unavailable: {0}")]
    Unavailable(String),
    /// The model or GPU needs something this backend lacks.
    #[error("unsupported on CUDA: {0}")]
    Unsupported(String),
    /// Device memory ran out.
    #[error("out of GPU memory: {0}")]
    OutOfMemory(String),
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// A cuBLASLt call failed.
    #[error("cuBLASLt: {0:?}")]
    Blas(#[from] cudarc::cublaslt::result::CublasError),
    /// Reading weights failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// NCCL is missing or a collective failed.
    #[error("NCCL: {0}")]
    Nccl(String),
    /// A caller's option is malformed.
    #[error("invalid CUDA option: {0}")]
    InvalidOption(String),
}

impl From<CudaError> for RunnerError {
    fn from(e: CudaError) -> Self {
        RunnerError::Backend(e.to_string())
    }
}
