//! The one-shot all-reduce over peer memory (`all_reduce_oneshot_f32` in
//! `collective.cu`): for the small messages of decode steps, where NCCL's
//! ring pays several hops of latency per call. The ranks are threads of one
//! process, so each GPU reads the others' exchange buffers directly by
//! address once peer access is on (NVLink on HGX machines). Larger messages
//! (prefill) take NCCL.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};

use crate::device::{Arg, DevPtr, Gpu, Kernel};
use crate::CudaError;

/// Largest message (bytes) the one-shot kernel takes; each rank's exchange
/// holds two.
pub const ONESHOT_MAX_BYTES: usize = 2 << 20;
/// Most blocks per call (sizes the flag and epoch arrays).
const MAX_BLOCKS: usize = 256;
const THREADS: u32 = 256;

/// One rank's side of the one-shot all-reduce.
pub struct PeerReduce {
    kernel: Kernel,
    rank: usize,
    ranks: usize,
    /// Device arrays of every rank's exchange and flag addresses.
    exchange_table: DevPtr,
    flags_table: DevPtr,
    /// This rank's per-block call counters.
    epochs: DevPtr,
    /// This rank's allocations, freed with its context bound.
    owned: Vec<DevPtr>,
    ctx: Arc<CudaContext>,
}

// SAFETY: device addresses and a kernel handle; used by one rank's thread.
unsafe impl Send for PeerReduce {}

/// Peer access between every pair of `gpus` (rank order) and each rank's
/// buffers; `None` (with the reason logged) where a pair cannot reach each
/// other, so the ranks use NCCL alone.
pub fn connect(gpus: &[&Gpu]) -> Result<Option<Vec<PeerReduce>>, CudaError> {
    for (i, a) in gpus.iter().enumerate() {
        for (j, b) in gpus.iter().enumerate() {
            if i == j {
                continue;
            }
            let mut can = 0;
            let (da, db) = (a.ctx.cu_device(), b.ctx.cu_device());
            unsafe { sys::cuDeviceCanAccessPeer(&mut can, da, db).result()? };
            if can == 0 {
                tracing::info!(from = i, to = j, "no peer access: all-reduces take NCCL");
                return Ok(None);
            }
            a.ctx.bind_to_thread()?;
            let status = unsafe { sys::cuCtxEnablePeerAccess(b.ctx.cu_ctx(), 0) };
            if status != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                status.result()?;
            }
        }
    }
    let ranks = gpus.len();
    let flag_bytes = MAX_BLOCKS * ranks * 4;
    let mut exchange = Vec::with_capacity(ranks);
    let mut flags = Vec::with_capacity(ranks);
    let mut parts = Vec::with_capacity(ranks);
    for gpu in gpus {
        gpu.ctx.bind_to_thread()?;
        let alloc = |bytes: usize| -> Result<DevPtr, CudaError> {
            let p = unsafe { result::malloc_sync(bytes)? };
            unsafe { result::memset_d8_sync(p, 0, bytes)? };
            Ok(p)
        };
        let (x, f) = (alloc(2 * ONESHOT_MAX_BYTES)?, alloc(flag_bytes)?);
        let epochs = alloc(MAX_BLOCKS * 4)?;
        let tables = alloc(2 * ranks * 8)?;
        exchange.push(x);
        flags.push(f);
        parts.push((x, f, epochs, tables));
    }
    let mut out = Vec::with_capacity(ranks);
    for (rank, (gpu, (x, f, epochs, tables))) in gpus.iter().zip(parts).enumerate() {
        gpu.ctx.bind_to_thread()?;
        let table: Vec<u64> = exchange.iter().chain(&flags).copied().collect();
        unsafe { result::memcpy_htod_sync(tables, &table)? };
        out.push(PeerReduce {
            kernel: gpu.kernel("all_reduce_oneshot_f32")?,
            rank,
            ranks,
            exchange_table: tables,
            flags_table: tables + (ranks * 8) as u64,
            epochs,
            owned: vec![x, f, epochs, tables],
            ctx: gpu.ctx.clone(),
        });
    }
    Ok(Some(out))
}

impl PeerReduce {
    /// Whether a message of `rows` rows of `width` f32 takes this kernel.
    pub fn takes(&self, rows: usize, width: usize) -> bool {
        rows * width * 4 <= ONESHOT_MAX_BYTES && rows <= MAX_BLOCKS && width.is_multiple_of(4)
    }

    /// Enqueues the sum over ranks of `rows` rows of `width` f32 at `x` in
    /// place, when [`Self::takes`] it (`false`: the caller takes NCCL);
    /// with `next` (`(norm weights, xg)`), the next RMSNorm's pre-scaled
    /// input and the rows' sums of squares in `sumsq`, as an accumulating
    /// GEMV leaves them.
    pub fn all_reduce_f32(
        &self,
        gpu: &Gpu,
        x: DevPtr,
        (rows, width): (usize, usize),
        next: Option<(DevPtr, DevPtr)>,
        sumsq: DevPtr,
    ) -> Result<bool, CudaError> {
        if !self.takes(rows, width) {
            return Ok(false);
        }
        // A pass of a float4 per thread per block, as many blocks per row
        // as that takes (within the flag slots).
        let per_row = width
            .div_ceil(THREADS as usize * 4)
            .clamp(1, (MAX_BLOCKS / rows).max(1));
        let (norm, xg) = next.unwrap_or((0, 0));
        let args = [
            Arg::Ptr(x),
            Arg::I32(width as i32),
            Arg::Ptr(self.exchange_table),
            Arg::Ptr(self.flags_table),
            Arg::Ptr(self.epochs),
            Arg::I32(self.rank as i32),
            Arg::I32(self.ranks as i32),
            Arg::I64((ONESHOT_MAX_BYTES / 4) as i64),
            Arg::Ptr(norm),
            Arg::Ptr(xg),
            Arg::Ptr(if next.is_some() { sumsq } else { 0 }),
        ];
        let grid = (per_row as u32, rows as u32, 1);
        gpu.launch(&self.kernel, grid, THREADS, 0, &args)?;
        Ok(true)
    }
}

impl Drop for PeerReduce {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            for &p in &self.owned {
                // Nothing to report to at drop.
                let _ = unsafe { result::free_sync(p) };
            }
        }
    }
}
