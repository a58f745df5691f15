//! The decoder's weight matrices as the device holds them: per layer, the
//! fused q/k/v, o_proj, the fused gate/up and down_proj (the groups FP8 and
//! native GGUF blocks store, each from one or more file tensors).

use ingot_models::llama::{is_sparse, EXPERTS_DOWN, EXPERTS_GATE, EXPERTS_UP};
use ingot_models::ModelConfig;

/// A layer's matrices, in the order their last tensors load.
pub(super) const MATRIX_GROUPS: [&str; 4] = ["qkv", "o_proj", "gate_up", "down"];

/// The number of file tensors of each of [`MATRIX_GROUPS`] (q/k/v, o,
/// gate/up, down).
pub(super) const GROUP_TENSORS: [usize; 4] = [3, 1, 2, 1];

/// `(rows, cols)` of a layer's matrix `group` (see [`MATRIX_GROUPS`]).
pub(super) fn group_shape(config: &ModelConfig, group: &str) -> (usize, usize) {
    let (d, q, kv, ff) = (
        config.hidden_size,
        config.q_dim(),
        config.kv_dim(),
        config.intermediate_size,
    );
    match group {
        "qkv" => (q + 2 * kv, d),
        "o_proj" => (d, q),
        "gate_up" => (2 * ff, d),
        _ => (d, ff),
    }
}

/// [`group_shape`] of layer `layer`: a sparse layer's "gate_up" and "down"
/// are its stacked experts as one matrix each (gate's rows then up's,
/// `[2 * experts * width, hidden]`; down's `[experts * hidden, width]`),
/// as FP8 stores them.
pub(super) fn layer_group_shape(config: &ModelConfig, layer: usize, group: &str) -> (usize, usize) {
    match &config.block.moe {
        Some(m) if is_sparse(config, layer) && group != "qkv" && group != "o_proj" => {
            let (e, w, d) = (
                m.num_experts,
                m.expert_intermediate_size,
                config.hidden_size,
            );
            if group == "gate_up" {
                (2 * e * w, d)
            } else {
                (e * d, w)
            }
        }
        _ => group_shape(config, group),
    }
}

/// `(layer, group, part)` of a sparse layer's stacked expert tensor, as
/// [`matrix_part`] names a dense layer's (see [`layer_group_shape`]).
pub(super) fn expert_part(name: &str) -> Option<(usize, &'static str, usize)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, leaf) = rest.split_once('.')?;
    let (group, part) = match leaf {
        EXPERTS_GATE => ("gate_up", 0),
        EXPERTS_UP => ("gate_up", 1),
        EXPERTS_DOWN => ("down", 0),
        _ => return None,
    };
    Some((layer.parse().ok()?, group, part))
}

/// The file tensors of each of [`MATRIX_GROUPS`], under a layer's prefix,
/// in the order their rows are stacked.
const GROUP_LEAVES: [&[&str]; 4] = [
    &[
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
    ],
    &["self_attn.o_proj.weight"],
    &["mlp.gate_proj.weight", "mlp.up_proj.weight"],
    &["mlp.down_proj.weight"],
];

/// `(layer, group, part)` of a layer weight matrix (its group and its rows'
/// place in it).
pub(super) fn matrix_part(name: &str) -> Option<(usize, &'static str, usize)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, leaf) = rest.split_once('.')?;
    let (group, part) = GROUP_LEAVES
        .iter()
        .zip(MATRIX_GROUPS)
        .find_map(|(leaves, group)| Some((group, leaves.iter().position(|l| *l == leaf)?)))?;
    Some((layer.parse().ok()?, group, part))
}

/// The file tensors of layer `layer`'s matrix group `group` (an index
/// into [`MATRIX_GROUPS`]).
pub(super) fn group_tensors(layer: usize, group: usize) -> impl Iterator<Item = String> {
    GROUP_LEAVES[group]
        .iter()
        .map(move |leaf| format!("model.layers.{layer}.{leaf}"))
}

/// Index of `group` in [`MATRIX_GROUPS`].
pub(super) fn group_index(group: &str) -> usize {
    MATRIX_GROUPS.iter().position(|g| *g == group).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_group_tensor_maps_back_to_its_group_and_part() {
        for (g, group) in MATRIX_GROUPS.iter().enumerate() {
            let names: Vec<String> = group_tensors(7, g).collect();
            assert_eq!(names.len(), GROUP_TENSORS[g]);
            for (part, name) in names.iter().enumerate() {
                assert_eq!(matrix_part(name), Some((7, *group, part)));
            }
        }
        assert_eq!(matrix_part("model.layers.x.mlp.down_proj.weight"), None);
        assert_eq!(
            matrix_part("model.layers.1.mlp.experts.0.down_proj.weight"),
            None
        );
        assert_eq!(
            expert_part("model.layers.4.mlp.experts.up_proj.weight"),
            Some((4, "gate_up", 1))
        );
        assert_eq!(
            expert_part("model.layers.4.mlp.experts.down_proj.weight"),
            Some((4, "down", 0))
        );
        assert_eq!(expert_part("model.layers.4.mlp.down_proj.weight"), None);
    }
}
