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
//!
//! An FP8 checkpoint whose decoder matrices are all e4m3 with per-tensor
//! or per-channel scales, loaded with `model.cuda_weights = "native"`,
//! takes the same layout with `from_file`: each file tensor's e4m3 bytes
//! and row scales (a per-tensor scale repeated) are copied to their rows
//! of the fused matrix as they are, with no staging and no quantizer.
//!
//! With [`NativeBlocks`] (`model.cuda_weights = "native"`), the decoder
//! matrices a GGUF stores in Q8_0, Q4_0, Q4_1, Q4_K, Q5_K or Q6_K keep
//! their blocks ([`blocks`]): placed first, Q8_0 in one region and the
//! others in another (a weight pointer in either names its kind, as for
//! e4m3), each file tensor's blocks split into planes on the way in.
//!
//! [`groups`] names the decoder's matrices, [`fp8`] holds the e4m3 layout
//! and the quantizer, [`blocks`] the GGUF block layouts, [`stager`] the pinned
//! streaming; this module places the tensors and names the result.

mod blocks;
mod fp8;
mod groups;
mod stager;

use ingot_models::llama::{
    expected_shapes, is_sparse, mlp_norm_name, EXPERTS_DOWN, EXPERTS_GATE, EXPERTS_UP,
    POST_ATTN_NORM, POST_MLP_NORM, ROUTER,
};
use ingot_models::{ModelConfig, TensorSource};

use crate::device::{Arena, Arg, DevPtr, Gpu, Kernel};
use crate::gemm::KqMatrixInfo;
use crate::{CudaError, Fp8Keep};
use blocks::{BlocksLayout, PlacedBlocks, EMBED, LM_HEAD};
pub use blocks::{NativeBlocks, Q8_0_BLOCK, Q8_0_BLOCK_BYTES};
use fp8::{quantize, quantized_part, staged_for_fp8, Fp8Layout, Fp8Matrix};
use groups::group_index;
use stager::Stager;

/// Whether file tensor `name` is part of a decoder matrix (q/k/v, o,
/// gate/up, down of a layer).
pub(crate) fn is_decoder_matrix(name: &str) -> bool {
    groups::matrix_part(name).is_some()
}

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
    /// `[2 intermediate, hidden]` bf16: gate rows, then up rows (null on
    /// a layer of experts).
    pub gate_up: DevPtr,
    /// `[hidden, intermediate]` bf16 (null on a layer of experts).
    pub down: DevPtr,
    /// The experts that take the MLP's place on a sparse layer.
    pub experts: Option<ExpertWeights>,
}

/// A sparse layer's router and stacked experts, bf16.
#[derive(Debug, Clone, Copy)]
pub struct ExpertWeights {
    /// `[experts, hidden]`.
    pub router: DevPtr,
    /// `[experts, width, hidden]`.
    pub gate: DevPtr,
    /// `[experts, width, hidden]`.
    pub up: DevPtr,
    /// `[experts, hidden, width]`.
    pub down: DevPtr,
    /// FP8 gate and up stacks (e4m3 bytes at `gate` and `up`): their row
    /// scales, `[experts * width]` f32 each.
    pub gate_up_scales: Option<(DevPtr, DevPtr)>,
    /// FP8 down stack (e4m3 bytes at `down`): its row scales,
    /// `[experts * hidden]` f32.
    pub down_scales: Option<DevPtr>,
}

impl ExpertWeights {
    /// A sparse layer's experts, `gate_up` and `down` its FP8 matrices
    /// where they are e4m3 (gate's rows then up's in one matrix).
    fn new(
        router: DevPtr,
        (gate, up, down): (DevPtr, DevPtr, DevPtr),
        (gate_up, down_fp8): (Option<Fp8Matrix>, Option<Fp8Matrix>),
    ) -> Self {
        let (up, gate_up_scales) = match gate_up {
            Some(m) => {
                let half = m.rows() / 2;
                let (up_bytes, up_scales) = m.rows_at(half);
                (up_bytes, Some((m.scales(), up_scales)))
            }
            None => (up, None),
        };
        Self {
            router,
            gate,
            up,
            down,
            gate_up_scales,
            down_scales: down_fp8.map(|m| m.scales()),
        }
    }
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
        /// The e4m3 bytes and scales come from an FP8 checkpoint as they
        /// are (`model.cuda_weights = "native"`), not quantized from bf16.
        from_file: bool,
    },
}

