//! cuBLASLt plans: descriptors and an algorithm per shape, built once
//! and cached (timed candidates while tuning; one split-K-free algorithm
//! per matrix in deterministic mode).

use std::ffi::c_void;

use cudarc::cublaslt::{result, sys};
use cudarc::driver::sys::CUevent_flags;

use super::fp8::{set_outer_vector_scales, set_scale_pointers, Fp8Scaling};
use super::{
    Gemm, InType, Operands, OutType, Shape, DETERMINISTIC_REF_TOKENS, TUNE_CANDIDATES,
    WORKSPACE_BYTES,
};
use crate::device::Gpu;
use crate::CudaError;

/// Everything cuBLASLt needs for one shape.
pub(super) struct Plan {
    pub(super) desc: sys::cublasLtMatmulDesc_t,
    pub(super) w: sys::cublasLtMatrixLayout_t,
    pub(super) x: sys::cublasLtMatrixLayout_t,
    pub(super) y: sys::cublasLtMatrixLayout_t,
    pub(super) algo: sys::cublasLtMatmulAlgo_t,
    /// beta = 1: add into the output.
    pub(super) accumulate: bool,
    /// Workspace bytes the algorithm may use.
    pub(super) workspace: usize,
    /// FP8 without outer-vector scales: f32 sums into scratch, then
    /// `fp8_scale_out`.
    pub(super) fp8_epilogue: bool,
}

/// Deterministic mode's algorithm of one matrix and the workspace it was
/// checked with.
#[derive(Clone, Copy)]
pub(super) struct Fixed {
    algo: sys::cublasLtMatmulAlgo_t,
    workspace: usize,
}

