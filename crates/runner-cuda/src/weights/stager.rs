//! Streaming file tensors to the device through pinned staging buffers
//! ([`Stager`]).

use std::time::{Duration, Instant};

use cudarc::driver::CudaEvent;
use half::bf16;
use ingot_models::{ModelError, TensorSource};
use rayon::prelude::*;

use super::blocks::BlockFormat;
use super::{Dtype, Placement};
use crate::device::{DevPtr, Gpu, Pinned};
use crate::CudaError;

/// Pinned staging buffers: enough for the host to fill one while the
/// copies out of the others run.
const STAGING_BUFFERS: usize = 4;
/// Bytes per staging buffer (fewer for a smaller model).
const STAGING_BYTES: usize = 64 << 20;
/// The tail of a nearly full buffer is skipped rather than taking a piece
/// smaller than this (unless the rest of the tensor is smaller).
const MIN_PIECE: usize = 1 << 20;
/// Bytes per rayon task when filling a buffer.
const FILL_CHUNK: usize = 1 << 20;
/// Offsets of pieces within a buffer are aligned to this.
const PIECE_ALIGN: usize = 256;

/// A tensor's host data as it goes into a staging buffer.
#[derive(Clone, Copy)]
enum HostData<'a> {
    /// Bytes copied as they are (bf16 from the source).
    Bytes(&'a [u8]),
    /// f32 values stored as bf16 (a source without a bf16 path).
    F32AsBf16(&'a [f32]),
    /// f32 values stored as f32 (norms, biases).
    F32(&'a [f32]),
    /// Plane `k` of GGUF blocks of a format.
    Plane(&'a [u8], &'static BlockFormat, usize),
}

impl HostData<'_> {
    /// Bytes this takes on the device.
    fn device_bytes(self) -> usize {
        match self {
            Self::Bytes(b) => b.len(),
            Self::F32AsBf16(v) => 2 * v.len(),
            Self::F32(v) => 4 * v.len(),
            Self::Plane(b, format, k) => format.plane_bytes(k, b),
        }
    }

    /// Writes device bytes `offset..offset + dst.len()` into `dst`, in
    /// parallel. `offset` and `dst.len()` are multiples of the element size.
    fn fill(self, offset: usize, dst: &mut [u8]) {
        let len = dst.len();
        match self {
            Self::Bytes(b) => dst
                .par_chunks_mut(FILL_CHUNK)
                .zip(b[offset..offset + len].par_chunks(FILL_CHUNK))
                .for_each(|(d, s)| d.copy_from_slice(s)),
            Self::F32AsBf16(v) => dst
                .par_chunks_mut(FILL_CHUNK)
                .zip(v[offset / 2..(offset + len) / 2].par_chunks(FILL_CHUNK / 2))
                .for_each(|(d, s)| {
                    for (d, &x) in d.chunks_exact_mut(2).zip(s) {
                        d.copy_from_slice(&bf16::from_f32(x).to_le_bytes());
                    }
                }),
            Self::F32(v) => dst
                .par_chunks_mut(FILL_CHUNK)
                .zip(v[offset / 4..(offset + len) / 4].par_chunks(FILL_CHUNK / 4))
                .for_each(|(d, s)| {
                    for (d, &x) in d.chunks_exact_mut(4).zip(s) {
                        d.copy_from_slice(&x.to_le_bytes());
                    }
                }),
            Self::Plane(b, format, k) => dst
                .par_chunks_mut(FILL_CHUNK)
                .enumerate()
                .for_each(|(i, d)| format.fill_plane(k, b, offset + i * FILL_CHUNK, d)),
        }
    }
}

/// One staging buffer and the event after its last copy.
struct Slot {
    host: Pinned<u8>,
    /// Recorded after the last copy out of `host`; it may be refilled once
    /// this has completed.
    copied: Option<CudaEvent>,
}

/// Where the load's time went (host wall time).
#[derive(Default)]
struct LoadStats {
    /// Allocating (pinning) the staging buffers.
    setup: Duration,
    /// In the source: f32 loads (dequantization) and bf16 loads (f16
    /// conversion, q/k row reorder).
    source: Duration,
    /// Filling staging buffers: reads of the mapped file and any f32 to
    /// bf16 conversion.
    fill: Duration,
    /// Waiting for a free buffer, and the final sync.
    wait: Duration,
    bytes: usize,
    tensors: usize,
    /// Tensors that came in bf16 or in their GGUF blocks from the source
    /// (no f32 round trip).
    direct: usize,
}

/// Streams tensors to the device through pinned staging buffers used in
/// turn: the host fills a buffer (in parallel) and enqueues its copy on the
/// runner's stream, then moves on, waiting on a buffer's event only when it
/// comes round again. Pageable copies run at a seventh of pinned speed, and
/// a sync per tensor would serialize reads and copies; this way the copies
/// hide behind the reads and there is one sync at the end.
pub(super) struct Stager<'g> {
    gpu: &'g Gpu,
    slots: Vec<Slot>,
    slot_bytes: usize,
    /// The buffer being filled and its bytes used.
    current: usize,
    used: usize,
    stats: LoadStats,
    start: Instant,
}