impl WeightFormat {
    /// Whether the layer matrices are e4m3.
    pub fn is_fp8(self) -> bool {
        matches!(self, Self::Fp8 { .. })
    }

    /// Whether the LM head is e4m3.
    pub fn fp8_lm_head(self) -> bool {
        matches!(self, Self::Fp8 { lm_head: true, .. })
    }

    /// Whether the e4m3 matrices come from the file as they are.
    pub fn fp8_from_file(self) -> bool {
        matches!(
            self,
            Self::Fp8 {
                from_file: true,
                ..
            }
        )
    }
}

/// Where the scales of a matrix stored one byte a weight (e4m3, or Q8_0's
/// quants) start, from its base: the next 256-byte boundary after its
/// `rows x cols` bytes (`scales_after` in the kernels' common.cuh).
pub fn scales_offset(rows: usize, cols: usize) -> usize {
    (rows * cols).next_multiple_of(256)
}

/// All weights; pointers into `arena`.
pub struct DeviceWeights {
    pub embed: DevPtr,
    /// The embedding table is kept in GGUF blocks (`embed` is a k-quant
    /// header: the lookup runs `embed_kq`).
    pub embed_blocks: bool,
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
    /// `[start, end)` of the Q8_0 layer matrices ([`NativeBlocks`]).
    pub q8_region: Option<(DevPtr, DevPtr)>,
    /// `[start, end)` of the Q4_0/Q4_1/Q4_K/Q5_K/Q6_K layer matrices
    /// (each pointer the model reads there is a `KqMatrix` header).
    pub kq_region: Option<(DevPtr, DevPtr)>,
    /// Each k-quant matrix's header, device bytes and type.
    pub kq_matrices: Vec<(DevPtr, KqMatrixInfo)>,
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
    /// An FP8 checkpoint's bytes as they are; its row scales go to
    /// `scales`.
    E4m3 {
        scales: DevPtr,
    },
}

