//! Model weights on the device in one arena: matrices in bf16 (q/k/v and
//! gate/up fused row-wise, as on the CPU), norms, biases and the rotary
//! tables in f32. Tensors stream in one at a time (host memory stays at one
//! tensor); random weights (`--load-format dummy`) are generated on the
//! device.

use half::bf16;
use ingot_models::llama::expected_shapes;
use ingot_models::{ModelConfig, ModelError, TensorSource};
use rayon::prelude::*;

use crate::device::{Arena, Arg, DevPtr, Gpu};
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
    pub arena: Arena,
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
        let tables = 2 * config.max_context * (config.head_dim / 2) * 4;
        Arena::size_of(
            expected_shapes(config).iter().map(|(name, shape)| {
                shape.iter().product::<usize>() * dtype_of(name, shape).size()
            }),
        ) + Arena::size_of([tables / 2, tables / 2])
    }

    /// Allocates the arena and fills it from `source`.
    pub fn load(
        gpu: &Gpu,
        config: &ModelConfig,
        source: &dyn TensorSource,
        progress: &dyn Fn(usize, usize),
    ) -> Result<Self, CudaError> {
        let mut arena = Arena::new(gpu, "weights", Self::bytes(config))?;
        let (placements, cos, sin) = Self::place(config, &mut arena)?;
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
                for (i, p) in placements.iter().enumerate() {
                    upload(gpu, source, p)?;
                    progress(i + 1, total);
                }
            }
        }
        let (cos_t, sin_t) = config.rope.tables(config.head_dim, config.max_context);
        gpu.upload(cos, &cos_t)?;
        gpu.upload(sin, &sin_t)?;
        gpu.sync()?;
        Self::assemble(config, &placements, (cos, sin), arena)
    }

    /// Carves the arena into tensors: where each named tensor lands (fused
    /// matrices take their parts at row offsets), then the rotary tables.
    fn place(
        config: &ModelConfig,
        arena: &mut Arena,
    ) -> Result<(Vec<Placement>, DevPtr, DevPtr), CudaError> {
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
        Ok((placements, cos, sin))
    }

    /// The named pointers of a placed arena.
    fn assemble(
        config: &ModelConfig,
        placements: &[Placement],
        (cos, sin): (DevPtr, DevPtr),
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
                mlp_norm: at(&p("post_attention_layernorm.weight"))?,
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
            cos,
            sin,
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

/// Loads one tensor on the host, checks its shape, converts and copies it.
fn upload(gpu: &Gpu, source: &dyn TensorSource, p: &Placement) -> Result<(), CudaError> {
    let t = source.load(&p.name)?;
    if t.shape != p.shape {
        return Err(ModelError::ShapeMismatch {
            name: p.name.clone(),
            expected: p.shape.clone(),
            got: t.shape,
        }
        .into());
    }
    match p.dtype {
        Dtype::F32 => gpu.upload(p.dst, &t.data)?,
        Dtype::Bf16 => {
            let host: Vec<bf16> = t.data.par_iter().map(|&v| bf16::from_f32(v)).collect();
            gpu.upload(p.dst, &host)?;
            // `host` is freed when this returns: finish the copy first.
            gpu.sync()?;
        }
    }
    gpu.sync()
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