impl<'g> Stager<'g> {
    /// Staging for a load of about `total_bytes`.
    pub(super) fn new(gpu: &'g Gpu, total_bytes: usize) -> Result<Self, CudaError> {
        let start = Instant::now();
        let slot_bytes =
            STAGING_BYTES.min(total_bytes.next_multiple_of(PIECE_ALIGN).max(MIN_PIECE));
        let slots = (0..STAGING_BUFFERS)
            .map(|_| {
                Ok(Slot {
                    host: Pinned::new(gpu, slot_bytes)?,
                    copied: None,
                })
            })
            .collect::<Result<_, CudaError>>()?;
        Ok(Self {
            gpu,
            slots,
            slot_bytes,
            current: 0,
            used: 0,
            stats: LoadStats {
                setup: start.elapsed(),
                ..LoadStats::default()
            },
            start,
        })
    }

    /// Loads placement `p` from `source` (in bf16 when the source can give
    /// it so) and enqueues its copies.
    pub(super) fn tensor(
        &mut self,
        source: &dyn TensorSource,
        p: &Placement,
    ) -> Result<(), CudaError> {
        let t = Instant::now();
        self.stats.tensors += 1;
        let numel: usize = p.shape.iter().product();
        if let Some(blocks) = &p.blocks {
            let format = blocks.format;
            let q = source.load_blocks(&p.name)?.ok_or_else(|| {
                CudaError::Unsupported(format!(
                    "{}: the source has no {} blocks for it",
                    p.name,
                    format.ty.name()
                ))
            })?;
            check_shape(p, &q.shape)?;
            let bytes = q.data.bytes();
            format.check(&p.name, q.ggml_type, bytes.len(), numel)?;
            self.stats.source += t.elapsed();
            self.stats.direct += 1;
            for (k, dst) in blocks.planes.iter().enumerate() {
                self.put(*dst, HostData::Plane(bytes, format, k))?;
            }
            return Ok(());
        }
        match p.dtype {
            Dtype::E4m3 { scales } => return self.e4m3(source, p, scales, t),
            Dtype::Bf16 => {
                if let Some(b) = source.load_bf16(&p.name)? {
                    check_shape(p, &b.shape)?;
                    if b.bytes.len() != 2 * numel {
                        return Err(CudaError::Unsupported(format!(
                            "tensor {} has {} bf16 bytes, expected {}",
                            p.name,
                            b.bytes.len(),
                            2 * numel
                        )));
                    }
                    self.stats.source += t.elapsed();
                    self.stats.direct += 1;
                    return self.put(p.dst, HostData::Bytes(&b.bytes));
                }
            }
            Dtype::F32 => {}
        }
        let h = source.load(&p.name)?;
        check_shape(p, &h.shape)?;
        self.stats.source += t.elapsed();
        let data = match p.dtype {
            Dtype::Bf16 => HostData::F32AsBf16(&h.data),
            _ => HostData::F32(&h.data),
        };
        self.put(p.dst, data)
    }

    /// An FP8 checkpoint's tensor as it is: its e4m3 bytes to `p.dst`, its
    /// row scales to `scales` (`t`: when the tensor's load began).
    fn e4m3(
        &mut self,
        source: &dyn TensorSource,
        p: &Placement,
        scales: DevPtr,
        t: Instant,
    ) -> Result<(), CudaError> {
        let e = source.load_e4m3(&p.name)?.ok_or_else(|| {
            CudaError::Unsupported(format!("{}: the source has no e4m3 bytes for it", p.name))
        })?;
        check_shape(p, &e.shape)?;
        let numel: usize = p.shape.iter().product();
        if e.bytes.len() != numel || e.row_scales.len() != p.shape[0] {
            return Err(CudaError::Unsupported(format!(
                "tensor {} has {} e4m3 bytes and {} row scales, expected {numel} and {}",
                p.name,
                e.bytes.len(),
                e.row_scales.len(),
                p.shape[0]
            )));
        }
        self.stats.source += t.elapsed();
        self.stats.direct += 1;
        self.put(p.dst, HostData::Bytes(&e.bytes))?;
        self.put(scales, HostData::F32(&e.row_scales))
    }

