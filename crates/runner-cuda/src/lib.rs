//! [`ModelRunner`](ingot_runner::ModelRunner) on an NVIDIA GPU: the Llama-family decoder in bf16 with
//! f32 accumulation; [`encoder`] runs the BERT-family embedding models.
//!
//! - Memory: three arenas allocated at start-up (weights, activation
//!   workspace sized for `max_num_batched_tokens`, the KV block pool sized
//!   from `--gpu-memory-utilization` after a profiling forward pass); the
//!   hot path never allocates.
//! - GEMMs: cuBLASLt with per-shape cached plans ([`gemm`]); everything else
//!   is ingot's own kernels (`ingot-kernels-cuda`).
//! - Decode steps replay CUDA graphs captured per batch-size bucket (at GEMV
//!   sizes also per attention split count, picked by the step's longest
//!   context); other steps (prefill, mixed, larger batches) run eagerly.
//! - A step's inputs (ids, positions, slots, block tables) go up in one copy
//!   from pinned memory; only picked ids (greedy or sampled on the device)
//!   and the logprobs rows ask for come back.
//! - [`TpRunner`] splits one model over several GPUs (tensor parallel over
//!   NCCL, one thread per GPU).
//! - Pure decode steps launch the next one before returning
//!   ([`runner`]'s launch-ahead steps), so the device runs while the engine
//!   schedules.

mod buffers;
mod config;
mod device;
mod eagle;
pub mod encoder;
mod error;
mod fused;
mod gemm;
mod kernels;
mod kv_copy;
mod kv_views;
mod memory;
mod nccl;
mod ops;
mod peer;
mod profile;
mod runner;
mod sampling;
mod support;
#[cfg(test)]
mod test_configs;
mod weights;

pub use config::{check_l2_prefetch, e4m3_decoder, CudaRunnerConfig, Fp8Keep};
pub use error::CudaError;
pub use kernels::KvDtype;
pub use memory::{device_memory, weight_bytes, MemoryReport};
pub use nccl::version as nccl_version;
pub use runner::{CudaRunner, TpRunner};
pub use support::{availability, device_count, supports};
pub use weights::{NativeBlocks, WeightFormat};
