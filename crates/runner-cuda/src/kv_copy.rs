//! Copies of KV pages between the pool and host memory (KV tiers,
//! docs/kv-cache.md): `kv_pages_gather` packs the chosen pages of every K
//! and V buffer into a device staging buffer, one copy moves that to pinned
//! host memory; restoring runs the other way (`kv_pages_scatter`). Work
//! goes in chunks of the staging size, on the runner's stream: ordered
//! after a step launched ahead and before the next forward pass.
//!
//! Made on first use (only a server with KV tiers copies pages), so the
//! staging memory is not taken from a pool that never needs it.

use cudarc::driver::{sys, CudaEvent};
use ingot_kv_cache::BlockId;
use rayon::prelude::*;

use crate::device::{Arena, Arg, DevPtr, Gpu, Kernel, Pinned};
use crate::error::CudaError;

/// Staging bytes (device and pinned host each), in two halves used in
/// turn: one half's copy runs while the host reads or fills the other.
const STAGING_BYTES: usize = 64 << 20;

/// The kernels and staging buffers.
pub struct KvCopier {
    gather: Kernel,
    scatter: Kernel,
    /// Holds the device staging, page ids and piece pointers.
    _arena: Arena,
    staging: [DevPtr; 2],
    ids_dev: [DevPtr; 2],
    pieces_dev: DevPtr,
    host: [Pinned<u8>; 2],
    ids_host: [Pinned<u32>; 2],
    chunk_pages: usize,
    piece_bytes: usize,
    npieces: usize,
}

impl KvCopier {
    /// Staging for pages of `pieces.len()` buffers of `piece_bytes` per page.
    pub fn new(gpu: &Gpu, pieces: &[DevPtr], piece_bytes: usize) -> Result<Self, CudaError> {
        if !piece_bytes.is_multiple_of(16) || pieces.is_empty() {
            return Err(CudaError::Unsupported(format!(
                "KV pages of {piece_bytes}-byte pieces cannot be copied"
            )));
        }
        let page_bytes = piece_bytes * pieces.len();
        let chunk_pages = (STAGING_BYTES / 2 / page_bytes).max(1);
        let (half, ids) = (chunk_pages * page_bytes, chunk_pages * 4);
        let sizes = [half, half, ids, ids, pieces.len() * 8];
        let mut arena = Arena::new(gpu, "kv copies", Arena::size_of(sizes))?;
        let staging = [arena.take(half)?, arena.take(half)?];
        let ids_dev = [arena.take(ids)?, arena.take(ids)?];
        let pieces_dev = arena.take(sizes[4])?;
        let mut pieces_host = Pinned::new(gpu, pieces.len())?;
        pieces_host.as_mut_slice().copy_from_slice(pieces);
        gpu.upload(pieces_dev, pieces_host.as_slice())?;
        // The pinned list is freed once its copy is done.
        gpu.sync()?;
        drop(pieces_host);
        Ok(Self {
            gather: gpu.kernel("kv_pages_gather")?,
            scatter: gpu.kernel("kv_pages_scatter")?,
            _arena: arena,
            staging,
            ids_dev,
            pieces_dev,
            host: [Pinned::new(gpu, half)?, Pinned::new(gpu, half)?],
            ids_host: [
                Pinned::new(gpu, chunk_pages)?,
                Pinned::new(gpu, chunk_pages)?,
            ],
            chunk_pages,
            piece_bytes,
            npieces: pieces.len(),
        })
    }

    fn page_bytes(&self) -> usize {
        self.piece_bytes * self.npieces
    }

    /// Uploads `ids` and launches `kernel` over them with staging `half`.
    fn launch(
        &mut self,
        gpu: &Gpu,
        gather: bool,
        half: usize,
        ids: &[BlockId],
    ) -> Result<(), CudaError> {
        self.ids_host[half].as_mut_slice()[..ids.len()].copy_from_slice(ids);
        gpu.upload(
            self.ids_dev[half],
            &self.ids_host[half].as_slice()[..ids.len()],
        )?;
        let args = [
            Arg::Ptr(self.ids_dev[half]),
            Arg::Ptr(self.pieces_dev),
            Arg::I32(self.npieces as i32),
            Arg::I64(self.piece_bytes as i64),
            Arg::Ptr(self.staging[half]),
        ];
        let kernel = if gather { &self.gather } else { &self.scatter };
        gpu.launch(
            kernel,
            (ids.len() as u32, self.npieces as u32, 1),
            256,
            0,
            &args,
        )
    }

    /// Enqueues gathering chunk `ids` into staging `half` and its download.
    fn start_read(
        &mut self,
        gpu: &Gpu,
        half: usize,
        ids: &[BlockId],
    ) -> Result<CudaEvent, CudaError> {
        self.launch(gpu, true, half, ids)?;
        let n = ids.len() * self.page_bytes();
        gpu.download(&mut self.host[half].as_mut_slice()[..n], self.staging[half])?;
        Ok(gpu
            .stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))?)
    }

    /// Copies page `pages[i]` into `out[i]`: the next chunk's gather and
    /// download run while the host copies this one out (on all cores).
    pub fn read(
        &mut self,
        gpu: &Gpu,
        pages: &[BlockId],
        out: &mut [&mut [u8]],
    ) -> Result<(), CudaError> {
        let pb = self.page_bytes();
        let chunks: Vec<&[BlockId]> = pages.chunks(self.chunk_pages).collect();
        let mut outs = out.chunks_mut(self.chunk_pages);
        let mut pending = match chunks.first() {
            Some(first) => Some(self.start_read(gpu, 0, first)?),
            None => return Ok(()),
        };
        for i in 0..chunks.len() {
            let next = match chunks.get(i + 1) {
                Some(ids) => Some(self.start_read(gpu, (i + 1) % 2, ids)?),
                None => None,
            };
            if let Some(done) = pending.take() {
                done.synchronize()?;
            }
            let host = self.host[i % 2].as_slice();
            if let Some(dst) = outs.next() {
                dst.par_iter_mut()
                    .zip(host.par_chunks_exact(pb))
                    .for_each(|(d, s)| d.copy_from_slice(s));
            }
            pending = next;
        }
        Ok(())
    }

    /// Writes `data[i]` into page `pages[i]`: the host fills one half while
    /// the other's upload and scatter run.
    pub fn write(&mut self, gpu: &Gpu, pages: &[BlockId], data: &[&[u8]]) -> Result<(), CudaError> {
        let pb = self.page_bytes();
        let mut in_flight: [Option<CudaEvent>; 2] = [None, None];
        for (i, (ids, data)) in pages
            .chunks(self.chunk_pages)
            .zip(data.chunks(self.chunk_pages))
            .enumerate()
        {
            let half = i % 2;
            // This half's pinned memory is free once its last upload ran.
            if let Some(done) = in_flight[half].take() {
                done.synchronize()?;
            }
            self.host[half]
                .as_mut_slice()
                .par_chunks_exact_mut(pb)
                .zip(data.par_iter())
                .for_each(|(slot, d)| slot.copy_from_slice(d));
            let n = ids.len() * pb;
            gpu.upload(self.staging[half], &self.host[half].as_slice()[..n])?;
            self.launch(gpu, false, half, ids)?;
            in_flight[half] = Some(
                gpu.stream
                    .record_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))?,
            );
        }
        // The callers' data may go once the uploads have read it.
        for done in in_flight.into_iter().flatten() {
            done.synchronize()?;
        }
        Ok(())
    }
}
