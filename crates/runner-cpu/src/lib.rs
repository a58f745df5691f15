//! [`ModelRunner`] on the CPU: the weights, the KV pool and the block-level
//! ops ([`block_ops`]) that the architecture files of `ingot-arch` drive.
//!
//! Two weight paths ([`CpuWeights`]):
//! - native (the default for quantized GGUFs): tensors stay in their GGUF
//!   blocks, borrowed from the memory map, and are multiplied with int8
//!   activations ([`quant`]). Decode reads ~5 bits per weight instead of 32,
//!   at the cost of activation rounding (like llama.cpp's CPU path).
//! - f32: weights dequantized exactly at load. That costs 4 bytes per
//!   parameter of memory bandwidth per decoded token (bf16 halves it), but
//!   makes this backend an exact reference: its logits match a plain f32
//!   forward pass to rounding, and the CUDA backend is checked against it.
//!
//! Activations are f32 throughout. q/k/v and gate/up projections are fused
//! into one matmul each. Every kernel is batch-invariant (see [`matmul`],
//! [`quant`]): a sequence's logits are bit-identical whatever it is batched
//! with.

mod attention;
mod block_ops;
mod eagle;
pub mod encoder;
mod experts;
mod kv_memory;
pub mod matmul;
mod matrix;
mod ops;
pub mod panel_matmul;
pub mod quant;
mod sharded;
mod simd;

use attention::{LayerKv, MAX_BLOCK_SIZE, MAX_HEAD_DIM};
use block_ops::CpuOps;
use experts::{ExpertScratch, Experts};
use ingot_kv_cache::{BlockId, KvLayout};
use ingot_models::eagle::{EagleHeadConfig, EagleHeadWeights};
use ingot_models::llama::{EXPERTS_DOWN, EXPERTS_GATE, EXPERTS_UP, ROUTER};
use ingot_models::{
    BlockData, HostTensor, LlamaWeights, MlpWeights, ModelConfig, ModelError, TensorSource,
};
use ingot_runner::{DraftHead, ForwardBatch, KvCacheShape, ModelRunner, RunnerError};
use kv_memory::KvSlots;
use matrix::Matrix;
pub use matrix::WeightDtype;
pub use quant::QuantKind;
use quant::{ActScratch, QuantMatrix};
pub use sharded::forward_sharded;
use std::sync::Arc;

/// The embedding tensor's name.
const EMBED: &str = "model.embed_tokens.weight";
/// The untied LM head's name.
const LM_HEAD: &str = "lm_head.weight";

/// How [`CpuRunner::load`] keeps weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuWeights {
    /// Quantized GGUF tensors (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
    /// Q6_K) stay in their blocks and use the native kernels; any other
    /// tensor is dequantized and stored per [`CpuRunnerConfig::weight_dtype`].
    #[default]
    Native,
    /// As [`CpuWeights::Native`], the 32-block formats on AMX tiles
    /// ([`quant::amx_available`]; refused without).
    Amx,
    /// Every tensor dequantized to f32 at load (then stored per
    /// `weight_dtype`): the exact reference path.
    F32,
}

/// Sizes chosen by the caller.
#[derive(Debug, Clone, Copy)]
pub struct CpuRunnerConfig {
    /// KV memory, in blocks of every layer. A model with sliding-window
    /// layers gets the same memory as pages of fewer layers (more of them),
    /// shared by its layer groups (see [`ingot_runner::kv_layout_of`]).
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size: usize,
    /// Storage type of the weight matrices (norms and biases stay f32).
    pub weight_dtype: WeightDtype,
}

/// One decoder block with fused projections.
struct Layer {
    attn_norm: Vec<f32>,
    /// `[q_dim + 2 * kv_dim, hidden]`: q, k, v rows stacked.
    qkv: Matrix,
    qkv_bias: Option<Vec<f32>>,
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    o_proj: Matrix,
    mlp_norm: Vec<f32>,
    /// RMSNorms of the attention and MLP outputs (Gemma 3).
    post_norms: Option<(Vec<f32>, Vec<f32>)>,
    mlp: Mlp,
}