impl Dtype {
    fn size(self) -> usize {
        match self {
            Self::E4m3 { .. } => 1,
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
    /// embedding table, which the token lookup reads in bf16); GGUF blocks
    /// kept: the matrix's base (a k-quant matrix's header).
    quantized: Option<DevPtr>,
    /// GGUF blocks kept: each plane's destination (`dst` is the first).
    blocks: Option<PlacedBlocks>,
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
    blocks: Option<BlocksLayout>,
}

impl DeviceWeights {
    /// Bytes the weights occupy on the device.
    pub fn bytes(
        config: &ModelConfig,
        format: WeightFormat,
        keep: &Fp8Keep,
        native: &NativeBlocks,
    ) -> usize {
        let table = config.max_context * (config.head_dim / 2) * 4;
        let fp8 = format.is_fp8();
        let fp8_head = if format.fp8_lm_head() {
            Arena::size_of([fp8::fp8_matrix_bytes(
                config.lm_head_rows(),
                config.hidden_size,
            )])
        } else {
            0
        };
        Arena::size_of(
            expected_shapes(config)
                .iter()
                .filter(|(name, _)| {
                    !staged_for_fp8(name, format, keep) && !native.keeps_tensor(name)
                })
                .map(|(name, shape)| {
                    shape.iter().product::<usize>() * dtype_of(name, shape).size()
                }),
        ) + Arena::size_of(vec![table; rope_table_count(config)])
            + if fp8 {
                fp8::layer_bytes(config, keep)
            } else {
                0
            }
            + fp8_head
            + native.bytes(config)
    }

    /// Allocates the arena and fills it from `source`.
    pub fn load(
        gpu: &Gpu,
        config: &ModelConfig,
        source: &dyn TensorSource,
        format: WeightFormat,
        (keep, native): (&Fp8Keep, &NativeBlocks),
        progress: &dyn Fn(usize, usize),
    ) -> Result<Self, CudaError> {
        let bytes = Self::bytes(config, format, keep, native);
        let mut arena = Arena::new(gpu, "weights", bytes)?;
        let staging = match format {
            WeightFormat::Fp8 { from_file, .. } if !from_file || format.fp8_lm_head() => {
                let bytes = fp8::staging_bytes(config, format);
                Some(Arena::new(gpu, "fp8 staging", bytes)?)
            }
            WeightFormat::Fp8 { .. } | WeightFormat::Bf16 => None,
        };
        // An FP8 checkpoint's matrices need no staging (the layout still
        // places them; their staged addresses go unused).
        let staging_base = staging
            .as_ref()
            .map(Arena::base)
            .or(format.is_fp8().then_some(0));
        let layout = Self::place(config, &mut arena, staging_base, format, (keep, native))?;
        let mut quantizer = match &layout.fp8 {
            Some(fp8) => Some((
                gpu.kernel("quantize_rows_e4m3")?,
                fp8.progress(format.fp8_from_file()),
            )),
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
                let fills = [
                    gpu.kernel("fill_uniform_bf16")?,
                    gpu.kernel("fill_uniform_f32")?,
                ];
                for (i, p) in placements.iter().enumerate() {
                    fill_random(gpu, &fills, p, (seed, config, source))?;
                    staged(p)?;
                    progress(i + 1, total);
                }
            }
            None => {
                let mut stager = Stager::new(gpu, bytes)?;
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
        for (at, header) in layout.blocks.iter().flat_map(|b| &b.headers) {
            gpu.upload(*at, header)?;
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
        (keep, native): (&Fp8Keep, &NativeBlocks),
    ) -> Result<Layout, CudaError> {
        let shapes = expected_shapes(config);
        let mut placements = Vec::with_capacity(shapes.len());
        let mut fused: Vec<(String, DevPtr)> = Vec::new();
        let mut fp8 = match staging {
            Some(staging) => Some(fp8::place(config, arena, staging, format, keep)?),
            None => None,
        };
        let kept = BlocksLayout::place(config, arena, native)?;
        let head_slot = config.num_layers;
        for (name, shape) in &shapes {
            let dtype = dtype_of(name, shape);
            if let Some((blocks, home)) = kept
                .as_ref()
                .and_then(|k| Some((k.destinations(config, name)?, k.home(name)?)))
            {
                placements.push(Placement {
                    name: name.clone(),
                    shape: shape.clone(),
                    dtype,
                    dst: blocks.planes[0],
                    fp8_slot: None,
                    quantized: Some(home),
                    blocks: Some(blocks),
                });
                continue;
            }
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
                    blocks: None,
                });
                continue;
            }
            if let (Some(fp8), Some((layer, group, part))) = (&fp8, quantized_part(name, keep)) {
                let matrix = fp8
                    .layers
                    .get(layer)
                    .and_then(|m| m[group_index(group)])
                    .ok_or_else(|| CudaError::Unsupported(format!("{name}: no such layer")))?;
                let rows = fp8::part_rows(config, layer, group, part);
                let placement = if format.fp8_from_file() {
                    let (dst, scales) = matrix.rows_at(rows);
                    Placement {
                        name: name.clone(),
                        shape: shape.clone(),
                        dtype: Dtype::E4m3 { scales },
                        dst,
                        fp8_slot: None,
                        quantized: Some(matrix.dst),
                        blocks: None,
                    }
                } else {
                    Placement {
                        name: name.clone(),
                        shape: shape.clone(),
                        dtype,
                        dst: matrix.staged_at(rows),
                        fp8_slot: Some(layer),
                        quantized: Some(matrix.dst),
                        blocks: None,
                    }
                };
                placements.push(placement);
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
                blocks: None,
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
            blocks: kept,
        })
    }

    /// The named pointers of a placed arena.
    fn assemble(config: &ModelConfig, layout: Layout, arena: Arena) -> Result<Self, CudaError> {
        let Layout {
            placements,
            tables,
            fp8,
            blocks,
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
            let sparse = is_sparse(config, i);
            let (gate_up, down, experts) = if sparse {
                let fp8_matrix = |g: &str| fp8.as_ref().and_then(|f| f.layers[i][group_index(g)]);
                let experts = ExpertWeights::new(
                    at(&p(ROUTER))?,
                    (
                        at(&p(EXPERTS_GATE))?,
                        at(&p(EXPERTS_UP))?,
                        at(&p(EXPERTS_DOWN))?,
                    ),
                    (fp8_matrix("gate_up"), fp8_matrix("down")),
                );
                (0, 0, Some(experts))
            } else {
                let dense = (
                    at(&p("mlp.gate_proj.weight"))?,
                    at(&p("mlp.down_proj.weight"))?,
                );
                (dense.0, dense.1, None)
            };
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
                gate_up,
                down,
                experts,
            });
        }
        let embed = at(EMBED)?;
        let embed_blocks = blocks.as_ref().is_some_and(|b| b.home(EMBED).is_some());
        let lm_head = match fp8.as_ref().and_then(|f| f.head) {
            Some(head) => head.dst,
            None if config.tie_word_embeddings => embed,
            None => at(LM_HEAD)?,
        };
        Ok(Self {
            embed,
            embed_blocks,
            lm_head,
            norm: at("model.norm.weight")?,
            layers,
            cos: tables.cos,
            sin: tables.sin,
            local_rope: tables.local,
            fp8_region: fp8.map(|f| f.region),
            q8_region: blocks.as_ref().and_then(|b| b.q8_region),
            kq_region: blocks.as_ref().and_then(|b| b.kq_region),
            kq_matrices: blocks.map(|b| b.kq_matrices).unwrap_or_default(),
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

/// Fills placement `p` with seeded uniform values on the device
/// (`--load-format dummy`; `fills`: the bf16 and f32 fill kernels). Same
/// distributions as the CPU's DummySource: norms near 1, everything else
/// small and centred.
fn fill_random(
    gpu: &Gpu,
    fills: &[Kernel; 2],
    p: &Placement,
    (seed, config, source): (u64, &ModelConfig, &dyn TensorSource),
) -> Result<(), CudaError> {
    let n: usize = p.shape.iter().product();
    let (scale, offset) = if p.name.contains("norm") {
        (0.2, 1.0)
    } else {
        (0.08, 0.0)
    };
    let kernel = match p.dtype {
        Dtype::Bf16 => &fills[0],
        Dtype::F32 => &fills[1],
        Dtype::E4m3 { .. } => {
            return Err(CudaError::Unsupported(format!(
                "{}: random weights are never an FP8 checkpoint's",
                p.name
            )))
        }
    };
    // A tensor-parallel rank fills its slice with the whole tensor's values
    // at the slice's indices (a tied model's head: the embedding's).
    let split = config.shard.and_then(|s| s.split(&p.name, &p.shape));
    let (inner, len, full, start) = match split {
        Some(s) => {
            let inner: usize = p.shape[s.dim + 1..].iter().product();
            (inner, s.len, s.full, s.start)
        }
        None => (n.max(1), 1, 1, 0),
    };
    let name = if p.name == LM_HEAD && !source.contains(LM_HEAD) {
        EMBED
    } else {
        &p.name
    };
    let args = [
        Arg::Ptr(p.dst),
        Arg::I64(n as i64),
        Arg::I64(name_hash(seed, name) as i64),
        Arg::F32(scale),
        Arg::F32(offset),
        Arg::I64(inner as i64),
        Arg::I64(len as i64),
        Arg::I64(full as i64),
        Arg::I64(start as i64),
    ];
    gpu.launch(kernel, (1024, 1, 1), 256, 0, &args)
}

/// A stable 64-bit hash of (seed, tensor name).
fn name_hash(seed: u64, name: &str) -> u64 {
    name.bytes().fold(seed ^ 0x9e37_79b9_7f4a_7c15, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
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
    fn matrices_are_bf16_and_vectors_f32() {
        assert!(dtype_of("x", &[4, 4]) == Dtype::Bf16);
        assert!(dtype_of("x", &[4]) == Dtype::F32);
    }
}