impl Gemm {
    pub(super) fn matmul(
        &self,
        gpu: &Gpu,
        plan: &Plan,
        algo: &sys::cublasLtMatmulAlgo_t,
        Operands { x, w, y, scales }: Operands,
    ) -> Result<(), CudaError> {
        let alpha = 1.0f32;
        let beta = if plan.accumulate { 1.0f32 } else { 0.0 };
        if let Some(scales) = scales {
            // Plans are per shape, shared by layers: the scales are per call.
            set_scale_pointers(plan.desc, scales)?;
        }
        // Deterministic plans get only the workspace their algorithm was
        // picked for (none where possible).
        let workspace = plan.workspace;
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
                algo,
                self.workspace as *mut c_void,
                workspace,
                gpu.stream.cu_stream() as sys::cudaStream_t,
            )?;
        }
        Ok(())
    }

    /// Builds `s`'s plan: the heuristic's pick (the fastest of its top
    /// candidates while tuning), or in deterministic mode the matrix's one
    /// algorithm, checked valid for this token count. FP8 products try
    /// cuBLASLt's outer-vector scales first, else an epilogue kernel.
    pub(super) fn plan(&self, gpu: &Gpu, s: Shape, ops: Operands) -> Result<Plan, CudaError> {
        if self.deterministic {
            return self.fixed_plan(s);
        }
        let Some(fp8) = self.fp8.as_ref().filter(|_| s.input == InType::Fp8) else {
            return self.build_plan(gpu, s, ops, Fp8Scaling::None);
        };
        let limits = fp8.limits;
        if s.tokens > limits.max_tokens || s.tokens * s.outputs > limits.max_sums {
            return Err(CudaError::Unsupported(format!(
                "an FP8 GEMM of {s:?} (scratch for {} tokens, {} sums)",
                limits.max_tokens, limits.max_sums
            )));
        }
        // Built, tuned and tried on the scratch output: no side effects.
        let trial = Operands { y: fp8.sums, ..ops };
        let outer = self
            .build_plan(gpu, s, trial, Fp8Scaling::OuterVector)
            .and_then(|plan| match self.matmul(gpu, &plan, &plan.algo, trial) {
                Ok(()) => Ok(plan),
                Err(e) => {
                    destroy_plan(&plan);
                    Err(e)
                }
            });
        match outer {
            Ok(plan) => Ok(plan),
            Err(e) => {
                tracing::info!(shape = ?s, error = %e, "FP8 GEMM: cuBLASLt refuses outer-vector scales; scaling in an epilogue kernel");
                self.build_plan(gpu, s, fp8.unscaled(ops), Fp8Scaling::Epilogue)
            }
        }
    }

    /// Deterministic mode's plan: the matrix's one algorithm, checked
    /// valid for this token count.
    fn fixed_plan(&self, s: Shape) -> Result<Plan, CudaError> {
        // Destroys the descriptors if this fails.
        let mut guard = PlanGuard::new(s, Fp8Scaling::None)?;
        let plan = &mut guard.0;
        let fixed = self.fixed_algo(s)?;
        (plan.algo, plan.workspace) = (fixed.algo, fixed.workspace);
        if let Err(why) = self.runs(plan, &fixed.algo, fixed.workspace) {
            return Err(CudaError::Unsupported(format!(
                "deterministic mode: the algorithm picked for this matrix does not run {s:?}: {why}"
            )));
        }
        Ok(guard.into_plan())
    }

    /// Builds (and while tuning, times candidates on `ops`) a plan.
    fn build_plan(
        &self,
        gpu: &Gpu,
        s: Shape,
        ops: Operands,
        scaling: Fp8Scaling,
    ) -> Result<Plan, CudaError> {
        let mut guard = PlanGuard::new(s, scaling)?;
        let plan = &mut guard.0;
        if let (Fp8Scaling::OuterVector, Some(scales)) = (scaling, ops.scales) {
            // cuBLASLt answers INVALID_VALUE to a heuristic query for
            // outer-vector scales whose pointers are unset (cuBLASLt 13.1,
            // H100): set the trial call's before asking.
            set_scale_pointers(plan.desc, scales)?;
        }
        let algos = self.heuristic(plan, WORKSPACE_BYTES, false)?;
        let Some(&first) = algos.first() else {
            return Err(CudaError::Unsupported(format!(
                "no cuBLASLt algorithm for {s:?}"
            )));
        };
        plan.algo = first;
        if algos.len() > 1 {
            plan.algo = self.fastest(gpu, plan, &algos, ops)?;
        }
        Ok(guard.into_plan())
    }

    /// The heuristic's top algorithms for `plan`'s descriptors (one unless
    /// tuning or deterministic) within `workspace` bytes; with `no_split`,
    /// only those that reduce nothing across CTAs (no split-K).
    fn heuristic(
        &self,
        plan: &Plan,
        workspace: usize,
        no_split: bool,
    ) -> Result<Vec<sys::cublasLtMatmulAlgo_t>, CudaError> {
        let wanted = if self.tune || self.deterministic {
            TUNE_CANDIDATES
        } else {
            1
        };
        let pref = result::create_matmul_pref()?;
        let mut found = [std::mem::MaybeUninit::<sys::cublasLtMatmulHeuristicResult_t>::zeroed();
            TUNE_CANDIDATES];
        let mut count = 0i32;
        let ws = workspace;
        // CUBLASLT_REDUCTION_SCHEME_NONE (0) is the only scheme the mask lets through.
        let reductions = sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32;
        let status = unsafe {
            set_pref(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws,
            )?;
            if no_split {
                set_pref(
                    pref,
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                    &reductions,
                )?;
            }
            let status = sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                plan.desc,
                plan.w,
                plan.x,
                plan.y,
                plan.y,
                pref,
                wanted as i32,
                found.as_mut_ptr() as *mut sys::cublasLtMatmulHeuristicResult_t,
                &mut count,
            );
            result::destroy_matmul_pref(pref)?;
            status
        };
        status.result()?;
        Ok(found[..count.max(0) as usize]
            .iter()
            .map(|r| unsafe { r.assume_init() }.algo)
            .collect())
    }

    /// Deterministic mode's algorithm for `s`'s matrix, picked once (no
    /// timing, so every process on this GPU and library picks the same):
    /// the heuristic's first split-K-free candidate, asked at
    /// [`DETERMINISTIC_REF_TOKENS`] (then at the largest step, then at one
    /// token), that runs every checked token count up to
    /// [`Gemm::max_tokens`], with split-K pinned to 1. Candidates that need
    /// no workspace come first; failing those, ones that need some (for
    /// anything but split-K, which is pinned off).
    fn fixed_algo(&self, s: Shape) -> Result<Fixed, CudaError> {
        let key = s.with_tokens(DETERMINISTIC_REF_TOKENS);
        if let Some(fixed) = self.fixed_algos.borrow().get(&key) {
            return Ok(*fixed);
        }
        let max = self.max_tokens.max(DETERMINISTIC_REF_TOKENS);
        let checked: Vec<PlanGuard> = [1, 2, 8, 16, DETERMINISTIC_REF_TOKENS, 128, 256, 512, max]
            .into_iter()
            .filter(|&t| t <= max)
            .map(|t| PlanGuard::new(s.with_tokens(t), Fp8Scaling::None))
            .collect::<Result<_, _>>()?;
        let mut why = Vec::new();
        for workspace in [0, WORKSPACE_BYTES] {
            for reference in [DETERMINISTIC_REF_TOKENS, max, 1] {
                let plan = PlanGuard::new(s.with_tokens(reference), Fp8Scaling::None)?;
                let mut candidates = self.heuristic(&plan.0, workspace, true)?;
                if candidates.is_empty() {
                    // A library that reads the reduction mask otherwise:
                    // any candidate, split-K pinned off below.
                    candidates = self.heuristic(&plan.0, workspace, false)?;
                }
                for algo in candidates.into_iter().map(no_split_k) {
                    let failed = checked
                        .iter()
                        .map(|p| self.runs(&p.0, &algo, workspace).err())
                        .find_map(|e| e);
                    let Some(failed) = failed else {
                        let fixed = Fixed { algo, workspace };
                        self.log_fixed(s, &fixed);
                        self.fixed_algos.borrow_mut().insert(key, fixed);
                        return Ok(fixed);
                    };
                    why.push(failed);
                }
            }
        }
        why.dedup();
        Err(CudaError::Unsupported(format!(
            "deterministic mode: no split-K-free cuBLASLt algorithm runs {key:?} at every token count up to {max}: {}",
            why.join("; ")
        )))
    }

    fn log_fixed(&self, s: Shape, fixed: &Fixed) {
        tracing::info!(
            inputs = s.inputs,
            outputs = s.outputs,
            algo_id = algo_config(&fixed.algo, ConfigAttr::CUBLASLT_ALGO_CONFIG_ID),
            tile = algo_config(&fixed.algo, ConfigAttr::CUBLASLT_ALGO_CONFIG_TILE_ID),
            stages = algo_config(&fixed.algo, ConfigAttr::CUBLASLT_ALGO_CONFIG_STAGES_ID),
            workspace = fixed.workspace,
            "deterministic GEMM algorithm"
        );
    }

    /// Whether cuBLASLt accepts `algo` for `plan`'s descriptors within
    /// `workspace` bytes; else why not.
    fn runs(
        &self,
        plan: &Plan,
        algo: &sys::cublasLtMatmulAlgo_t,
        workspace: usize,
    ) -> Result<(), String> {
        let mut found = std::mem::MaybeUninit::<sys::cublasLtMatmulHeuristicResult_t>::zeroed();
        let status = unsafe {
            sys::cublasLtMatmulAlgoCheck(
                self.handle,
                plan.desc,
                plan.w,
                plan.x,
                plan.y,
                plan.y,
                algo,
                found.as_mut_ptr(),
            )
        };
        status.result().map_err(|e| format!("{e:?}"))?;
        let needs = unsafe { found.assume_init() }.workspaceSize;
        if needs > workspace {
            return Err(format!("needs {needs} bytes of workspace"));
        }
        Ok(())
    }

    /// Times each candidate (after one warm-up call) and returns the fastest.
    fn fastest(
        &self,
        gpu: &Gpu,
        plan: &Plan,
        algos: &[sys::cublasLtMatmulAlgo_t],
        ptrs: Operands,
    ) -> Result<sys::cublasLtMatmulAlgo_t, CudaError> {
        const RUNS: usize = 5;
        let mut best = (f32::INFINITY, algos[0]);
        for algo in algos {
            // Some candidates fail for this shape; skip them.
            if self.matmul(gpu, plan, algo, ptrs).is_err() {
                continue;
            }
            let start = gpu
                .stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            for _ in 0..RUNS {
                self.matmul(gpu, plan, algo, ptrs)?;
            }
            let end = gpu
                .stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            end.synchronize()?;
            let ms = start.elapsed_ms(&end)?;
            if ms < best.0 {
                best = (ms, *algo);
            }
        }
        Ok(best.1)
    }
}

