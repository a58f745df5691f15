//! FP8 weights: which layer matrices are e4m3, their layout (e4m3 rows,
//! then f32 row scales), the one-layer bf16 staging they arrive in, and
//! the quantizer that turns each complete layer into e4m3 (see the
//! parent module's doc).

use ingot_models::ModelConfig;

use super::groups::{
    expert_part, group_index, layer_group_shape, matrix_part, GROUP_TENSORS, MATRIX_GROUPS,
};
use super::{scales_offset, WeightFormat, LM_HEAD};
use crate::device::{Arena, Arg, DevPtr, Gpu, Kernel};
use crate::{CudaError, Fp8Keep};

/// Bytes of an e4m3 matrix of `rows` x `cols` and its row scales.
pub fn fp8_matrix_bytes(rows: usize, cols: usize) -> usize {
    scales_offset(rows, cols) + rows * 4
}

/// Whether tensor `name` is written to FP8 staging rather than the arena
/// (a quantized layer matrix, or an untied e4m3 LM head).
pub(super) fn staged_for_fp8(name: &str, format: WeightFormat, keep: &Fp8Keep) -> bool {
    (format.is_fp8() && quantized_part(name, keep).is_some())
        || (format.fp8_lm_head() && name == LM_HEAD)
}

/// [`matrix_part`] (or, on a sparse layer, [`expert_part`]) of a matrix
/// that `keep` does not keep in bf16.
pub(super) fn quantized_part(name: &str, keep: &Fp8Keep) -> Option<(usize, &'static str, usize)> {
    matrix_part(name)
        .or_else(|| expert_part(name))
        .filter(|(layer, group, _)| !keep.keeps(*layer, group_index(group)))
}

/// Rows of layer `layer`'s matrix `group` before part `part` (the up
/// projections follow the gate's: a dense layer's `ff` rows, a sparse
/// layer's whole stack of experts' rows).
pub(super) fn part_rows(config: &ModelConfig, layer: usize, group: &str, part: usize) -> usize {
    match (group, part) {
        (_, 0) => 0,
        ("gate_up", _) => layer_group_shape(config, layer, group).0 / 2,
        _ => super::fused_offset_rows(config, group, part),
    }
}

/// Byte offset of `group` in the one-layer staging arena (bf16), in
/// layer `layer`'s layout.
fn staging_offset(config: &ModelConfig, layer: usize, group: &str) -> usize {
    MATRIX_GROUPS
        .iter()
        .take_while(|g| **g != group)
        .map(|g| {
            let (rows, cols) = layer_group_shape(config, layer, g);
            (rows * cols * 2).next_multiple_of(256)
        })
        .sum()
}

/// A layer matrix staged in bf16 at `staged`, quantized into `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Fp8Matrix {
    pub(super) staged: DevPtr,
    pub(super) dst: DevPtr,
    rows: usize,
    cols: usize,
}

impl Fp8Matrix {
    /// Rows of the matrix.
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    /// Where row `row` of the matrix is staged (bf16).
    pub(super) fn staged_at(&self, row: usize) -> DevPtr {
        self.staged + (row * self.cols * 2) as u64
    }

    /// The row scales (`[rows]` f32) after the e4m3 bytes.
    pub(super) fn scales(&self) -> DevPtr {
        self.dst + scales_offset(self.rows, self.cols) as u64
    }

    /// Where rows `row..` of the matrix go: their e4m3 bytes and their row
    /// scales (an FP8 checkpoint's tensor copied as it is).
    pub(super) fn rows_at(&self, row: usize) -> (DevPtr, DevPtr) {
        let scales = self.scales();
        (
            self.dst + (row * self.cols) as u64,
            scales + (row * 4) as u64,
        )
    }
}

/// Which layer's matrices are in staging and when they are complete.
/// Staging holds one layer, so a layer's tensors must load together.
pub(super) struct Fp8Progress {
    /// Per layer: its quantized matrices and the tensors still to come.
    layers: Vec<([Option<Fp8Matrix>; 4], usize)>,
    /// The layer whose tensors are in staging.
    open: Option<usize>,
}