/// A block's MLP.
enum Mlp {
    Dense {
        /// `[2 * intermediate, hidden]`: gate rows then up rows.
        gate_up: Matrix,
        down: Matrix,
    },
    Experts(Experts),
}

impl Layer {
    /// Every weight matrix of the block.
    fn matrices(&self) -> Box<dyn Iterator<Item = &Matrix> + '_> {
        let attention = [&self.qkv, &self.o_proj].into_iter();
        match &self.mlp {
            Mlp::Dense { gate_up, down } => Box::new(attention.chain([gate_up, down])),
            Mlp::Experts(e) => Box::new(attention.chain(e.matrices())),
        }
    }
}

/// Activation buffers, grown to the largest batch seen, never shrunk.
#[derive(Default)]
struct Workspace {
    x: Vec<f32>,
    xn: Vec<f32>,
    qkv: Vec<f32>,
    q: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    last: Vec<f32>,
    logits: Vec<f32>,
    /// Quantized activations for the native kernels.
    acts: ActScratch,
    /// The expert blocks' buffers.
    experts: ExpertScratch,
    positions: Vec<usize>,
    /// The captured hidden states (see [`ModelRunner::capture_hidden`]).
    captured: Vec<f32>,
}

impl Workspace {
    /// The gated MLP of residual rows `..t` of `x` (width `d`, `ff` wide):
    /// RMSNorm by `norm`, gate/up, `act`, down; the output lands in `proj`.
    fn gated_mlp(
        &mut self,
        (t, d, ff): (usize, usize, usize),
        (norm, eps): (&[f32], f32),
        (gate_up, down): (&Matrix, &Matrix),
        act: ingot_arch::Activation,
    ) {
        grow(&mut self.xn, t * d);
        grow(&mut self.gate_up, t * 2 * ff);
        grow(&mut self.act, t * ff);
        grow(&mut self.proj, t * d);
        ops::rms_norm(&self.x[..t * d], norm, eps, &mut self.xn[..t * d]);
        gate_up.linear(&self.xn, &mut self.gate_up, (t, d, 2 * ff), &mut self.acts);
        ops::gated_mul(
            act,
            &self.gate_up[..t * 2 * ff],
            &mut self.act[..t * ff],
            ff,
        );
        down.linear(&self.act, &mut self.proj, (t, ff, d), &mut self.acts);
    }
}

fn grow(buf: &mut Vec<f32>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
}

/// The CPU backend.
pub struct CpuRunner {
    config: ModelConfig,
    /// Shared with an EAGLE head that has none of its own.
    embed: Arc<Matrix>,
    /// `None` when tied to `embed`.
    lm_head: Option<Matrix>,
    norm: Vec<f32>,
    layers: Vec<Layer>,
    /// One K/V tensor per layer of a page: the groups' layers share them
    /// (see [`KvLayout`]).
    kv: Vec<LayerKv>,
    kv_shape: KvCacheShape,
    layout: KvLayout,
    /// `[position, head_dim / 2]` tables.
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// The tables of the sliding layers' own rope base (Gemma 3); empty
    /// when every layer uses the global one.
    local_cos: Vec<f32>,
    local_sin: Vec<f32>,
    ws: Workspace,
    /// Attention's softmax weights from the 8-lane polynomial exp
    /// ([`Self::with_fast_exp`]).
    fast_exp: bool,
    /// Layers whose input hidden states each forward pass keeps.
    capture: Vec<usize>,
    /// How float matrices are stored (a draft head's too).
    weight_dtype: WeightDtype,
}

