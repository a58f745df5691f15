//! The resolved decoder configuration: every field decided, no `Option`s.
//!
//! Built from a Hugging Face `config.json` ([`crate::hf`]) or GGUF metadata
//! ([`crate::gguf_model`]); the rest of the engine only sees [`ModelConfig`].

use crate::ModelError;

/// Decoder families served by the one Llama-style decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3.x, SmolLM2, TinyLlama.
    Llama,
    /// Mistral (Llama layout).
    Mistral,
    /// Qwen2 / Qwen2.5: bias on q/k/v.
    Qwen2,
    /// Qwen3: RMSNorm on q and k per head, no bias.
    Qwen3,
    /// Qwen3-MoE: Qwen3 attention, mixture-of-experts MLPs (softmax
    /// routing, top-k, optionally renormalised; no shared expert).
    Qwen3Moe,
    /// Mixtral: Mistral attention, mixture-of-experts MLPs (top-k of a
    /// softmax, renormalised). llama.cpp writes it as `llama` with experts.
    Mixtral,
    /// Gemma 3 (text): sliding-window attention on most layers, q/k norms,
    /// norms after attention and MLP too, GELU-tanh MLP, scaled embeddings.
    Gemma3,
}

impl Architecture {
    /// Maps an HF `architectures[0]` or a GGUF `general.architecture` name.
    pub fn from_name(name: &str) -> Result<Self, ModelError> {
        Ok(match name {
            "LlamaForCausalLM" | "llama" => Self::Llama,
            "MistralForCausalLM" | "mistral" => Self::Mistral,
            "Qwen2ForCausalLM" | "qwen2" => Self::Qwen2,
            "Qwen3ForCausalLM" | "qwen3" => Self::Qwen3,
            "Qwen3MoeForCausalLM" | "qwen3moe" | "qwen3_moe" => Self::Qwen3Moe,
            "MixtralForCausalLM" | "mixtral" => Self::Mixtral,
            "Gemma3ForCausalLM" | "gemma3" | "gemma3_text" => Self::Gemma3,
            other => {
                return Err(ModelError::UnsupportedArchitecture {
                    name: other.to_string(),
                })
            }
        })
    }

    /// Short display name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Qwen3Moe => "qwen3moe",
            Self::Mixtral => "mixtral",
            Self::Gemma3 => "gemma3",
        }
    }
}

/// How rotary frequencies are stretched for long contexts.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear {
        /// Stretch factor.
        factor: f32,
    },
    /// Llama 3.1 wavelength-dependent scaling.
    Llama3 {
        /// Scale for low frequencies.
        factor: f32,
        /// Wavelength bound below which frequencies are scaled fully.
        low_freq_factor: f32,
        /// Wavelength bound above which frequencies are kept.
        high_freq_factor: f32,
        /// Context the model was pre-trained with.
        original_max_position: usize,
    },
    /// Per-frequency divisors stored in the file (GGUF `rope_freqs.weight`).
    FreqFactors(Vec<f32>),
}

/// Rotary position embedding parameters. Rotation is always applied in the
/// Hugging Face "rotate half" layout; GGUF llama weights are un-permuted at load.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    /// Base of the frequency geometric series.
    pub theta: f32,
    /// Long-context scaling.
    pub scaling: RopeScaling,
}

impl RopeConfig {
    /// Inverse frequencies, one per rotated pair (`head_dim / 2` values).
    pub fn inv_freqs(&self, head_dim: usize) -> Vec<f32> {
        let half = head_dim / 2;
        (0..half)
            .map(|i| {
                let base = 1.0 / (self.theta as f64).powf(2.0 * i as f64 / head_dim as f64);
                (match &self.scaling {
                    RopeScaling::None => base,
                    RopeScaling::Linear { factor } => base / *factor as f64,
                    RopeScaling::FreqFactors(f) => base / f.get(i).copied().unwrap_or(1.0) as f64,
                    RopeScaling::Llama3 {
                        factor,
                        low_freq_factor,
                        high_freq_factor,
                        original_max_position,
                    } => llama3_scale(
                        base,
                        *factor as f64,
                        *low_freq_factor as f64,
                        *high_freq_factor as f64,
                        *original_max_position as f64,
                    ),
                }) as f32
            })
            .collect()
    }
}

