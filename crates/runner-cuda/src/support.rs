//! What this process and this backend can run: the driver and kernels
//! ([`availability`]), the model's architecture ([`supports`]) and its
//! weight format.

use cudarc::driver::sys;
use ingot_models::ModelConfig;

use crate::kernels::{MOE_MAX_EXPERTS, MOE_MAX_TOP_K};
use crate::weights::WeightFormat;
use crate::CudaError;

/// Whether this process can run the CUDA backend: kernels compiled in and a
/// driver library present (checked without touching the GPU).
pub fn availability() -> Result<(), CudaError> {
    if !ingot_kernels_cuda::compiled() {
        return Err(CudaError::Unavailable(
            "this build has no CUDA kernels (nvcc was not found when it was compiled)".into(),
        ));
    }
    if ingot_kernels_cuda::CHECK_ONLY {
        return Err(CudaError::Unavailable(
            "this build's CUDA kernels were compiled unoptimised, only to check that they compile \
             (INGOT_CUDA_KERNELS_CHECK_ONLY=1, as CI builds); rebuild without it to run them"
                .into(),
        ));
    }
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::Unavailable(
            "no CUDA driver (libcuda) found".into(),
        ));
    }
    Ok(())
}

/// GPUs the driver sees.
pub fn device_count() -> Result<usize, CudaError> {
    availability()?;
    cudarc::driver::result::init()?;
    Ok(cudarc::driver::result::device::get_count()? as usize)
}

/// Whether this backend runs `config`'s architecture: the Llama family and
/// Gemma 3 (sliding windows, local rope, post-norms, GELU-tanh MLP, scaled
/// embeddings, logit soft-capping). Head sizes and GQA groups are checked
/// where the kernels load.
pub fn supports(config: &ModelConfig) -> Result<(), CudaError> {
    if let Some(moe) = &config.block.moe {
        let (n, top_k) = (moe.num_experts, moe.experts_per_token);
        if n > MOE_MAX_EXPERTS
            || top_k > MOE_MAX_TOP_K
            || !moe.expert_intermediate_size.is_multiple_of(8)
        {
            return Err(CudaError::Unsupported(format!(
                "a mixture of {n} experts, {top_k} per token, of width {} on the CUDA backend \
                 (up to {MOE_MAX_EXPERTS} experts and {MOE_MAX_TOP_K} per token, widths that \
                 are multiples of 8); serve it on the CPU (--device cpu)",
                moe.expert_intermediate_size
            )));
        }
    }
    // Post-norm blocks stage their f32 output in the gate/up buffer.
    if config.block.post_norms && config.intermediate_size < config.hidden_size {
        return Err(CudaError::Unsupported(format!(
            "the {} architecture with an MLP ({}) narrower than the model ({}) on the \
             CUDA backend; serve it on the CPU (--device cpu)",
            config.architecture.name(),
            config.intermediate_size,
            config.hidden_size
        )));
    }
    Ok(())
}

/// Whether `format` suits the model: e4m3 GEMMs and the FP8 GEMV read
/// 16 weights per load, so every matrix's input width must be a multiple
/// of 16.
pub(crate) fn supports_format(config: &ModelConfig, format: WeightFormat) -> Result<(), CudaError> {
    if format.fp8_from_file() && config.block.moe.is_some() {
        return Err(CudaError::Unsupported(
            "an FP8 checkpoint of a mixture of experts (model.cuda_weights = \"native\"): \
             its experts load from bf16 weights only; load the bf16 checkpoint with \
             --quantization fp8"
                .into(),
        ));
    }
    let expert_width = config
        .block
        .moe
        .as_ref()
        .map(|m| m.expert_intermediate_size);
    let widths = [config.hidden_size, config.q_dim(), config.intermediate_size]
        .into_iter()
        .chain(expert_width);
    let widths: Vec<usize> = widths.collect();
    if format.is_fp8() && widths.iter().any(|w| !w.is_multiple_of(16)) {
        return Err(CudaError::Unsupported(format!(
            "FP8 weights (model.quantization = \"fp8\") need matrix widths that are \
             multiples of 16; this model has {widths:?} (hidden, q, intermediate, and the experts' width)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_configs::{gemma3, FP8};

    #[test]
    fn gemma3_is_supported_and_a_narrow_post_norm_mlp_is_refused() {
        let mut c = gemma3();
        assert!(supports(&c).is_ok());
        c.intermediate_size = 320;
        let err = supports(&c).map(|_| ()).unwrap_err().to_string();
        assert!(
            err.contains("narrower") && err.contains("--device cpu"),
            "{err}"
        );
    }

    #[test]
    fn fp8_needs_widths_that_16_divides() {
        let mut c = gemma3();
        assert!(supports_format(&c, FP8).is_ok());
        c.intermediate_size = 2056;
        assert!(supports_format(&c, WeightFormat::Bf16).is_ok());
        let err = supports_format(&c, FP8).unwrap_err().to_string();
        assert!(err.contains("multiples of 16"), "{err}");
    }
}