type ConfigAttr = sys::cublasLtMatmulAlgoConfigAttributes_t;

/// Descriptor and layouts of `s` in cuBLASLt's column-major view:
/// `yᵀ[outputs, tokens] = op(W)[outputs, inputs] · xᵀ[inputs, tokens]`,
/// where the row-major `w` is a column-major `[inputs, outputs]`, transposed.
#[allow(clippy::type_complexity)]
fn describe(
    s: Shape,
    scaling: Fp8Scaling,
) -> Result<
    (
        sys::cublasLtMatmulDesc_t,
        sys::cublasLtMatrixLayout_t,
        sys::cublasLtMatrixLayout_t,
        sys::cublasLtMatrixLayout_t,
    ),
    CudaError,
> {
    let bf16 = sys::cudaDataType_t::CUDA_R_16BF;
    let in_type = match s.input {
        InType::Bf16 => bf16,
        InType::F16 => sys::cudaDataType_t::CUDA_R_16F,
        InType::Fp8 => sys::cudaDataType_t::CUDA_R_8F_E4M3,
    };
    let out_type = match s.out {
        _ if scaling == Fp8Scaling::Epilogue => sys::cudaDataType_t::CUDA_R_32F,
        OutType::Bf16 => bf16,
        OutType::F32 | OutType::AddF32 => sys::cudaDataType_t::CUDA_R_32F,
    };
    let (m, n, k) = (s.outputs as u64, s.tokens as u64, s.inputs as u64);
    let desc = result::create_matmul_desc(
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        sys::cudaDataType_t::CUDA_R_32F,
    )?;
    let transpose: i32 = 1;
    // SAFETY: TRANSA is an i32 (cublasOperation_t).
    unsafe {
        set_desc(
            desc,
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            &transpose,
        )?;
    }
    if scaling == Fp8Scaling::OuterVector {
        set_outer_vector_scales(desc)?;
    }
    let w = result::create_matrix_layout(in_type, k, m, k as i64)?;
    let x = result::create_matrix_layout(in_type, k, n, k as i64)?;
    let y = result::create_matrix_layout(out_type, m, n, s.out_stride as i64)?;
    Ok((desc, w, x, y))
}

