//! Model weights on the device in one arena: matrices in bf16 (q/k/v and
//! gate/up fused row-wise, as on the CPU), norms, biases and the rotary
//! tables in f32. File weights stream through a few pinned staging buffers
//! (see [`Stager`]): bf16/f16 tensors go in without an f32 round trip, and
//! host reads overlap the copies; random weights (`--load-format dummy`) are
//! generated on the device.

use std::time::{Duration, Instant};

use cudarc::driver::CudaEvent;
use half::bf16;
use ingot_models::llama::{expected_shapes, mlp_norm_name, POST_ATTN_NORM, POST_MLP_NORM};
use ingot_models::{ModelConfig, ModelError, TensorSource};
use rayon::prelude::*;

use crate::device::{Arena, Arg, DevPtr, Gpu, Pinned};
use crate::CudaError;

/// One decoder block's weights.
pub struct LayerWeights {
    pub attn_norm: DevPtr,
    /// `[q_dim + 2 kv_dim, hidden]` bf16.
    pub qkv: DevPtr,
    /// `[q_dim + 2 kv_dim]` f32 (Qwen2).
    pub qkv_bias: Option<DevPtr>,
    /// `[head_dim]` f32 each (Qwen3).
    pub qk_norm: Option<(DevPtr, DevPtr)>,
    pub o_proj: DevPtr,
    pub mlp_norm: DevPtr,
    /// `(after attention, after the MLP)` `[hidden]` f32 each (Gemma).
    pub post_norms: Option<(DevPtr, DevPtr)>,
    /// `[2 intermediate, hidden]` bf16: gate rows, then up rows.
    pub gate_up: DevPtr,
    pub down: DevPtr,
}

/// All weights; pointers into `arena`.
pub struct DeviceWeights {
    pub embed: DevPtr,
    /// The embedding table when tied.
    pub lm_head: DevPtr,
    pub norm: DevPtr,
    pub layers: Vec<LayerWeights>,
    /// `[max_context, head_dim / 2]` f32.
    pub cos: DevPtr,
    pub sin: DevPtr,
    /// The sliding layers' tables (their own rope base), when the model
    /// has sliding layers.
    pub local_rope: Option<(DevPtr, DevPtr)>,
    pub arena: Arena,
}

/// The rotary tables: global, then local when the model has sliding layers.
struct RopeTables {
    cos: DevPtr,
    sin: DevPtr,
    local: Option<(DevPtr, DevPtr)>,
}

