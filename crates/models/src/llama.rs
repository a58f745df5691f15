//! Weights of the Llama-family decoder (Llama 2/3.x, Mistral, Qwen2/2.5,
//! Qwen3, SmolLM2): pre-norm blocks of GQA attention with rotary embeddings
//! and a SiLU-gated MLP, dense or a mixture of experts (Mixtral,
//! Qwen3-MoE). Paper: <https://arxiv.org/abs/2302.13971>.
//!
//! Shapes follow PyTorch: a linear weight is `[out_features, in_features]`.

use crate::{HostTensor, ModelConfig, ModelError, TensorSource};

/// One decoder block.
#[derive(Debug)]
pub struct LayerWeights {
    /// RMSNorm before attention, `[hidden]`.
    pub attn_norm: HostTensor,
    /// `[q_dim, hidden]`.
    pub q_proj: HostTensor,
    /// `[kv_dim, hidden]`.
    pub k_proj: HostTensor,
    /// `[kv_dim, hidden]`.
    pub v_proj: HostTensor,
    /// `[hidden, q_dim]`.
    pub o_proj: HostTensor,
    /// q/k/v biases (Qwen2).
    pub qkv_bias: Option<[HostTensor; 3]>,
    /// Per-head RMSNorm weights for q and k, `[head_dim]` each (Qwen3).
    pub qk_norm: Option<[HostTensor; 2]>,
    /// RMSNorm before the MLP, `[hidden]`.
    pub mlp_norm: HostTensor,
    /// RMSNorms of the attention output and of the MLP output, `[hidden]`
    /// each (Gemma 3).
    pub post_norms: Option<[HostTensor; 2]>,
    /// The MLP: dense or experts.
    pub mlp: MlpWeights,
}

/// A block's gated MLP.
#[derive(Debug)]
pub enum MlpWeights {
    /// One MLP for every token.
    Dense {
        /// `[intermediate, hidden]`.
        gate_proj: HostTensor,
        /// `[intermediate, hidden]`.
        up_proj: HostTensor,
        /// `[hidden, intermediate]`.
        down_proj: HostTensor,
    },
    /// A router over stacked experts.
    Experts {
        /// `[experts, hidden]`.
        router: HostTensor,
        /// `[experts, expert_intermediate, hidden]`.
        gate_proj: HostTensor,
        /// `[experts, expert_intermediate, hidden]`.
        up_proj: HostTensor,
        /// `[experts, hidden, expert_intermediate]`.
        down_proj: HostTensor,
    },
}

/// All decoder weights in f32.
#[derive(Debug)]
pub struct LlamaWeights {
    /// `[vocab, hidden]`.
    pub embed_tokens: HostTensor,
    /// Decoder blocks.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm, `[hidden]`.
    pub norm: HostTensor,
    /// `[vocab, hidden]`; `None` when tied to `embed_tokens`.
    pub lm_head: Option<HostTensor>,
}

impl LlamaWeights {
    /// The output projection (the embedding table when tied).
    pub fn output(&self) -> &HostTensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    /// Loads and shape-checks every tensor; `progress(done, total)` is called
    /// after each one.
    pub fn load(
        config: &ModelConfig,
        source: &dyn TensorSource,
        progress: &dyn Fn(usize, usize),
    ) -> Result<Self, ModelError> {
        let shapes = expected_shapes(config);
        let total = shapes.len();
        let mut done = 0;
        let mut get = |name: String| -> Result<HostTensor, ModelError> {
            let expected = shapes
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, s)| s.clone())
                .unwrap_or_default();
            let t = source.load(&name)?;
            if t.shape != expected {
                return Err(ModelError::ShapeMismatch {
                    name,
                    expected,
                    got: t.shape,
                });
            }
            done += 1;
            progress(done, total);
            Ok(t)
        };
        let embed_tokens = get("model.embed_tokens.weight".into())?;
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = |s: &str| format!("model.layers.{i}.{s}");
            let qkv_bias = if config.qkv_bias {
                Some([
                    get(p("self_attn.q_proj.bias"))?,
                    get(p("self_attn.k_proj.bias"))?,
                    get(p("self_attn.v_proj.bias"))?,
                ])
            } else {
                None
            };
            let qk_norm = if config.qk_norm {
                Some([
                    get(p("self_attn.q_norm.weight"))?,
                    get(p("self_attn.k_norm.weight"))?,
                ])
            } else {
                None
            };
            let post_norms = if config.block.post_norms {
                Some([get(p(POST_ATTN_NORM))?, get(p(POST_MLP_NORM))?])
            } else {
                None
            };
            let mlp = if is_sparse(config, i) {
                MlpWeights::Experts {
                    router: get(p(ROUTER))?,
                    gate_proj: get(p(EXPERTS_GATE))?,
                    up_proj: get(p(EXPERTS_UP))?,
                    down_proj: get(p(EXPERTS_DOWN))?,
                }
            } else {
                MlpWeights::Dense {
                    gate_proj: get(p("mlp.gate_proj.weight"))?,
                    up_proj: get(p("mlp.up_proj.weight"))?,
                    down_proj: get(p("mlp.down_proj.weight"))?,
                }
            };
            layers.push(LayerWeights {
                attn_norm: get(p("input_layernorm.weight"))?,
                q_proj: get(p("self_attn.q_proj.weight"))?,
                k_proj: get(p("self_attn.k_proj.weight"))?,
                v_proj: get(p("self_attn.v_proj.weight"))?,
                o_proj: get(p("self_attn.o_proj.weight"))?,
                qkv_bias,
                qk_norm,
                mlp_norm: get(p(mlp_norm_name(config)))?,
                post_norms,
                mlp,
            });
        }
        let norm = get("model.norm.weight".into())?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(get("lm_head.weight".into())?)
        };
        Ok(Self {
            embed_tokens,
            layers,
            norm,
            lm_head,
        })
    }
}

