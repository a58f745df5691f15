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

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::cublaslt::{result, sys};

use cudarc::driver::sys::CUevent_flags;
use ingot_arch::Activation;

use crate::device::{Arena, Arg, DevPtr, Gpu, Kernel};
use crate::weights::fp8_scales_offset;
use crate::CudaError;

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

/// Whether the GEMV kernels take `tokens` rows of `inputs`-wide
/// activations (16-byte loads of weights: inputs a multiple of 8 for bf16,
/// of 16 for e4m3).
fn gemv_fits(tokens: usize, inputs: usize, fp8: bool) -> bool {
    (1..=GEMV_MAX_TOKENS).contains(&tokens) && inputs.is_multiple_of(if fp8 { 16 } else { 8 })
}

/// The GEMV kernel variants, in the order of [`Gemm`]'s `gemv` table.
const GEMV_MODES: [&str; 10] = [
    "bf16",
    "f32",
    "add_f32",
    "swiglu",
    "qkv_rope",
    "swiglu_norm",
    "qkv_rope_norm",
    "bf16_norm",
    "geglu",
    "geglu_norm",
];

/// The GEMV kernels for n = 1..=8 of one weight type (`prefix`: `gemv` or
/// `gemv_fp8`).
fn gemv_table(gpu: &Gpu, prefix: &str) -> Result<Vec<[Kernel; 10]>, CudaError> {
    (1..=GEMV_MAX_TOKENS)
        .map(|n| gemv_modes(gpu, prefix, n))
        .collect()
}

/// The GEMV kernels of every mode for `n` rows.
fn gemv_modes(gpu: &Gpu, prefix: &str, n: usize) -> Result<[Kernel; 10], CudaError> {
    let kernels = GEMV_MODES
        .iter()
        .map(|mode| gpu.kernel(&format!("{prefix}_n{n}_{mode}")))
        .collect::<Result<Vec<_>, CudaError>>()?;
    kernels
        .try_into()
        .map_err(|_| CudaError::Unsupported("GEMV table size".into()))
}

/// The most inputs of a bf16 matrix whose batch-1 GEMV loads each lane's
/// whole row before its PDL wait (`gemv_short_n1_*`: gemv.cu's
/// `SHORT_ROW_LOADS` = 8 loads of 8 a lane, over 32 lanes).
const SHORT_ROW_INPUTS: usize = 8 * 8 * 32;

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