impl RopeConfig {
    /// cos and sin of every (position, frequency) pair for positions
    /// `0..max_positions`, each `[max_positions, head_dim / 2]`, computed in f64.
    pub fn tables(&self, head_dim: usize, max_positions: usize) -> (Vec<f32>, Vec<f32>) {
        let inv = self.inv_freqs(head_dim);
        let n = max_positions * inv.len();
        let (mut cos, mut sin) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for pos in 0..max_positions {
            for &f in &inv {
                let angle = pos as f64 * f as f64;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        (cos, sin)
    }
}

/// Llama 3.1 rope scaling (see `_compute_llama3_parameters` in transformers).
fn llama3_scale(inv_freq: f64, factor: f64, low: f64, high: f64, orig: f64) -> f64 {
    let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
    let low_wavelen = orig / low;
    let high_wavelen = orig / high;
    if wavelen < high_wavelen {
        inv_freq
    } else if wavelen > low_wavelen {
        inv_freq / factor
    } else {
        let smooth = (orig / wavelen - low) / (high - low);
        (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
    }
}

/// Sliding-window attention on some layers (Gemma 3: five local layers,
/// then one global, repeating).
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// A query at position `p` sees keys at `p - size + 1 ..= p` on sliding
    /// layers.
    pub size: usize,
    /// Layer `i` attends globally when `(i + 1) % global_every == 0`, and
    /// through the window otherwise.
    pub global_every: usize,
    /// Rotary parameters of the sliding layers (the global ones use
    /// [`ModelConfig::rope`]).
    pub local_rope: RopeConfig,
}

/// Values of a model's file that a block beyond the plain pre-norm Llama
/// block needs (what is fixed per family, such as Gemma's GELU-tanh MLP or
/// its embedding scale, is written in its architecture file instead). The
/// default is the Llama block.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockOptions {
    /// Windowed attention on some layers; `None`: every layer is global.
    pub sliding_window: Option<SlidingWindow>,
    /// RMSNorm on the attention output and on the MLP output before each is
    /// added to the residual stream.
    pub post_norms: bool,
    /// Attention scores are `q·k * scale`; `None`: `head_dim^-0.5`.
    pub attention_scale: Option<f32>,
    /// Logits become `cap * tanh(logits / cap)`.
    pub final_logit_softcap: Option<f32>,
    /// Mixture-of-experts MLPs; `None`: every MLP is dense.
    pub moe: Option<MoeConfig>,
}

/// Mixture-of-experts MLP layers: a router picks `experts_per_token` of
/// `num_experts` gated MLPs per token and sums their outputs, weighted by
/// the router's softmax probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Experts per sparse layer.
    pub num_experts: usize,
    /// Experts each token is routed to (top-k).
    pub experts_per_token: usize,
    /// Inner width of one expert's gated MLP.
    pub expert_intermediate_size: usize,
    /// The top-k probabilities are divided by their sum (Mixtral always;
    /// Qwen3-MoE's `norm_topk_prob`).
    pub normalize_top_k: bool,
    /// Layers with a dense MLP of `intermediate_size` instead (Qwen3-MoE's
    /// `mlp_only_layers` and `decoder_sparse_step`), ascending.
    pub dense_layers: Vec<usize>,
}

impl MoeConfig {
    /// True when layer `layer`'s MLP is experts.
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.dense_layers.binary_search(&layer).is_err()
    }

    /// Parameters of one sparse layer's MLP: the router and every expert.
    pub fn layer_params(&self, hidden: usize) -> usize {
        self.num_experts * (hidden + 3 * hidden * self.expert_intermediate_size)
    }

    /// Parameters of one sparse layer's MLP that a token reads: the router
    /// and its experts.
    pub fn active_layer_params(&self, hidden: usize) -> usize {
        self.num_experts * hidden
            + self.experts_per_token * 3 * hidden * self.expert_intermediate_size
    }
}

