//! GGUF Q8_0 decoder matrices kept in their blocks on the device
//! (`model.cuda_weights = "native"`): which matrices ([`NativeBlocks`]),
//! their layout (int8 quants row-major, then one f16 scale per block of 32
//! at the next 256-byte boundary: `quant.cu`), where each file tensor's
//! rows land in its fused matrix, and how its 34-byte blocks are split on
//! the way in (the quants stay 16-byte aligned for the GEMV's loads).

use ingot_models::gguf::GgmlType;
use ingot_models::{ModelConfig, TensorSource};

use super::groups::{group_index, group_shape, group_tensors, matrix_part, MATRIX_GROUPS};
use super::{fused_offset_rows, scales_offset};
use crate::device::{Arena, DevPtr};
use crate::CudaError;

/// Weights per Q8_0 block.
pub const Q8_0_BLOCK: usize = 32;
/// Bytes of a Q8_0 block in the file: its f16 scale, then 32 int8 quants.
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// Device bytes of a Q8_0 matrix: the file's bytes plus the padding before
/// the scales.
pub fn q8_0_matrix_bytes(rows: usize, cols: usize) -> usize {
    scales_offset(rows, cols) + rows * cols / Q8_0_BLOCK * 2
}

/// Which layer matrices keep their GGUF Q8_0 blocks on the device; the
/// rest (other types, float storage) expand to bf16 at load.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NativeBlocks {
    /// Per layer, per matrix group (q/k/v, o, gate/up, down).
    layers: Vec<[bool; 4]>,
}

impl NativeBlocks {
    /// Nothing kept: every matrix in bf16.
    pub const fn none() -> Self {
        Self { layers: Vec::new() }
    }

    /// The matrices of `source` whose every file tensor is stored in Q8_0
    /// (a fused q/k/v with one part in another type expands whole), read
    /// from its metadata.
    pub fn plan(config: &ModelConfig, source: &dyn TensorSource) -> Self {
        let layers = (0..config.num_layers)
            .map(|layer| {
                let mut kept = [false; 4];
                for (g, group) in MATRIX_GROUPS.iter().enumerate() {
                    let (_, cols) = group_shape(config, group);
                    kept[g] = cols.is_multiple_of(Q8_0_BLOCK)
                        && group_tensors(layer, g)
                            .all(|name| source.stored_type(&name) == Some(GgmlType::Q8_0));
                }
                kept
            })
            .collect();
        Self { layers }
    }

    /// Matrices kept in their blocks.
    pub fn count(&self) -> usize {
        self.layers.iter().flatten().filter(|k| **k).count()
    }

    /// Whether layer `layer`'s matrix group `group` (an index into the
    /// groups q/k/v, o, gate/up, down) is kept.
    fn keeps(&self, layer: usize, group: usize) -> bool {
        self.layers.get(layer).is_some_and(|l| l[group])
    }

    /// Whether file tensor `name` goes into a kept matrix.
    pub(super) fn keeps_tensor(&self, name: &str) -> bool {
        matrix_part(name).is_some_and(|(layer, group, _)| self.keeps(layer, group_index(group)))
    }

    /// The kept matrices' `(rows, cols)`.
    fn shapes<'a>(&'a self, config: &'a ModelConfig) -> impl Iterator<Item = (usize, usize)> + 'a {
        self.layers.iter().flat_map(move |kept| {
            MATRIX_GROUPS
                .iter()
                .zip(kept)
                .filter(|(_, k)| **k)
                .map(|(g, _)| group_shape(config, g))
        })
    }

    /// Bytes of the kept matrices in the weights arena.
    pub(super) fn bytes(&self, config: &ModelConfig) -> usize {
        Arena::size_of(self.shapes(config).map(|(r, c)| q8_0_matrix_bytes(r, c)))
    }

    /// Elements of the largest kept matrix: the bf16 scratch that products
    /// beyond the GEMV's sizes expand it into.
    pub fn max_elements(&self, config: &ModelConfig) -> usize {
        self.shapes(config).map(|(r, c)| r * c).max().unwrap_or(0)
    }
}

/// A kept matrix in the weights arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Q8Matrix {
    base: DevPtr,
    rows: usize,
    cols: usize,
}

/// Every kept matrix's place, and the address range they fill (a weight
/// pointer inside it is Q8_0).
pub(super) struct Q8Layout {
    layers: Vec<[Option<Q8Matrix>; 4]>,
    pub(super) region: (DevPtr, DevPtr),
}

impl Q8Layout {
    /// Takes the kept matrices from `arena`, one after the other; `None`
    /// when nothing is kept.
    pub(super) fn place(
        config: &ModelConfig,
        arena: &mut Arena,
        native: &NativeBlocks,
    ) -> Result<Option<Self>, CudaError> {
        if native.count() == 0 {
            return Ok(None);
        }
        let (mut start, mut end) = (None, 0);
        let mut layers = Vec::with_capacity(config.num_layers);
        for layer in 0..config.num_layers {
            let mut matrices = [None; 4];
            for (g, (m, group)) in matrices.iter_mut().zip(MATRIX_GROUPS).enumerate() {
                if !native.keeps(layer, g) {
                    continue;
                }
                let (rows, cols) = group_shape(config, group);
                let bytes = q8_0_matrix_bytes(rows, cols);
                let base = arena.take(bytes)?;
                start.get_or_insert(base);
                end = base + bytes as u64;
                *m = Some(Q8Matrix { base, rows, cols });
            }
            layers.push(matrices);
        }
        Ok(Some(Self {
            layers,
            region: (start.unwrap_or(end), end),
        }))
    }

