//! ingot's GEMV kernels: up to [`GEMV_MAX_TOKENS`] rows stream each weight
//! row once, with the activation, the residual add, the next RMSNorm or
//! the q/k/v rotary write fused in by mode.

use ingot_arch::Activation;

use super::quant::KQ_ONE_TYPE_GATED_COLS;
use super::{Gemm, OutType, GEMV_MAX_TOKENS};
use crate::device::{Arg, DevPtr, Gpu, Kernel};
use crate::weights::Q8_0_BLOCK;
use crate::CudaError;

/// Whether the GEMV kernels take `tokens` rows of `inputs`-wide
/// activations (16-byte loads of weights: inputs a multiple of `align`,
/// the weights of a load, or of the smallest GGUF block, 32).
fn gemv_fits(tokens: usize, inputs: usize, align: usize) -> bool {
    (1..=GEMV_MAX_TOKENS).contains(&tokens) && inputs.is_multiple_of(align)
}

/// Whether the k-quant GEMV's per-block sums of the activations' runs of
/// 16 fit its shared memory (gemv.cuh: `KQ_RUNSUM_CAP` floats at up to
/// `KQ_BLOCK_SUMS_MAX_N` rows; from 3 rows each lane sums its own).
fn kq_run_sums_fit(tokens: usize, inputs: usize) -> bool {
    const RUNSUM_CAP: usize = 4096;
    const BLOCK_SUMS_MAX_N: usize = 2;
    tokens > BLOCK_SUMS_MAX_N || tokens * inputs / 16 <= RUNSUM_CAP
}