impl CpuRunner {
    /// Takes ownership of the f32 weights (fusing projections) and
    /// allocates the KV pool.
    pub fn new(
        config: ModelConfig,
        weights: LlamaWeights,
        opts: CpuRunnerConfig,
    ) -> Result<Self, RunnerError> {
        let dt = opts.weight_dtype;
        let layers = weights
            .layers
            .into_iter()
            .map(|l| Layer {
                attn_norm: l.attn_norm.data,
                qkv: Matrix::new([l.q_proj.data, l.k_proj.data, l.v_proj.data].concat(), dt),
                qkv_bias: l
                    .qkv_bias
                    .map(|[q, k, v]| [q.data, k.data, v.data].concat()),
                qk_norm: l.qk_norm.map(|[q, k]| (q.data, k.data)),
                o_proj: Matrix::new(l.o_proj.data, dt),
                mlp_norm: l.mlp_norm.data,
                post_norms: l.post_norms.map(|[a, m]| (a.data, m.data)),
                mlp: match l.mlp {
                    MlpWeights::Dense {
                        gate_proj,
                        up_proj,
                        down_proj,
                    } => Mlp::Dense {
                        gate_up: Matrix::new([gate_proj.data, up_proj.data].concat(), dt),
                        down: Matrix::new(down_proj.data, dt),
                    },
                    MlpWeights::Experts {
                        router,
                        gate_proj,
                        up_proj,
                        down_proj,
                    } => Mlp::Experts(experts_from_floats(
                        router.data,
                        [gate_proj, up_proj, down_proj],
                        &mut |data, _| Matrix::new(data, dt),
                    )),
                },
            })
            .collect();
        Self::assemble(
            config,
            Matrix::new(weights.embed_tokens.data, dt),
            weights.lm_head.map(|t| Matrix::new(t.data, dt)),
            weights.norm.data,
            layers,
            opts,
        )
    }

