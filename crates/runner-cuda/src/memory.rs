//! Device memory: what the weights will take (the start-up estimate), what
//! the GPU has, and what the runner reserved ([`MemoryReport`]).

use ingot_models::ModelConfig;

use crate::support::availability;
use crate::weights::{DeviceWeights, NativeBlocks, WeightFormat};
use crate::{CudaError, Fp8Keep};

/// Bytes the model's weights take on the device in `format` (the start-up
/// memory estimate).
/// `keep`: the matrices `model.fp8_ignore` keeps in bf16 under FP8;
/// `native`: the GGUF matrices kept in their blocks.
pub fn weight_bytes(
    config: &ModelConfig,
    format: WeightFormat,
    keep: &Fp8Keep,
    native: &NativeBlocks,
) -> usize {
    DeviceWeights::bytes(config, format, keep, native)
}

/// Free and total bytes of device `ordinal`'s memory (opens its primary
/// context, which the runner later shares).
pub fn device_memory(ordinal: usize) -> Result<(usize, usize), CudaError> {
    availability()?;
    let ctx = cudarc::driver::CudaContext::new(ordinal)?;
    ctx.bind_to_thread()?;
    Ok(cudarc::driver::result::mem_get_info()?)
}

/// Device memory reserved at start-up, by use.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryReport {
    /// Weights and rotary tables.
    pub weights: usize,
    /// Activations, step inputs and the cuBLASLt workspace.
    pub workspace: usize,
    /// The KV page pool.
    pub kv_cache: usize,
    /// The GPU's memory.
    pub total: usize,
}

impl MemoryReport {
    /// What the runner reserved: weights, workspace and KV pool (the
    /// CUDA context and cuBLASLt's own allocations come on top).
    pub fn reserved(&self) -> usize {
        self.weights + self.workspace + self.kv_cache
    }

