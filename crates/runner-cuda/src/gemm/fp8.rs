//! FP8 (e4m3) weights: the activation quantizer and scratch, the GEMV
//! table for e4m3 rows, and cuBLASLt's outer-vector scales (see the module
//! doc of [`super`]).

use cudarc::cublaslt::sys;

use super::plan::set_desc;
use super::{gemv_table, Gemm, Operands};
use crate::device::{Arena, Arg, DevPtr, Gpu, Kernel};
use crate::weights::{Q8_0_BLOCK, Q8_0_BLOCK_BYTES};
use crate::CudaError;

/// FP8 weights: where they live, and scratch for quantized activations.
pub(super) struct Fp8 {
    /// `[start, end)` of the e4m3 matrices.
    pub(super) region: (DevPtr, DevPtr),
    pub(super) gemv: Vec<[Kernel; 10]>,
    pub(super) quantize: Kernel,
    /// `[max_tokens, max_inputs]` e4m3 and `[max_tokens]` f32 scales.
    pub(super) x8: DevPtr,
    pub(super) x_scales: DevPtr,
    /// `max_sums` f32: unscaled sums (epilogue plans) and the trial output
    /// of new plans.
    pub(super) sums: DevPtr,
    pub(super) scale_out: Kernel,
    pub(super) limits: Fp8Limits,
}

/// What the FP8 scratch holds: the largest product its GEMMs take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8Limits {
    /// Activation rows of one product (a step's tokens).
    pub max_tokens: usize,
    /// The widest quantized input.
    pub max_inputs: usize,
    /// The most `tokens x outputs` f32 sums of one product.
    pub max_sums: usize,
}

/// How a plan scales an FP8 product.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Fp8Scaling {
    /// Not FP8.
    None,
    /// cuBLASLt's outer-vector scales.
    OuterVector,
    /// Unscaled f32 sums; `fp8_scale_out` scales them.
    Epilogue,
}

impl Gemm {
    /// Arena bytes [`Gemm::enable_fp8`] takes for `limits`.
    pub fn fp8_scratch_bytes(limits: Fp8Limits) -> usize {
        Arena::size_of([
            limits.max_tokens * limits.max_inputs,
            limits.max_tokens * 4,
            limits.max_sums * 4,
        ])
    }

    /// Weights inside `region` are e4m3 (see the module doc); their GEMMs
    /// quantize activations and keep sums within `limits`, in scratch
    /// taken from `arena`.
    pub fn enable_fp8(
        &mut self,
        gpu: &Gpu,
        arena: &mut Arena,
        region: (DevPtr, DevPtr),
        limits: Fp8Limits,
    ) -> Result<(), CudaError> {
        if self.deterministic {
            return Err(CudaError::Unsupported(
                "FP8 weights in deterministic mode".into(),
            ));
        }
        self.fp8 = Some(Fp8 {
            region,
            gemv: gemv_table(gpu, "gemv_fp8")?,
            quantize: gpu.kernel("quantize_rows_e4m3")?,
            x8: arena.take(limits.max_tokens * limits.max_inputs)?,
            x_scales: arena.take(limits.max_tokens * 4)?,
            sums: arena.take(limits.max_sums * 4)?,
            scale_out: gpu.kernel("fp8_scale_out")?,
            limits,
        });
        Ok(())
    }

    /// The FP8 state when `w` is an e4m3 matrix.
    pub(super) fn fp8_of(&self, w: DevPtr) -> Option<&Fp8> {
        self.fp8
            .as_ref()
            .filter(|f| (f.region.0..f.region.1).contains(&w))
    }

    /// The bytes a GEMV streams for `w`, a `rows x cols` matrix: 1 a
    /// weight for e4m3 (its row scales are noise beside them), 34 per 32
    /// for Q8_0, a k-quant matrix's device bytes, 2 a weight for bf16.
    pub fn weight_bytes(&self, w: DevPtr, rows: usize, cols: usize) -> usize {
        if self.fp8_of(w).is_some() {
            rows * cols
        } else if let Some(bytes) = self.kq_bytes(w) {
            bytes
        } else if self.blocks_of(w).is_some() {
            rows * cols / Q8_0_BLOCK * Q8_0_BLOCK_BYTES
        } else {
            rows * cols * 2
        }
    }

    /// Where [`Gemm::linear`] over `w` at `tokens` rows of `inputs` would
    /// quantize its input, when it would (an FP8 matrix on the GEMM path):
    /// the e4m3 rows and their scales. A producer that writes them itself
    /// (`rms_norm_e4m3`, `silu_mul_e4m3`) passes the rows' address as the
    /// linear layer's `x`, and the quantize pass is skipped.
    pub fn quantized_input(
        &self,
        w: DevPtr,
        tokens: usize,
        inputs: usize,
    ) -> Option<(DevPtr, DevPtr)> {
        let fp8 = self.fp8_of(w)?;
        let fits = tokens <= fp8.limits.max_tokens && inputs <= fp8.limits.max_inputs;
        (fits && !self.gemv_fits(tokens, inputs, w)).then_some((fp8.x8, fp8.x_scales))
    }
}

impl Fp8 {
    /// `ops` writing unscaled sums to the scratch (no scale pointers).
    pub(super) fn unscaled(&self, ops: Operands) -> Operands {
        Operands {
            y: self.sums,
            scales: None,
            ..ops
        }
    }
}

/// FP8 scaling: one f32 per row of `op(A)` (weight rows: output channels)
/// and per column of `B` (tokens), the sums multiplied by both.
pub(super) fn set_outer_vector_scales(desc: sys::cublasLtMatmulDesc_t) -> Result<(), CudaError> {
    use sys::cublasLtMatmulDescAttributes_t as A;
    let mode = sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F as i32;
    for attr in [
        A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
        A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
    ] {
        // SAFETY: the scale modes are i32 (cublasLtMatmulMatrixScale_t).
        unsafe { set_desc(desc, attr, &mode)? };
    }
    Ok(())
}

/// Points `desc`'s A and B scales at the weight rows' and the activation
/// rows' f32 scales.
pub(super) fn set_scale_pointers(
    desc: sys::cublasLtMatmulDesc_t,
    (w_scales, x_scales): (DevPtr, DevPtr),
) -> Result<(), CudaError> {
    use sys::cublasLtMatmulDescAttributes_t as A;
    // SAFETY: the scale pointers are device pointers (`DevPtr`, a u64 the
    // size of the attribute's `void*`).
    unsafe {
        set_desc(desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales)?;
        set_desc(desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales)?;
    }
    Ok(())
}

/// Quantizes `tokens` rows of `inputs` bf16 activations at `x` into the
/// FP8 scratch, one scale per row.
pub(super) fn quantize_activations(
    gpu: &Gpu,
    fp8: &Fp8,
    x: DevPtr,
    tokens: usize,
    inputs: usize,
) -> Result<(), CudaError> {
    let limits = fp8.limits;
    if tokens > limits.max_tokens || inputs > limits.max_inputs {
        return Err(CudaError::Unsupported(format!(
            "an FP8 GEMM of {tokens} x {inputs} activations (scratch for {} x {})",
            limits.max_tokens, limits.max_inputs
        )));
    }
    let args = [
        Arg::Ptr(x),
        Arg::Ptr(fp8.x8),
        Arg::Ptr(fp8.x_scales),
        Arg::I32(inputs as i32),
    ];
    gpu.launch(&fp8.quantize, (tokens as u32, 1, 1), 256, 0, &args)
}
