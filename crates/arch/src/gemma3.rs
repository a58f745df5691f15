//! Gemma 3 (text; paper <https://arxiv.org/abs/2503.19786>): the Llama
//! block plus q/k RMSNorm, an RMSNorm after attention and after the MLP
//! (before each residual add), a GELU-tanh gated MLP and embeddings scaled
//! by `sqrt(hidden)`. Five of every six layers attend through a sliding
//! window with their own (local) rope base; the sixth attends globally.
//! RMSNorm weights are used as stored: GGUF files already hold Gemma's
//! `1 + w`.

use ingot_models::ModelConfig;

use crate::ops::{
    Activation, AttentionSpec, DecoderOps, EmbedSpec, HeadSpec, MlpSpec, NextNorm, RopeTable,
};

/// The LM head, soft-capped where the config has a cap.
pub fn head_spec(config: &ModelConfig) -> HeadSpec {
    HeadSpec {
        softcap: config.block.final_logit_softcap,
    }
}

/// The attention block of layer `layer`: windowed with the local rope
/// table on sliding layers, global otherwise.
pub fn attention_spec(config: &ModelConfig, layer: usize) -> AttentionSpec {
    let window = config.block.window_of(layer);
    AttentionSpec {
        qkv_bias: false,
        qk_norm: true,
        rope: if window.is_some() {
            RopeTable::Local
        } else {
            RopeTable::Global
        },
        window,
        post_norm: true,
        softcap: None,
    }
}

/// The MLP block of every layer.
pub const MLP: MlpSpec = MlpSpec {
    act: Activation::GeluTanh,
    post_norm: true,
};

/// One forward step.
pub fn forward<O: DecoderOps>(config: &ModelConfig, ops: &mut O) -> Result<(), O::Error> {
    let embed = EmbedSpec {
        scale: Some((config.hidden_size as f32).sqrt()),
    };
    ops.embed(&embed, NextNorm::Attention(0))?;
    for layer in 0..config.num_layers {
        ops.attention(layer, &attention_spec(config, layer), NextNorm::Mlp(layer))?;
        let next = if layer + 1 < config.num_layers {
            NextNorm::Attention(layer + 1)
        } else {
            NextNorm::Final
        };
        ops.mlp(layer, &MLP, next)?;
    }
    ops.logits(&head_spec(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_models::{Architecture, BlockOptions, RopeConfig, RopeScaling, SlidingWindow};

    fn config() -> ModelConfig {
        let rope = |theta| RopeConfig {
            theta,
            scaling: RopeScaling::None,
        };
        ModelConfig {
            architecture: Architecture::Gemma3,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 12,
            num_heads: 4,
            num_kv_heads: 1,
            head_dim: 16,
            vocab_size: 100,
            max_context: 64,
            rms_norm_eps: 1e-6,
            rope: rope(1e6),
            qkv_bias: false,
            qk_norm: true,
            tie_word_embeddings: true,
            shard: None,
            block: BlockOptions {
                sliding_window: Some(SlidingWindow {
                    size: 8,
                    global_every: 6,
                    local_rope: rope(1e4),
                }),
                post_norms: true,
                attention_scale: None,
                final_logit_softcap: None,
                moe: None,
            },
        }
    }

    #[test]
    fn every_sixth_layer_is_global_with_the_global_rope() {
        let c = config();
        let specs: Vec<_> = (0..12).map(|l| attention_spec(&c, l)).collect();
        for (l, s) in specs.iter().enumerate() {
            let global = l == 5 || l == 11;
            assert_eq!(s.window, (!global).then_some(8), "layer {l}");
            let table = if global {
                RopeTable::Global
            } else {
                RopeTable::Local
            };
            assert_eq!(s.rope, table, "layer {l}");
            assert!(s.qk_norm && s.post_norm);
        }
        assert_eq!(crate::head_spec(&c).softcap, None);
    }
}
