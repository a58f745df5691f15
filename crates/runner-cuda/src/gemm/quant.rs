//! GGUF weights kept in their blocks (`model.cuda_weights = "native"`,
//! layouts in `quant.cu` and `kquant.cuh`): Q8_0 matrices and the 4- to
//! 6-bit types' (a k-quant matrix pointer is its header), each kind in an
//! address range of its own. The GEMV tables read them at decode sizes;
//! larger products expand the matrix into bf16 scratch first and run
//! cuBLASLt's bf16 GEMM (at those sizes the GEMM's compute, not the
//! weights' bytes, sets the time).

use std::collections::HashMap;

use super::gemv::mode_kernels;
use super::{gemv_table, Gemm};
use crate::device::{Arena, Arg, DevPtr, Gpu, Kernel};
use crate::CudaError;

/// Most blocks of the expansion kernels (they stride over the rest).
const DEQUANT_MAX_BLOCKS: usize = 4096;

/// A k-quant matrix as the GEMMs see it: its device bytes, and its GGML
/// type when every row segment has the same one (the batch-1 gated GEMVs
/// built for that type then take it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KqMatrixInfo {
    pub bytes: usize,
    pub single_type: Option<u32>,
}

/// The k-quant types with batch-1 gated GEMVs of their own (gemv_kq.cu:
/// `gemv_kq_{name}_n1_{mode}`), by GGML type id: the 4-bit ones (Q5_K
/// and Q6_K measured no faster that way).
const KQ_ONE_TYPE_GATED: [(u32, &str); 3] = [(2, "q4_0"), (3, "q4_1"), (12, "q4_k")];

/// The gated modes of those kernels, in [`Gemm::gated`]'s order.
const GATED_MODES: [&str; 4] = ["swiglu", "swiglu_norm", "geglu", "geglu_norm"];

/// Gate/up columns a warp of those kernels (gemv_kq.cu's
/// `KQ_ONE_TYPE_GATED_COLS`): the host's grid divides by it.
pub(super) const KQ_ONE_TYPE_GATED_COLS: usize = 2;

/// One kind of kept blocks: where its matrices live and their kernels.
pub(super) struct BlockKind {
    /// `[start, end)` of its matrices.
    pub(super) region: (DevPtr, DevPtr),
    pub(super) gemv: Vec<[Kernel; 10]>,
    /// Batch 1's gated GEMVs for matrices of one type, by GGML type id
    /// (k-quants only; two output columns a warp).
    pub(super) gated_one_type: Vec<(u32, [Kernel; 4])>,
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
    /// Each k-quant matrix, by pointer.
    kq: HashMap<DevPtr, KqMatrixInfo>,
}

/// What [`Gemm::enable_native`] is given: each kind's range, the largest
/// matrix's weights, and each k-quant matrix.
pub struct NativeRegions {
    pub q8_0: Option<(DevPtr, DevPtr)>,
    pub kq: Option<(DevPtr, DevPtr)>,
    pub max_elements: usize,
    pub kq_matrices: HashMap<DevPtr, KqMatrixInfo>,
}

/// Batch 1's one-type gated GEMVs (see [`KQ_ONE_TYPE_GATED`]).
fn gated_one_type_kernels(gpu: &Gpu) -> Result<Vec<(u32, [Kernel; 4])>, CudaError> {
    KQ_ONE_TYPE_GATED
        .iter()
        .map(|&(ty, name)| {
            Ok((
                ty,
                mode_kernels(gpu, &format!("gemv_kq_{name}_n1"), &GATED_MODES)?,
            ))
        })
        .collect()
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
                gated_one_type: Vec::new(),
                dequant: gpu.kernel("dequant_q8_0_bf16")?,
                per_thread: 16,
            });
        }
        if let Some(region) = regions.kq {
            kinds.push(BlockKind {
                region,
                gemv: gemv_table(gpu, "gemv_kq")?,
                gated_one_type: gated_one_type_kernels(gpu)?,
                dequant: gpu.kernel("dequant_kq_bf16")?,
                per_thread: 32,
            });
        }
        self.native = Some(Native {
            kinds,
            scratch: arena.take(regions.max_elements * 2)?,
            scratch_elements: regions.max_elements,
            kq: regions.kq_matrices,
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
        Some(self.native.as_ref()?.kq.get(&w)?.bytes)
    }

    /// Batch 1's gated GEMVs built for `w`'s one type, when it is a
    /// k-quant matrix of one type (mode order: [`GATED_MODES`]).
    pub(super) fn kq_gated_one_type(&self, w: DevPtr) -> Option<&[Kernel; 4]> {
        let ty = self.native.as_ref()?.kq.get(&w)?.single_type?;
        let kind = self.blocks_of(w)?;
        kind.gated_one_type
            .iter()
            .find(|(t, _)| *t == ty)
            .map(|(_, k)| k)
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