/// FP8 weights: where they live, and scratch for quantized activations.
struct Fp8 {
    /// `[start, end)` of the e4m3 matrices.
    region: (DevPtr, DevPtr),
    gemv: Vec<[Kernel; 10]>,
    quantize: Kernel,
    /// `[max_tokens, max_inputs]` e4m3 and `[max_tokens]` f32 scales.
    x8: DevPtr,
    x_scales: DevPtr,
    /// `max_sums` f32: unscaled sums (epilogue plans) and the trial output
    /// of new plans.
    sums: DevPtr,
    scale_out: Kernel,
    limits: Fp8Limits,
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
enum Fp8Scaling {
    /// Not FP8.
    None,
    /// cuBLASLt's outer-vector scales.
    OuterVector,
    /// Unscaled f32 sums; `fp8_scale_out` scales them.
    Epilogue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Shape {
    tokens: usize,
    inputs: usize,
    outputs: usize,
    out: OutType,
    input: InType,
}

impl Shape {
    /// The same product at another token count (deterministic mode's
    /// reference shape shares the algorithm with every token count).
    fn with_tokens(self, tokens: usize) -> Self {
        Self { tokens, ..self }
    }
}

/// Everything cuBLASLt needs for one shape.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    w: sys::cublasLtMatrixLayout_t,
    x: sys::cublasLtMatrixLayout_t,
    y: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
    /// beta = 1: add into the output.
    accumulate: bool,
    /// Workspace bytes the algorithm may use.
    workspace: usize,
    /// FP8 without outer-vector scales: f32 sums into scratch, then
    /// `fp8_scale_out`.
    fp8_epilogue: bool,
}

/// Deterministic mode's algorithm of one matrix and the workspace it was
/// checked with.
#[derive(Clone, Copy)]
struct Fixed {
    algo: sys::cublasLtMatmulAlgo_t,
    workspace: usize,
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
    /// The same modes at batch 1 for rows of at most [`SHORT_ROW_INPUTS`].
    gemv_short: [Kernel; 10],
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
            gemv_short: gemv_modes(gpu, "gemv_short", 1)?,
            tune: false,
            deterministic: false,
            fixed_algos: RefCell::new(HashMap::new()),
            max_tokens: 0,
            sumsq: 0,
            fp8: None,
        })
    }

    /// Whether the GEMV kernels take this product (never in deterministic
    /// mode: their per-row reduction order is not cuBLASLt's).
    fn gemv_fits(&self, tokens: usize, inputs: usize, w: DevPtr) -> bool {
        !self.deterministic && gemv_fits(tokens, inputs, self.fp8_of(w).is_some())
    }

    /// Workspace bytes to reserve in the arena passed to [`Gemm::new`].
    pub fn workspace_bytes() -> usize {
        WORKSPACE_BYTES
    }

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
    fn fp8_of(&self, w: DevPtr) -> Option<&Fp8> {
        self.fp8
            .as_ref()
            .filter(|f| (f.region.0..f.region.1).contains(&w))
    }

    /// The bytes a GEMV streams for `w`, a `rows x cols` matrix: 1 a
    /// weight for e4m3 (its row scales are noise beside them), 2 for bf16.
    pub fn weight_bytes(&self, w: DevPtr, rows: usize, cols: usize) -> usize {
        rows * cols * if self.fp8_of(w).is_some() { 1 } else { 2 }
    }

    /// The GEMV kernels for `w`'s type at `tokens` rows of `inputs`.
    fn gemv_kernels(&self, w: DevPtr, tokens: usize, inputs: usize) -> &[Kernel; 10] {
        match self.fp8_of(w) {
            Some(f) => &f.gemv[tokens - 1],
            None if tokens == 1 && inputs <= SHORT_ROW_INPUTS => &self.gemv_short,
            None => &self.gemv[tokens - 1],
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
        let mut shape = Shape {
            tokens,
            inputs,
            outputs,
            out,
            input: InType::Bf16,
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
            let w_scales = w + fp8_scales_offset(outputs, inputs) as u64;
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
                let mode = match shape.out {
                    OutType::Bf16 => 0,
                    OutType::F32 => 1,
                    OutType::AddF32 => 2,
                };
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

    /// Runs the GEMV kernel when `tokens` and `inputs` suit it; false
    /// otherwise (the caller runs cuBLASLt).
    #[allow(clippy::too_many_arguments)]
    fn gemv(
        &self,
        gpu: &Gpu,
        (x, w, y): (DevPtr, DevPtr, DevPtr),
        tokens: usize,
        inputs: usize,
        outputs: usize,
        out: OutType,
        next_norm: Option<(DevPtr, DevPtr)>,
    ) -> Result<bool, CudaError> {
        if !self.gemv_fits(tokens, inputs, w) {
            return Ok(false);
        }
        let (mode, sumsq) = match out {
            OutType::Bf16 => (0, 0),
            OutType::F32 => (1, 0),
            OutType::AddF32 => (2, self.sumsq),
        };
        let (norm, xg) = next_norm.unwrap_or((0, 0));
        let grid = (outputs.div_ceil(8) as u32, 1, 1);
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::Ptr(y),
            Arg::I32(inputs as i32),
            Arg::I32(outputs as i32),
            Arg::Ptr(sumsq),
            Arg::Ptr(norm),
            Arg::Ptr(xg),
        ];
        gpu.launch(
            &self.gemv_kernels(w, tokens, inputs)[mode],
            grid,
            256,
            0,
            &args,
        )?;
        Ok(true)
    }

    /// `act[t, i] = f(x·gateᵢ) · (x·upᵢ)` (f: SiLU or GELU-tanh) straight
    /// from the fused `[2 * outputs, inputs]` gate/up matrix when the GEMV
    /// path applies (the activation then costs no kernel); false otherwise
    /// (the caller runs [`Gemm::linear`] and the activation kernel).
    #[allow(clippy::too_many_arguments)]
    pub fn gated(
        &self,
        gpu: &Gpu,
        (x, w, act): (DevPtr, DevPtr, DevPtr),
        activation: Activation,
        tokens: usize,
        inputs: usize,
        outputs: usize,
        norm_eps: Option<f32>,
    ) -> Result<bool, CudaError> {
        if !self.gemv_fits(tokens, inputs, w) {
            return Ok(false);
        }
        let grid = (outputs.div_ceil(8) as u32, 1, 1);
        let tail = [
            Arg::Ptr(w),
            Arg::Ptr(act),
            Arg::I32(inputs as i32),
            Arg::I32(outputs as i32),
        ];
        let (kernel, head) = match norm_eps {
            // x is the pre-scaled residual (see `accumulate`); the kernel
            // applies 1/rms from the sums of squares.
            Some(eps) => (5, vec![Arg::Ptr(x), Arg::F32(eps), Arg::Ptr(self.sumsq)]),
            None => (3, vec![Arg::Ptr(x)]),
        };
        let kernel = match (activation, kernel) {
            (Activation::Silu, k) => k,
            (Activation::GeluTanh, 5) => 9,
            (Activation::GeluTanh, _) => 8,
        };
        let args: Vec<Arg> = head.into_iter().chain(tail).collect();
        gpu.launch(
            &self.gemv_kernels(w, tokens, inputs)[kernel],
            grid,
            256,
            0,
            &args,
        )?;
        Ok(true)
    }

    /// `y = rmsnorm(x)·wᵀ` in bf16 by the GEMV kernel, from the
    /// pre-scaled input `xg` (see [`Gemm::accumulate`]) and the sums of
    /// squares; false when the GEMV path does not apply.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_normed(
        &self,
        gpu: &Gpu,
        (xg, w, y): (DevPtr, DevPtr, DevPtr),
        tokens: usize,
        inputs: usize,
        outputs: usize,
        eps: f32,
    ) -> Result<bool, CudaError> {
        if !self.gemv_fits(tokens, inputs, w) {
            return Ok(false);
        }
        let args = [
            Arg::Ptr(xg),
            Arg::F32(eps),
            Arg::Ptr(self.sumsq),
            Arg::Ptr(w),
            Arg::Ptr(y),
            Arg::I32(inputs as i32),
            Arg::I32(outputs as i32),
        ];
        let grid = (outputs.div_ceil(8) as u32, 1, 1);
        gpu.launch(
            &self.gemv_kernels(w, tokens, inputs)[7],
            grid,
            256,
            0,
            &args,
        )?;
        Ok(true)
    }

    /// The fused q/k/v projection + rotary + KV write kernel for `tokens`
    /// rows of `inputs` wide activations and weights `w`, when the GEMV
    /// path applies. With `norm`, the variant that applies the RMSNorm to a
    /// pre-scaled input (arguments: xg, eps, sums of squares, then the rest).
    pub fn qkv_rope_kernel(
        &self,
        w: DevPtr,
        tokens: usize,
        inputs: usize,
        norm: bool,
    ) -> Option<&Kernel> {
        self.gemv_fits(tokens, inputs, w)
            .then(|| &self.gemv_kernels(w, tokens, inputs)[if norm { 6 } else { 4 }])
    }

    fn matmul(
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
    fn plan(&self, gpu: &Gpu, s: Shape, ops: Operands) -> Result<Plan, CudaError> {
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
    let y = result::create_matrix_layout(out_type, m, n, m as i64)?;
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
fn destroy_plan(p: &Plan) {
    unsafe {
        let _ = result::destroy_matrix_layout(p.w);
        let _ = result::destroy_matrix_layout(p.x);
        let _ = result::destroy_matrix_layout(p.y);
        let _ = result::destroy_matmul_desc(p.desc);
    }
}

impl Fp8 {
    /// `ops` writing unscaled sums to the scratch (no scale pointers).
    fn unscaled(&self, ops: Operands) -> Operands {
        Operands {
            y: self.sums,
            scales: None,
            ..ops
        }
    }
}

/// Sets one matmul descriptor attribute.
///
/// # Safety
/// `T` must be the attribute's C type.
unsafe fn set_desc<T>(
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

/// FP8 scaling: one f32 per row of `op(A)` (weight rows: output channels)
/// and per column of `B` (tokens), the sums multiplied by both.
fn set_outer_vector_scales(desc: sys::cublasLtMatmulDesc_t) -> Result<(), CudaError> {
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
fn set_scale_pointers(
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
fn quantize_activations(
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
