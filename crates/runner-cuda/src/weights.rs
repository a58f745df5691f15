//! Model weights on the device in one arena: matrices in bf16 (q/k/v and
//! gate/up fused row-wise, as on the CPU), norms, biases and the rotary
//! tables in f32. File weights stream through a few pinned staging buffers
//! (see [`Stager`]): bf16/f16 tensors go in without an f32 round trip, and
//! host reads overlap the copies; random weights (`--load-format dummy`) are
//! generated on the device.
//!
//! With [`WeightFormat::Fp8`] (`--quantization fp8`) the decoder's weight
//! matrices (q/k/v, o, gate/up, down) are kept in e4m3 with one f32 scale
//! per output channel: each layer's matrices arrive in bf16 in a one-layer
//! staging arena (from the file, or generated) and `quantize_rows_e4m3`
//! writes them into the weights arena, in order on the stream, so the next
//! layer's copies reuse the staging memory. The embeddings stay bf16; the
//! LM head does too unless `model.fp8_lm_head` asks for it in e4m3
//! (`WeightFormat::Fp8 { lm_head: true }`): it is then quantized like a
//! layer matrix into the e4m3 region, from staging (`lm_head.weight`) or,
//! when tied, from the bf16 embedding table, which stays for the token
//! lookup (the FP8 head is a second copy). Matrices `model.fp8_ignore`
//! names ([`Fp8Keep`]) stay bf16 too, placed outside the e4m3 region.

use std::time::{Duration, Instant};

use cudarc::driver::CudaEvent;
use half::bf16;
use ingot_models::llama::{expected_shapes, mlp_norm_name, POST_ATTN_NORM, POST_MLP_NORM};
use ingot_models::{ModelConfig, ModelError, TensorSource};
use rayon::prelude::*;

use crate::device::{Arena, Arg, DevPtr, Gpu, Kernel, Pinned};
use crate::Fp8Keep;
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

/// How the decoder's weight matrices are stored on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// bf16 (the file's bf16; f16, f32 and dequantized GGUF rows rounded).
    #[default]
    Bf16,
    /// e4m3 rows, then one f32 scale per row (output channel) at the next
    /// 256-byte boundary (the layout of `fp8.cu`).
    Fp8 {
        /// The LM head in e4m3 too (`model.fp8_lm_head`).
        lm_head: bool,
    },
}

impl WeightFormat {
    /// Whether the layer matrices are e4m3.
    pub fn is_fp8(self) -> bool {
        matches!(self, Self::Fp8 { .. })
    }

    /// Whether the LM head is e4m3.
    pub fn fp8_lm_head(self) -> bool {
        matches!(self, Self::Fp8 { lm_head: true })
    }
}

/// The untied LM head's tensor.
const LM_HEAD: &str = "lm_head.weight";
/// The embedding table (the LM head when tied).
const EMBED: &str = "model.embed_tokens.weight";

/// Bytes of an e4m3 matrix of `rows` x `cols` and its row scales.
pub fn fp8_matrix_bytes(rows: usize, cols: usize) -> usize {
    fp8_scales_offset(rows, cols) + rows * 4
}

/// Where the row scales of an e4m3 matrix start, from its base.
pub fn fp8_scales_offset(rows: usize, cols: usize) -> usize {
    (rows * cols).next_multiple_of(256)
}

/// A layer's quantized matrices, in the order their last tensors load.
const FP8_GROUPS: [&str; 4] = ["qkv", "o_proj", "gate_up", "down"];

/// The file tensors of each of [`FP8_GROUPS`] (q/k/v, o, gate/up, down).
const FP8_GROUP_TENSORS: [usize; 4] = [3, 1, 2, 1];

/// `(rows, cols)` of a layer's matrix `group` (see [`FP8_GROUPS`]).
fn group_shape(config: &ModelConfig, group: &str) -> (usize, usize) {
    let (d, q, kv, ff) = (
        config.hidden_size,
        config.q_dim(),
        config.kv_dim(),
        config.intermediate_size,
    );
    match group {
        "qkv" => (q + 2 * kv, d),
        "o_proj" => (d, q),
        "gate_up" => (2 * ff, d),
        _ => (d, ff),
    }
}