/// Name (within a layer) of a sparse MLP's router, `[experts, hidden]`.
pub const ROUTER: &str = "mlp.gate.weight";
/// Name (within a layer) of the stacked experts' gate projections,
/// `[experts, expert_intermediate, hidden]`. Hugging Face files hold one
/// tensor per expert (`mlp.experts.{e}.gate_proj.weight`; Mixtral's
/// `block_sparse_moe.experts.{e}.w1.weight`), stacked at load; GGUF files
/// hold the stack (`ffn_gate_exps`).
pub const EXPERTS_GATE: &str = "mlp.experts.gate_proj.weight";
/// As [`EXPERTS_GATE`], the up projections.
pub const EXPERTS_UP: &str = "mlp.experts.up_proj.weight";
/// As [`EXPERTS_GATE`], the down projections, `[experts, hidden,
/// expert_intermediate]`.
pub const EXPERTS_DOWN: &str = "mlp.experts.down_proj.weight";

/// True when layer `layer`'s MLP is experts.
pub fn is_sparse(c: &ModelConfig, layer: usize) -> bool {
    c.block.moe.as_ref().is_some_and(|m| m.is_sparse(layer))
}

/// Hugging Face name of the post-attention norm of post-norm blocks.
pub const POST_ATTN_NORM: &str = "post_attention_layernorm.weight";
/// Hugging Face name of the post-MLP norm of post-norm blocks.
pub const POST_MLP_NORM: &str = "post_feedforward_layernorm.weight";

/// Hugging Face name (within a layer) of the norm before the MLP: Llama
/// calls it `post_attention_layernorm`, post-norm blocks (Gemma) use that
/// name for the norm after attention.
pub fn mlp_norm_name(c: &ModelConfig) -> &'static str {
    if c.block.post_norms {
        "pre_feedforward_layernorm.weight"
    } else {
        "post_attention_layernorm.weight"
    }
}

/// Every tensor the config implies, with its shape, in load order.
pub fn expected_shapes(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (d, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![c.vocab_size, d],
    )];
    for i in 0..c.num_layers {
        let mut add =
            |s: &str, shape: Vec<usize>| out.push((format!("model.layers.{i}.{s}"), shape));
        if c.qkv_bias {
            add("self_attn.q_proj.bias", vec![q]);
            add("self_attn.k_proj.bias", vec![kv]);
            add("self_attn.v_proj.bias", vec![kv]);
        }
        if c.qk_norm {
            add("self_attn.q_norm.weight", vec![c.head_dim]);
            add("self_attn.k_norm.weight", vec![c.head_dim]);
        }
        add("input_layernorm.weight", vec![d]);
        add("self_attn.q_proj.weight", vec![q, d]);
        add("self_attn.k_proj.weight", vec![kv, d]);
        add("self_attn.v_proj.weight", vec![kv, d]);
        add("self_attn.o_proj.weight", vec![d, q]);
        add(mlp_norm_name(c), vec![d]);
        if c.block.post_norms {
            add(POST_ATTN_NORM, vec![d]);
            add(POST_MLP_NORM, vec![d]);
        }
        match c.block.moe.as_ref().filter(|m| m.is_sparse(i)) {
            Some(m) => {
                let (e, eff) = (m.num_experts, m.expert_intermediate_size);
                add(ROUTER, vec![e, d]);
                add(EXPERTS_GATE, vec![e, eff, d]);
                add(EXPERTS_UP, vec![e, eff, d]);
                add(EXPERTS_DOWN, vec![e, d, eff]);
            }
            None => {
                add("mlp.gate_proj.weight", vec![ff, d]);
                add("mlp.up_proj.weight", vec![ff, d]);
                add("mlp.down_proj.weight", vec![d, ff]);
            }
        }
    }
    out.push(("model.norm.weight".to_string(), vec![d]));
    if !c.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![c.lm_head_rows(), d]));
    }
    out
}