    /// Loads the weights from `source` the way `weights` says and allocates
    /// the KV pool; `progress(done, total)` is called after each tensor.
    /// With `quantize_floats` (native only: Q8_0, Q4_0 or Q4_K), float
    /// weight matrices (f32/f16/bf16 files, Hugging Face directories) are
    /// quantized at load and run on the native kernels too; rows a k-quant
    /// block does not divide take Q8_0 ([`quant::quantize`]).
    pub fn load(
        config: ModelConfig,
        source: &dyn TensorSource,
        opts: CpuRunnerConfig,
        weights: CpuWeights,
        quantize_floats: Option<QuantKind>,
        progress: &dyn Fn(usize, usize),
    ) -> Result<Self, RunnerError> {
        let quantizable = [QuantKind::Q8_0, QuantKind::Q4_0, QuantKind::Q4K];
        if quantize_floats.is_some_and(|k| !quantizable.contains(&k)) {
            return Err(RunnerError::Backend(
                "quantization at load supports q8_0, q4_0 and q4_k".to_string(),
            ));
        }
        let model_err = |e: ModelError| RunnerError::Backend(e.to_string());
        let amx = weights == CpuWeights::Amx;
        if amx && !quant::amx_available() {
            return Err(RunnerError::Backend(
                "model.cpu_weights = \"amx\" needs AMX-INT8 and AVX512 (Intel Xeon from \
                 Sapphire Rapids on) and a kernel that grants the tile state; this CPU or OS \
                 has none: use \"native\""
                    .to_string(),
            ));
        }
        if weights == CpuWeights::F32 {
            let w = LlamaWeights::load(&config, source, progress).map_err(model_err)?;
            return Self::new(config, w, opts);
        }
        let shapes = ingot_models::llama::expected_shapes(&config);
        let total = shapes.len();
        let done = std::cell::Cell::new(0);
        let tick = || {
            done.set(done.get() + 1);
            progress(done.get(), total);
        };
        let check = |name: &str, got: &[usize]| -> Result<(), RunnerError> {
            let expected = shapes
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, s)| s.as_slice())
                .unwrap_or_default();
            if got != expected {
                return Err(model_err(ModelError::ShapeMismatch {
                    name: name.to_string(),
                    expected: expected.to_vec(),
                    got: got.to_vec(),
                }));
            }
            Ok(())
        };
        // A tensor dequantized, shape-checked.
        let floats = |name: &str| -> Result<HostTensor, RunnerError> {
            let t = source.load(name).map_err(model_err)?;
            check(name, &t.shape)?;
            tick();
            Ok(t)
        };
        let vector = |name: String| floats(&name).map(|t| t.data);
        // Float rows of `cols` weights as a matrix: quantized at load when
        // asked, else stored per `weight_dtype`. The embedding and the LM
        // head (`edge`) keep 8 bits under the 4-bit kinds (as llama.cpp's Q4
        // files keep them at Q8_0/Q6_K): the logits are read straight off
        // them, and they cost the most accuracy per byte saved.
        let from_floats = |data: Vec<f32>, cols: usize, edge: bool| -> Matrix {
            let kind = quantize_floats.map(|k| if edge { QuantKind::Q8_0 } else { k });
            float_matrix(data, cols, kind, (opts.weight_dtype, amx))
        };
        // Rows of `names` stacked into one matrix: native when every part
        // has a kernel, else all dequantized.
        let matrix = |names: &[String]| -> Result<Matrix, RunnerError> {
            let mut parts = Vec::with_capacity(names.len());
            let mut cols = 0;
            for name in names {
                let Some(q) = source.load_blocks(name).map_err(model_err)? else {
                    break;
                };
                let Some(kind) = QuantKind::from_ggml(q.ggml_type) else {
                    break;
                };
                check(name, &q.shape)?;
                cols = q.shape.get(1).copied().unwrap_or(0);
                parts.push((kind, q.data, q.shape[0]));
            }
            if parts.len() == names.len() {
                if let Some(m) = QuantMatrix::new(parts, cols) {
                    names.iter().for_each(|_| tick());
                    return Ok(Matrix::Quant(m.with_amx(amx)));
                }
            }
            let mut data = Vec::new();
            let mut cols = 0;
            for name in names {
                let t = floats(name)?;
                cols = t.shape.get(1).copied().unwrap_or(0);
                data.extend_from_slice(&t.data);
            }
            let edge = names.iter().any(|n| n == EMBED || n == LM_HEAD);
            Ok(from_floats(data, cols, edge))
        };
        // A stacked expert tensor in its blocks, one part per expert.
        let expert_blocks =
            |name: &str| -> Result<Option<(QuantKind, Vec<BlockData>)>, RunnerError> {
                let Some(q) = source.load_blocks(name).map_err(model_err)? else {
                    return Ok(None);
                };
                let Some(kind) = QuantKind::from_ggml(q.ggml_type) else {
                    return Ok(None);
                };
                check(name, &q.shape)?;
                Ok(q.data.split(q.shape[0]).map(|parts| (kind, parts)))
            };
        // Layer `i`'s experts: native when every stack has a kernel, else
        // dequantized (and quantized again when asked).
        let experts = |i: usize| -> Result<Experts, RunnerError> {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let router = vector(p(ROUTER))?;
            let names = [p(EXPERTS_GATE), p(EXPERTS_UP), p(EXPERTS_DOWN)];
            if let [Some(g), Some(u), Some(d)] = [
                expert_blocks(&names[0])?,
                expert_blocks(&names[1])?,
                expert_blocks(&names[2])?,
            ] {
                if let Some(e) = native_experts(router.clone(), g, u, d, (&config, amx)) {
                    names.iter().for_each(|_| tick());
                    return Ok(e);
                }
            }
            let [g, u, d] = [&names[0], &names[1], &names[2]].map(|n| floats(n));
            Ok(experts_from_floats(
                router,
                [g?, u?, d?],
                &mut |data, cols| from_floats(data, cols, false),
            ))
        };
        let embed = matrix(&[EMBED.to_string()])?;
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let qkv_bias = if config.qkv_bias {
                Some(
                    [
                        vector(p("self_attn.q_proj.bias"))?,
                        vector(p("self_attn.k_proj.bias"))?,
                        vector(p("self_attn.v_proj.bias"))?,
                    ]
                    .concat(),
                )
            } else {
                None
            };
            let qk_norm = if config.qk_norm {
                Some((
                    vector(p("self_attn.q_norm.weight"))?,
                    vector(p("self_attn.k_norm.weight"))?,
                ))
            } else {
                None
            };
            let post_norms = if config.block.post_norms {
                Some((
                    vector(p(ingot_models::llama::POST_ATTN_NORM))?,
                    vector(p(ingot_models::llama::POST_MLP_NORM))?,
                ))
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: vector(p("input_layernorm.weight"))?,
                qkv: matrix(&[
                    p("self_attn.q_proj.weight"),
                    p("self_attn.k_proj.weight"),
                    p("self_attn.v_proj.weight"),
                ])?,
                qkv_bias,
                qk_norm,
                o_proj: matrix(&[p("self_attn.o_proj.weight")])?,
                mlp_norm: vector(p(ingot_models::llama::mlp_norm_name(&config)))?,
                post_norms,
                mlp: if ingot_models::llama::is_sparse(&config, i) {
                    Mlp::Experts(experts(i)?)
                } else {
                    Mlp::Dense {
                        gate_up: matrix(&[p("mlp.gate_proj.weight"), p("mlp.up_proj.weight")])?,
                        down: matrix(&[p("mlp.down_proj.weight")])?,
                    }
                },
            });
        }
        let norm = vector("model.norm.weight".to_string())?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(matrix(&[LM_HEAD.to_string()])?)
        };
        Self::assemble(config, embed, lm_head, norm, layers, opts)
    }

    /// Checks the shapes the kernels support and allocates the KV pool.
    fn assemble(
        config: ModelConfig,
        embed: Matrix,
        lm_head: Option<Matrix>,
        norm: Vec<f32>,
        layers: Vec<Layer>,
        opts: CpuRunnerConfig,
    ) -> Result<Self, RunnerError> {
        if config.head_dim > MAX_HEAD_DIM
            || opts.block_size > MAX_BLOCK_SIZE
            || opts.block_size == 0
        {
            return Err(RunnerError::Backend(format!(
                "CPU attention supports head_dim <= {MAX_HEAD_DIM} and block_size in 1..={MAX_BLOCK_SIZE}"
            )));
        }
        let layout = ingot_runner::kv_layout_of(&config);
        // Same memory as `num_blocks` blocks of every layer.
        let num_pages = opts.num_blocks * config.num_layers / layout.page_layers();
        let slots = num_pages * opts.block_size * config.kv_dim();
        let kv = (0..layout.page_layers())
            .map(|_| layer_kv(slots))
            .collect::<Result<_, _>>()?;
        let (cos, sin) = config.rope.tables(config.head_dim, config.max_context);
        let (local_cos, local_sin) = match &config.block.sliding_window {
            Some(w) => w.local_rope.tables(config.head_dim, config.max_context),
            None => (Vec::new(), Vec::new()),
        };
        Ok(Self {
            embed: Arc::new(embed),
            lm_head,
            norm,
            layers,
            kv,
            kv_shape: KvCacheShape {
                num_blocks: num_pages,
                block_size: opts.block_size,
            },
            layout,
            cos,
            sin,
            local_cos,
            local_sin,
            ws: Workspace::default(),
            config,
            fast_exp: false,
            capture: Vec::new(),
            weight_dtype: opts.weight_dtype,
        })
    }

    /// Attention's softmax weights from an 8-lane polynomial exp (within 2
    /// ulp of the true value) instead of the C library's `expf`, one
    /// position at a time, where the CPU has AVX2 and FMA
    /// (`model.cpu_fast_exp`): faster at long contexts, not the same bits.
    pub fn with_fast_exp(self, fast_exp: bool) -> Self {
        Self { fast_exp, ..self }
    }

    /// True when any weight matrix uses the native quantized kernels.
    pub fn uses_quantized_weights(&self) -> bool {
        std::iter::once(&*self.embed)
            .chain(self.layers.iter().flat_map(Layer::matrices))
            .any(|m| matches!(m, Matrix::Quant(_)))
    }

    /// Bytes of weight matrices held.
    pub fn weight_bytes(&self) -> usize {
        std::iter::once(&*self.embed)
            .chain(self.lm_head.as_ref())
            .chain(self.layers.iter().flat_map(Layer::matrices))
            .map(Matrix::bytes)
            .sum()
    }

    /// KV slots of one layer's K (or V).
    fn kv_slots(&self) -> usize {
        self.kv_shape.num_blocks * self.kv_shape.block_size * self.config.kv_dim()
    }

    /// Slots of one page of one layer's K (or V).
    fn page_slots(&self) -> usize {
        self.kv_shape.block_size * self.config.kv_dim()
    }

    /// A page copy of one buffer per page, in an awake pool.
    fn check_pages(
        &self,
        pages: &[BlockId],
        lens: impl ExactSizeIterator<Item = usize>,
    ) -> Result<(), RunnerError> {
        if self
            .kv
            .first()
            .is_some_and(|kv| kv.k.len() != self.kv_slots())
        {
            return Err(RunnerError::Backend("the model is asleep".into()));
        }
        let (page_bytes, num_pages) = (self.kv_page_bytes(), self.kv_shape.num_blocks);
        ingot_runner::check_kv_copy(pages, lens, page_bytes, num_pages)
    }

    /// Bytes of KV cache per token position (all layers, K and V).
    pub fn kv_bytes_per_token(config: &ModelConfig) -> usize {
        config.num_layers * 2 * config.kv_dim() * std::mem::size_of::<f32>()
    }
}