    /// Copies `data` to `dst` in pieces that fit the staging buffers.
    fn put(&mut self, dst: DevPtr, data: HostData) -> Result<(), CudaError> {
        let total = data.device_bytes();
        let mut offset = 0;
        while offset < total {
            let left = total - offset;
            let room = self.slot_bytes - self.used;
            if room < left.min(MIN_PIECE) {
                self.next_slot()?;
                continue;
            }
            // Pieces split between elements: all sizes here are even, and
            // multiples of 4 for f32 data (room and MIN_PIECE are).
            let len = room.min(left);
            let t = Instant::now();
            let start = self.used;
            let buf = &mut self.slots[self.current].host.as_mut_slice()[start..start + len];
            data.fill(offset, buf);
            self.stats.fill += t.elapsed();
            // The slot is not refilled before its event says this copy is done.
            self.gpu.upload(dst + offset as u64, buf)?;
            self.used = (start + len)
                .next_multiple_of(PIECE_ALIGN)
                .min(self.slot_bytes);
            offset += len;
        }
        self.stats.bytes += total;
        Ok(())
    }

    /// Closes the current buffer (an event after its copies) and opens the
    /// next one, waiting until its previous copies are done.
    fn next_slot(&mut self) -> Result<(), CudaError> {
        if self.used > 0 {
            self.slots[self.current].copied = Some(self.gpu.stream.record_event(None)?);
        }
        self.current = (self.current + 1) % self.slots.len();
        self.used = 0;
        if let Some(event) = self.slots[self.current].copied.take() {
            let t = Instant::now();
            event.synchronize()?;
            self.stats.wait += t.elapsed();
        }
        Ok(())
    }

    /// Waits for every copy and logs the breakdown.
    pub(super) fn finish(mut self) -> Result<(), CudaError> {
        let t = Instant::now();
        self.gpu.sync()?;
        self.stats.wait += t.elapsed();
        let s = &self.stats;
        let total = self.start.elapsed();
        let ms = |d: Duration| (d.as_secs_f64() * 1e3).round() as u64;
        tracing::info!(
            tensors = s.tensors,
            bf16_direct = s.direct,
            gib = format!("{:.2}", s.bytes as f64 / (1u64 << 30) as f64),
            setup_ms = ms(s.setup),
            source_ms = ms(s.source),
            fill_ms = ms(s.fill),
            wait_ms = ms(s.wait),
            total_ms = ms(total),
            gb_per_s = format!(
                "{:.1}",
                s.bytes as f64 / total.as_secs_f64().max(1e-9) / 1e9
            ),
            "weights streamed to the device"
        );
        Ok(())
    }
}

impl Drop for Stager<'_> {
    /// Copies may still read the pinned buffers (after an error midway):
    /// they must finish before the buffers are freed.
    fn drop(&mut self) {
        if let Err(e) = self.gpu.sync() {
            tracing::warn!(error = %e, "cannot wait for weight copies");
        }
    }
}

/// Checks a loaded tensor's shape against its placement.
fn check_shape(p: &Placement, got: &[usize]) -> Result<(), CudaError> {
    if got != p.shape {
        return Err(ModelError::ShapeMismatch {
            name: p.name.clone(),
            expected: p.shape.clone(),
            got: got.to_vec(),
        }
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_data_fills_any_piece() {
        let v = [1.5f32, -2.0, 0.25, 3.0];
        let mut out = [0u8; 4];
        HostData::F32AsBf16(&v).fill(4, &mut out);
        let want: Vec<u8> = [0.25f32, 3.0]
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect();
        assert_eq!(out.as_slice(), want.as_slice());
        let mut out = [0u8; 8];
        HostData::F32(&v).fill(4, &mut out);
        assert_eq!(out[..4], (-2.0f32).to_le_bytes());
        let bytes = [1u8, 2, 3, 4, 5, 6];
        let mut out = [0u8; 2];
        HostData::Bytes(&bytes).fill(2, &mut out);
        assert_eq!(out, [3, 4]);
        assert_eq!(HostData::F32AsBf16(&v).device_bytes(), 8);
    }
}
