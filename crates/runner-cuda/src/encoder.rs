//! [`EncoderOps`] on an NVIDIA GPU: the BERT-family encoder of
//! `ingot_arch::bert` (all-MiniLM-L6-v2, …) with its forward unchanged.
//!
//! Activations are f32 rows; every op that produces a GEMM input also writes
//! an f16 copy of it, and the linear layers run cuBLASLt f16 × f16 with f32
//! accumulation and f32 output (bf16 inputs cost MiniLM a hundred times
//! more of its cosine to the f32 reference: docs/benchmarks.md). Weights
//! are kept in f32 (embedding tables, norms, biases) and, for matrices, in
//! f16 as well. Sequences stay packed back to back; attention gets each
//! token's sequence bounds. Activations are allocated per forward from the
//! driver's stream-ordered pool.

use std::cell::Cell;
use std::sync::Mutex;

use cudarc::driver::{CudaSlice, DevicePtr};
use half::f16;
use ingot_arch::bert::{EncoderBatch, EncoderOps, Heads, Linear, Norm};
use ingot_arch::{ArchError, Bert};
use ingot_models::bert::{BertConfig, BertFiles, Pooling};
use ingot_models::{HostTensor, TensorSource};

use crate::device::{Arena, Arg, DevPtr, Gpu, Kernel};
use crate::gemm::Gemm;
use crate::CudaError;

/// GEMM row counts are rounded up to this, so cuBLASLt plans (one per
/// shape) stay few whatever the batch's token count.
const ROW_QUANTUM: usize = 64;
/// Threads of the per-row kernels (rows of a few hundred values).
const ROW_THREADS: u32 = 128;
/// Warps per attention block (one warp per token and head).
const ATTENTION_WARPS: u32 = 4;
/// Head widths the attention kernel is built for.
const HEAD_DIMS: [usize; 2] = [32, 64];

impl From<CudaError> for ArchError {
    fn from(e: CudaError) -> Self {
        ArchError::Backend(e.to_string())
    }
}

fn driver(e: cudarc::driver::DriverError) -> ArchError {
    CudaError::from(e).into()
}

/// Whether the CUDA encoder runs `config` (its attention kernel's head widths).
pub fn supports_encoder(config: &BertConfig) -> Result<(), CudaError> {
    let hd = config.head_dim();
    if !HEAD_DIMS.contains(&hd) {
        return Err(CudaError::Unsupported(format!(
            "encoder head_dim {hd} (32 and 64 are supported); serve it on the CPU (--device cpu)"
        )));
    }
    if !config.hidden_size.is_multiple_of(8) || !config.intermediate_size.is_multiple_of(8) {
        return Err(CudaError::Unsupported(format!(
            "encoder widths {} / {} (multiples of 8 are supported)",
            config.hidden_size, config.intermediate_size
        )));
    }
    Ok(())
}

/// Loads a BERT directory's weights onto GPU `ordinal`.
pub fn load_bert(files: &BertFiles, ordinal: usize) -> Result<Bert<CudaEncoder>, ArchError> {
    supports_encoder(&files.config)?;
    let ops = CudaEncoder::open(ordinal, files.config.head_dim())?;
    let tensors = &files.tensors;
    Bert::load(
        ops,
        files.config.clone(),
        &|name| tensors.load(name),
        &|name| tensors.contains(name),
    )
}

/// The encoder's kernels.
struct EncoderKernels {
    gather_add: Kernel,
    add_bias: Kernel,
    add_layer_norm: Kernel,
    gelu: Kernel,
    to_half: Kernel,
    attention: Kernel,
    pool: Kernel,
    l2_normalize: Kernel,
}

impl EncoderKernels {
    fn load(gpu: &Gpu, head_dim: usize) -> Result<Self, CudaError> {
        Ok(Self {
            gather_add: gpu.kernel("enc_gather_add")?,
            add_bias: gpu.kernel("enc_add_bias")?,
            add_layer_norm: gpu.kernel("enc_add_layer_norm")?,
            gelu: gpu.kernel("enc_gelu")?,
            to_half: gpu.kernel("enc_to_half")?,
            attention: gpu.kernel(&format!("enc_attention_hd{head_dim}"))?,
            pool: gpu.kernel("enc_pool")?,
            l2_normalize: gpu.kernel("enc_l2_normalize")?,
        })
    }
}