/// Blocks (8 warps each) that cover `outputs` outputs at `per_warp` a warp
/// (rows of a plain GEMV, columns of a gated one); the last block's spare
/// warps skip their writes.
fn gemv_blocks(outputs: usize, per_warp: usize) -> u32 {
    outputs.div_ceil(8 * per_warp) as u32
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
pub(super) fn gemv_table(gpu: &Gpu, prefix: &str) -> Result<Vec<[Kernel; 10]>, CudaError> {
    (1..=GEMV_MAX_TOKENS)
        .map(|n| gemv_modes(gpu, prefix, n))
        .collect()
}

/// The GEMV kernels of every mode for `n` rows.
fn gemv_modes(gpu: &Gpu, prefix: &str, n: usize) -> Result<[Kernel; 10], CudaError> {
    mode_kernels(gpu, &format!("{prefix}_n{n}"), &GEMV_MODES)
}

/// The kernels `{prefix}_{mode}` for each of `modes`, in their order.
pub(super) fn mode_kernels<const M: usize>(
    gpu: &Gpu,
    prefix: &str,
    modes: &[&str; M],
) -> Result<[Kernel; M], CudaError> {
    let kernels = modes
        .iter()
        .map(|mode| gpu.kernel(&format!("{prefix}_{mode}")))
        .collect::<Result<Vec<_>, CudaError>>()?;
    kernels
        .try_into()
        .map_err(|_| CudaError::Unsupported("GEMV table size".into()))
}

/// The tensor-core GEMVs `gemv_tc_n{n}_{bf16,f32,add_f32}` for n = 2..=8.
pub(super) fn gemv_tc_table(gpu: &Gpu) -> Result<Vec<[Kernel; 3]>, CudaError> {
    (2..=GEMV_MAX_TOKENS)
        .map(|n| mode_kernels(gpu, &format!("gemv_tc_n{n}"), &["bf16", "f32", "add_f32"]))
        .collect()
}

/// The most inputs of a bf16 matrix whose GEMV loads each lane's whole row
/// before its PDL wait and stages x in shared memory (`gemv_short_n{n}_*`:
/// gemv.cuh's `SHORT_ROW_INPUTS`, 8 loads of 8 a lane, over 32 lanes).
pub(super) const SHORT_ROW_INPUTS: usize = 8 * 8 * 32;

/// The most inputs of `gemv_whole4k_n1_add_f32` (16 loads of 8 a lane).
pub(super) const WHOLE_ROW_INPUTS: usize = 16 * 8 * 32;

/// The most rows a SM for which that kernel is taken: below about 16 warps
/// an SM (a warp a row), the plain kernel's batches of loads leave DRAM
/// latency uncovered (H200: Qwen3-30B-A3B's o_proj of 2,048 rows gained
/// 1.7 % end to end; a dense 8B's of 4,096 lost 0.6 %).
const WHOLE_ROW_MAX_ROWS_PER_SM: usize = 16;

/// The whole-row GEMV's shapes: one token, rows longer than the short
/// kernels' and at most [`WHOLE_ROW_INPUTS`], too few of them to fill
/// `num_sms` SMs with warps.
fn whole_row_shape(tokens: usize, inputs: usize, outputs: usize, num_sms: usize) -> bool {
    tokens == 1
        && (SHORT_ROW_INPUTS + 1..=WHOLE_ROW_INPUTS).contains(&inputs)
        && outputs <= WHOLE_ROW_MAX_ROWS_PER_SM * num_sms
}

impl Gemm {
    /// Whether the GEMV kernels take this product (never in deterministic
    /// mode: their per-row reduction order is not cuBLASLt's).
    pub(super) fn gemv_fits(&self, tokens: usize, inputs: usize, w: DevPtr) -> bool {
        let align = if self.blocks_of(w).is_some() {
            Q8_0_BLOCK
        } else if self.fp8_of(w).is_some() {
            16
        } else {
            8
        };
        let kq_sums_fit = self.kq_bytes(w).is_none() || kq_run_sums_fit(tokens, inputs);
        !self.deterministic && gemv_fits(tokens, inputs, align) && kq_sums_fit
    }

    /// Whether a bf16 f32-accumulate product of `inputs` to `outputs` at
    /// `tokens` rows (o_proj into the residual) takes the whole-row kernel
    /// ([`whole_row_shape`]).
    pub fn whole_row_fits(&self, tokens: usize, inputs: usize, outputs: usize, w: DevPtr) -> bool {
        whole_row_shape(tokens, inputs, outputs, self.num_sms)
            && self.gemv_fits(tokens, inputs, w)
            && self.fp8_of(w).is_none()
            && self.blocks_of(w).is_none()
            && self.kq_bytes(w).is_none()
    }

    /// Whether steps of `tokens` rows of a model of width `hidden` take
    /// the tensor-core GEMVs (`cuda.tc_gemv_min_rows` to 8 rows, bf16 weights, rows
    /// longer than the short kernels'): their steps then run the norms,
    /// the activation and rope apart, as the GEMM path does.
    pub fn tc_rows(&self, tokens: usize, hidden: usize) -> bool {
        self.tc_row_count(tokens) && hidden > SHORT_ROW_INPUTS
    }

    /// Whether products of `tokens` rows may take the tensor-core GEMVs
    /// at all (`cuda.tc_gemv_min_rows` to 8 rows, bf16 weights).
    fn tc_row_count(&self, tokens: usize) -> bool {
        self.tc_min_rows > 0
            && !self.deterministic
            && (self.tc_min_rows.max(2)..=GEMV_MAX_TOKENS).contains(&tokens)
            && self.fp8.is_none()
            && self.native.is_none()
    }

    /// Whether the tensor-core GEMV takes `w` at `tokens` rows of `inputs`
    /// (its chunks are 32 inputs; its blocks 16 outputs, checked at launch)
    /// in a tensor-core step ([`Gemm::tc_rows`]).
    fn tc_fits(&self, tokens: usize, inputs: usize, w: DevPtr) -> bool {
        self.tc_rows(tokens, inputs) && self.tc_takes(inputs, w)
    }

    /// Whether a product with nothing fused into it (bf16 or f32 out: no
    /// residual add, whose kernels leave the next norm's sums of squares)
    /// takes the tensor-core GEMV, in any step of `tokens` rows: the LM
    /// head of a model narrow enough for the short kernels (SmolLM2's, of
    /// 49,152 rows, cost 2.7x its one-row time at 6 rows on those).
    fn tc_fits_plain(&self, tokens: usize, inputs: usize, w: DevPtr, out: OutType) -> bool {
        out != OutType::AddF32 && self.tc_row_count(tokens) && self.tc_takes(inputs, w)
    }

    /// Whether the tensor-core kernel reads `w` (bf16) of `inputs` wide rows.
    fn tc_takes(&self, inputs: usize, w: DevPtr) -> bool {
        inputs.is_multiple_of(32) && self.fp8_of(w).is_none() && self.blocks_of(w).is_none()
    }

    /// Blocks of the plain GEMV kernels for `outputs` rows: 8 warps a
    /// block, each taking gemv.cuh's `plain_rows` rows (two for a k-quant
    /// matrix at one token, else one).
    fn plain_grid(&self, w: DevPtr, tokens: usize, outputs: usize) -> (u32, u32, u32) {
        let rows_a_warp = if tokens == 1 && self.kq_bytes(w).is_some() {
            2
        } else {
            1
        };
        (gemv_blocks(outputs, rows_a_warp), 1, 1)
    }

    /// The GEMV kernels for `w`'s type at `tokens` rows of `inputs`.
    pub(super) fn gemv_kernels(&self, w: DevPtr, tokens: usize, inputs: usize) -> &[Kernel; 10] {
        if let Some(k) = self.blocks_of(w) {
            return &k.gemv[tokens - 1];
        }
        match self.fp8_of(w) {
            Some(f) => &f.gemv[tokens - 1],
            None if inputs <= SHORT_ROW_INPUTS => &self.gemv_short[tokens - 1],
            None => &self.gemv[tokens - 1],
        }
    }

    /// Runs the GEMV kernel when `tokens` and `inputs` suit it; false
    /// otherwise (the caller runs cuBLASLt).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemv(
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
        let mode = out.mode();
        let sumsq = if out == OutType::AddF32 {
            self.sumsq
        } else {
            0
        };
        let (norm, xg) = next_norm.unwrap_or((0, 0));
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
        let tc = self.tc_fits(tokens, inputs, w) || self.tc_fits_plain(tokens, inputs, w, out);
        if next_norm.is_none() && outputs.is_multiple_of(16) && tc {
            // The tensor-core kernels take x, w, y and the sizes only.
            let grid = ((outputs / 16) as u32, 1, 1);
            gpu.launch(&self.gemv_tc[tokens - 2][mode], grid, 256, 0, &args[..5])?;
            return Ok(true);
        }
        let grid = self.plain_grid(w, tokens, outputs);
        if out == OutType::AddF32 && self.whole_row_fits(tokens, inputs, outputs, w) {
            gpu.launch(&self.gemv_whole4k, grid, 256, 0, &args)?;
            return Ok(true);
        }
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
        // Tensor-core steps run the gate/up product and the activation apart.
        if self.tc_fits(tokens, inputs, w) {
            return Ok(false);
        }
        if !self.gemv_fits(tokens, inputs, w) {
            return Ok(false);
        }
        // A k-quant matrix of one type at one token: that type's kernel,
        // several columns a warp.
        let one_type = (tokens == 1).then(|| self.kq_gated_one_type(w)).flatten();
        let cols_a_warp = if one_type.is_some() {
            KQ_ONE_TYPE_GATED_COLS
        } else {
            1
        };
        let grid = (gemv_blocks(outputs, cols_a_warp), 1, 1);
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
        let (kernel, one_type_mode) = match (activation, kernel) {
            (Activation::Silu, 5) => (5, 1),
            (Activation::Silu, k) => (k, 0),
            (Activation::GeluTanh, 5) => (9, 3),
            (Activation::GeluTanh, _) => (8, 2),
        };
        let args: Vec<Arg> = head.into_iter().chain(tail).collect();
        let kernel = match one_type {
            Some(kernels) => &kernels[one_type_mode],
            None => &self.gemv_kernels(w, tokens, inputs)[kernel],
        };
        gpu.launch(kernel, grid, 256, 0, &args)?;
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
        let grid = self.plain_grid(w, tokens, outputs);
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
        (self.gemv_fits(tokens, inputs, w) && !self.tc_fits(tokens, inputs, w))
            .then(|| &self.gemv_kernels(w, tokens, inputs)[if norm { 6 } else { 4 }])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn whole_rows_take_few_long_rows_at_one_token() {
        let h200 = 132;
        for (tokens, inputs, outputs, takes, what) in [
            (1, 4096, 2048, true, "Qwen3-30B-A3B's o_proj"),
            (1, 4096, 4096, false, "a dense 8B's o_proj: rows enough"),
            (2, 4096, 2048, false, "two tokens"),
            (1, 2048, 2048, false, "a short row (gemv_short's)"),
            (1, 4104, 2048, false, "a row past 4,096 inputs"),
            (1, 2056, 2112, true, "16 rows a SM"),
            (1, 2056, 2113, false, "one row more"),
        ] {
            assert_eq!(
                super::whole_row_shape(tokens, inputs, outputs, h200),
                takes,
                "{what}"
            );
        }
    }

    #[test]
    fn gemv_blocks_cover_every_output_with_no_spare_block() {
        for (outputs, rows_a_warp, blocks) in [
            (960, 1, 120),
            (960, 2, 60),
            (97, 2, 7),
            (97, 1, 13),
            (16, 2, 1),
        ] {
            let b = super::gemv_blocks(outputs, rows_a_warp) as usize;
            assert_eq!(b, blocks, "{outputs} rows, {rows_a_warp} a warp");
            assert!(b * 8 * rows_a_warp >= outputs && (b - 1) * 8 * rows_a_warp < outputs);
        }
    }

    #[test]
    fn k_quant_run_sums_fit_up_to_the_kernels_capacity() {
        // 65,536 inputs at batch 1 (4,096 runs), half that at batch 2.
        assert!(super::kq_run_sums_fit(1, 65536) && !super::kq_run_sums_fit(1, 65536 + 32));
        assert!(super::kq_run_sums_fit(2, 32768) && !super::kq_run_sums_fit(2, 32768 + 32));
        // Three rows and up sum in the lanes: any width.
        assert!(super::kq_run_sums_fit(3, 1 << 20));
    }
}
