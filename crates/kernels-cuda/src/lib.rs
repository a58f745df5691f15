//! ingot's CUDA kernels, compiled ahead of time by `build.rs` and embedded:
//! a cubin for sm_90 (loaded as is on H100/H200) and PTX for compute_80
//! (JIT-compiled by the driver on any other GPU from Ampere on).
//!
//! The sources are in `cuda/`: `elementwise.cu` (embedding, residual add +
//! RMSNorm, SiLU x mul, argmax, random fill), `rope.cu` (bias, q/k norm,
//! rotary embedding and paged KV write), `attention.cu` (paged decode
//! attention with GQA and split-K, tensor-core prefill attention) and
//! `moe.cu` (mixture-of-experts routing and expert GEMVs),
//! `collective.cu` (tensor parallel: the one-shot all-reduce over peer
//! memory, the LM head's vocabulary gather) and
//! `encoder.cu` (the BERT encoder's LayerNorm, GELU, bidirectional
//! attention over packed sequences, pooling and L2 normalisation).

/// One compiled `.cu` file.
#[derive(Debug, Clone, Copy)]
pub struct Module {
    /// File stem, e.g. `"attention"`.
    pub name: &'static str,
    /// Machine code for compute capability 9.0.
    pub cubin_sm90: &'static [u8],
    /// PTX for compute capability 8.0 and newer.
    pub ptx_compute80: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/modules.rs"));

/// Whether this build carries kernels (nvcc was found at build time); they
/// can run only where [`CHECK_ONLY`] is false.
pub fn compiled() -> bool {
    !MODULES.is_empty()
}