impl Fp8Progress {
    /// Notes that a staged tensor of `layer` is in (its copy enqueued);
    /// after the layer's last, returns its matrices to quantize.
    pub(super) fn note_staged(
        &mut self,
        layer: usize,
        name: &str,
    ) -> Result<Option<[Option<Fp8Matrix>; 4]>, CudaError> {
        if self.open.is_some_and(|open| open != layer) {
            return Err(CudaError::Unsupported(format!(
                "{name} loads before the previous layer's matrices are complete (FP8 staging holds one layer)"
            )));
        }
        let (matrices, left) = self
            .layers
            .get_mut(layer)
            .ok_or_else(|| CudaError::Unsupported(format!("{name}: no such layer")))?;
        *left = left.saturating_sub(1);
        if *left > 0 {
            self.open = Some(layer);
            return Ok(None);
        }
        self.open = None;
        Ok(Some(*matrices))
    }

    /// Fails unless every layer was quantized.
    pub(super) fn finish(&self) -> Result<(), CudaError> {
        match self.layers.iter().position(|(_, left)| *left > 0) {
            Some(slot) => Err(CudaError::Unsupported(format!(
                "weight slot {slot}'s matrices are incomplete (a layer, or after the layers the FP8 LM head)"
            ))),
            None => Ok(()),
        }
    }
}

/// Enqueues `quantize_rows_e4m3` over staged matrices.
pub(super) fn quantize(
    gpu: &Gpu,
    kernel: &Kernel,
    matrices: &[Option<Fp8Matrix>],
) -> Result<(), CudaError> {
    for m in matrices.iter().flatten() {
        let args = [
            Arg::Ptr(m.staged),
            Arg::Ptr(m.dst),
            Arg::Ptr(m.scales()),
            Arg::I32(m.cols as i32),
        ];
        gpu.launch(kernel, (m.rows as u32, 1, 1), 256, 0, &args)?;
    }
    Ok(())
}

/// Every layer's e4m3 matrices (and the LM head's, when it is e4m3), and
/// the address range they fill.
pub(super) struct Fp8Layout {
    /// `None`: kept in bf16.
    pub(super) layers: Vec<[Option<Fp8Matrix>; 4]>,
    /// The e4m3 LM head, quantized from its staged tensor or the tied
    /// embedding table (`staged` set when the table is placed).
    pub(super) head: Option<Fp8Matrix>,
    pub(super) region: (DevPtr, DevPtr),
}

impl Fp8Layout {
    /// The quantizer's slots: each layer's matrices and tensor count, then
    /// the head's (one tensor: `lm_head.weight` or the embedding table).
    /// With `from_file` the layers' matrices are copied in as they are:
    /// nothing of theirs to quantize.
    pub(super) fn progress(&self, from_file: bool) -> Fp8Progress {
        let layers = self.layers.iter().map(|m| match from_file {
            true => ([None; 4], 0),
            false => (*m, staged_tensors(m)),
        });
        let head = self.head.map(|h| ([Some(h), None, None, None], 1));
        Fp8Progress {
            layers: layers.chain(head).collect(),
            open: None,
        }
    }
}

/// Bytes of every layer's e4m3 matrices (those `keep` leaves to FP8) in
/// the weights arena.
pub(super) fn layer_bytes(config: &ModelConfig, keep: &Fp8Keep) -> usize {
    (0..config.num_layers)
        .map(|layer| {
            Arena::size_of(
                MATRIX_GROUPS
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !keep.keeps(layer, *i))
                    .map(|(_, g)| {
                        let (rows, cols) = layer_group_shape(config, layer, g);
                        fp8_matrix_bytes(rows, cols)
                    }),
            )
        })
        .sum()
}

/// Bytes of the bf16 staging arena of an FP8 load: the largest layer, or
/// an untied e4m3 LM head if larger (it loads alone, after the layers).
pub(super) fn staging_bytes(config: &ModelConfig, format: WeightFormat) -> usize {
    let head = if format.fp8_lm_head() && !config.tie_word_embeddings {
        config.lm_head_rows() * config.hidden_size * 2
    } else {
        0
    };
    let layer = (0..config.num_layers)
        .map(|layer| staging_offset(config, layer, ""))
        .max()
        .unwrap_or(0);
    layer.max(head)
}