impl BlockOptions {
    /// The attention window of layer `layer`: `Some(size)` on sliding
    /// layers, `None` on global ones.
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        let w = self.sliding_window.as_ref()?;
        (!(layer + 1).is_multiple_of(w.global_every.max(1))).then_some(w.size)
    }
}

/// A fully resolved decoder configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Decoder family.
    pub architecture: Architecture,
    /// Model width.
    pub hidden_size: usize,
    /// Gated-MLP inner width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (GQA when smaller than `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Rows of the embedding table.
    pub vocab_size: usize,
    /// Longest supported sequence (prompt + generated).
    pub max_context: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// Rotary embedding parameters.
    pub rope: RopeConfig,
    /// Bias on the q/k/v projections (Qwen2).
    pub qkv_bias: bool,
    /// RMSNorm on q and k per head (Qwen3).
    pub qk_norm: bool,
    /// The output projection reuses the embedding table.
    pub tie_word_embeddings: bool,
    /// Departures from the Llama block (all default for the Llama family).
    pub block: BlockOptions,
    /// One rank's part of a tensor-parallel model (its heads and widths
    /// above are the rank's; see [`crate::parallel`]); `None`: the whole
    /// model.
    pub shard: Option<crate::parallel::Shard>,
}

/// The sizes of a dense Llama ([`ModelConfig::llama`]).
#[derive(Debug, Clone, Copy)]
pub struct LlamaShape {
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
}

impl ModelConfig {
    /// A dense Llama of `shape` (rope base 10,000, RMSNorm eps 1e-5, tied
    /// embeddings, 512 positions): small models for tests and benchmarks.
    pub fn llama(shape: LlamaShape) -> Self {
        Self {
            architecture: Architecture::Llama,
            hidden_size: shape.hidden,
            intermediate_size: shape.intermediate,
            num_layers: shape.layers,
            num_heads: shape.heads,
            num_kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
            vocab_size: shape.vocab,
            max_context: 512,
            rms_norm_eps: 1e-5,
            rope: RopeConfig {
                theta: 10000.0,
                scaling: RopeScaling::None,
            },
            qkv_bias: false,
            qk_norm: false,
            tie_word_embeddings: true,
            shard: None,
            block: BlockOptions::default(),
        }
    }

    /// Width of the query projection output.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Rows of the LM head this config computes: the vocabulary, or a
    /// tensor-parallel rank's share of it.
    pub fn lm_head_rows(&self) -> usize {
        self.shard.map_or(self.vocab_size, |s| s.vocab_rows)
    }

    /// Width of the key (and value) projection output.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Parameters of the decoder (embedding, every layer's projections,
    /// norms and biases, every expert and router, the final norm and an
    /// untied LM head): what sizes its weights in memory.
    pub fn num_params(&self) -> usize {
        self.count_params(false)
    }

    /// Parameters one token reads: [`Self::num_params`] with only
    /// `experts_per_token` experts of each sparse layer (equal to it for a
    /// dense model).
    pub fn num_active_params(&self) -> usize {
        self.count_params(true)
    }

    fn count_params(&self, active_only: bool) -> usize {
        let (h, q, kv) = (self.hidden_size, self.q_dim(), self.kv_dim());
        let attention = h * (q + 2 * kv) + q * h;
        let norms = self.norms_per_layer() * h + if self.qk_norm { 2 * self.head_dim } else { 0 };
        let bias = if self.qkv_bias { q + 2 * kv } else { 0 };
        let dense_mlp = 3 * h * self.intermediate_size;
        let mlps: usize = (0..self.num_layers)
            .map(|layer| match &self.block.moe {
                Some(moe) if moe.is_sparse(layer) && active_only => moe.active_layer_params(h),
                Some(moe) if moe.is_sparse(layer) => moe.layer_params(h),
                _ => dense_mlp,
            })
            .sum();
        let layers = self.num_layers * (attention + norms + bias) + mlps;
        let embedding = self.vocab_size * h;
        let head = if self.tie_word_embeddings {
            0
        } else {
            embedding
        };
        embedding + layers + h + head
    }

