//! The Llama family: Llama 2/3.x, SmolLM2, TinyLlama, Mistral, Qwen2
//! (bias on q/k/v) and Qwen3 (q/k RMSNorm). Pre-norm blocks, SwiGLU MLP,
//! one rope table, full attention.

use ingot_models::ModelConfig;

use crate::ops::{
    Activation, AttentionSpec, DecoderOps, EmbedSpec, HeadSpec, MlpSpec, NextNorm, RopeTable,
};

/// The LM head: no soft-capping.
pub const HEAD: HeadSpec = HeadSpec { softcap: None };

/// The attention block of every layer.
pub fn attention_spec(config: &ModelConfig) -> AttentionSpec {
    AttentionSpec {
        qkv_bias: config.qkv_bias,
        qk_norm: config.qk_norm,
        rope: RopeTable::Global,
        window: None,
        post_norm: false,
        softcap: None,
    }
}

/// The MLP block of every layer.
pub const MLP: MlpSpec = MlpSpec {
    act: Activation::Silu,
    post_norm: false,
};

/// One forward step.
pub fn forward<O: DecoderOps>(config: &ModelConfig, ops: &mut O) -> Result<(), O::Error> {
    let attention = attention_spec(config);
    ops.embed(&EmbedSpec { scale: None }, NextNorm::Attention(0))?;
    for layer in 0..config.num_layers {
        ops.attention(layer, &attention, NextNorm::Mlp(layer))?;
        let next = if layer + 1 < config.num_layers {
            NextNorm::Attention(layer + 1)
        } else {
            NextNorm::Final
        };
        ops.mlp(layer, &MLP, next)?;
    }
    ops.logits(&HEAD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_models::{Architecture, RopeConfig, RopeScaling};

    /// Records the calls and the norm each writer announces.
    #[derive(Default)]
    struct Recorder(Vec<String>);

    impl DecoderOps for Recorder {
        type Error = ();
        fn embed(&mut self, _: &EmbedSpec, next: NextNorm) -> Result<(), ()> {
            self.0.push(format!("embed>{next:?}"));
            Ok(())
        }
        fn attention(&mut self, l: usize, s: &AttentionSpec, next: NextNorm) -> Result<(), ()> {
            self.0.push(format!("attn{l}/{}>{next:?}", s.qk_norm));
            Ok(())
        }
        fn mlp(&mut self, l: usize, _: &MlpSpec, next: NextNorm) -> Result<(), ()> {
            self.0.push(format!("mlp{l}>{next:?}"));
            Ok(())
        }
        fn logits(&mut self, _: &HeadSpec) -> Result<(), ()> {
            self.0.push("logits".into());
            Ok(())
        }
    }

    #[test]
    fn layers_run_in_order_and_announce_the_norm_that_reads_next() {
        let config = ModelConfig {
            architecture: Architecture::Qwen3,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            vocab_size: 100,
            max_context: 64,
            rms_norm_eps: 1e-6,
            rope: RopeConfig {
                theta: 10000.0,
                scaling: RopeScaling::None,
            },
            qkv_bias: false,
            qk_norm: true,
            tie_word_embeddings: true,
        };
        let mut ops = Recorder::default();
        assert_eq!(crate::forward(&config, &mut ops), Ok(()));
        assert_eq!(
            ops.0,
            [
                "embed>Attention(0)",
                "attn0/true>Mlp(0)",
                "mlp0>Attention(1)",
                "attn1/true>Mlp(1)",
                "mlp1>Final",
                "logits"
            ]
        );
    }
}