    /// Where file tensor `name`'s quants and block scales go, when its
    /// matrix is kept: its rows' place in the quants and in the scales.
    pub(super) fn destinations(
        &self,
        config: &ModelConfig,
        name: &str,
    ) -> Option<(DevPtr, DevPtr)> {
        let (layer, group, part) = matrix_part(name)?;
        let m = self.layers.get(layer)?[group_index(group)]?;
        let row = if part == 0 {
            0
        } else {
            fused_offset_rows(config, group, part)
        };
        let quants = m.base + (row * m.cols) as u64;
        let scales = scales_offset(m.rows, m.cols) + row * (m.cols / Q8_0_BLOCK) * 2;
        Some((quants, m.base + scales as u64))
    }
}

/// The two parts of Q8_0 blocks on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Q8Part {
    /// The int8 quants, 32 a block.
    Quants,
    /// The f16 scales' bytes, 2 a block.
    Scales,
}

impl Q8Part {
    /// Device bytes of this part of `blocks` (whole Q8_0 blocks).
    pub(super) fn bytes(self, blocks: &[u8]) -> usize {
        let n = blocks.len() / Q8_0_BLOCK_BYTES;
        match self {
            Self::Quants => n * Q8_0_BLOCK,
            Self::Scales => n * 2,
        }
    }

    /// Writes this part's device bytes `offset..offset + dst.len()`.
    pub(super) fn fill(self, blocks: &[u8], offset: usize, dst: &mut [u8]) {
        match self {
            Self::Quants => pick::<Q8_0_BLOCK, 2>(blocks, offset, dst),
            Self::Scales => pick::<2, 0>(blocks, offset, dst),
        }
    }
}

/// Byte `e` of a part is byte `SKIP + e % PER` of block `e / PER`
/// (constants, so the divisions are shifts).
fn pick<const PER: usize, const SKIP: usize>(blocks: &[u8], offset: usize, dst: &mut [u8]) {
    for (k, out) in dst.iter_mut().enumerate() {
        let e = offset + k;
        *out = blocks[e / PER * Q8_0_BLOCK_BYTES + SKIP + e % PER];
    }
}

/// Checks that `name`'s blocks are whole Q8_0 blocks for `elements`.
pub(super) fn check_q8_0(
    name: &str,
    ty: GgmlType,
    bytes: usize,
    elements: usize,
) -> Result<(), CudaError> {
    if ty != GgmlType::Q8_0 || bytes != elements / Q8_0_BLOCK * Q8_0_BLOCK_BYTES {
        return Err(CudaError::Unsupported(format!(
            "{name}: expected {elements} weights in Q8_0 blocks, the file has {bytes} bytes of {}",
            ty.name()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two blocks, scales 0x0102 and 0x0304, quants 0..32 and 100..132.
    fn two_blocks() -> Vec<u8> {
        let mut b = vec![0x02, 0x01];
        b.extend(0u8..32);
        b.extend([0x04, 0x03]);
        b.extend(100u8..132);
        b
    }

    #[test]
    fn blocks_split_into_quants_and_scales_from_any_offset() {
        let blocks = two_blocks();
        assert_eq!(Q8Part::Quants.bytes(&blocks), 64);
        assert_eq!(Q8Part::Scales.bytes(&blocks), 4);
        let mut all = vec![0u8; 64];
        Q8Part::Quants.fill(&blocks, 0, &mut all);
        let want: Vec<u8> = (0u8..32).chain(100..132).collect();
        assert_eq!(all, want);
        let mut piece = [0u8; 4];
        Q8Part::Quants.fill(&blocks, 30, &mut piece);
        assert_eq!(piece, [30, 31, 100, 101]);
        let mut scales = [0u8; 3];
        Q8Part::Scales.fill(&blocks, 1, &mut scales);
        assert_eq!(scales, [0x01, 0x04, 0x03]);
    }

    #[test]
    fn scales_follow_the_quants_at_a_256_byte_boundary() {
        assert_eq!(scales_offset(3, 64), 256);
        assert_eq!(q8_0_matrix_bytes(3, 64), 256 + 3 * 2 * 2);
        // A 4096-wide row: 4096 quant bytes and 256 scale bytes (the
        // file's 4352 = 128 blocks of 34).
        assert_eq!(q8_0_matrix_bytes(1, 4096), 4096 + 256);
    }

    #[test]
    fn a_wrong_type_or_length_is_named() {
        assert!(check_q8_0("w", GgmlType::Q8_0, 68, 64).is_ok());
        let e = check_q8_0("w", GgmlType::Q4_0, 36, 64)
            .unwrap_err()
            .to_string();
        assert!(e.contains("w:") && e.contains("Q4_0"), "{e}");
        assert!(check_q8_0("w", GgmlType::Q8_0, 34, 64).is_err());
    }
}