    /// Hidden-width RMSNorms in a block: before attention and the MLP, and
    /// after each with post-norms.
    fn norms_per_layer(&self) -> usize {
        if self.block.post_norms {
            4
        } else {
            2
        }
    }

    /// The rotary parameters of layer `layer` (sliding layers may have
    /// their own).
    pub fn rope_of(&self, layer: usize) -> &RopeConfig {
        match &self.block.sliding_window {
            Some(w) if self.block.window_of(layer).is_some() => &w.local_rope,
            _ => &self.rope,
        }
    }

    /// Checks the shape relations the forward pass relies on.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |msg: String| Err(ModelError::InvalidConfig(msg));
        if self.hidden_size == 0 || self.num_layers == 0 || self.vocab_size == 0 {
            return bad("hidden_size, num_layers and vocab_size must be non-zero".into());
        }
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
        {
            return bad(format!(
                "num_heads ({}) must be a non-zero multiple of num_kv_heads ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim must be even, got {}", self.head_dim));
        }
        if self.rope.theta.is_nan() || self.rope.theta <= 0.0 {
            return bad(format!(
                "rope theta must be positive, got {}",
                self.rope.theta
            ));
        }
        if let Some(w) = &self.block.sliding_window {
            if w.size == 0 || w.global_every == 0 {
                return bad("sliding window size and global layer period must be non-zero".into());
            }
        }
        if let Some(moe) = &self.block.moe {
            if moe.num_experts == 0
                || moe.experts_per_token == 0
                || moe.experts_per_token > moe.num_experts
                || moe.expert_intermediate_size == 0
            {
                return bad(format!(
                    "a mixture of experts needs 1 <= experts per token ({}) <= experts ({}) and a non-zero expert width",
                    moe.experts_per_token, moe.num_experts
                ));
            }
        }
        if self
            .block
            .final_logit_softcap
            .is_some_and(|c| c.is_nan() || c <= 0.0)
        {
            return bad("final logit soft-cap must be positive".into());
        }
        Ok(())
    }

    /// Parameter count of the decoder as configured.
    pub fn num_parameters(&self) -> u64 {
        self.num_params() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_inv_freqs() {
        let r = RopeConfig {
            theta: 10000.0,
            scaling: RopeScaling::None,
        };
        let f = r.inv_freqs(8);
        assert_eq!(f.len(), 4);
        assert!((f[0] - 1.0).abs() < 1e-7);
        assert!((f[1] - 0.1).abs() < 1e-7);
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let r = RopeConfig {
            theta: 500000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 8192,
            },
        };
        let plain = RopeConfig {
            theta: 500000.0,
            scaling: RopeScaling::None,
        };
        let (a, b) = (r.inv_freqs(128), plain.inv_freqs(128));
        assert_eq!(a[0], b[0]);
        assert!((a[63] - b[63] / 8.0).abs() < 1e-12);
    }

    #[test]
    fn gemma3_layers_alternate_five_local_one_global() {
        let local = RopeConfig {
            theta: 10000.0,
            scaling: RopeScaling::None,
        };
        let block = BlockOptions {
            sliding_window: Some(SlidingWindow {
                size: 512,
                global_every: 6,
                local_rope: local,
            }),
            ..Default::default()
        };
        let windows: Vec<_> = (0..12).map(|i| block.window_of(i)).collect();
        let global: Vec<usize> = (0..12).filter(|&i| windows[i].is_none()).collect();
        assert_eq!(global, vec![5, 11]);
        assert_eq!(windows[0], Some(512));
        assert_eq!(BlockOptions::default().window_of(3), None);
    }

    #[test]
    fn unknown_architecture_is_named() {
        let e = Architecture::from_name("GPTBigCodeForCausalLM").unwrap_err();
        assert!(e.to_string().contains("GPTBigCodeForCausalLM"));
    }
}
