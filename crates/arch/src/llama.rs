//! The Llama family: Llama 2/3.x, SmolLM2, TinyLlama, Mistral, Qwen2
//! (bias on q/k/v) and Qwen3 (q/k RMSNorm), and their mixture-of-experts
//! kin Mixtral and Qwen3-MoE (a routed set of SwiGLU experts in place of
//! the MLP on sparse layers). Pre-norm blocks, SwiGLU MLP, one rope table,
//! full attention.

use ingot_models::ModelConfig;

use crate::ops::{
    Activation, AttentionSpec, DecoderOps, EmbedSpec, HeadSpec, MlpSpec, MoeSpec, NextNorm,
    RopeTable, Routing,
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

/// The expert block of the sparse layers, `None` for a dense model.
pub fn moe_spec(config: &ModelConfig) -> Option<MoeSpec> {
    config.block.moe.as_ref().map(|m| MoeSpec {
        act: Activation::Silu,
        routing: Routing::SoftmaxTopK,
        top_k: m.experts_per_token,
        normalize: m.normalize_top_k,
    })
}

/// One forward step.
pub fn forward<O: DecoderOps>(config: &ModelConfig, ops: &mut O) -> Result<(), O::Error> {
    let attention = attention_spec(config);
    let moe = moe_spec(config);
    ops.embed(&EmbedSpec { scale: None }, NextNorm::Attention(0))?;
    for layer in 0..config.num_layers {
        ops.attention(layer, &attention, NextNorm::Mlp(layer))?;
        let next = if layer + 1 < config.num_layers {
            NextNorm::Attention(layer + 1)
        } else {
            NextNorm::Final
        };
        match &moe {
            Some(spec) if ingot_models::llama::is_sparse(config, layer) => {
                ops.moe(layer, spec, next)?
            }
            _ => ops.mlp(layer, &MLP, next)?,
        }
    }
    ops.logits(&HEAD)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        fn moe(&mut self, l: usize, s: &MoeSpec, next: NextNorm) -> Result<(), ()> {
            self.0
                .push(format!("moe{l}/{}/{}>{next:?}", s.top_k, s.normalize));
            Ok(())
        }
        fn logits(&mut self, _: &HeadSpec) -> Result<(), ()> {
            self.0.push("logits".into());
            Ok(())
        }
    }

    /// A config from tests/gpu/configs.
    fn config(name: &str) -> ModelConfig {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/gpu/configs");
        let loaded = ingot_models::hf::load_config(&dir.join(name).join("config.json"));
        loaded.unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    #[test]
    fn layers_run_in_order_and_announce_the_norm_that_reads_next() {
        for (name, qk_norm) in [("qwen3-8b", true), ("llama-3.1-8b", false)] {
            let config = config(name);
            let n = config.num_layers;
            let mut ops = Recorder::default();
            assert_eq!(crate::forward(&config, &mut ops), Ok(()));
            let mut expected = vec!["embed>Attention(0)".to_string()];
            for l in 0..n {
                expected.push(format!("attn{l}/{qk_norm}>Mlp({l})"));
                let next = if l + 1 < n {
                    format!("Attention({})", l + 1)
                } else {
                    "Final".into()
                };
                expected.push(format!("mlp{l}>{next}"));
            }
            expected.push("logits".into());
            assert_eq!(ops.0, expected, "{name}");
        }
    }

    #[test]
    fn sparse_layers_run_experts_and_dense_layers_the_mlp() {
        let mut config = config("qwen3-30b-a3b");
        config.num_layers = 3;
        if let Some(moe) = config.block.moe.as_mut() {
            moe.dense_layers = vec![1];
        }
        let mut ops = Recorder::default();
        assert_eq!(crate::forward(&config, &mut ops), Ok(()));
        let blocks: Vec<&str> = ops.0.iter().map(String::as_str).collect();
        assert_eq!(
            blocks,
            [
                "embed>Attention(0)",
                "attn0/true>Mlp(0)",
                "moe0/8/true>Attention(1)",
                "attn1/true>Mlp(1)",
                "mlp1>Attention(2)",
                "attn2/true>Mlp(2)",
                "moe2/8/true>Final",
                "logits",
            ]
        );
    }
}
