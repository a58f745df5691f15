//! Linear layers: bf16 inputs, f32 accumulation, bf16 or f32 output.
//!
//! Up to [`GEMV_MAX_TOKENS`] tokens (decode at small batch) run ingot's own
//! GEMV kernels, which stream each weight row once at memory speed. Larger
//! shapes go to cuBLASLt; descriptors and the algorithm are built once per
//! shape and cached. While [`Gemm::tune`] is set (start-up: the profiling
//! pass and the graph warm-up, whose data is scratch) the heuristic's top
//! candidates are timed on the real shape and the fastest is kept.
//!
//! In deterministic mode ([`Gemm::deterministic`]) every row of a product
//! must come out the same whatever the token count: the GEMV kernels and
//! their fused norms are off (their reduction order differs from
//! cuBLASLt's), and each weight matrix gets one cuBLASLt algorithm for
//! every token count, picked once at [`DETERMINISTIC_REF_TOKENS`] without
//! split-K (and without workspace where one runs every token count), so no
//! cross-CTA reduction can depend on the shape, and checked valid for each
//! shape that uses it (`Gemm::fixed_algo`).
//!
//! FP8 weights (`--quantization fp8`, see [`crate::weights::WeightFormat`])
//! live in one address range, so a weight pointer says its type: the GEMV
//! kernels' `gemv_fp8_*` variants read them at small batch, and larger
//! shapes quantize the activations per token (`quantize_rows_e4m3`) and
//! run cuBLASLt's e4m3 GEMM with outer-vector scales (per weight row and
//! per token, applied to the f32 sums before the bf16/f32 output). Where
//! the cuBLASLt at hand refuses those scales for a shape (checked once per
//! shape, on scratch), the GEMM writes unscaled f32 sums to scratch and
//! `fp8_scale_out` applies both scales and writes (or adds) the output.
//! FP8 and deterministic mode are not combined (refused at start-up).
//!
//! GGUF weights kept in their blocks ([`crate::NativeBlocks`]: Q8_0, and
//! Q4_0/Q4_1/Q4_K/Q5_K/Q6_K) live in regions of their own too: the
//! `gemv_q8_0_*` and `gemv_kq_*` kernels read them at small batch; larger products expand the matrix into bf16 scratch and run
//! the bf16 GEMM (deterministic mode included: its algorithm choice does
//! not depend on where the bf16 matrix came from).
//!
//! [`plan`] builds and caches the cuBLASLt plans, [`gemv`] launches the GEMV
//! kernels, [`fp8`] holds the e4m3 scratch, quantizer and scales, [`quant`]
//! the GGUF blocks' GEMVs and expansion.

mod fp8;
mod gemv;
mod plan;
mod quant;

use std::cell::RefCell;
use std::collections::HashMap;

use cudarc::cublaslt::{result, sys};

use crate::device::{Arena, Arg, DevPtr, Gpu, Kernel};
use crate::weights::scales_offset;
use crate::CudaError;
pub use fp8::Fp8Limits;
use fp8::{quantize_activations, Fp8};
use gemv::{gemv_table, gemv_tc_table};
use plan::{destroy_plan, Fixed, Plan};
use quant::Native;
pub use quant::{KqMatrixInfo, NativeRegions};

/// cuBLASLt's recommended workspace on Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;
/// Most tokens handled by the GEMV kernels.
pub const GEMV_MAX_TOKENS: usize = 8;
/// Candidates timed per shape while tuning.
const TUNE_CANDIDATES: usize = 8;
/// Deterministic mode picks each matrix's one algorithm for this token
/// count: a middle size, so batch 1 keeps enough tiles to stream the
/// weights and 256 rows do not re-read them too often.
pub const DETERMINISTIC_REF_TOKENS: usize = 64;

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

impl OutType {
    /// The kernels' mode index of this output (bf16, f32, f32 accumulate).
    fn mode(self) -> usize {
        match self {
            Self::Bf16 => 0,
            Self::F32 => 1,
            Self::AddF32 => 2,
        }
    }
}

/// Input (weight and activation) element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum InType {
    /// The decoder's bf16.
    Bf16,
    /// f16: the encoder's (its 3 more mantissa bits keep MiniLM's
    /// sentence vectors within 1e-6 of the f32 reference's direction).
    F16,
    /// e4m3 weights and per-token e4m3 activations, each with f32 scales.
    Fp8,
}

