//! The runner's options ([`CudaRunnerConfig`]) and what start-up derives
//! from them before touching the GPU: the weight format, the matrices kept
//! in bf16 under FP8 ([`Fp8Keep`]), the GGUF blocks kept as they are
//! ([`NativeBlocks`]) and the FP8 scratch limits.

mod fp8_keep;

use ingot_models::llama::expected_shapes;
use ingot_models::{ModelConfig, TensorSource};

pub use fp8_keep::Fp8Keep;

use crate::gemm::Fp8Limits;
use crate::kernels::{KvDtype, L2PrefetchSpec};
use crate::weights::{is_decoder_matrix, NativeBlocks, WeightFormat};
use crate::CudaError;

/// Sizes and switches chosen by the caller.
#[derive(Debug, Clone)]
pub struct CudaRunnerConfig {
    /// GPU ordinal.
    pub device: usize,
    /// Token slots per KV block.
    pub block_size: usize,
    /// Most tokens in one forward pass (sizes the workspace).
    pub max_num_batched_tokens: usize,
    /// Most sequences in one forward pass (graph buckets go up to it).
    pub max_num_seqs: usize,
    /// Share of the GPU's memory to use in all (weights + workspace + KV).
    pub gpu_memory_utilization: f64,
    /// KV tokens to allocate instead of filling the memory budget.
    pub kv_cache_tokens: Option<usize>,
    /// Element type of the KV cache (`model.kv_cache_dtype`).
    pub kv_cache_dtype: KvDtype,
    /// Capture decode steps in CUDA graphs.
    pub cuda_graphs: bool,
    /// Log a per-step GPU time breakdown (`cuda.profile`).
    pub profile: bool,
    /// Synchronize after every launch and name the kernel that failed
    /// (`cuda.check`; debugging only).
    pub check: bool,
    /// `<MiB>[:<mode>]`: how much of o_proj's weights small-batch decode
    /// attention prefetches into L2 (`cuda.l2_prefetch`; `None`: a sixth of
    /// L2; `0`: off). Checked by [`check_l2_prefetch`].
    pub l2_prefetch: Option<String>,
    /// Programmatic dependent launch on sm_90+ (`cuda.pdl`).
    pub pdl: bool,
    /// The decoder's weight matrices in FP8 (e4m3, per-channel scales;
    /// `model.quantization = "fp8"`).
    pub fp8_weights: bool,
    /// With `fp8_weights`: matrices kept in bf16 (`model.fp8_ignore`, see
    /// [`Fp8Keep`]); empty keeps none.
    pub fp8_ignore: String,
    /// With `fp8_weights`: the LM head in e4m3 too (`model.fp8_lm_head`;
    /// off by default: it changes answers).
    pub fp8_lm_head: bool,
    /// GGUF quantized decoder matrices kept in their blocks
    /// (`model.cuda_weights = "native"`, see [`crate::NativeBlocks`]).
    pub native_weights: bool,
    /// One kernel for each layer's attention combine, o_proj, MLP and the
    /// next layer's q/k/v on small models at GEMV batch sizes
    /// (`cuda.fused_block`; off by default: measured slower).
    pub fused_block: bool,
    /// GEMVs of this many rows up to 8 of wide bf16 models on tensor cores
    /// (`cuda.tc_gemv_min_rows`; 0: never).
    pub tc_gemv_min_rows: usize,
    /// Batch-invariant kernels (`engine.deterministic`): a row's result
    /// does not depend on what else is in the step. Linear layers run
    /// cuBLASLt with one split-K-free algorithm per matrix at every token
    /// count (no GEMV kernels, no fused norms), attention runs every token
    /// through the decode kernel in one split. Costs speed.
    pub deterministic: bool,
    /// Tensor parallel: small all-reduces take the one-shot kernel over
    /// peer memory instead of NCCL (`cuda.custom_all_reduce`).
    pub custom_all_reduce: bool,
    /// Decode steps with at least this many decode rows use the
    /// tensor-core decode attention (`cuda.tc_decode_min_rows`; 0: never).
    pub tc_decode_min_rows: usize,
    /// The same for an FP8 KV cache (`cuda.tc_decode_fp8_min_rows`; 0:
    /// never); the smaller non-zero threshold of the two applies.
    pub tc_decode_fp8_min_rows: usize,
    /// Mixture of experts: steps of at least this many tokens run the
    /// experts as grouped tensor-core GEMMs over the slots sorted by expert
    /// instead of per-slot GEMVs (`cuda.moe_grouped_min_tokens`; 0: never).
    pub moe_grouped_min_tokens: usize,
    /// Every kernel's preferred shared-memory carveout in percent
    /// (`cuda.smem_carveout`; `None`: the driver's choice per kernel).
    pub smem_carveout: Option<u8>,
}

