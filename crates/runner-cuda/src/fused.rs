//! The fused second half of a decoder layer for small models at GEMV batch
//! sizes (`fused_block.cu`): attention combine, o_proj, the MLP's RMSNorm,
//! gate/up + activation, down and (when the next layer's attention takes
//! it) the next layer's q/k/v + rope + KV write in one kernel with
//! grid-wide barriers between the phases, instead of five kernels. It
//! gives the same bits as the unfused kernels; `cuda.fused_block` turns it
//! off.

use ingot_arch::Activation;
use ingot_models::ModelConfig;

use crate::device::{Arg, DevPtr, Gpu, Kernel};
use crate::gemm::GEMV_MAX_TOKENS;
use crate::kernels::RopeTarget;
use crate::CudaError;

/// Threads of a block (the kernel's `FB_WARPS` warps).
const BLOCK_THREADS: u32 = 256;
/// Output columns of a block task (one per warp).
const COLUMNS_PER_TASK: usize = 8;
/// The kernel's shared-memory bounds (`FB_MAX_QDIM`, `FB_MAX_PARTS`).
const MAX_Q_DIM: usize = 1024;
const MAX_PARTS: usize = 512;
/// Heads the per-head weight sums hold (`FB_MAX_PARTS / 8`).
const MAX_HEADS: usize = MAX_PARTS / 8;
/// Widest model the fused block is for: beyond it each GEMV is long enough
/// to hide its kernel boundary (and the 8B path stays as measured).
const MAX_HIDDEN: usize = 1024;

/// One kernel per token count (1..=8) and activation, with the grid each
/// may use.
pub struct FusedBlocks {
    /// `[tokens - 1][SwiGLU, GeGLU]`: (kernel, most co-resident blocks).
    kernels: Vec<[(Kernel, usize); 2]>,
}

impl FusedBlocks {
    /// The kernels when the model is small enough for them; `None` when it
    /// is not (or `enabled` is off).
    pub fn load(gpu: &Gpu, config: &ModelConfig, enabled: bool) -> Result<Option<Self>, CudaError> {
        if !enabled || !fits(config) {
            return Ok(None);
        }
        let sms = gpu.num_sms()?;
        let load = |name: String| -> Result<(Kernel, usize), CudaError> {
            let k = gpu.kernel(&name)?;
            let resident = k.max_resident_blocks(BLOCK_THREADS)? * sms;
            Ok((k, resident))
        };
        let kernels = (1..=GEMV_MAX_TOKENS)
            .map(|n| {
                Ok([
                    load(format!("fused_block_n{n}_swiglu"))?,
                    load(format!("fused_block_n{n}_geglu"))?,
                ])
            })
            .collect::<Result<_, CudaError>>()?;
        Ok(Some(Self { kernels }))
    }

    /// The kernel for `tokens` rows, `heads` query heads over `splits`
    /// attention splits and `act`, if the fused block takes that step.
    fn pick(
        &self,
        tokens: usize,
        (heads, splits): (usize, usize),
        act: Activation,
    ) -> Option<&(Kernel, usize)> {
        if heads * splits > MAX_PARTS {
            return None;
        }
        let pair = self.kernels.get(tokens.checked_sub(1)?)?;
        let k = match act {
            Activation::Silu => &pair[0],
            Activation::GeluTanh => &pair[1],
        };
        (k.1 > 0).then_some(k)
    }

    /// Whether [`FusedBlock::launch`] takes a step of `tokens` rows with
    /// `heads` query heads over `splits` attention splits (either
    /// activation).
    pub fn takes(&self, tokens: usize, heads: usize, splits: usize) -> bool {
        [Activation::Silu, Activation::GeluTanh]
            .into_iter()
            .all(|act| self.pick(tokens, (heads, splits), act).is_some())
    }
}

/// Whether the model's shapes fit the kernel's shared memory and its
/// small-model purpose.
fn fits(c: &ModelConfig) -> bool {
    let q_dim = c.q_dim();
    c.hidden_size <= MAX_HIDDEN
        && q_dim <= MAX_Q_DIM
        && q_dim.is_multiple_of(8)
        && c.num_heads <= MAX_HEADS
        && c.hidden_size.is_multiple_of(8)
        && c.intermediate_size.is_multiple_of(8)
}

/// Where the attention left its output: split-K partials (or, with one
/// split, the combined rows in `attn`).
#[derive(Debug, Clone, Copy)]
pub struct AttentionOut {
    pub part_acc: DevPtr,
    pub part_ml: DevPtr,
    /// Decode row -> token row (0: the same).
    pub decode_ids: DevPtr,
    pub attn: DevPtr,
    pub heads: usize,
    pub head_dim: usize,
    pub splits: usize,
}

/// One layer's o_proj and MLP over `tokens` decode rows.
pub struct FusedBlock {
    pub tokens: usize,
    pub activation: Activation,
    pub attention: AttentionOut,
    pub o_proj: DevPtr,
    /// The f32 residual.
    pub x: DevPtr,
    pub mlp_norm: DevPtr,
    /// Pre-scaled norm inputs (`xn`).
    pub xn: DevPtr,
    pub sumsq: DevPtr,
    pub eps: f32,
    pub gate_up: DevPtr,
    pub act: DevPtr,
    pub down: DevPtr,
    /// The next layer's attention norm (0: the final norm follows).
    pub next_norm: DevPtr,
    pub hidden: usize,
    pub ff: usize,
    /// The next layer's q/k/v projection, when this kernel runs it.
    pub next_qkv: Option<NextQkv>,
}