/// Float rows of `cols` weights as a matrix: quantized to `kind` for the
/// native kernels where given and the shape allows, else stored as `dtype`.
fn float_matrix(
    data: Vec<f32>,
    cols: usize,
    kind: Option<QuantKind>,
    (dtype, amx): (WeightDtype, bool),
) -> Matrix {
    if let Some((kind, blocks)) = kind.and_then(|k| quant::quantize(k, &data, cols)) {
        let rows = data.len() / cols.max(1);
        let parts = vec![(kind, BlockData::Owned(blocks), rows)];
        if let Some(m) = QuantMatrix::new(parts, cols) {
            return Matrix::Quant(m.with_amx(amx));
        }
    }
    Matrix::new(data, dtype)
}

/// Experts from their dequantized stacks (`[experts, width, hidden]` gate
/// and up, `[experts, hidden, width]` down), each expert's matrices made by
/// `make(rows, cols)`.
fn experts_from_floats(
    router: Vec<f32>,
    [gate, up, down]: [HostTensor; 3],
    make: &mut dyn FnMut(Vec<f32>, usize) -> Matrix,
) -> Experts {
    let (n, width, hidden) = (gate.shape[0], gate.shape[1], gate.shape[2]);
    let each = width * hidden;
    let mut experts = Experts {
        router,
        gate_up: Vec::with_capacity(n),
        down: Vec::with_capacity(n),
        width,
    };
    for e in 0..n {
        let rows = e * each..(e + 1) * each;
        let gate_up = [&gate.data[rows.clone()], &up.data[rows.clone()]].concat();
        experts.gate_up.push(make(gate_up, hidden));
        experts.down.push(make(down.data[rows].to_vec(), width));
    }
    experts
}