impl Default for CudaRunnerConfig {
    fn default() -> Self {
        Self {
            device: 0,
            block_size: 16,
            max_num_batched_tokens: 2048,
            max_num_seqs: 256,
            gpu_memory_utilization: 0.9,
            kv_cache_tokens: None,
            kv_cache_dtype: KvDtype::Bf16,
            cuda_graphs: true,
            profile: false,
            check: false,
            l2_prefetch: None,
            pdl: true,
            fp8_weights: false,
            fp8_ignore: String::new(),
            fp8_lm_head: false,
            native_weights: false,
            fused_block: false,
            tc_gemv_min_rows: 3,
            deterministic: false,
            tc_decode_min_rows: 0,
            tc_decode_fp8_min_rows: 0,
            custom_all_reduce: true,
            moe_grouped_min_tokens: 0,
            smem_carveout: None,
        }
    }
}

/// The GGUF quantized matrices kept in their blocks (`opts.native_weights`;
/// none otherwise). Refused beside FP8 weights, which quantize from bf16.
pub(crate) fn native_blocks(
    opts: &CudaRunnerConfig,
    config: &ModelConfig,
    source: &dyn TensorSource,
) -> Result<NativeBlocks, CudaError> {
    if !opts.native_weights {
        return Ok(NativeBlocks::none());
    }
    if opts.fp8_weights {
        return Err(CudaError::Unsupported(
            "model.cuda_weights = \"native\" with model.quantization = \"fp8\": \
             choose one (native keeps a GGUF's quantized blocks, fp8 quantizes bf16 weights)"
                .into(),
        ));
    }
    let native = NativeBlocks::plan(config, source);
    let total = config.num_layers * 4;
    tracing::info!(
        kept = native.count(),
        of = total,
        "model.cuda_weights = native: Q8_0/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K decoder matrices stay in their blocks (the rest expand to bf16)"
    );
    Ok(native)
}

/// Checks a `cuda.l2_prefetch` spec (`<MiB>[:<mode>]`) without a GPU, so a
/// config can be validated anywhere.
pub fn check_l2_prefetch(spec: &str) -> Result<(), CudaError> {
    L2PrefetchSpec::parse(Some(spec)).map(|_| ())
}

/// Whether the decoder matrices come from an FP8 checkpoint as they are:
/// `opts.native_weights`, no tensor parallelism (a rank's shard is sliced
/// as floats), a dense model, and every decoder matrix's file tensors
/// e4m3 with per-tensor or per-channel scales (block-wise scales, or any
/// matrix in floats, and the checkpoint expands to bf16 as before).
pub(crate) fn fp8_checkpoint(
    opts: &CudaRunnerConfig,
    config: &ModelConfig,
    source: &dyn TensorSource,
) -> bool {
    let all = opts.native_weights && !opts.fp8_weights && e4m3_decoder(config, source);
    if all {
        tracing::info!(
            "model.cuda_weights = native: the FP8 checkpoint's e4m3 decoder matrices and their scales load as they are"
        );
    }
    all
}