/// The CUDA encoder backend: one GPU context and stream, the encoder's
/// kernels and a cuBLASLt handle.
pub struct CudaEncoder {
    gpu: Gpu,
    kernels: EncoderKernels,
    /// cuBLASLt's plan cache is not thread-safe; forwards are serial anyway.
    gemm: Mutex<Gemm>,
    /// Holds the GEMM workspace.
    _workspace: Arena,
}

// SAFETY: the kernel handles are immutable once loaded and the driver API is
// thread-safe; every op binds the context to the calling thread, and the
// only mutable state (the GEMM plans) is behind a mutex.
unsafe impl Send for CudaEncoder {}
unsafe impl Sync for CudaEncoder {}

/// A weight on the device: f32, and for matrices an f16 copy for the GEMMs.
pub struct DeviceTensor {
    f32: CudaSlice<f32>,
    f16: Option<CudaSlice<f16>>,
    shape: Vec<usize>,
}

/// Activation rows on the device: f32, plus an f16 copy that GEMMs read
/// (made on demand when an op left it stale).
pub struct DeviceRows {
    f32: CudaSlice<f32>,
    f16: CudaSlice<f16>,
    f16_fresh: Cell<bool>,
    rows: usize,
    width: usize,
}

impl DeviceRows {
    fn len(&self) -> usize {
        self.rows * self.width
    }
}

/// Per-token and per-sequence bounds of a packed batch, on the device.
struct Bounds {
    /// `[tokens]` first token of each token's sequence, then `[tokens]` its
    /// length.
    per_token: CudaSlice<i32>,
    /// `[sequences]` first tokens, then `[sequences]` lengths.
    per_sequence: CudaSlice<i32>,
}

fn mismatch(what: &str) -> ArchError {
    ArchError::Backend(format!("{what}: operand sizes do not match"))
}

fn i32_of(v: usize) -> Result<i32, ArchError> {
    i32::try_from(v).map_err(|_| ArchError::Input(format!("{v} is too large for the GPU kernels")))
}

impl CudaEncoder {
    /// Opens GPU `ordinal` for an encoder of attention heads `head_dim` wide.
    pub fn open(ordinal: usize, head_dim: usize) -> Result<Self, CudaError> {
        let gpu = Gpu::open(ordinal, false, false)?;
        let kernels = EncoderKernels::load(&gpu, head_dim)?;
        let mut workspace = Arena::new(&gpu, "encoder GEMM workspace", Gemm::workspace_bytes())?;
        let gemm = Gemm::new(&gpu, &mut workspace)?;
        Ok(Self {
            gpu,
            kernels,
            gemm: Mutex::new(gemm),
            _workspace: workspace,
        })
    }

