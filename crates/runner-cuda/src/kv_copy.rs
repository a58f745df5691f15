//! Copies of KV pages between the pool and host memory (KV tiers,
//! docs/kv-cache.md): `kv_pages_gather` packs the chosen pages of every K
//! and V buffer into a device staging buffer, one copy moves that to pinned
//! host memory; restoring runs the other way (`kv_pages_scatter`). Work
//! goes in chunks of the staging size, on the runner's stream: ordered
//! after a step launched ahead and before the next forward pass.
//!
//! Made on first use (only a server with KV tiers copies pages), so the
//! staging memory is not taken from a pool that never needs it.

use ingot_kv_cache::BlockId;

use crate::device::{Arena, Arg, DevPtr, Gpu, Kernel, Pinned};
use crate::error::CudaError;

/// Staging bytes (device and pinned host each).
const STAGING_BYTES: usize = 64 << 20;

/// The kernels and staging buffers.
pub struct KvCopier {
    gather: Kernel,
    scatter: Kernel,
    /// Holds the device staging, page ids and piece pointers.
    _arena: Arena,
    staging: DevPtr,
    ids_dev: DevPtr,
    pieces_dev: DevPtr,
    host: Pinned<u8>,
    ids_host: Pinned<u32>,
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
        let chunk_pages = (STAGING_BYTES / page_bytes).max(1);
        let sizes = [chunk_pages * page_bytes, chunk_pages * 4, pieces.len() * 8];
        let mut arena = Arena::new(gpu, "kv copies", Arena::size_of(sizes))?;
        let mut pieces_host = Pinned::new(gpu, pieces.len())?;
        pieces_host.as_mut_slice().copy_from_slice(pieces);
        let pieces_dev = arena.take(sizes[2])?;
        gpu.upload(pieces_dev, pieces_host.as_slice())?;
        // The pinned list is freed once its copy is done.
        gpu.sync()?;
        drop(pieces_host);
        Ok(Self {
            gather: gpu.kernel("kv_pages_gather")?,
            scatter: gpu.kernel("kv_pages_scatter")?,
            staging: arena.take(sizes[0])?,
            ids_dev: arena.take(sizes[1])?,
            pieces_dev,
            _arena: arena,
            host: Pinned::new(gpu, chunk_pages * page_bytes)?,
            ids_host: Pinned::new(gpu, chunk_pages)?,
            chunk_pages,
            piece_bytes,
            npieces: pieces.len(),
        })
    }

    fn page_bytes(&self) -> usize {
        self.piece_bytes * self.npieces
    }

    /// Uploads `ids` and launches `kernel` over them.
    fn launch(&mut self, gpu: &Gpu, kernel: &Kernel, ids: &[BlockId]) -> Result<(), CudaError> {
        self.ids_host.as_mut_slice()[..ids.len()].copy_from_slice(ids);
        gpu.upload(self.ids_dev, &self.ids_host.as_slice()[..ids.len()])?;
        let args = [
            Arg::Ptr(self.ids_dev),
            Arg::Ptr(self.pieces_dev),
            Arg::I32(self.npieces as i32),
            Arg::I64(self.piece_bytes as i64),
            Arg::Ptr(self.staging),
        ];
        gpu.launch(kernel, (ids.len() as u32, self.npieces as u32, 1), 256, 0, &args)
    }

    /// Copies page `pages[i]` into `out[i]`.
    pub fn read(&mut self, gpu: &Gpu, pages: &[BlockId], out: &mut [&mut [u8]]) -> Result<(), CudaError> {
        let pb = self.page_bytes();
        for (ids, out) in pages.chunks(self.chunk_pages).zip(out.chunks_mut(self.chunk_pages)) {
            let gather = self.gather.clone();
            self.launch(gpu, &gather, ids)?;
            let n = ids.len() * pb;
            gpu.download(&mut self.host.as_mut_slice()[..n], self.staging)?;
            gpu.sync()?;
            for (dst, src) in out.iter_mut().zip(self.host.as_slice().chunks_exact(pb)) {
                dst.copy_from_slice(src);
            }
        }
        Ok(())
    }

    /// Writes `data[i]` into page `pages[i]`.
    pub fn write(&mut self, gpu: &Gpu, pages: &[BlockId], data: &[&[u8]]) -> Result<(), CudaError> {
        let pb = self.page_bytes();
        for (ids, data) in pages.chunks(self.chunk_pages).zip(data.chunks(self.chunk_pages)) {
            for (slot, d) in self.host.as_mut_slice().chunks_exact_mut(pb).zip(data) {
                slot.copy_from_slice(d);
            }
            let n = ids.len() * pb;
            gpu.upload(self.staging, &self.host.as_slice()[..n])?;
            let scatter = self.scatter.clone();
            self.launch(gpu, &scatter, ids)?;
            // The pinned buffers are rewritten by the next chunk.
            gpu.sync()?;
        }
        Ok(())
    }
}
