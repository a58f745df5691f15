//! Which decoder matrices stay bf16 under `--quantization fp8`
//! (`model.fp8_ignore`, like vLLM's `ignored_layers`).
//!
//! The spec is a comma-separated list of patterns. A pattern matches a
//! matrix when its dot-separated segments appear, in order and whole, in
//! the matrix's name: `model.layers.{i}.self_attn.qkv_proj`,
//! `model.layers.{i}.self_attn.o_proj`, `model.layers.{i}.mlp.gate_up_proj`
//! or `model.layers.{i}.mlp.down_proj` (the names of the fused matrices the
//! CUDA backend stores). So `down_proj` keeps every layer's down
//! projection, `layers.0` all of layer 0 (not layer 10), and
//! `layers.29.mlp` layer 29's MLP. A kept matrix lies outside the FP8
//! region of the weight arena, so every product on it takes the bf16 path.

use crate::CudaError;

/// The matched names of a layer's matrices, in the order of
/// `weights::fp8::FP8_GROUPS` (qkv, o_proj, gate_up, down).
const MATRIX_NAMES: [&str; 4] = [
    "self_attn.qkv_proj",
    "self_attn.o_proj",
    "mlp.gate_up_proj",
    "mlp.down_proj",
];

/// Unfused parts a pattern cannot select on its own, and the fused
/// matrix that holds them.
const FUSED_PARTS: [(&str, &str); 5] = [
    ("q_proj", "qkv_proj"),
    ("k_proj", "qkv_proj"),
    ("v_proj", "qkv_proj"),
    ("gate_proj", "gate_up_proj"),
    ("up_proj", "gate_up_proj"),
];

/// Per layer, which of its four matrices stay bf16. The default keeps none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fp8Keep {
    layers: Vec<[bool; 4]>,
}

impl Fp8Keep {
    /// Parses `spec` (see the module docs) for a model of `num_layers`
    /// layers. Fails on an empty pattern, on a pattern naming part of a
    /// fused matrix, and on one that matches no matrix of this model.
    pub fn parse(spec: &str, num_layers: usize) -> Result<Self, CudaError> {
        let mut layers = vec![[false; 4]; num_layers];
        if spec.trim().is_empty() {
            return Ok(Self { layers });
        }
        for pattern in spec.split(',').map(str::trim) {
            let segments = checked_segments(pattern)?;
            let mut matched = false;
            for (layer, keep) in layers.iter_mut().enumerate() {
                for (index, kept) in keep.iter_mut().enumerate() {
                    if matches(&segments, &matrix_name(layer, index)) {
                        *kept = true;
                        matched = true;
                    }
                }
            }
            if !matched {
                return Err(CudaError::Unsupported(format!(
                    "model.fp8_ignore: `{pattern}` matches no matrix of this {num_layers}-layer \
                     model; names look like model.layers.0.self_attn.qkv_proj, \
                     model.layers.0.self_attn.o_proj, model.layers.0.mlp.gate_up_proj and \
                     model.layers.0.mlp.down_proj"
                )));
            }
        }
        Ok(Self { layers })
    }

    /// Whether matrix `index` (in `FP8_GROUPS` order) of `layer` stays bf16.
    pub fn keeps(&self, layer: usize, index: usize) -> bool {
        self.layers
            .get(layer)
            .and_then(|k| k.get(index))
            .copied()
            .unwrap_or(false)
    }

    /// How many matrices stay bf16.
    pub fn count(&self) -> usize {
        self.layers.iter().flatten().filter(|k| **k).count()
    }
}

fn matrix_name(layer: usize, index: usize) -> String {
    format!("model.layers.{layer}.{}", MATRIX_NAMES[index])
}

/// The pattern's segments, or why it cannot match anything.
fn checked_segments(pattern: &str) -> Result<Vec<&str>, CudaError> {
    let segments: Vec<&str> = pattern.split('.').collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err(CudaError::Unsupported(format!(
            "model.fp8_ignore: `{pattern}` is not a pattern (empty, or an empty segment \
             between dots); give comma-separated names such as `down_proj` or `layers.0`"
        )));
    }
    if let Some((part, fused)) = FUSED_PARTS.iter().find(|(p, _)| segments.contains(p)) {
        return Err(CudaError::Unsupported(format!(
            "model.fp8_ignore: `{pattern}` names {part}, which the CUDA backend fuses into \
             {fused}; keep the whole {fused} instead"
        )));
    }
    Ok(segments)
}

/// Whether `segments` occur, contiguous and whole, among `name`'s.
fn matches(segments: &[&str], name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.windows(segments.len()).any(|w| w == segments)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_whole_segments() {
        let k = Fp8Keep::parse("down_proj, layers.1", 12).unwrap();
        assert!((0..12).all(|l| k.keeps(l, 3)));
        assert!(k.keeps(1, 0) && k.keeps(1, 1) && k.keeps(1, 2));
        // `layers.1` is layer 1 only, not 10 or 11.
        assert!(!k.keeps(10, 0) && !k.keeps(11, 2) && !k.keeps(0, 0));
        assert_eq!(k.count(), 12 + 3);
    }

    #[test]
    fn vllm_style_full_names_and_sections_match() {
        let k = Fp8Keep::parse("model.layers.29.mlp,layers.0.self_attn.o_proj", 30).unwrap();
        assert!(k.keeps(29, 2) && k.keeps(29, 3) && !k.keeps(29, 0));
        assert!(k.keeps(0, 1) && !k.keeps(0, 0));
        assert_eq!(k.count(), 3);
    }

    #[test]
    fn empty_spec_keeps_nothing() {
        let k = Fp8Keep::parse(" ", 4).unwrap();
        assert_eq!(k.count(), 0);
        assert!(!k.keeps(0, 0));
        assert_eq!(Fp8Keep::default().count(), 0);
    }

    #[test]
    fn bad_patterns_are_refused_with_the_reason() {
        let err = |spec: &str| Fp8Keep::parse(spec, 30).unwrap_err().to_string();
        assert!(
            err("layers.30").contains("matches no matrix"),
            "{}",
            err("layers.30")
        );
        assert!(err("down_proj,,o_proj").contains("not a pattern"));
        assert!(err("layers..0").contains("not a pattern"));
        let e = err("layers.0.self_attn.k_proj");
        assert!(e.contains("k_proj") && e.contains("qkv_proj"), "{e}");
        assert!(err("gate_proj").contains("gate_up_proj"));
    }
}