/// Experts on the native kernels, each a view of the stacks' blocks;
/// `None` when a stack's blocks do not fit the shapes.
fn native_experts(
    router: Vec<f32>,
    (gate_kind, gate): (QuantKind, Vec<BlockData>),
    (up_kind, up): (QuantKind, Vec<BlockData>),
    (down_kind, down): (QuantKind, Vec<BlockData>),
    (config, amx): (&ModelConfig, bool),
) -> Option<Experts> {
    let width = config.block.moe.as_ref()?.expert_intermediate_size;
    let hidden = config.hidden_size;
    let mut experts = Experts {
        router,
        gate_up: Vec::with_capacity(gate.len()),
        down: Vec::with_capacity(gate.len()),
        width,
    };
    for ((g, u), d) in gate.into_iter().zip(up).zip(down) {
        let gate_up = vec![(gate_kind, g, width), (up_kind, u, width)];
        experts.gate_up.push(Matrix::Quant(
            QuantMatrix::new(gate_up, hidden)?.with_amx(amx),
        ));
        let down = vec![(down_kind, d, hidden)];
        experts
            .down
            .push(Matrix::Quant(QuantMatrix::new(down, width)?.with_amx(amx)));
    }
    Some(experts)
}

/// One layer's K and V of `slots` values each (zero pages until touched).
fn layer_kv(slots: usize) -> Result<LayerKv, RunnerError> {
    let alloc = || {
        KvSlots::zeroed(slots)
            .map_err(|e| RunnerError::Backend(format!("cannot allocate the KV cache: {e}")))
    };
    Ok(LayerKv {
        k: alloc()?,
        v: alloc()?,
    })
}