/// `(layer, group, part)` of a layer weight matrix kept in e4m3.
fn fp8_part(name: &str) -> Option<(usize, &'static str, usize)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, leaf) = rest.split_once('.')?;
    let (group, part) = match leaf {
        "self_attn.q_proj.weight" => ("qkv", 0),
        "self_attn.k_proj.weight" => ("qkv", 1),
        "self_attn.v_proj.weight" => ("qkv", 2),
        "self_attn.o_proj.weight" => ("o_proj", 0),
        "mlp.gate_proj.weight" => ("gate_up", 0),
        "mlp.up_proj.weight" => ("gate_up", 1),
        "mlp.down_proj.weight" => ("down", 0),
        _ => return None,
    };
    Some((layer.parse().ok()?, group, part))
}

/// Whether tensor `name` is written to FP8 staging rather than the arena
/// (a quantized layer matrix, or an untied e4m3 LM head).
fn staged_for_fp8(name: &str, format: WeightFormat, keep: &Fp8Keep) -> bool {
    (format.is_fp8() && quantized_part(name, keep).is_some())
        || (format.fp8_lm_head() && name == LM_HEAD)
}

/// [`fp8_part`] of a matrix that `keep` does not keep in bf16.
fn quantized_part(name: &str, keep: &Fp8Keep) -> Option<(usize, &'static str, usize)> {
    fp8_part(name).filter(|(layer, group, _)| !keep.keeps(*layer, group_index(group)))
}

/// Index of `group` in [`FP8_GROUPS`].
fn group_index(group: &str) -> usize {
    FP8_GROUPS.iter().position(|g| *g == group).unwrap_or(0)
}

/// Byte offset of `group` in the one-layer staging arena (bf16).
fn staging_offset(config: &ModelConfig, group: &str) -> usize {
    FP8_GROUPS
        .iter()
        .take_while(|g| **g != group)
        .map(|g| {
            let (rows, cols) = group_shape(config, g);
            (rows * cols * 2).next_multiple_of(256)
        })
        .sum()
}

/// A layer matrix staged in bf16 at `staged`, quantized into `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fp8Matrix {
    staged: DevPtr,
    dst: DevPtr,
    rows: usize,
    cols: usize,
}

/// Which layer's matrices are in staging and when they are complete.
/// Staging holds one layer, so a layer's tensors must load together.
struct Fp8Progress {
    /// Per layer: its quantized matrices and the tensors still to come.
    layers: Vec<([Option<Fp8Matrix>; 4], usize)>,
    /// The layer whose tensors are in staging.
    open: Option<usize>,
}

impl Fp8Progress {
    /// Notes that a staged tensor of `layer` is in (its copy enqueued);
    /// after the layer's last, returns its matrices to quantize.
    fn note_staged(
        &mut self,
        layer: usize,
        name: &str,
    ) -> Result<Option<[Option<Fp8Matrix>; 4]>, CudaError> {
        if self.open.is_some_and(|open| open != layer) {
            return Err(CudaError::Unsupported(format!(
                "{name} loads before the previous layer's matrices are complete (FP8 staging holds one layer)"
            )));
        }
        let (matrices, left) = self
            .layers
            .get_mut(layer)
            .ok_or_else(|| CudaError::Unsupported(format!("{name}: no such layer")))?;
        *left = left.saturating_sub(1);
        if *left > 0 {
            self.open = Some(layer);
            return Ok(None);
        }
        self.open = None;
        Ok(Some(*matrices))
    }

    /// Fails unless every layer was quantized.
    fn finish(&self) -> Result<(), CudaError> {
        match self.layers.iter().position(|(_, left)| *left > 0) {
            Some(slot) => Err(CudaError::Unsupported(format!(
                "weight slot {slot}'s matrices are incomplete (a layer, or after the layers the FP8 LM head)"
            ))),
            None => Ok(()),
        }
    }
}

