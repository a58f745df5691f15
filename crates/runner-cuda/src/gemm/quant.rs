//! GGUF weights kept in their blocks (`model.cuda_weights = "native"`,
//! layouts in `quant.cu` and `kquant.cuh`): Q8_0 matrices and the 4- to
//! 6-bit types' (a k-quant matrix pointer is its header), each kind in an
//! address range of its own. The GEMV tables read them at decode sizes;
//! larger products expand the matrix into bf16 scratch first and run
//! cuBLASLt's bf16 GEMM (at those sizes the GEMM's compute, not the
//! weights' bytes, sets the time).

use std::collections::HashMap;

use super::{gemv_table, Gemm};
use crate::device::{Arena, Arg, DevPtr, Gpu, Kernel};
use crate::CudaError;

/// Most blocks of the expansion kernels (they stride over the rest).
const DEQUANT_MAX_BLOCKS: usize = 4096;

/// One kind of kept blocks: where its matrices live and their kernels.
pub(super) struct BlockKind {
    /// `[start, end)` of its matrices.
    pub(super) region: (DevPtr, DevPtr),
    pub(super) gemv: Vec<[Kernel; 10]>,
    dequant: Kernel,
    /// Weights a thread of `dequant` expands.
    per_thread: usize,
}

/// The kept kinds and the bf16 scratch of their larger products.
pub(super) struct Native {
    pub(super) kinds: Vec<BlockKind>,
    /// `[scratch_elements]` bf16.
    scratch: DevPtr,
    scratch_elements: usize,
    /// Device bytes of each k-quant matrix, by pointer.
    kq_bytes: HashMap<DevPtr, usize>,
}

/// What [`Gemm::enable_native`] is given: each kind's range, the largest
/// matrix's weights, and each k-quant matrix's bytes.
pub struct NativeRegions {
    pub q8_0: Option<(DevPtr, DevPtr)>,
    pub kq: Option<(DevPtr, DevPtr)>,
    pub max_elements: usize,
    pub kq_bytes: HashMap<DevPtr, usize>,
}

impl Gemm {
    /// Arena bytes [`Gemm::enable_native`] takes for matrices of up to
    /// `max_elements` weights.
    pub fn native_scratch_bytes(max_elements: usize) -> usize {
        Arena::size_of([max_elements * 2])
    }

    /// Weights inside the regions are kept GGUF blocks (see the module
    /// doc); products beyond the GEMV's sizes expand them into bf16
    /// scratch taken from `arena`.
    pub fn enable_native(
        &mut self,
        gpu: &Gpu,
        arena: &mut Arena,
        regions: NativeRegions,
    ) -> Result<(), CudaError> {
        let mut kinds = Vec::new();
        if let Some(region) = regions.q8_0 {
            kinds.push(BlockKind {
                region,
                gemv: gemv_table(gpu, "gemv_q8_0")?,
                dequant: gpu.kernel("dequant_q8_0_bf16")?,
                per_thread: 16,
            });
        }
        if let Some(region) = regions.kq {
            kinds.push(BlockKind {
                region,
                gemv: gemv_table(gpu, "gemv_kq")?,
                dequant: gpu.kernel("dequant_kq_bf16")?,
                per_thread: 32,
            });
        }
        self.native = Some(Native {
            kinds,
            scratch: arena.take(regions.max_elements * 2)?,
            scratch_elements: regions.max_elements,
            kq_bytes: regions.kq_bytes,
        });
        Ok(())
    }

    /// The kind of kept blocks `w` is, when it is one.
    pub(super) fn blocks_of(&self, w: DevPtr) -> Option<&BlockKind> {
        self.native
            .as_ref()?
            .kinds
            .iter()
            .find(|k| (k.region.0..k.region.1).contains(&w))
    }

    /// Device bytes of the k-quant matrix at `w`, when it is one.
    pub(super) fn kq_bytes(&self, w: DevPtr) -> Option<usize> {
        self.native.as_ref()?.kq_bytes.get(&w).copied()
    }

    /// The matrix cuBLASLt reads for `w` (`rows x cols`): `w` itself, or
    /// for kept blocks their bf16 expansion, enqueued into the scratch.
    pub(super) fn gemm_weight(
        &self,
        gpu: &Gpu,
        w: DevPtr,
        rows: usize,
        cols: usize,
    ) -> Result<DevPtr, CudaError> {
        if self.blocks_of(w).is_none() {
            return Ok(w);
        }
        self.expand_rows(gpu, w, (0, rows), rows, cols)
    }

    /// Rows per chunk when a k-quant matrix of `rows x cols` is larger
    /// than the bf16 scratch (an LM head: the scratch is sized for the
    /// decoder's matrices); `None` when it fits, or is not one.
    pub(super) fn expansion_chunk(&self, w: DevPtr, rows: usize, cols: usize) -> Option<usize> {
        let native = self.native.as_ref()?;
        let fits = rows * cols <= native.scratch_elements;
        (self.kq_bytes(w).is_some() && !fits).then_some((native.scratch_elements / cols).max(1))
    }

    /// Enqueues the bf16 expansion of rows `first..first + n` of `w`
    /// (`total_rows x cols`) into the scratch, and returns the scratch.
    pub(super) fn expand_rows(
        &self,
        gpu: &Gpu,
        w: DevPtr,
        (first, n): (usize, usize),
        total_rows: usize,
        cols: usize,
    ) -> Result<DevPtr, CudaError> {
        let (Some(kind), Some(native)) = (self.blocks_of(w), self.native.as_ref()) else {
            return Err(CudaError::Unsupported(
                "expanding a matrix not in GGUF blocks".into(),
            ));
        };
        if n * cols > native.scratch_elements {
            return Err(CudaError::Unsupported(format!(
                "{n} x {cols} weights of a GGUF-block matrix exceed its bf16 scratch of {}",
                native.scratch_elements
            )));
        }
        let threads = n * cols / kind.per_thread;
        let blocks = threads.div_ceil(256).clamp(1, DEQUANT_MAX_BLOCKS);
        let args = [
            Arg::Ptr(w),
            Arg::Ptr(native.scratch),
            Arg::I64(total_rows as i64),
            Arg::I32(cols as i32),
            Arg::I64(first as i64),
            Arg::I64(n as i64),
        ];
        gpu.launch(&kind.dequant, (blocks as u32, 1, 1), 256, 0, &args)?;
        Ok(native.scratch)
    }
}
