//! GEMMs through cuBLASLt: bf16 inputs, f32 accumulation, bf16 or f32
//! output. Descriptors and the heuristic's algorithm are built once per
//! shape and cached, so a step's GEMMs cost one `cublasLtMatmul` call each.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::cublaslt::{result, sys};

use crate::device::{Arena, DevPtr, Gpu};
use crate::CudaError;

/// cuBLASLt's recommended workspace on Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

/// Output element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutType {
    /// bf16 activations.
    Bf16,
    /// f32 (the logits).
    F32,
    /// f32, added to what `y` holds (`y += x·wᵀ`): the residual stream
    /// takes o_proj and down_proj outputs without a bf16 rounding.
    AddF32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Shape {
    tokens: usize,
    inputs: usize,
    outputs: usize,
    out: OutType,
}

/// Everything cuBLASLt needs for one shape.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    w: sys::cublasLtMatrixLayout_t,
    x: sys::cublasLtMatrixLayout_t,
    y: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

/// `y[tokens, outputs] = x[tokens, inputs] · w[outputs, inputs]ᵀ` (row-major,
/// PyTorch's linear layout).
pub struct Gemm {
    handle: sys::cublasLtHandle_t,
    workspace: DevPtr,
    plans: HashMap<Shape, Plan>,
}

// The handle is only used from the runner's thread.
unsafe impl Send for Gemm {}

impl Gemm {
    /// A handle whose workspace is taken from `arena`.
    pub fn new(arena: &mut Arena) -> Result<Self, CudaError> {
        Ok(Self {
            handle: result::create_handle()?,
            workspace: arena.take(WORKSPACE_BYTES)?,
            plans: HashMap::new(),
        })
    }

    /// Workspace bytes to reserve in the arena passed to [`Gemm::new`].
    pub fn workspace_bytes() -> usize {
        WORKSPACE_BYTES
    }

    /// Enqueues one linear layer on `gpu`'s stream.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &mut self,
        gpu: &Gpu,
        x: DevPtr,
        w: DevPtr,
        y: DevPtr,
        tokens: usize,
        inputs: usize,
        outputs: usize,
        out: OutType,
    ) -> Result<(), CudaError> {
        let shape = Shape {
            tokens,
            inputs,
            outputs,
            out,
        };
        if !self.plans.contains_key(&shape) {
            let plan = self.plan(shape)?;
            self.plans.insert(shape, plan);
        }
        let plan = &self.plans[&shape];
        let alpha = 1.0f32;
        let beta = if out == OutType::AddF32 { 1.0f32 } else { 0.0 };
        unsafe {
            result::matmul(
                self.handle,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                w as *const c_void,
                plan.w,
                x as *const c_void,
                plan.x,
                y as *const c_void,
                plan.y,
                y as *mut c_void,
                plan.y,
                &plan.algo,
                self.workspace as *mut c_void,
                WORKSPACE_BYTES,
                gpu.stream.cu_stream() as sys::cudaStream_t,
            )?;
        }
        Ok(())
    }

    /// Column-major view: `yᵀ[outputs, tokens] = op(W)[outputs, inputs] · xᵀ[inputs, tokens]`
    /// where the row-major `w` is a column-major `[inputs, outputs]`, transposed.
    fn plan(&self, s: Shape) -> Result<Plan, CudaError> {
        let bf16 = sys::cudaDataType_t::CUDA_R_16BF;
        let out_type = match s.out {
            OutType::Bf16 => bf16,
            OutType::F32 | OutType::AddF32 => sys::cudaDataType_t::CUDA_R_32F,
        };
        let (m, n, k) = (s.outputs as u64, s.tokens as u64, s.inputs as u64);
        let desc = result::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )?;
        let transpose: i32 = 1;
        unsafe {
            result::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &transpose as *const i32 as *const c_void,
                std::mem::size_of::<i32>(),
            )?;
        }
        let w = result::create_matrix_layout(bf16, k, m, k as i64)?;
        let x = result::create_matrix_layout(bf16, k, n, k as i64)?;
        let y = result::create_matrix_layout(out_type, m, n, m as i64)?;
        let pref = result::create_matmul_pref()?;
        let heuristic = unsafe {
            let ws = WORKSPACE_BYTES;
            result::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            )?;
            let h = result::get_matmul_algo_heuristic(self.handle, desc, w, x, y, y, pref);
            result::destroy_matmul_pref(pref)?;
            h?
        };
        Ok(Plan {
            desc,
            w,
            x,
            y,
            algo: heuristic.algo,
        })
    }
}

impl Drop for Gemm {
    fn drop(&mut self) {
        unsafe {
            for (_, p) in self.plans.drain() {
                let _ = result::destroy_matrix_layout(p.w);
                let _ = result::destroy_matrix_layout(p.x);
                let _ = result::destroy_matrix_layout(p.y);
                let _ = result::destroy_matmul_desc(p.desc);
            }
            let _ = result::destroy_handle(self.handle);
        }
    }
}