    fn bind(&self) -> Result<(), ArchError> {
        self.gpu.ctx.bind_to_thread().map_err(driver)
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> DevPtr {
        s.device_ptr(&self.gpu.stream).0
    }

    /// Zeroed rows, the allocation rounded up to [`ROW_QUANTUM`] rows.
    fn rows(&self, rows: usize, width: usize) -> Result<DeviceRows, ArchError> {
        let padded = rows.next_multiple_of(ROW_QUANTUM).max(ROW_QUANTUM) * width;
        let s = &self.gpu.stream;
        Ok(DeviceRows {
            f32: s.alloc_zeros::<f32>(padded).map_err(driver)?,
            f16: s.alloc_zeros::<f16>(padded).map_err(driver)?,
            f16_fresh: Cell::new(true),
            rows,
            width,
        })
    }

    fn upload<T: cudarc::driver::DeviceRepr>(&self, v: &[T]) -> Result<CudaSlice<T>, ArchError> {
        self.gpu.stream.clone_htod(v).map_err(driver)
    }

    fn launch(
        &self,
        kernel: &Kernel,
        grid: u32,
        block: u32,
        args: &[Arg],
    ) -> Result<(), ArchError> {
        Ok(self.gpu.launch(kernel, (grid, 1, 1), block, 0, args)?)
    }

    /// Converts `len` f32 values at `x` to f16 at `out`.
    fn to_half(&self, x: DevPtr, out: DevPtr, len: usize) -> Result<(), ArchError> {
        let grid = len.div_ceil(256).clamp(1, 4096) as u32;
        let args = [Arg::Ptr(x), Arg::Ptr(out), Arg::I64(len as i64)];
        self.launch(&self.kernels.to_half, grid, 256, &args)
    }

    /// The f16 copy of `x`, refreshed if an op left it stale.
    fn half_of(&self, x: &DeviceRows) -> Result<DevPtr, ArchError> {
        let out = self.ptr(&x.f16);
        if !x.f16_fresh.get() {
            self.to_half(self.ptr(&x.f32), out, x.len())?;
            x.f16_fresh.set(true);
        }
        Ok(out)
    }

    fn bounds(&self, batch: &EncoderBatch) -> Result<Bounds, ArchError> {
        let (per_token, per_sequence) = packed_bounds(&batch.seq_lens, batch.tokens.len())?;
        Ok(Bounds {
            per_token: self.upload(&per_token)?,
            per_sequence: self.upload(&per_sequence)?,
        })
    }
}

/// The kernels' view of `tokens` tokens packed as `seq_lens`: per token its
/// sequence's first token, then per token that sequence's length; per
/// sequence its first token, then per sequence its length.
fn packed_bounds(seq_lens: &[usize], tokens: usize) -> Result<(Vec<i32>, Vec<i32>), ArchError> {
    let mut per_token = vec![0i32; 2 * tokens];
    let mut per_sequence = Vec::with_capacity(2 * seq_lens.len());
    let mut start = 0usize;
    for &len in seq_lens {
        if start + len > tokens {
            return Err(mismatch("sequence lengths"));
        }
        let (s, l) = (i32_of(start)?, i32_of(len)?);
        per_token[start..start + len].fill(s);
        per_token[tokens + start..tokens + start + len].fill(l);
        per_sequence.push(s);
        start += len;
    }
    if start != tokens {
        return Err(mismatch("sequence lengths"));
    }
    for &len in seq_lens {
        per_sequence.push(i32_of(len)?);
    }
    Ok((per_token, per_sequence))
}

impl EncoderOps for CudaEncoder {
    type Weight = DeviceTensor;
    type Act = DeviceRows;

    fn device_name(&self) -> &str {
        &self.gpu.name
    }

    fn weight(&self, tensor: HostTensor) -> Result<DeviceTensor, ArchError> {
        self.bind()?;
        let f32 = self.upload(&tensor.data)?;
        let f16 = if tensor.shape.len() == 2 {
            let half = self
                .gpu
                .stream
                .alloc_zeros::<f16>(tensor.data.len())
                .map_err(driver)?;
            self.to_half(self.ptr(&f32), self.ptr(&half), tensor.data.len())?;
            Some(half)
        } else {
            None
        };
        Ok(DeviceTensor {
            f32,
            f16,
            shape: tensor.shape,
        })
    }

    fn gather_sum(&self, tables: &[(&DeviceTensor, &[u32])]) -> Result<DeviceRows, ArchError> {
        self.bind()?;
        let (first, ids) = tables.first().ok_or_else(|| mismatch("gather_sum"))?;
        let width = first.shape.last().copied().unwrap_or(0);
        let out = self.rows(ids.len(), width)?;
        if ids.is_empty() {
            return Ok(out);
        }
        for (i, (table, ids)) in tables.iter().enumerate() {
            let (rows, w) = match table.shape[..] {
                [r, w] => (r, w),
                _ => return Err(mismatch("gather_sum")),
            };
            if w != width || ids.len() != out.rows {
                return Err(mismatch("gather_sum"));
            }
            if let Some(id) = ids.iter().find(|&&id| id as usize >= rows) {
                return Err(ArchError::Input(format!("row {id} is out of the table")));
            }
            let ids = self.upload(ids)?;
            let args = [
                Arg::Ptr(self.ptr(&ids)),
                Arg::Ptr(self.ptr(&table.f32)),
                Arg::Ptr(self.ptr(&out.f32)),
                Arg::I32(i32_of(width)?),
                Arg::I32(i32::from(i > 0)),
            ];
            self.launch(
                &self.kernels.gather_add,
                out.rows as u32,
                ROW_THREADS,
                &args,
            )?;
        }
        out.f16_fresh.set(false);
        Ok(out)
    }