/// Whether every decoder matrix of `source` is e4m3 with per-tensor or
/// per-channel scales (an FP8 checkpoint the GPU can keep as it is), for a
/// dense model on one GPU (a tensor-parallel rank's shard is sliced as
/// floats).
pub fn e4m3_decoder(config: &ModelConfig, source: &dyn TensorSource) -> bool {
    if config.shard.is_some() || config.block.moe.is_some() {
        return false;
    }
    let mut matrices = expected_shapes(config)
        .into_iter()
        .filter(|(name, _)| is_decoder_matrix(name))
        .peekable();
    matrices.peek().is_some() && matrices.all(|(name, _)| source.stored_e4m3(&name))
}

/// How the weights are stored: `opts.fp8_weights` and `opts.fp8_lm_head`,
/// or an FP8 checkpoint's e4m3 kept (`from_file`, [`fp8_checkpoint`]);
/// an FP8 head without FP8 weights is refused rather than ignored.
pub(crate) fn weight_format(
    opts: &CudaRunnerConfig,
    from_file: bool,
) -> Result<WeightFormat, CudaError> {
    match (opts.fp8_weights || from_file, opts.fp8_lm_head) {
        (true, lm_head) => {
            if lm_head {
                tracing::info!("FP8: model.fp8_lm_head puts the LM head in e4m3");
            }
            Ok(WeightFormat::Fp8 { lm_head, from_file })
        }
        (false, false) => Ok(WeightFormat::Bf16),
        (false, true) => Err(CudaError::Unsupported(
            "model.fp8_lm_head needs model.quantization = \"fp8\"".into(),
        )),
    }
}

/// The largest FP8 product of a step of `max_tokens` tokens and
/// `max_seqs` sequences: any layer matrix over every token, and with an
/// FP8 LM head its vocab-wide logits of up to `max_seqs` rows (the last
/// rows of a step, or scored prompt positions, which go in groups of
/// `max_seqs`).
pub(crate) fn fp8_limits(
    config: &ModelConfig,
    format: WeightFormat,
    max_tokens: usize,
    max_seqs: usize,
) -> Fp8Limits {
    // The widest input of a quantized matrix (o_proj's q, down's ff; the
    // head's is the hidden size).
    let max_inputs = config
        .hidden_size
        .max(config.q_dim())
        .max(config.intermediate_size);
    // The widest output of a layer matrix (q/k/v, gate/up).
    let max_outputs = (config.q_dim() + 2 * config.kv_dim())
        .max(2 * config.intermediate_size)
        .max(config.hidden_size);
    let head_sums = if format.fp8_lm_head() {
        max_seqs * config.lm_head_rows()
    } else {
        0
    };
    Fp8Limits {
        max_tokens,
        max_inputs,
        max_sums: (max_tokens * max_outputs).max(head_sums),
    }
}