/// Enqueues `quantize_rows_e4m3` over staged matrices.
fn quantize(gpu: &Gpu, kernel: &Kernel, matrices: &[Option<Fp8Matrix>]) -> Result<(), CudaError> {
    for m in matrices.iter().flatten() {
        let scales = m.dst + fp8_scales_offset(m.rows, m.cols) as u64;
        let args = [
            Arg::Ptr(m.staged),
            Arg::Ptr(m.dst),
            Arg::Ptr(scales),
            Arg::I32(m.cols as i32),
        ];
        gpu.launch(kernel, (m.rows as u32, 1, 1), 256, 0, &args)?;
    }
    Ok(())
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
    /// `[start, end)` of the e4m3 layer matrices ([`WeightFormat::Fp8`]).
    pub fp8_region: Option<(DevPtr, DevPtr)>,
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
    /// Where its bytes are written.
    dst: DevPtr,
    /// FP8: the quantizer's slot (its layer, or the LM head's after the
    /// layers) this tensor's copy fills part of; quantized from `dst` once
    /// the slot is complete.
    fp8_slot: Option<usize>,
    /// FP8: the e4m3 base the model reads instead of `dst` (not for a tied
    /// embedding table, which the token lookup reads in bf16).
    quantized: Option<DevPtr>,
}

impl Placement {
    /// The pointer the model reads.
    fn home(&self) -> DevPtr {
        self.quantized.unwrap_or(self.dst)
    }
}

/// The carved arena: tensors, rotary tables, and for FP8 the quantizer
/// and the e4m3 region.
struct Layout {
    placements: Vec<Placement>,
    tables: RopeTables,
    fp8: Option<Fp8Layout>,
}

/// Every layer's e4m3 matrices (and the LM head's, when it is e4m3), and
/// the address range they fill.
struct Fp8Layout {
    /// `None`: kept in bf16.
    layers: Vec<[Option<Fp8Matrix>; 4]>,
    /// The e4m3 LM head, quantized from its staged tensor or the tied
    /// embedding table (`staged` set when the table is placed).
    head: Option<Fp8Matrix>,
    region: (DevPtr, DevPtr),
}

impl Fp8Layout {
    /// The quantizer's slots: each layer's matrices and tensor count, then
    /// the head's (one tensor: `lm_head.weight` or the embedding table).
    fn progress(&self) -> Fp8Progress {
        let layers = self.layers.iter().map(|m| (*m, staged_tensors(m)));
        let head = self.head.map(|h| ([Some(h), None, None, None], 1));
        Fp8Progress {
            layers: layers.chain(head).collect(),
            open: None,
        }
    }
}