/// Sets one matmul preference attribute.
///
/// # Safety
/// `T` must be the attribute's C type.
unsafe fn set_pref<T>(
    pref: sys::cublasLtMatmulPreference_t,
    attr: sys::cublasLtMatmulPreferenceAttributes_t,
    value: &T,
) -> Result<(), CudaError> {
    unsafe {
        result::set_matmul_pref_attribute(
            pref,
            attr,
            value as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )?;
    }
    Ok(())
}

/// `algo` with split-K pinned to 1 and no reduction scheme.
fn no_split_k(mut algo: sys::cublasLtMatmulAlgo_t) -> sys::cublasLtMatmulAlgo_t {
    let one: i32 = 1;
    let none = sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32;
    // A candidate these fail on is caught by the validity check after.
    unsafe {
        let _ = sys::cublasLtMatmulAlgoConfigSetAttribute(
            &mut algo,
            ConfigAttr::CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
            &one as *const i32 as *const c_void,
            std::mem::size_of::<i32>(),
        );
        let _ = sys::cublasLtMatmulAlgoConfigSetAttribute(
            &mut algo,
            ConfigAttr::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
            &none as *const u32 as *const c_void,
            std::mem::size_of::<u32>(),
        );
    }
    algo
}

/// One 32-bit config attribute of `algo` (for the log; -1 if unreadable).
fn algo_config(algo: &sys::cublasLtMatmulAlgo_t, attr: ConfigAttr) -> i64 {
    let mut value: u32 = 0;
    let mut written = 0usize;
    let status = unsafe {
        sys::cublasLtMatmulAlgoConfigGetAttribute(
            algo,
            attr,
            &mut value as *mut u32 as *mut c_void,
            std::mem::size_of::<u32>(),
            &mut written,
        )
    };
    if status.result().is_ok() {
        i64::from(value)
    } else {
        -1
    }
}

/// A plan's descriptors that are destroyed when it goes out of scope
/// (unless the plan is taken: [`PlanGuard::into_plan`]).
struct PlanGuard(Plan);

impl PlanGuard {
    fn new(s: Shape, scaling: Fp8Scaling) -> Result<Self, CudaError> {
        let (desc, w, x, y) = describe(s, scaling)?;
        Ok(Self(Plan {
            desc,
            w,
            x,
            y,
            algo: unsafe { std::mem::zeroed() },
            accumulate: s.out == OutType::AddF32 && scaling != Fp8Scaling::Epilogue,
            workspace: WORKSPACE_BYTES,
            fp8_epilogue: scaling == Fp8Scaling::Epilogue,
        }))
    }
}

impl PlanGuard {
    /// The plan, whose descriptors the caller now owns.
    fn into_plan(self) -> Plan {
        let guard = std::mem::ManuallyDrop::new(self);
        // SAFETY: the guard is never dropped, so the handles move out once.
        unsafe { std::ptr::read(&guard.0) }
    }
}

impl Drop for PlanGuard {
    fn drop(&mut self) {
        destroy_plan(&self.0);
    }
}

/// Frees a plan's cuBLASLt objects.
pub(super) fn destroy_plan(p: &Plan) {
    unsafe {
        let _ = result::destroy_matrix_layout(p.w);
        let _ = result::destroy_matrix_layout(p.x);
        let _ = result::destroy_matrix_layout(p.y);
        let _ = result::destroy_matmul_desc(p.desc);
    }
}

/// Sets one matmul descriptor attribute.
///
/// # Safety
/// `T` must be the attribute's C type.
pub(super) unsafe fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<(), CudaError> {
    unsafe {
        result::set_matmul_desc_attribute(
            desc,
            attr,
            value as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )?;
    }
    Ok(())
}