/// What one cuBLASLt call reads and writes.
#[derive(Clone, Copy)]
struct Operands {
    x: DevPtr,
    w: DevPtr,
    y: DevPtr,
    /// FP8: the weight rows' and the activation rows' scales.
    scales: Option<(DevPtr, DevPtr)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Shape {
    tokens: usize,
    inputs: usize,
    outputs: usize,
    out: OutType,
    input: InType,
    /// Elements between the output's rows: `outputs`, or the whole
    /// product's for a slice of its columns (a k-quant LM head expanded
    /// in row chunks).
    out_stride: usize,
}

impl Shape {
    /// The same product at another token count (deterministic mode's
    /// reference shape shares the algorithm with every token count).
    fn with_tokens(self, tokens: usize) -> Self {
        Self { tokens, ..self }
    }
}

/// `y[tokens, outputs] = x[tokens, inputs] · w[outputs, inputs]ᵀ` (row-major,
/// PyTorch's linear layout).
pub struct Gemm {
    handle: sys::cublasLtHandle_t,
    workspace: DevPtr,
    /// Interior mutability: steps borrow the runner's parts immutably.
    plans: RefCell<HashMap<Shape, Plan>>,
    /// `[tokens - 1][mode]`: bf16, f32, f32 accumulate, SwiGLU, q/k/v + rope,
    /// then SwiGLU, q/k/v + rope and bf16 with the input RMSNorm fused,
    /// then GeGLU (GELU-tanh) without and with it.
    gemv: Vec<[Kernel; 10]>,
    /// The same for rows of at most [`gemv::SHORT_ROW_INPUTS`] (small
    /// models: whole rows loaded before the PDL wait, x staged in shared
    /// memory), n = 1..=8.
    gemv_short: Vec<[Kernel; 10]>,
    /// Batch-1 f32 accumulate of bf16 rows of up to [`gemv::WHOLE_ROW_INPUTS`],
    /// whole rows loaded before the PDL wait, for matrices of few rows
    /// ([`Gemm::whole_row_fits`]).
    gemv_whole4k: Kernel,
    /// The device's SM count (which matrices take the whole-row GEMV).
    num_sms: usize,
    /// `[tokens - 2]`: the tensor-core GEMVs of 2-8 rows (bf16, f32, f32
    /// accumulate), taken from [`Gemm::tc_min_rows`] rows.
    gemv_tc: Vec<[Kernel; 3]>,
    /// Run bf16 GEMVs of this many rows up to 8 of wide models on tensor
    /// cores (`cuda.tc_gemv_min_rows`, 0: never; see [`Gemm::tc_rows`]).
    pub tc_min_rows: usize,
    /// Time the candidates of new shapes (only while buffers hold scratch).
    pub tune: bool,
    /// Batch-invariant products: no GEMV kernels, one split-K-free
    /// cuBLASLt algorithm per matrix for every token count (module doc).
    pub deterministic: bool,
    /// Deterministic mode's algorithm per matrix (keyed by its shape at
    /// [`DETERMINISTIC_REF_TOKENS`]).
    fixed_algos: RefCell<HashMap<Shape, Fixed>>,
    /// The most tokens of a step: deterministic algorithms are checked up
    /// to it.
    pub max_tokens: usize,
    /// Where accumulating GEMVs leave the residual's sums of squares and
    /// the normed SwiGLU GEMV reads them (`SumSq`); set once the workspace
    /// is carved.
    pub sumsq: DevPtr,
    /// Set by [`Gemm::enable_fp8`].
    fp8: Option<Fp8>,
    /// Set by [`Gemm::enable_native`].
    native: Option<Native>,
}

// The handle is only used from the runner's thread.
unsafe impl Send for Gemm {}

impl Gemm {
    /// A handle whose workspace is taken from `arena`.
    pub fn new(gpu: &Gpu, arena: &mut Arena) -> Result<Self, CudaError> {
        Ok(Self {
            handle: result::create_handle()?,
            workspace: arena.take(WORKSPACE_BYTES)?,
            plans: RefCell::new(HashMap::new()),
            gemv: gemv_table(gpu, "gemv")?,
            gemv_short: gemv_table(gpu, "gemv_short")?,
            gemv_whole4k: gpu.kernel("gemv_whole4k_n1_add_f32")?,
            num_sms: gpu.num_sms()?,
            gemv_tc: gemv_tc_table(gpu)?,
            tc_min_rows: 0,
            tune: false,
            deterministic: false,
            fixed_algos: RefCell::new(HashMap::new()),
            max_tokens: 0,
            sumsq: 0,
            fp8: None,
            native: None,
        })
    }

    /// Workspace bytes to reserve in the arena passed to [`Gemm::new`].
    pub fn workspace_bytes() -> usize {
        WORKSPACE_BYTES
    }