impl ModelRunner for CpuRunner {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_cache_shape(&self) -> KvCacheShape {
        self.kv_shape
    }

    /// The model's layer groups: Gemma 3's sliding layers read their own
    /// table, whose blocks leave with the window.
    fn kv_layout(&self) -> KvLayout {
        self.layout.clone()
    }

    fn device_name(&self) -> String {
        format!("cpu ({} threads)", rayon::current_num_threads())
    }

    fn computes_on_host(&self) -> bool {
        true
    }

    /// Frees the KV pool and the activations; the weights stay (they are
    /// host memory already), so waking is only a KV allocation.
    fn sleep(&mut self) -> Result<u64, RunnerError> {
        for kv in &mut self.kv {
            kv.k = KvSlots::empty();
            kv.v = KvSlots::empty();
        }
        self.ws = Workspace::default();
        Ok(self.weight_bytes() as u64)
    }

    fn wake(&mut self) -> Result<(), RunnerError> {
        let slots = self.kv_slots();
        for kv in &mut self.kv {
            if kv.k.len() != slots {
                *kv = layer_kv(slots)?;
            }
        }
        Ok(())
    }

    /// K then V of each page layer, f32 in the host's byte order.
    fn kv_page_bytes(&self) -> usize {
        self.page_slots() * 2 * self.kv.len() * std::mem::size_of::<f32>()
    }

    fn kv_page_format(&self) -> String {
        format!(
            "cpu-f32-{}",
            if cfg!(target_endian = "little") {
                "le"
            } else {
                "be"
            }
        )
    }

    fn read_kv_pages(
        &mut self,
        pages: &[BlockId],
        out: &mut [&mut [u8]],
    ) -> Result<(), RunnerError> {
        self.check_pages(pages, out.iter().map(|o| o.len()))?;
        let n = self.page_slots();
        for (&p, out) in pages.iter().zip(out.iter_mut()) {
            let at = p as usize * n;
            let parts = self
                .kv
                .iter()
                .flat_map(|kv| [&kv.k[at..at + n], &kv.v[at..at + n]]);
            for (src, dst) in parts.zip(out.chunks_exact_mut(n * 4)) {
                for (x, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
                    d.copy_from_slice(&x.to_ne_bytes());
                }
            }
        }
        Ok(())
    }