    fn linear(
        &self,
        x: &DeviceRows,
        layer: &Linear<DeviceTensor>,
    ) -> Result<DeviceRows, ArchError> {
        self.bind()?;
        let (n, k) = match layer.weight.shape[..] {
            [n, k] => (n, k),
            _ => return Err(mismatch("linear")),
        };
        let w = layer
            .weight
            .f16
            .as_ref()
            .ok_or_else(|| mismatch("linear"))?;
        if x.width != k || layer.bias.f32.len() != n {
            return Err(mismatch("linear"));
        }
        let out = self.rows(x.rows, n)?;
        if x.rows == 0 {
            return Ok(out);
        }
        let xh = self.half_of(x)?;
        let tokens = x.rows.next_multiple_of(ROW_QUANTUM);
        let gemm = self.gemm.lock().unwrap_or_else(|e| e.into_inner());
        gemm.linear_f16(&self.gpu, xh, self.ptr(w), self.ptr(&out.f32), tokens, k, n)?;
        drop(gemm);
        let args = [
            Arg::Ptr(self.ptr(&out.f32)),
            Arg::Ptr(self.ptr(&layer.bias.f32)),
            Arg::I32(i32_of(n)?),
        ];
        self.launch(&self.kernels.add_bias, out.rows as u32, ROW_THREADS, &args)?;
        out.f16_fresh.set(false);
        Ok(out)
    }

    fn attention(
        &self,
        qkv: &DeviceRows,
        heads: Heads,
        batch: &EncoderBatch,
    ) -> Result<DeviceRows, ArchError> {
        self.bind()?;
        let h = heads.count * heads.dim;
        let tokens = batch.tokens.len();
        if qkv.width != 3 * h || qkv.rows != tokens || !HEAD_DIMS.contains(&heads.dim) {
            return Err(mismatch("attention"));
        }
        let out = self.rows(tokens, h)?;
        if tokens == 0 {
            return Ok(out);
        }
        let bounds = self.bounds(batch)?;
        let per_token = self.ptr(&bounds.per_token);
        let warps = tokens * heads.count;
        let args = [
            Arg::Ptr(self.ptr(&qkv.f32)),
            Arg::Ptr(self.ptr(&out.f32)),
            Arg::Ptr(self.ptr(&out.f16)),
            Arg::Ptr(per_token),
            Arg::Ptr(per_token + (tokens * 4) as u64),
            Arg::I32(i32_of(tokens)?),
            Arg::I32(i32_of(heads.count)?),
            Arg::F32(1.0 / (heads.dim as f32).sqrt()),
        ];
        let grid = warps.div_ceil(ATTENTION_WARPS as usize) as u32;
        self.launch(&self.kernels.attention, grid, 32 * ATTENTION_WARPS, &args)?;
        Ok(out)
    }

    fn add_layer_norm(
        &self,
        x: &mut DeviceRows,
        residual: Option<&DeviceRows>,
        norm: &Norm<DeviceTensor>,
        eps: f32,
    ) -> Result<(), ArchError> {
        self.bind()?;
        if norm.weight.f32.len() != x.width
            || residual.is_some_and(|r| r.rows != x.rows || r.width != x.width)
        {
            return Err(mismatch("add_layer_norm"));
        }
        if x.rows == 0 {
            return Ok(());
        }
        let args = [
            Arg::Ptr(self.ptr(&x.f32)),
            Arg::Ptr(residual.map_or(0, |r| self.ptr(&r.f32))),
            Arg::Ptr(self.ptr(&norm.weight.f32)),
            Arg::Ptr(self.ptr(&norm.bias.f32)),
            Arg::Ptr(self.ptr(&x.f16)),
            Arg::I32(i32_of(x.width)?),
            Arg::F32(eps),
        ];
        self.launch(
            &self.kernels.add_layer_norm,
            x.rows as u32,
            ROW_THREADS,
            &args,
        )?;
        x.f16_fresh.set(true);
        Ok(())
    }

