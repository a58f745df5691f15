//! GGUF Q8_0 weights kept in their blocks (`model.cuda_weights =
//! "native"`, layout in `quant.cu`): the GEMV table that reads them at
//! decode sizes, and, for larger products, their expansion into bf16
//! scratch before cuBLASLt's bf16 GEMM (at those sizes the GEMM's compute,
//! not the weights' bytes, sets the time).

use super::{gemv_table, Gemm};
use crate::device::{Arena, Arg, DevPtr, Gpu, Kernel};
use crate::CudaError;

/// Most blocks of the expansion kernel (it strides over the rest).
const DEQUANT_MAX_BLOCKS: usize = 4096;

/// Q8_0 weights: where they live, their GEMV kernels, and the bf16
/// scratch of larger products.
pub(super) struct Q8 {
    /// `[start, end)` of the Q8_0 matrices.
    pub(super) region: (DevPtr, DevPtr),
    pub(super) gemv: Vec<[Kernel; 10]>,
    dequant: Kernel,
    /// `[scratch_elements]` bf16.
    scratch: DevPtr,
    scratch_elements: usize,
}

impl Gemm {
    /// Arena bytes [`Gemm::enable_q8_0`] takes for matrices of up to
    /// `max_elements` weights.
    pub fn q8_0_scratch_bytes(max_elements: usize) -> usize {
        Arena::size_of([max_elements * 2])
    }

    /// Weights inside `region` are Q8_0 (see the module doc); products
    /// beyond the GEMV's sizes expand them (up to `max_elements` weights)
    /// into bf16 scratch taken from `arena`.
    pub fn enable_q8_0(
        &mut self,
        gpu: &Gpu,
        arena: &mut Arena,
        region: (DevPtr, DevPtr),
        max_elements: usize,
    ) -> Result<(), CudaError> {
        self.q8 = Some(Q8 {
            region,
            gemv: gemv_table(gpu, "gemv_q8_0")?,
            dequant: gpu.kernel("dequant_q8_0_bf16")?,
            scratch: arena.take(max_elements * 2)?,
            scratch_elements: max_elements,
        });
        Ok(())
    }

    /// The Q8_0 state when `w` is a Q8_0 matrix.
    pub(super) fn q8_of(&self, w: DevPtr) -> Option<&Q8> {
        self.q8
            .as_ref()
            .filter(|q| (q.region.0..q.region.1).contains(&w))
    }

    /// The matrix cuBLASLt reads for `w` (`rows x cols`): `w` itself, or
    /// for Q8_0 its bf16 expansion, enqueued into the scratch.
    pub(super) fn gemm_weight(
        &self,
        gpu: &Gpu,
        w: DevPtr,
        rows: usize,
        cols: usize,
    ) -> Result<DevPtr, CudaError> {
        let Some(q) = self.q8_of(w) else {
            return Ok(w);
        };
        if rows * cols > q.scratch_elements {
            return Err(CudaError::Unsupported(format!(
                "a {rows} x {cols} Q8_0 matrix exceeds its bf16 scratch of {} weights",
                q.scratch_elements
            )));
        }
        let vecs = rows * cols / 16;
        let blocks = vecs.div_ceil(256).clamp(1, DEQUANT_MAX_BLOCKS);
        let args = [
            Arg::Ptr(w),
            Arg::Ptr(q.scratch),
            Arg::I64(rows as i64),
            Arg::I32(cols as i32),
        ];
        gpu.launch(&q.dequant, (blocks as u32, 1, 1), 256, 0, &args)?;
        Ok(q.scratch)
    }
}