    /// Enqueues one linear layer on `gpu`'s stream (`x`: bf16 rows, or the
    /// e4m3 rows of [`Gemm::quantized_input`]).
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &self,
        gpu: &Gpu,
        x: DevPtr,
        w: DevPtr,
        y: DevPtr,
        tokens: usize,
        inputs: usize,
        outputs: usize,
        out: OutType,
    ) -> Result<(), CudaError> {
        if self.gemv(gpu, (x, w, y), tokens, inputs, outputs, out, None)? {
            return Ok(());
        }
        if let Some(rows) = self.expansion_chunk(w, outputs, inputs) {
            // A matrix larger than the bf16 scratch (a k-quant LM head):
            // its rows expanded and multiplied a chunk at a time, each into
            // its columns of y.
            let size = if out == OutType::Bf16 { 2 } else { 4 };
            for first in (0..outputs).step_by(rows) {
                let n = rows.min(outputs - first);
                let scratch = self.expand_rows(gpu, w, (first, n), outputs, inputs)?;
                let shape = Shape {
                    tokens,
                    inputs,
                    outputs: n,
                    out,
                    input: InType::Bf16,
                    out_stride: outputs,
                };
                let ops = Operands {
                    x,
                    w: scratch,
                    y: y + (first * size) as u64,
                    scales: None,
                };
                self.run_plan(gpu, shape, ops)?;
            }
            return Ok(());
        }
        let w = self.gemm_weight(gpu, w, outputs, inputs)?;
        let mut shape = Shape {
            tokens,
            inputs,
            outputs,
            out,
            input: InType::Bf16,
            out_stride: outputs,
        };
        let mut ops = Operands {
            x,
            w,
            y,
            scales: None,
        };
        if let Some(fp8) = self.fp8_of(w) {
            shape.input = InType::Fp8;
            ops.x = fp8.x8;
            let w_scales = w + scales_offset(outputs, inputs) as u64;
            ops.scales = Some((w_scales, fp8.x_scales));
            if x != fp8.x8 {
                quantize_activations(gpu, fp8, x, tokens, inputs)?;
            }
        }
        self.run_plan(gpu, shape, ops)
    }

    /// `y = x·wᵀ` with f16 `x` and `w` and f32 `y`, always through cuBLASLt
    /// (the encoder's linear layers).
    #[allow(clippy::too_many_arguments)]
    pub fn linear_f16(
        &self,
        gpu: &Gpu,
        x: DevPtr,
        w: DevPtr,
        y: DevPtr,
        tokens: usize,
        inputs: usize,
        outputs: usize,
    ) -> Result<(), CudaError> {
        let shape = Shape {
            tokens,
            inputs,
            outputs,
            out: OutType::F32,
            input: InType::F16,
            out_stride: outputs,
        };
        let ops = Operands {
            x,
            w,
            y,
            scales: None,
        };
        self.run_plan(gpu, shape, ops)
    }

    /// Runs `shape`'s cached plan, building it first if new.
    fn run_plan(&self, gpu: &Gpu, shape: Shape, ops: Operands) -> Result<(), CudaError> {
        if !self.plans.borrow().contains_key(&shape) {
            let plan = self.plan(gpu, shape, ops)?;
            self.plans.borrow_mut().insert(shape, plan);
        }
        let plans = self.plans.borrow();
        let plan = &plans[&shape];
        match (&self.fp8, plan.fp8_epilogue, ops.scales) {
            (Some(fp8), true, Some((w_scales, x_scales))) => {
                self.matmul(gpu, plan, &plan.algo, fp8.unscaled(ops))?;
                let mode = shape.out.mode() as i32;
                let args = [
                    Arg::Ptr(fp8.sums),
                    Arg::Ptr(x_scales),
                    Arg::Ptr(w_scales),
                    Arg::Ptr(ops.y),
                    Arg::I32(shape.tokens as i32),
                    Arg::I32(shape.outputs as i32),
                    Arg::I32(mode),
                ];
                let elems = shape.tokens * shape.outputs;
                gpu.launch(
                    &fp8.scale_out,
                    (elems.div_ceil(256) as u32, 1, 1),
                    256,
                    0,
                    &args,
                )
            }
            _ => self.matmul(gpu, plan, &plan.algo, ops),
        }
    }

    /// `residual += x·wᵀ` (f32). At GEMV sizes it also leaves the sums of
    /// squares of the updated rows, and with `next_norm = (g, xg)` the next
    /// RMSNorm's pre-scaled input `xg = bf16(residual ⊙ g)`, which the
    /// normed SwiGLU and q/k/v GEMVs read.
    #[allow(clippy::too_many_arguments)]
    pub fn accumulate(
        &self,
        gpu: &Gpu,
        x: DevPtr,
        w: DevPtr,
        residual: DevPtr,
        tokens: usize,
        inputs: usize,
        outputs: usize,
        next_norm: Option<(DevPtr, DevPtr)>,
    ) -> Result<(), CudaError> {
        let out = OutType::AddF32;
        if self.gemv(
            gpu,
            (x, w, residual),
            tokens,
            inputs,
            outputs,
            out,
            next_norm,
        )? {
            return Ok(());
        }
        self.linear(gpu, x, w, residual, tokens, inputs, outputs, out)
    }
}

impl Drop for Gemm {
    fn drop(&mut self) {
        unsafe {
            for (_, p) in self.plans.get_mut().drain() {
                destroy_plan(&p);
            }
            let _ = result::destroy_handle(self.handle);
        }
    }
}