    fn gelu(&self, x: &mut DeviceRows) -> Result<(), ArchError> {
        self.bind()?;
        let len = x.len();
        if len == 0 {
            return Ok(());
        }
        let grid = len.div_ceil(256).clamp(1, 4096) as u32;
        let args = [
            Arg::Ptr(self.ptr(&x.f32)),
            Arg::Ptr(self.ptr(&x.f16)),
            Arg::I64(len as i64),
        ];
        self.launch(&self.kernels.gelu, grid, 256, &args)?;
        x.f16_fresh.set(true);
        Ok(())
    }

    fn pool(
        &self,
        x: &DeviceRows,
        pooling: Pooling,
        batch: &EncoderBatch,
    ) -> Result<DeviceRows, ArchError> {
        self.bind()?;
        if x.rows != batch.tokens.len() || batch.seq_lens.contains(&0) {
            return Err(mismatch("pool"));
        }
        let sequences = batch.seq_lens.len();
        let out = self.rows(sequences, x.width)?;
        if sequences == 0 {
            return Ok(out);
        }
        let bounds = self.bounds(batch)?;
        let starts = self.ptr(&bounds.per_sequence);
        let args = [
            Arg::Ptr(self.ptr(&x.f32)),
            Arg::Ptr(self.ptr(&out.f32)),
            Arg::Ptr(starts),
            Arg::Ptr(starts + (sequences * 4) as u64),
            Arg::I32(i32_of(x.width)?),
            Arg::I32(i32::from(pooling == Pooling::Cls)),
        ];
        self.launch(&self.kernels.pool, sequences as u32, ROW_THREADS, &args)?;
        out.f16_fresh.set(false);
        Ok(out)
    }

    fn l2_normalize(&self, x: &mut DeviceRows) -> Result<(), ArchError> {
        self.bind()?;
        if x.rows == 0 {
            return Ok(());
        }
        let args = [Arg::Ptr(self.ptr(&x.f32)), Arg::I32(i32_of(x.width)?)];
        self.launch(
            &self.kernels.l2_normalize,
            x.rows as u32,
            ROW_THREADS,
            &args,
        )?;
        x.f16_fresh.set(false);
        Ok(())
    }

    fn to_host(&self, x: &DeviceRows) -> Result<Vec<f32>, ArchError> {
        self.bind()?;
        let mut out = vec![0f32; x.len()];
        if !out.is_empty() {
            self.gpu.download(&mut out, self.ptr(&x.f32))?;
        }
        self.gpu.sync()?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_give_every_token_its_sequence() {
        let (per_token, per_sequence) = packed_bounds(&[3, 1, 2], 6).unwrap();
        assert_eq!(per_token, [0, 0, 0, 3, 4, 4, 3, 3, 3, 1, 2, 2]);
        assert_eq!(per_sequence, [0, 3, 4, 3, 1, 2]);
    }

    #[test]
    fn bounds_refuse_lengths_that_miss_the_token_count() {
        assert!(packed_bounds(&[3, 4], 6).is_err());
        assert!(packed_bounds(&[3, 2], 6).is_err());
    }

    fn config(hidden: usize, heads: usize) -> BertConfig {
        BertConfig {
            hidden_size: hidden,
            intermediate_size: 4 * hidden,
            num_layers: 1,
            num_heads: heads,
            vocab_size: 10,
            max_positions: 8,
            type_vocab_size: 1,
            layer_norm_eps: 1e-12,
            pooling: Pooling::Mean,
            normalize: true,
        }
    }

    #[test]
    fn takes_the_head_widths_its_attention_kernel_has() {
        assert!(supports_encoder(&config(384, 12)).is_ok()); // MiniLM: 32
        assert!(supports_encoder(&config(768, 12)).is_ok()); // BERT-base: 64
        let e = supports_encoder(&config(384, 8)).unwrap_err(); // 48
        assert!(e.to_string().contains("head_dim 48"), "{e}");
    }
}