/// Takes every layer's e4m3 matrices from `arena` (one region), then
/// an e4m3 LM head's, and pairs them with their places in the
/// `staging` arena (the head's start there; a tied one's source is set
/// when the embedding table is placed).
pub(super) fn place(
    config: &ModelConfig,
    arena: &mut Arena,
    staging: DevPtr,
    format: WeightFormat,
    keep: &Fp8Keep,
) -> Result<Fp8Layout, CudaError> {
    let mut layers = Vec::with_capacity(config.num_layers);
    let (mut start, mut end) = (None, 0);
    for layer in 0..config.num_layers {
        let mut matrices = [None; 4];
        for (i, (m, group)) in matrices.iter_mut().zip(MATRIX_GROUPS).enumerate() {
            if keep.keeps(layer, i) {
                continue;
            }
            let (rows, cols) = layer_group_shape(config, layer, group);
            let bytes = fp8_matrix_bytes(rows, cols);
            let dst = arena.take(bytes)?;
            start.get_or_insert(dst);
            end = dst + bytes as u64;
            *m = Some(Fp8Matrix {
                staged: staging + staging_offset(config, layer, group) as u64,
                dst,
                rows,
                cols,
            });
        }
        layers.push(matrices);
    }
    let head = if format.fp8_lm_head() {
        let (rows, cols) = (config.lm_head_rows(), config.hidden_size);
        let bytes = fp8_matrix_bytes(rows, cols);
        let dst = arena.take(bytes)?;
        start.get_or_insert(dst);
        end = dst + bytes as u64;
        Some(Fp8Matrix {
            staged: staging,
            dst,
            rows,
            cols,
        })
    } else {
        None
    };
    Ok(Fp8Layout {
        layers,
        head,
        region: (start.unwrap_or(end), end),
    })
}