    /// Sets the `ingot_gpu_memory_bytes{use=...}` gauges shown on /metrics.
    pub fn publish(&self) {
        metrics::describe_gauge!(
            "ingot_gpu_memory_bytes",
            metrics::Unit::Bytes,
            "GPU memory by use: weights, workspace, kv_cache, their total, and the GPU's capacity."
        );
        for (use_, bytes) in [
            ("weights", self.weights),
            ("workspace", self.workspace),
            ("kv_cache", self.kv_cache),
            ("total", self.reserved()),
            ("capacity", self.total),
        ] {
            metrics::gauge!("ingot_gpu_memory_bytes", "use" => use_).set(bytes as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_configs::{gemma3, llama8b, TypedFile, FP8, FP8_HEAD};
    use ingot_models::gguf::GgmlType;

    const NONE: NativeBlocks = NativeBlocks::none();

    /// A GGUF whose layer matrices are all Q8_0 but layer 0's v_proj (Q6_K).
    const Q8_FILE: TypedFile = TypedFile(|name| {
        if name == "model.layers.0.self_attn.v_proj.weight" {
            GgmlType::Q6_K
        } else {
            GgmlType::Q8_0
        }
    });

    /// Kept Q8_0 matrices take the file's 34 bytes per 32 weights instead
    /// of bf16's 64; a group with one part in another type stays bf16.
    #[test]
    fn native_q8_0_matrices_take_the_files_bytes() {
        let c = llama8b();
        let native = NativeBlocks::plan(&c, &Q8_FILE);
        assert_eq!(native.count(), 4 * c.num_layers - 1);
        let (d, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let layer = (q + 2 * kv) * d + d * q + 2 * ff * d + d * ff;
        let kept = c.num_layers * layer - (q + 2 * kv) * d;
        let none = Fp8Keep::default();
        let saved = weight_bytes(&c, WeightFormat::Bf16, &none, &NONE)
            - weight_bytes(&c, WeightFormat::Bf16, &none, &native);
        let want = kept * 2 - kept / 32 * 34;
        assert!(
            saved.abs_diff(want) < 8 * 256 * c.num_layers,
            "saved {saved}, want {want}"
        );
        assert_eq!(native.max_elements(&c), 2 * ff * d);
    }

    /// A Q4_K_M-style GGUF: Q4_K everywhere but v_proj, down_proj and the
    /// LM head (Q6_K), and layer 1's up_proj (Q5_K: its gate/up group mixes
    /// types and so stays bf16).
    const MIXED_FILE: TypedFile = TypedFile(|name| {
        let six = ["v_proj.weight", "down_proj.weight", "lm_head.weight"];
        if six.iter().any(|s| name.ends_with(s)) {
            GgmlType::Q6_K
        } else if name == "model.layers.1.mlp.up_proj.weight" {
            GgmlType::Q5_K
        } else {
            GgmlType::Q4_K
        }
    });

    /// A q/k/v of Q4_K and Q6_K parts stays one kept matrix; each type
    /// takes its file's bytes (144 per 256 for Q4_K, 210 for Q6_K) plus a
    /// header and plane padding; gate/up in two types expand to bf16. The
    /// embedding table (Q4_K) and the LM head (Q6_K) are kept too.
    #[test]
    fn mixed_k_quant_matrices_take_the_files_bytes() {
        let c = llama8b();
        assert!(!c.tie_word_embeddings);
        let native = NativeBlocks::plan(&c, &MIXED_FILE);
        assert_eq!(native.count(), 4 * c.num_layers - 1 + 2);
        assert!(native.keeps_embedding());
        let (d, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let vocab = c.vocab_size;
        let q4 = (q + kv) * d + d * q + 2 * ff * d;
        let q6 = kv * d + ff * d;
        let layers = c.num_layers;
        let (q4, q6) = (q4 + vocab * d / layers, q6 + vocab * d / layers);
        let file = layers * (q4 / 256 * 144 + q6 / 256 * 210) - 2 * ff * d / 256 * 144;
        let kept_bf16 = layers * (q4 + q6) - 2 * ff * d;
        let none = Fp8Keep::default();
        let saved = weight_bytes(&c, WeightFormat::Bf16, &none, &NONE)
            - weight_bytes(&c, WeightFormat::Bf16, &none, &native);
        let want = kept_bf16 * 2 - file;
        assert!(
            saved <= want && want - saved < 16 * 256 * layers,
            "saved {saved}, want {want}"
        );
    }

    #[test]
    fn sliding_models_get_a_second_pair_of_rope_tables() {
        let c = gemma3();
        let mut global_only = c.clone();
        global_only.block.sliding_window = None;
        let table = c.max_context * (c.head_dim / 2) * 4;
        let bytes = |c| DeviceWeights::bytes(c, WeightFormat::Bf16, &Fp8Keep::default(), &NONE);
        let extra = bytes(&c) - bytes(&global_only);
        assert!((2 * table..2 * table + 1024).contains(&extra), "{extra}");
    }

    #[test]
    fn fp8_weights_take_one_byte_per_layer_weight_plus_row_scales() {
        let c = gemma3();
        let (d, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let layer_weights = (q + 2 * kv) * d + d * q + 2 * ff * d + d * ff;
        let layer_rows = (q + 2 * kv) + d + 2 * ff + d;
        let none = Fp8Keep::default();
        let saved = weight_bytes(&c, WeightFormat::Bf16, &none, &NONE)
            - weight_bytes(&c, FP8, &none, &NONE);
        // bf16 2 bytes -> e4m3 1 byte, plus a 4-byte scale per row (and
        // the arena's 256-byte rounding of each piece).
        let want = c.num_layers * (layer_weights - 4 * layer_rows);
        let slack = c.num_layers * 16 * 256;
        assert!(saved.abs_diff(want) < slack, "saved {saved}, want {want}");
    }

    #[test]
    fn fp8_ignore_keeps_its_matrices_at_two_bytes_a_weight() {
        let c = gemma3();
        let (d, ff) = (c.hidden_size, c.intermediate_size);
        let none = Fp8Keep::default();
        let down = Fp8Keep::parse("down_proj", c.num_layers).unwrap();
        let extra = weight_bytes(&c, FP8, &down, &NONE) - weight_bytes(&c, FP8, &none, &NONE);
        // Each layer's down_proj: 2 bytes instead of 1, less its row scales.
        let want = c.num_layers * (d * ff - 4 * d);
        assert!(
            extra.abs_diff(want) < c.num_layers * 2 * 256,
            "extra {extra}, want {want}"
        );
        // Everything kept: the bf16 size.
        let all = Fp8Keep::parse("layers", c.num_layers).unwrap();
        assert_eq!(
            weight_bytes(&c, FP8, &all, &NONE),
            weight_bytes(&c, WeightFormat::Bf16, &none, &NONE)
        );
    }

    /// A tied FP8 head is a second copy beside the bf16 embedding table
    /// (1 byte a weight plus a 4-byte scale a row); an untied one replaces
    /// the bf16 head (saving 1 byte a weight, less the scales).
    #[test]
    fn fp8_lm_head_bytes_are_counted_in_the_plan() {
        let tied = gemma3();
        let (v, d) = (tied.vocab_size, tied.hidden_size);
        let none = Fp8Keep::default();
        let head = v * d + 4 * v;
        let extra =
            weight_bytes(&tied, FP8_HEAD, &none, &NONE) - weight_bytes(&tied, FP8, &none, &NONE);
        assert!(extra.abs_diff(head) < 2 * 256, "extra {extra}, want {head}");
        let mut untied = gemma3();
        untied.tie_word_embeddings = false;
        let saved = weight_bytes(&untied, FP8, &none, &NONE)
            - weight_bytes(&untied, FP8_HEAD, &none, &NONE);
        let want = v * d - 4 * v;
        assert!(saved.abs_diff(want) < 2 * 256, "saved {saved}, want {want}");
        // Only the head changes: the bf16 plan is the same either way.
        assert_eq!(
            weight_bytes(&untied, WeightFormat::Bf16, &none, &NONE)
                - weight_bytes(&untied, FP8, &none, &NONE),
            weight_bytes(&tied, WeightFormat::Bf16, &none, &NONE)
                - weight_bytes(&tied, FP8, &none, &NONE)
        );
    }
}