/// The matrices kept in bf16: `opts.fp8_ignore` parsed (see [`Fp8Keep`]);
/// a list without FP8 weights is refused rather than ignored.
pub(crate) fn fp8_keep(opts: &CudaRunnerConfig, num_layers: usize) -> Result<Fp8Keep, CudaError> {
    if !opts.fp8_weights && !opts.fp8_ignore.trim().is_empty() {
        return Err(CudaError::Unsupported(
            "model.fp8_ignore needs model.quantization = \"fp8\"".into(),
        ));
    }
    let keep = Fp8Keep::parse(&opts.fp8_ignore, num_layers)?;
    if keep.count() > 0 {
        tracing::info!(
            matrices = keep.count(),
            "FP8: model.fp8_ignore keeps matrices in bf16"
        );
    }
    Ok(keep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_configs::{gemma3, FP8, FP8_HEAD};

    #[test]
    fn fp8_ignore_without_fp8_is_refused() {
        let opts = CudaRunnerConfig {
            fp8_ignore: "down_proj".into(),
            ..CudaRunnerConfig::default()
        };
        let err = fp8_keep(&opts, 4).unwrap_err().to_string();
        assert!(err.contains("model.quantization"), "{err}");
        let opts = CudaRunnerConfig {
            fp8_weights: true,
            ..opts
        };
        assert_eq!(fp8_keep(&opts, 4).unwrap().count(), 4);
    }

    /// The FP8 sums scratch holds vocab-wide logits for every row the head
    /// takes at once (up to max_seqs), and the layer products as before.
    #[test]
    fn fp8_scratch_covers_the_heads_rows_of_logits() {
        let c = gemma3();
        let widest = 2 * c.intermediate_size;
        let plain = fp8_limits(&c, FP8, 2048, 256);
        assert_eq!(plain.max_sums, 2048 * widest);
        assert_eq!(plain.max_inputs, c.intermediate_size);
        let head = fp8_limits(&c, FP8_HEAD, 2048, 256);
        assert_eq!(head.max_sums, 256 * c.vocab_size);
        assert!(head.max_sums > plain.max_sums);
        assert!(head.max_inputs >= c.hidden_size);
        // A step's tokens through the widest layer matrix can still be more.
        let long = fp8_limits(&c, FP8_HEAD, 65536, 256);
        assert_eq!(long.max_sums, 65536 * widest);
    }

    /// An FP8 checkpoint keeps its e4m3 under `cuda_weights = native` when
    /// every decoder matrix is e4m3 per tensor or channel; otherwise (a
    /// matrix in floats, no native, `--quantization fp8`, a tensor-parallel
    /// rank) it expands as before.
    #[test]
    fn fp8_checkpoints_keep_their_e4m3_only_when_every_matrix_is() {
        use crate::test_configs::{llama8b, E4m3File};
        let c = llama8b();
        let native = CudaRunnerConfig {
            native_weights: true,
            ..CudaRunnerConfig::default()
        };
        let all = E4m3File(|name| name.ends_with("proj.weight"));
        assert!(fp8_checkpoint(&native, &c, &all));
        assert_eq!(
            weight_format(&native, true).unwrap(),
            WeightFormat::Fp8 {
                lm_head: false,
                from_file: true
            }
        );
        let one_float =
            E4m3File(|name| name.ends_with("proj.weight") && !name.contains("layers.7.mlp.down"));
        assert!(!fp8_checkpoint(&native, &c, &one_float));
        assert!(!fp8_checkpoint(&CudaRunnerConfig::default(), &c, &all));
        let quantize = CudaRunnerConfig {
            fp8_weights: true,
            ..native.clone()
        };
        assert!(!fp8_checkpoint(&quantize, &c, &all));
        let mut rank = c.clone();
        rank.shard = Some(ingot_models::parallel::Shard {
            rank: 0,
            size: 2,
            vocab: c.vocab_size,
            vocab_rows: c.vocab_size.div_ceil(2),
            kv_heads: c.num_kv_heads,
        });
        assert!(!fp8_checkpoint(&native, &rank, &all));
    }

    #[test]
    fn fp8_lm_head_without_fp8_is_refused() {
        let opts = CudaRunnerConfig {
            fp8_lm_head: true,
            ..CudaRunnerConfig::default()
        };
        let err = weight_format(&opts, false).unwrap_err().to_string();
        assert!(
            err.contains("model.fp8_lm_head") && err.contains("model.quantization"),
            "{err}"
        );
        let fp8 = CudaRunnerConfig {
            fp8_weights: true,
            ..opts.clone()
        };
        assert_eq!(weight_format(&fp8, false).unwrap(), FP8_HEAD);
        let plain = CudaRunnerConfig {
            fp8_lm_head: false,
            ..fp8
        };
        assert_eq!(weight_format(&plain, false).unwrap(), FP8);
        assert_eq!(
            weight_format(&CudaRunnerConfig::default(), false).unwrap(),
            WeightFormat::Bf16
        );
    }
}