/// The next layer's fused q/k/v weights, bias (0: none) and where its
/// rope and KV write go (`gemv_n*_qkv_rope_norm`'s work).
#[derive(Debug, Clone, Copy)]
pub struct NextQkv {
    pub weight: DevPtr,
    pub bias: DevPtr,
    pub target: RopeTarget,
}

impl NextQkv {
    /// The kernel's trailing arguments (zeros: no q/k/v phase).
    fn args(this: Option<&Self>) -> [Arg; 11] {
        let Some(q) = this else {
            // Null pointers; a block size of 1 keeps the kernel's unused
            // divisions defined.
            let mut none = [Arg::Ptr(0); 11];
            none[9] = Arg::I32(0);
            none[10] = Arg::I32(1);
            return none;
        };
        let t = &q.target;
        [
            Arg::Ptr(q.weight),
            Arg::Ptr(q.bias),
            Arg::Ptr(t.positions),
            Arg::Ptr(t.slots),
            Arg::Ptr(t.cos),
            Arg::Ptr(t.sin),
            Arg::Ptr(t.q),
            Arg::Ptr(t.kv.k),
            Arg::Ptr(t.kv.v),
            Arg::I32(t.heads.kv_heads as i32),
            Arg::I32(t.kv.block_size as i32),
        ]
    }

    /// Block tasks of the q/k/v phase: two warps per rotary pair.
    fn tasks(&self) -> usize {
        let h = self.target.heads;
        ((h.heads + 2 * h.kv_heads) * h.head_dim).div_ceil(COLUMNS_PER_TASK)
    }
}

impl FusedBlock {
    pub fn launch(&self, gpu: &Gpu, fused: &FusedBlocks) -> Result<(), CudaError> {
        let a = &self.attention;
        let (kernel, resident) = fused
            .pick(self.tokens, (a.heads, a.splits), self.activation)
            .ok_or_else(|| {
                CudaError::Unsupported(format!(
                    "a fused block of {} tokens and {} splits",
                    self.tokens, a.splits
                ))
            })?;
        let mut args = vec![
            Arg::Ptr(a.part_acc),
            Arg::Ptr(a.part_ml),
            Arg::Ptr(a.decode_ids),
            Arg::Ptr(a.attn),
            Arg::I32(a.heads as i32),
            Arg::I32(a.head_dim as i32),
            Arg::I32(a.splits as i32),
            Arg::Ptr(self.o_proj),
            Arg::Ptr(self.x),
            Arg::Ptr(self.mlp_norm),
            Arg::Ptr(self.xn),
            Arg::Ptr(self.sumsq),
            Arg::F32(self.eps),
            Arg::Ptr(self.gate_up),
            Arg::Ptr(self.act),
            Arg::Ptr(self.down),
            Arg::Ptr(self.next_norm),
            Arg::I32(self.hidden as i32),
            Arg::I32(self.ff as i32),
        ];
        args.extend(NextQkv::args(self.next_qkv.as_ref()));
        let qkv_tasks = self.next_qkv.as_ref().map_or(0, NextQkv::tasks);
        let grid = grid_blocks(self.hidden, self.ff, qkv_tasks, *resident);
        gpu.launch(kernel, (grid as u32, 1, 1), BLOCK_THREADS, 0, &args)
    }
}

/// One block per task of the widest phase (gate/up, o_proj/down or the
/// next q/k/v), capped so that the whole grid is resident at once (its
/// barriers need that).
fn grid_blocks(hidden: usize, ff: usize, qkv_tasks: usize, resident: usize) -> usize {
    let tasks = hidden.max(ff).div_ceil(COLUMNS_PER_TASK).max(qkv_tasks);
    tasks.min(resident).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_covers_the_widest_phase_within_residency() {
        // SmolLM2: 1,536 MLP columns = 192 tasks; two blocks on 132 SMs.
        assert_eq!(grid_blocks(576, 1536, 120, 264), 192);
        // Fewer resident slots than tasks: blocks loop over tasks.
        assert_eq!(grid_blocks(576, 1536, 120, 132), 132);
        // A q/k/v phase wider than the MLP sets the grid.
        assert_eq!(grid_blocks(64, 128, 40, 264), 40);
        assert_eq!(grid_blocks(8, 8, 0, 1), 1);
    }

    fn llama(hidden: usize, ff: usize, heads: usize, kv_heads: usize) -> ModelConfig {
        ModelConfig {
            architecture: ingot_models::Architecture::Llama,
            hidden_size: hidden,
            intermediate_size: ff,
            num_layers: 2,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: hidden / heads,
            vocab_size: 1024,
            max_context: 8192,
            rms_norm_eps: 1e-5,
            rope: ingot_models::RopeConfig {
                theta: 1e5,
                scaling: ingot_models::RopeScaling::None,
            },
            qkv_bias: false,
            qk_norm: false,
            tie_word_embeddings: true,
            shard: None,
            block: ingot_models::BlockOptions::default(),
        }
    }

    #[test]
    fn small_models_fit_and_the_8b_shape_keeps_its_kernels() {
        assert!(fits(&llama(576, 1536, 9, 3)), "SmolLM2-135M");
        assert!(fits(&llama(960, 2560, 15, 5)), "SmolLM2-360M");
        assert!(!fits(&llama(2048, 8192, 32, 8)), "Llama-3.2-1B");
        assert!(!fits(&llama(4096, 14336, 32, 8)), "Llama-3.1-8B");
        let mut odd = llama(576, 1536, 9, 3);
        odd.intermediate_size = 1540;
        assert!(!fits(&odd), "an MLP width the 16-byte loads cannot take");
    }
}