/// File tensors of a layer's quantized matrices (what staging receives).
fn staged_tensors(matrices: &[Option<Fp8Matrix>; 4]) -> usize {
    matrices
        .iter()
        .zip(GROUP_TENSORS)
        .filter(|(m, _)| m.is_some())
        .map(|(_, n)| n)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_configs::{llama8b, qwen3_moe, FP8, FP8_HEAD};
    use crate::weights::{ExpertWeights, EMBED};

    #[test]
    fn fp8_takes_the_layer_matrices_only() {
        assert_eq!(
            matrix_part("model.layers.12.self_attn.v_proj.weight"),
            Some((12, "qkv", 2))
        );
        assert_eq!(
            matrix_part("model.layers.0.mlp.down_proj.weight"),
            Some((0, "down", 0))
        );
        assert_eq!(matrix_part("model.layers.0.self_attn.q_proj.bias"), None);
        assert_eq!(matrix_part("model.layers.0.input_layernorm.weight"), None);
        assert_eq!(matrix_part("model.embed_tokens.weight"), None);
        assert_eq!(matrix_part("lm_head.weight"), None);
    }

    #[test]
    fn fp8_scales_follow_the_bytes_at_a_256_byte_boundary() {
        assert_eq!(scales_offset(3, 100), 512);
        assert_eq!(scales_offset(2, 128), 256);
        assert_eq!(fp8_matrix_bytes(3, 100), 512 + 12);
    }

    /// An untied e4m3 head goes through staging (1 GiB in bf16 on the 8B,
    /// more than a layer's 436 MiB), a tied one is quantized from the
    /// embedding table in place.
    #[test]
    fn an_untied_fp8_head_is_staged_and_sizes_staging() {
        let c = llama8b();
        let none = Fp8Keep::default();
        let layer = staging_bytes(&c, FP8);
        assert_eq!(layer, staging_offset(&c, 0, ""));
        assert_eq!(staging_bytes(&c, FP8_HEAD), 128256 * 4096 * 2);
        assert!(staged_for_fp8(LM_HEAD, FP8_HEAD, &none));
        assert!(!staged_for_fp8(LM_HEAD, FP8, &none));
        assert!(!staged_for_fp8(EMBED, FP8_HEAD, &none));
        assert!(staged_for_fp8(
            "model.layers.3.mlp.up_proj.weight",
            FP8_HEAD,
            &none
        ));
        assert!(!staged_for_fp8(
            "model.layers.3.mlp.up_proj.weight",
            WeightFormat::Bf16,
            &none
        ));
        let mut tied = c.clone();
        tied.tie_word_embeddings = true;
        assert_eq!(staging_bytes(&tied, FP8_HEAD), layer);
    }

    /// The head is the quantizer's last slot, complete after one tensor,
    /// and the progress refuses it while a layer is still open (its
    /// staging would be overwritten).
    #[test]
    fn the_fp8_head_is_one_tensor_after_the_layers() {
        let m = Fp8Matrix {
            staged: 0,
            dst: 0,
            rows: 8,
            cols: 16,
        };
        let layout = Fp8Layout {
            layers: vec![[Some(m); 4]; 2],
            head: Some(Fp8Matrix { rows: 32, ..m }),
            region: (0, 0),
        };
        let mut q = layout.progress(false);
        assert_eq!(q.layers.len(), 3);
        assert_eq!(q.layers[2].1, 1);
        assert!(matches!(q.note_staged(0, "q"), Ok(None)));
        assert!(q.note_staged(2, LM_HEAD).is_err());
        let mut q = layout.progress(false);
        let head = q.note_staged(2, LM_HEAD).ok().flatten();
        assert_eq!(head.and_then(|h| h[0]).map(|h| h.rows), Some(32));
        assert!(q.finish().is_err());
        let without = Fp8Layout {
            head: None,
            ..layout
        };
        assert_eq!(without.progress(false).layers.len(), 2);
    }

    /// An FP8 checkpoint's tensor lands at its rows of the fused matrix:
    /// bytes at row x cols, scales at the scale area's row; its layers
    /// leave the quantizer nothing (only an e4m3 head of bf16 weights).
    #[test]
    fn fp8_checkpoint_rows_land_in_place_and_skip_the_quantizer() {
        let m = Fp8Matrix {
            staged: 0,
            dst: 1 << 20,
            rows: 6144,
            cols: 4096,
        };
        let scales = (1 << 20) + scales_offset(6144, 4096) as u64;
        assert_eq!(m.rows_at(0), (1 << 20, scales));
        assert_eq!(
            m.rows_at(4096),
            ((1 << 20) + 4096 * 4096, scales + 4096 * 4)
        );
        let layout = Fp8Layout {
            layers: vec![[Some(m); 4]; 2],
            head: None,
            region: (0, 0),
        };
        let q = layout.progress(true);
        assert!(q
            .layers
            .iter()
            .all(|(ms, left)| *left == 0 && ms.iter().all(Option::is_none)));
        assert!(q.finish().is_ok());
        let with_head = Fp8Layout {
            head: Some(m),
            ..layout
        };
        assert_eq!(with_head.progress(true).layers[2].1, 1);
    }

    /// A sparse layer's experts are two e4m3 matrices (gate's rows then
    /// up's, and down's), counted in the layer's bytes and staged whole; a
    /// dense layer of the same model keeps its own shapes, and staging
    /// holds the largest layer.
    #[test]
    fn fp8_experts_are_two_stacked_matrices_per_sparse_layer() {
        let c = qwen3_moe(vec![1]);
        let none = Fp8Keep::default();
        let (e, w, d) = (128, 768, 2048);
        assert_eq!(layer_group_shape(&c, 0, "gate_up"), (2 * e * w, d));
        assert_eq!(layer_group_shape(&c, 0, "down"), (e * d, w));
        assert_eq!(layer_group_shape(&c, 1, "gate_up"), (2 * 6144, d));
        assert_eq!(layer_group_shape(&c, 0, "qkv"), ((32 + 8) * 128, d));
        for (name, part) in [
            (
                "model.layers.0.mlp.experts.gate_proj.weight",
                (0, "gate_up", 0),
            ),
            (
                "model.layers.0.mlp.experts.up_proj.weight",
                (0, "gate_up", 1),
            ),
            (
                "model.layers.0.mlp.experts.down_proj.weight",
                (0, "down", 0),
            ),
        ] {
            assert_eq!(quantized_part(name, &none), Some(part));
            assert!(staged_for_fp8(name, FP8, &none));
        }
        assert!(quantized_part("model.layers.0.mlp.gate.weight", &none).is_none());
        assert_eq!(part_rows(&c, 0, "gate_up", 1), e * w);
        assert_eq!(part_rows(&c, 1, "gate_up", 1), 6144);
        assert_eq!(part_rows(&c, 0, "qkv", 2), (32 + 4) * 128);
        let experts = fp8_matrix_bytes(2 * e * w, d) + fp8_matrix_bytes(e * d, w);
        let attention = fp8_matrix_bytes(5120, d) + fp8_matrix_bytes(d, 4096);
        let sparse = Arena::size_of([
            fp8_matrix_bytes(5120, d),
            fp8_matrix_bytes(d, 4096),
            fp8_matrix_bytes(2 * e * w, d),
            fp8_matrix_bytes(e * d, w),
        ]);
        assert!(sparse >= experts + attention);
        let one_dense = qwen3_moe((0..48).collect());
        assert!(layer_bytes(&c, &none) > layer_bytes(&one_dense, &none));
        // Staging takes the sparse layer's 3 x 128 x 768 x 2048 bf16 experts.
        assert!(staging_bytes(&c, FP8) >= 3 * e * w * d * 2);
        assert_eq!(staging_bytes(&c, FP8), staging_offset(&c, 0, ""));
    }

    /// FP8 experts read up's bytes and scales after gate's, in the one
    /// gate/up matrix; bf16 experts keep their three stacks and no scales.
    #[test]
    fn fp8_experts_find_up_and_the_scales_in_the_stacked_matrix() {
        let (e, w, d) = (128, 768, 2048);
        let gu = Fp8Matrix {
            staged: 0,
            dst: 1 << 30,
            rows: 2 * e * w,
            cols: d,
        };
        let dn = Fp8Matrix {
            staged: 0,
            dst: 1 << 34,
            rows: e * d,
            cols: w,
        };
        let experts = ExpertWeights::new(7, (gu.dst, gu.dst, dn.dst), (Some(gu), Some(dn)));
        assert_eq!(experts.up, gu.dst + (e * w * d) as u64);
        let scales = gu.dst + scales_offset(2 * e * w, d) as u64;
        let up_scales = scales + (e * w * 4) as u64;
        assert_eq!(experts.gate_up_scales, Some((scales, up_scales)));
        let down_scales = dn.dst + scales_offset(e * d, w) as u64;
        assert_eq!(experts.down_scales, Some(down_scales));
        let bf16 = ExpertWeights::new(7, (1, 2, 3), (None, None));
        assert_eq!((bf16.gate, bf16.up, bf16.down), (1, 2, 3));
        assert!(bf16.gate_up_scales.is_none() && bf16.down_scales.is_none());
    }

    /// The quantizer waits for a layer's seven matrices, refuses a
    /// second layer while one is open, and reports an unfinished layer.
    #[test]
    fn fp8_staging_holds_one_layer_at_a_time() {
        let m = Fp8Matrix {
            staged: 0,
            dst: 0,
            rows: 1,
            cols: 16,
        };
        // All seven tensors go through staging; a kept (bf16) o_proj and
        // down_proj take theirs straight to the arena.
        assert_eq!(staged_tensors(&[Some(m); 4]), 7);
        assert_eq!(staged_tensors(&[Some(m), None, Some(m), None]), 5);
        let mut q = Fp8Progress {
            layers: vec![([Some(m); 4], staged_tensors(&[Some(m); 4])); 2],
            open: None,
        };
        q.layers[0].1 = 2;
        assert!(matches!(q.note_staged(0, "a"), Ok(None)));
        assert_eq!(q.open, Some(0));
        assert!(q.note_staged(1, "b").is_err());
        assert!(matches!(q.note_staged(0, "a"), Ok(Some(_))));
        assert_eq!(q.open, None);
        assert!(q.finish().is_err());
    }
}