    fn write_kv_pages(&mut self, pages: &[BlockId], data: &[&[u8]]) -> Result<(), RunnerError> {
        self.check_pages(pages, data.iter().map(|d| d.len()))?;
        let n = self.page_slots();
        for (&p, src) in pages.iter().zip(data) {
            let at = p as usize * n;
            let mut chunks = src.chunks_exact(n * 4);
            for kv in &mut self.kv {
                for dst in [&mut kv.k[at..at + n], &mut kv.v[at..at + n]] {
                    let bytes = chunks.next().unwrap_or_default();
                    for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                        *d = f32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
                    }
                }
            }
        }
        Ok(())
    }

    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<&[f32], RunnerError> {
        ingot_runner::validate_grouped(&self.config, self.kv_shape, &self.layout, batch)?;
        if self
            .kv
            .first()
            .is_some_and(|kv| kv.k.len() != self.kv_slots())
        {
            return Err(RunnerError::Backend("the model is asleep".into()));
        }
        // Run the whole step on a pool thread: each of the ~10 parallel
        // kernels per layer then forks from inside the pool instead of
        // injecting a job from outside and sleeping until it is done, which
        // cost a thread wake-up per kernel (a third of decode time).
        let len = rayon::scope(|_| self.forward_in_pool(batch))?;
        Ok(&self.ws.logits[..len])
    }

    /// Every step keeps its rows (the copies cost little beside the step).
    fn capture_hidden(&mut self, layers: &[usize]) -> Result<(), RunnerError> {
        if let Some(&l) = layers.iter().find(|&&l| l >= self.config.num_layers) {
            return Err(RunnerError::Backend(format!(
                "cannot capture the input of layer {l}: the model has {}",
                self.config.num_layers
            )));
        }
        self.capture = layers.to_vec();
        Ok(())
    }

    fn captured_hidden(&self) -> &[f32] {
        let width = self.capture.len() * self.config.hidden_size;
        &self.ws.captured[..self.ws.positions.len() * width]
    }

    fn draft_head(
        &self,
        config: EagleHeadConfig,
        weights: EagleHeadWeights,
        kv_tokens: usize,
    ) -> Result<Box<dyn DraftHead>, RunnerError> {
        // On the native kernels the head's matrices take Q8_0 blocks (a
        // draft needs no more; it reads a quarter of the f32 bytes).
        let storage = eagle::HeadStorage {
            dtype: self.weight_dtype,
            quantize: self.uses_quantized_weights(),
        };
        let head = eagle::CpuEagleHead::new(
            config,
            weights,
            Arc::clone(&self.embed),
            (kv_tokens, self.kv_shape.block_size),
            storage,
        )?;
        Ok(Box::new(head.with_fast_exp(self.fast_exp)))
    }
}

impl CpuRunner {
    /// The forward pass of the model's architecture file over the CPU ops;
    /// returns the number of logits written.
    fn forward_in_pool(&mut self, batch: &ForwardBatch<'_>) -> Result<usize, RunnerError> {
        let mut ops = self.ops(batch);
        let config = ops.config;
        ingot_arch::forward(config, &mut ops)?;
        Ok(ops.logits_len)
    }

    /// One step's ops over this runner's weights, KV and workspace.
    fn ops<'a, 'b>(&'a mut self, batch: &'a ForwardBatch<'b>) -> CpuOps<'a, 'b> {
        CpuOps {
            config: &self.config,
            embed: &self.embed,
            lm_head: self.lm_head.as_ref(),
            capture: &self.capture,
            norm: &self.norm,
            layers: &self.layers,
            kv: &mut self.kv,
            layout: &self.layout,
            block_size: self.kv_shape.block_size,
            fast_exp: self.fast_exp,
            cos: &self.cos,
            sin: &self.sin,
            local_cos: &self.local_cos,
            local_sin: &self.local_sin,
            ws: &mut self.ws,
            batch,
            sites: Vec::new(),
            logits_len: 0,
        }
    }
}