impl DeviceWeights {
    /// Bytes the weights occupy on the device.
    pub fn bytes(config: &ModelConfig, format: WeightFormat, keep: &Fp8Keep) -> usize {
        let table = config.max_context * (config.head_dim / 2) * 4;
        let fp8 = format.is_fp8();
        let fp8_head = if format.fp8_lm_head() {
            Arena::size_of([fp8_matrix_bytes(config.vocab_size, config.hidden_size)])
        } else {
            0
        };
        let fp8_layers: usize = (0..config.num_layers)
            .map(|layer| {
                Arena::size_of(
                    FP8_GROUPS
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| !keep.keeps(layer, *i))
                        .map(|(_, g)| {
                            let (rows, cols) = group_shape(config, g);
                            fp8_matrix_bytes(rows, cols)
                        }),
                )
            })
            .sum();
        Arena::size_of(
            expected_shapes(config)
                .iter()
                .filter(|(name, _)| !staged_for_fp8(name, format, keep))
                .map(|(name, shape)| {
                    shape.iter().product::<usize>() * dtype_of(name, shape).size()
                }),
        ) + Arena::size_of(vec![table; rope_table_count(config)])
            + if fp8 { fp8_layers } else { 0 }
            + fp8_head
    }

    /// Bytes of the bf16 staging arena of an FP8 load: one layer, or an
    /// untied e4m3 LM head if larger (it loads alone, after the layers).
    fn staging_bytes(config: &ModelConfig, format: WeightFormat) -> usize {
        let head = if format.fp8_lm_head() && !config.tie_word_embeddings {
            config.vocab_size * config.hidden_size * 2
        } else {
            0
        };
        staging_offset(config, "").max(head)
    }

    /// Allocates the arena and fills it from `source`.
    pub fn load(
        gpu: &Gpu,
        config: &ModelConfig,
        source: &dyn TensorSource,
        format: WeightFormat,
        keep: &Fp8Keep,
        progress: &dyn Fn(usize, usize),
    ) -> Result<Self, CudaError> {
        let mut arena = Arena::new(gpu, "weights", Self::bytes(config, format, keep))?;
        let staging = match format {
            WeightFormat::Fp8 { .. } => {
                let bytes = Self::staging_bytes(config, format);
                Some(Arena::new(gpu, "fp8 staging", bytes)?)
            }
            WeightFormat::Bf16 => None,
        };
        let staging_base = staging.as_ref().map(Arena::base);
        let layout = Self::place(config, &mut arena, staging_base, format, keep)?;
        let mut quantizer = match &layout.fp8 {
            Some(fp8) => Some((gpu.kernel("quantize_rows_e4m3")?, fp8.progress())),
            None => None,
        };
        // After a tensor's copy (or fill) is enqueued: quantize its layer
        // once complete (stream order keeps the next layer's copies out
        // of staging until then).
        let mut staged = |p: &Placement| -> Result<(), CudaError> {
            let (Some((kernel, progress)), Some(slot)) = (&mut quantizer, p.fp8_slot) else {
                return Ok(());
            };
            match progress.note_staged(slot, &p.name)? {
                Some(matrices) => quantize(gpu, kernel, &matrices),
                None => Ok(()),
            }
        };
        let placements = &layout.placements;
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
                    staged(p)?;
                    progress(i + 1, total);
                }
            }
            None => {
                let mut stager = Stager::new(gpu, Self::bytes(config, format, keep))?;
                for (i, p) in placements.iter().enumerate() {
                    stager.tensor(source, p)?;
                    staged(p)?;
                    progress(i + 1, total);
                }
                stager.finish()?;
            }
        }
        if let Some((_, progress)) = &quantizer {
            progress.finish()?;
        }
        let tables = &layout.tables;
        let (cos_t, sin_t) = config.rope.tables(config.head_dim, config.max_context);
        gpu.upload(tables.cos, &cos_t)?;
        gpu.upload(tables.sin, &sin_t)?;
        if let (Some((cos, sin)), Some(w)) = (tables.local, &config.block.sliding_window) {
            let (cos_t, sin_t) = w.local_rope.tables(config.head_dim, config.max_context);
            gpu.upload(cos, &cos_t)?;
            gpu.upload(sin, &sin_t)?;
        }
        gpu.sync()?;
        // The staging arena goes back here, its last reads done.
        drop(staging);
        Self::assemble(config, layout, arena)
    }

    /// Carves the arena into tensors: where each named tensor lands (fused
    /// matrices take their parts at row offsets), then the rotary tables.
    /// With `staging` (FP8), the layer matrices' e4m3 homes (and an e4m3
    /// LM head's) come first, in one region, and their tensors are written
    /// to the staging arena.
    fn place(
        config: &ModelConfig,
        arena: &mut Arena,
        staging: Option<DevPtr>,
        format: WeightFormat,
        keep: &Fp8Keep,
    ) -> Result<Layout, CudaError> {
        let shapes = expected_shapes(config);
        let mut placements = Vec::with_capacity(shapes.len());
        let mut fused: Vec<(String, DevPtr)> = Vec::new();
        let mut fp8 = match staging {
            Some(staging) => Some(Self::place_fp8(config, arena, staging, format, keep)?),
            None => None,
        };
        let head_slot = config.num_layers;
        for (name, shape) in &shapes {
            let dtype = dtype_of(name, shape);
            if let Some(head) = fp8
                .as_ref()
                .and_then(|f| f.head)
                .filter(|_| name == LM_HEAD)
            {
                placements.push(Placement {
                    name: name.clone(),
                    shape: shape.clone(),
                    dtype,
                    dst: head.staged,
                    fp8_slot: Some(head_slot),
                    quantized: Some(head.dst),
                });
                continue;
            }
            if let (Some(fp8), Some((layer, group, part))) = (&fp8, quantized_part(name, keep)) {
                let matrix = fp8
                    .layers
                    .get(layer)
                    .and_then(|m| m[group_index(group)])
                    .ok_or_else(|| CudaError::Unsupported(format!("{name}: no such layer")))?;
                let rows = if part == 0 {
                    0
                } else {
                    fused_offset_rows(config, group, part)
                };
                placements.push(Placement {
                    name: name.clone(),
                    shape: shape.clone(),
                    dtype,
                    dst: matrix.staged + (rows * row_bytes(shape, dtype)) as u64,
                    fp8_slot: Some(layer),
                    quantized: Some(matrix.dst),
                });
                continue;
            }
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
            // A tied e4m3 head is quantized from the bf16 table once it is in.
            let tied_head = fp8
                .as_mut()
                .and_then(|f| f.head.as_mut())
                .filter(|_| name == EMBED && config.tie_word_embeddings);
            let fp8_slot = tied_head.map(|head| {
                head.staged = dst;
                head_slot
            });
            placements.push(Placement {
                name: name.clone(),
                shape: shape.clone(),
                dtype,
                dst,
                fp8_slot,
                quantized: None,
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
        Ok(Layout {
            placements,
            tables: RopeTables { cos, sin, local },
            fp8,
        })
    }

    /// Takes every layer's e4m3 matrices from `arena` (one region), then
    /// an e4m3 LM head's, and pairs them with their places in the
    /// `staging` arena (the head's start there; a tied one's source is set
    /// when the embedding table is placed).
    fn place_fp8(
        config: &ModelConfig,
        arena: &mut Arena,
        staging: DevPtr,
        format: WeightFormat,
        keep: &Fp8Keep,
    ) -> Result<Fp8Layout, CudaError> {
        let mut layers = Vec::with_capacity(config.num_layers);
        let (mut start, mut end) = (None, 0);
        for layer in 0..config.num_layers {
            let mut matrices = [None; 4];
            for (i, (m, group)) in matrices.iter_mut().zip(FP8_GROUPS).enumerate() {
                if keep.keeps(layer, i) {
                    continue;
                }
                let (rows, cols) = group_shape(config, group);
                let bytes = fp8_matrix_bytes(rows, cols);
                let dst = arena.take(bytes)?;
                start.get_or_insert(dst);
                end = dst + bytes as u64;
                *m = Some(Fp8Matrix {
                    staged: staging + staging_offset(config, group) as u64,
                    dst,
                    rows,
                    cols,
                });
            }
            layers.push(matrices);
        }
        let head = if format.fp8_lm_head() {
            let (rows, cols) = (config.vocab_size, config.hidden_size);
            let bytes = fp8_matrix_bytes(rows, cols);
            let dst = arena.take(bytes)?;
            start.get_or_insert(dst);
            end = dst + bytes as u64;
            Some(Fp8Matrix {
                staged: staging,
                dst,
                rows,
                cols,
            })
        } else {
            None
        };
        Ok(Fp8Layout {
            layers,
            head,
            region: (start.unwrap_or(end), end),
        })
    }

    /// The named pointers of a placed arena.
    fn assemble(config: &ModelConfig, layout: Layout, arena: Arena) -> Result<Self, CudaError> {
        let Layout {
            placements,
            tables,
            fp8,
        } = layout;
        let at = |n: &str| -> Result<DevPtr, CudaError> {
            placements
                .iter()
                .find(|p| p.name == n)
                .map(Placement::home)
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
        let embed = at(EMBED)?;
        let lm_head = match fp8.as_ref().and_then(|f| f.head) {
            Some(head) => head.dst,
            None if config.tie_word_embeddings => embed,
            None => at(LM_HEAD)?,
        };
        Ok(Self {
            embed,
            lm_head,
            norm: at("model.norm.weight")?,
            layers,
            cos: tables.cos,
            sin: tables.sin,
            local_rope: tables.local,
            fp8_region: fp8.map(|f| f.region),
            arena,
        })
    }
}

/// File tensors of a layer's quantized matrices (what staging receives).
fn staged_tensors(matrices: &[Option<Fp8Matrix>; 4]) -> usize {
    matrices
        .iter()
        .zip(FP8_GROUP_TENSORS)
        .filter(|(m, _)| m.is_some())
        .map(|(_, n)| n)
        .sum()
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
    use crate::test_configs::llama8b;

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

    #[test]
    fn fp8_takes_the_layer_matrices_only() {
        assert_eq!(
            fp8_part("model.layers.12.self_attn.v_proj.weight"),
            Some((12, "qkv", 2))
        );
        assert_eq!(
            fp8_part("model.layers.0.mlp.down_proj.weight"),
            Some((0, "down", 0))
        );
        assert_eq!(fp8_part("model.layers.0.self_attn.q_proj.bias"), None);
        assert_eq!(fp8_part("model.layers.0.input_layernorm.weight"), None);
        assert_eq!(fp8_part("model.embed_tokens.weight"), None);
        assert_eq!(fp8_part("lm_head.weight"), None);
    }

    #[test]
    fn fp8_scales_follow_the_bytes_at_a_256_byte_boundary() {
        assert_eq!(fp8_scales_offset(3, 100), 512);
        assert_eq!(fp8_scales_offset(2, 128), 256);
        assert_eq!(fp8_matrix_bytes(3, 100), 512 + 12);
    }

    const FP8: WeightFormat = WeightFormat::Fp8 { lm_head: false };
    const FP8_HEAD: WeightFormat = WeightFormat::Fp8 { lm_head: true };

    /// An untied e4m3 head goes through staging (1 GiB in bf16 on the 8B,
    /// more than a layer's 436 MiB), a tied one is quantized from the
    /// embedding table in place.
    #[test]
    fn an_untied_fp8_head_is_staged_and_sizes_staging() {
        let c = llama8b();
        let none = Fp8Keep::default();
        let layer = DeviceWeights::staging_bytes(&c, FP8);
        assert_eq!(layer, staging_offset(&c, ""));
        assert_eq!(
            DeviceWeights::staging_bytes(&c, FP8_HEAD),
            128256 * 4096 * 2
        );
        assert!(staged_for_fp8(LM_HEAD, FP8_HEAD, &none));
        assert!(!staged_for_fp8(LM_HEAD, FP8, &none));
        assert!(!staged_for_fp8(EMBED, FP8_HEAD, &none));
        assert!(staged_for_fp8(
            "model.layers.3.mlp.up_proj.weight",
            FP8_HEAD,
            &none
        ));
        assert!(!staged_for_fp8(
            "model.layers.3.mlp.up_proj.weight",
            WeightFormat::Bf16,
            &none
        ));
        let mut tied = c.clone();
        tied.tie_word_embeddings = true;
        assert_eq!(DeviceWeights::staging_bytes(&tied, FP8_HEAD), layer);
    }

    /// The head is the quantizer's last slot, complete after one tensor,
    /// and the progress refuses it while a layer is still open (its
    /// staging would be overwritten).
    #[test]
    fn the_fp8_head_is_one_tensor_after_the_layers() {
        let m = Fp8Matrix {
            staged: 0,
            dst: 0,
            rows: 8,
            cols: 16,
        };
        let layout = Fp8Layout {
            layers: vec![[Some(m); 4]; 2],
            head: Some(Fp8Matrix { rows: 32, ..m }),
            region: (0, 0),
        };
        let mut q = layout.progress();
        assert_eq!(q.layers.len(), 3);
        assert_eq!(q.layers[2].1, 1);
        assert!(matches!(q.note_staged(0, "q"), Ok(None)));
        assert!(q.note_staged(2, LM_HEAD).is_err());
        let mut q = layout.progress();
        let head = q.note_staged(2, LM_HEAD).ok().flatten();
        assert_eq!(head.and_then(|h| h[0]).map(|h| h.rows), Some(32));
        assert!(q.finish().is_err());
        let without = Fp8Layout {
            head: None,
            ..layout
        };
        assert_eq!(without.progress().layers.len(), 2);
    }

    /// The quantizer waits for a layer's seven matrices, refuses a
    /// second layer while one is open, and reports an unfinished layer.
    #[test]
    fn fp8_staging_holds_one_layer_at_a_time() {
        let m = Fp8Matrix {
            staged: 0,
            dst: 0,
            rows: 1,
            cols: 16,
        };
        // All seven tensors go through staging; a kept (bf16) o_proj and
        // down_proj take theirs straight to the arena.
        assert_eq!(staged_tensors(&[Some(m); 4]), 7);
        assert_eq!(staged_tensors(&[Some(m), None, Some(m), None]), 5);
        let mut q = Fp8Progress {
            layers: vec![([Some(m); 4], staged_tensors(&[Some(m); 4])); 2],
            open: None,
        };
        q.layers[0].1 = 2;
        assert!(matches!(q.note_staged(0, "a"), Ok(None)));
        assert_eq!(q.open, Some(0));
        assert!(q.note_staged(1, "b").is_err());
        assert!(matches!(q.note_staged(0, "a"), Ok(Some(_))));
        assert_eq!(q.open, None);
        assert!(q.finish().is_err());
    }
}