/// Rotary tables the model needs (two per rope base).
fn rope_table_count(config: &ModelConfig) -> usize {
    if config.block.sliding_window.is_some() {
        4
    } else {
        2
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dtype {
    Bf16,
    F32,
}

impl Dtype {
    fn size(self) -> usize {
        match self {
            Self::Bf16 => 2,
            Self::F32 => 4,
        }
    }
}

/// Where a named tensor goes.
struct Placement {
    name: String,
    shape: Vec<usize>,
    dtype: Dtype,
    dst: DevPtr,
}

impl DeviceWeights {
    /// Bytes the weights occupy on the device.
    pub fn bytes(config: &ModelConfig) -> usize {
        let table = config.max_context * (config.head_dim / 2) * 4;
        Arena::size_of(
            expected_shapes(config).iter().map(|(name, shape)| {
                shape.iter().product::<usize>() * dtype_of(name, shape).size()
            }),
        ) + Arena::size_of(vec![table; rope_table_count(config)])
    }

    /// Allocates the arena and fills it from `source`.
    pub fn load(
        gpu: &Gpu,
        config: &ModelConfig,
        source: &dyn TensorSource,
        progress: &dyn Fn(usize, usize),
    ) -> Result<Self, CudaError> {
        let mut arena = Arena::new(gpu, "weights", Self::bytes(config))?;
        let (placements, tables) = Self::place(config, &mut arena)?;
        let total = placements.len();
        match source.random_seed() {
            Some(seed) => {
                let fill_bf16 = gpu.kernel("fill_uniform_bf16")?;
                let fill_f32 = gpu.kernel("fill_uniform_f32")?;
                for (i, p) in placements.iter().enumerate() {
                    let n: usize = p.shape.iter().product();
                    // Same distributions as the CPU's DummySource: norms near
                    // 1, everything else small and centred.
                    let (scale, offset) = if p.name.contains("norm") {
                        (0.2, 1.0)
                    } else {
                        (0.08, 0.0)
                    };
                    let kernel = if p.dtype == Dtype::Bf16 {
                        &fill_bf16
                    } else {
                        &fill_f32
                    };
                    let args = [
                        Arg::Ptr(p.dst),
                        Arg::I64(n as i64),
                        Arg::I64(name_hash(seed, &p.name) as i64),
                        Arg::F32(scale),
                        Arg::F32(offset),
                    ];
                    gpu.launch(kernel, (1024, 1, 1), 256, 0, &args)?;
                    progress(i + 1, total);
                }
            }
            None => {
                let mut stager = Stager::new(gpu, Self::bytes(config))?;
                for (i, p) in placements.iter().enumerate() {
                    stager.tensor(source, p)?;
                    progress(i + 1, total);
                }
                stager.finish()?;
            }
        }
        let (cos_t, sin_t) = config.rope.tables(config.head_dim, config.max_context);
        gpu.upload(tables.cos, &cos_t)?;
        gpu.upload(tables.sin, &sin_t)?;
        if let (Some((cos, sin)), Some(w)) = (tables.local, &config.block.sliding_window) {
            let (cos_t, sin_t) = w.local_rope.tables(config.head_dim, config.max_context);
            gpu.upload(cos, &cos_t)?;
            gpu.upload(sin, &sin_t)?;
        }
        gpu.sync()?;
        Self::assemble(config, &placements, tables, arena)
    }

    /// Carves the arena into tensors: where each named tensor lands (fused
    /// matrices take their parts at row offsets), then the rotary tables.
    fn place(
        config: &ModelConfig,
        arena: &mut Arena,
    ) -> Result<(Vec<Placement>, RopeTables), CudaError> {
        let shapes = expected_shapes(config);
        let mut placements = Vec::with_capacity(shapes.len());
        let mut fused: Vec<(String, DevPtr)> = Vec::new();
        for (name, shape) in &shapes {
            let dtype = dtype_of(name, shape);
            let bytes = shape.iter().product::<usize>() * dtype.size();
            // Parts of a fused matrix follow the first part contiguously.
            let dst = match fused_part(name) {
                Some((group, 0)) => {
                    let group_bytes = fused_group_bytes(config, &group, dtype);
                    let base = arena.take(group_bytes)?;
                    fused.push((group, base));
                    base
                }
                Some((group, index)) => {
                    let base = fused
                        .iter()
                        .find(|(g, _)| *g == group)
                        .map(|(_, p)| *p)
                        .ok_or_else(|| {
                            CudaError::Unsupported(format!("{name} comes before its fused group"))
                        })?;
                    let rows = fused_offset_rows(config, &group, index);
                    base + (rows * row_bytes(shape, dtype)) as u64
                }
                None => arena.take(bytes)?,
            };
            placements.push(Placement {
                name: name.clone(),
                shape: shape.clone(),
                dtype,
                dst,
            });
        }
        let table_bytes = config.max_context * (config.head_dim / 2) * 4;
        let cos = arena.take(table_bytes)?;
        let sin = arena.take(table_bytes)?;
        let local = if rope_table_count(config) > 2 {
            Some((arena.take(table_bytes)?, arena.take(table_bytes)?))
        } else {
            None
        };
        Ok((placements, RopeTables { cos, sin, local }))
    }

    /// The named pointers of a placed arena.
    fn assemble(
        config: &ModelConfig,
        placements: &[Placement],
        tables: RopeTables,
        arena: Arena,
    ) -> Result<Self, CudaError> {
        let at = |n: &str| -> Result<DevPtr, CudaError> {
            placements
                .iter()
                .find(|p| p.name == n)
                .map(|p| p.dst)
                .ok_or_else(|| CudaError::Unsupported(format!("no tensor {n}")))
        };
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            layers.push(LayerWeights {
                attn_norm: at(&p("input_layernorm.weight"))?,
                qkv: at(&p("self_attn.q_proj.weight"))?,
                qkv_bias: if config.qkv_bias {
                    Some(at(&p("self_attn.q_proj.bias"))?)
                } else {
                    None
                },
                qk_norm: if config.qk_norm {
                    Some((
                        at(&p("self_attn.q_norm.weight"))?,
                        at(&p("self_attn.k_norm.weight"))?,
                    ))
                } else {
                    None
                },
                o_proj: at(&p("self_attn.o_proj.weight"))?,
                mlp_norm: at(&p(mlp_norm_name(config)))?,
                post_norms: if config.block.post_norms {
                    Some((at(&p(POST_ATTN_NORM))?, at(&p(POST_MLP_NORM))?))
                } else {
                    None
                },
                gate_up: at(&p("mlp.gate_proj.weight"))?,
                down: at(&p("mlp.down_proj.weight"))?,
            });
        }
        let embed = at("model.embed_tokens.weight")?;
        Ok(Self {
            embed,
            lm_head: if config.tie_word_embeddings {
                embed
            } else {
                at("lm_head.weight")?
            },
            norm: at("model.norm.weight")?,
            layers,
            cos: tables.cos,
            sin: tables.sin,
            local_rope: tables.local,
            arena,
        })
    }
}

/// Matrices in bf16; vectors (norms, biases) in f32.
fn dtype_of(_name: &str, shape: &[usize]) -> Dtype {
    if shape.len() >= 2 {
        Dtype::Bf16
    } else {
        Dtype::F32
    }
}

fn row_bytes(shape: &[usize], dtype: Dtype) -> usize {
    shape[1..].iter().product::<usize>() * dtype.size()
}

/// `(group, part index)` for the parts of fused tensors.
fn fused_part(name: &str) -> Option<(String, usize)> {
    let (prefix, leaf) = name
        .rsplit_once(".self_attn.")
        .or_else(|| name.rsplit_once(".mlp."))?;
    let (group, index) = match leaf {
        "q_proj.weight" => ("qkv", 0),
        "k_proj.weight" => ("qkv", 1),
        "v_proj.weight" => ("qkv", 2),
        "q_proj.bias" => ("qkv_bias", 0),
        "k_proj.bias" => ("qkv_bias", 1),
        "v_proj.bias" => ("qkv_bias", 2),
        "gate_proj.weight" => ("gate_up", 0),
        "up_proj.weight" => ("gate_up", 1),
        _ => return None,
    };
    Some((format!("{prefix}.{group}"), index))
}

/// Rows of a fused matrix (elements of a fused bias) before part `index`.
fn fused_offset_rows(config: &ModelConfig, group: &str, index: usize) -> usize {
    let (q, kv, ff) = (config.q_dim(), config.kv_dim(), config.intermediate_size);
    if group.ends_with("gate_up") {
        index * ff
    } else {
        [0, q, q + kv][index.min(2)]
    }
}

fn fused_group_bytes(config: &ModelConfig, group: &str, dtype: Dtype) -> usize {
    let (d, q, kv, ff) = (
        config.hidden_size,
        config.q_dim(),
        config.kv_dim(),
        config.intermediate_size,
    );
    let elems = if group.ends_with("qkv_bias") {
        q + 2 * kv
    } else if group.ends_with("qkv") {
        (q + 2 * kv) * d
    } else {
        2 * ff * d
    };
    elems * dtype.size()
}

/// A stable 64-bit hash of (seed, tensor name).
fn name_hash(seed: u64, name: &str) -> u64 {
    name.bytes().fold(seed ^ 0x9e37_79b9_7f4a_7c15, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

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
}

impl HostData<'_> {
    /// Bytes this takes on the device.
    fn device_bytes(self) -> usize {
        match self {
            Self::Bytes(b) => b.len(),
            Self::F32AsBf16(v) => 2 * v.len(),
            Self::F32(v) => 4 * v.len(),
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
    /// Tensors that came in bf16 from the source (no f32 round trip).
    direct: usize,
}

/// Streams tensors to the device through pinned staging buffers used in
/// turn: the host fills a buffer (in parallel) and enqueues its copy on the
/// runner's stream, then moves on, waiting on a buffer's event only when it
/// comes round again. Pageable copies run at a seventh of pinned speed, and
/// a sync per tensor would serialize reads and copies; this way the copies
/// hide behind the reads and there is one sync at the end.
struct Stager<'g> {
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
    fn new(gpu: &'g Gpu, total_bytes: usize) -> Result<Self, CudaError> {
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
    fn tensor(&mut self, source: &dyn TensorSource, p: &Placement) -> Result<(), CudaError> {
        let t = Instant::now();
        self.stats.tensors += 1;
        let numel: usize = p.shape.iter().product();
        if p.dtype == Dtype::Bf16 {
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
        let h = source.load(&p.name)?;
        check_shape(p, &h.shape)?;
        self.stats.source += t.elapsed();
        let data = match p.dtype {
            Dtype::Bf16 => HostData::F32AsBf16(&h.data),
            Dtype::F32 => HostData::F32(&h.data),
        };
        self.put(p.dst, data)
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
    fn finish(mut self) -> Result<(), CudaError> {
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
    fn fused_parts_land_at_their_row_offsets() {
        let (g, i) = fused_part("model.layers.3.self_attn.k_proj.weight").unwrap_or_default();
        assert_eq!((g.as_str(), i), ("model.layers.3.qkv", 1));
        let (g, i) = fused_part("model.layers.0.mlp.up_proj.weight").unwrap_or_default();
        assert_eq!((g.as_str(), i), ("model.layers.0.gate_up", 1));
        assert!(fused_part("model.layers.0.self_attn.o_proj.weight").is_none());
        assert!(fused_part("model.norm.weight").is_none());
    }

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

    #[test]
    fn matrices_are_bf16_and_vectors_f32() {
        assert!(dtype_of("x", &[4, 4]) == Dtype::Bf16);
        assert!(dtype_of("x", &[4]) == Dtype::F32);
    }
}
