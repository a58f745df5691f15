//! GGUF block-quantized decoder matrices kept as they are on the device
//! (`model.cuda_weights = "native"`): which matrices ([`NativeBlocks`]),
//! their layout and where each file tensor's blocks land.
//!
//! Every kept type stores each field of its blocks as a *plane*: that
//! field's bytes of every block, row-major, each plane at a 256-byte
//! boundary ([`BlockFormat`]), so 16-byte loads stay aligned whatever the
//! block size (Q6_K's is 210 bytes). Two kinds of matrix:
//! - Q8_0: the planes of the whole fused matrix from its base (`quant.cu`):
//!   int8 quants, then f16 scales; read by the `gemv_q8_0_*` kernels.
//! - Q4_0, Q4_1, Q4_K, Q5_K, Q6_K (`kquant.cuh`): a 256-byte header (the
//!   row segments, up to three, each with its type and base: a q/k/v whose
//!   v is Q6_K and q/k Q4_K, as in Q4_K_M files, stays one matrix), then
//!   each segment's planes. Read by the `gemv_kq_*` kernels.

use ingot_models::gguf::GgmlType;
use ingot_models::{ModelConfig, TensorSource};

use super::fused_offset_rows;
use super::groups::{group_index, group_shape, group_tensors, matrix_part, MATRIX_GROUPS};
use crate::device::{Arena, DevPtr};
use crate::gemm::KqMatrixInfo;
use crate::CudaError;

/// Weights per Q8_0 block.
pub const Q8_0_BLOCK: usize = 32;
/// Bytes of a Q8_0 block in the file: its f16 scale, then 32 int8 quants.
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// Planes start at this alignment.
const PLANE_ALIGN: usize = 256;
/// Bytes of a k-quant matrix's header (`KqMatrix` in kquant.cuh, padded).
pub(super) const KQ_HEADER_BYTES: usize = 256;
/// Row segments a k-quant matrix header holds (`KQ_MAX_SEGMENTS`).
const KQ_MAX_SEGMENTS: usize = 3;

/// One field of a block type: `bytes` a block, from byte `at` of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Plane {
    bytes: usize,
    at: usize,
}

/// A GGUF block type the device reads as it is: `unit` weights in a
/// `block_bytes` block whose fields are `planes`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct BlockFormat {
    pub(super) ty: GgmlType,
    pub(super) unit: usize,
    block_bytes: usize,
    planes: &'static [Plane],
}

const fn plane(bytes: usize, at: usize) -> Plane {
    Plane { bytes, at }
}

/// The kept types; planes in the order of kquant.cuh's `plane(k)` (the
/// quants' low bits first).
const FORMATS: [BlockFormat; 6] = [
    BlockFormat {
        ty: GgmlType::Q8_0,
        unit: Q8_0_BLOCK,
        block_bytes: Q8_0_BLOCK_BYTES,
        planes: &[plane(32, 2), plane(2, 0)],
    },
    BlockFormat {
        ty: GgmlType::Q4_0,
        unit: 32,
        block_bytes: 18,
        planes: &[plane(16, 2), plane(2, 0)],
    },
    BlockFormat {
        ty: GgmlType::Q4_1,
        unit: 32,
        block_bytes: 20,
        planes: &[plane(16, 4), plane(4, 0)],
    },
    BlockFormat {
        ty: GgmlType::Q4_K,
        unit: 256,
        block_bytes: 144,
        planes: &[plane(128, 16), plane(16, 0)],
    },
    BlockFormat {
        ty: GgmlType::Q5_K,
        unit: 256,
        block_bytes: 176,
        planes: &[plane(128, 48), plane(32, 16), plane(16, 0)],
    },
    BlockFormat {
        ty: GgmlType::Q6_K,
        unit: 256,
        block_bytes: 210,
        planes: &[plane(128, 0), plane(64, 128), plane(16, 192), plane(2, 208)],
    },
];

/// The device format of a GGUF type, when it is kept.
pub(super) fn block_format(ty: GgmlType) -> Option<&'static BlockFormat> {
    FORMATS.iter().find(|f| f.ty == ty)
}

impl BlockFormat {
    /// Where each plane of a `rows x cols` matrix starts, and its end.
    fn plane_offsets(&self, rows: usize, cols: usize) -> ([usize; 4], usize) {
        let blocks = rows * (cols / self.unit);
        let (mut offsets, mut end) = ([0usize; 4], 0usize);
        for (k, p) in self.planes.iter().enumerate() {
            offsets[k] = end.next_multiple_of(PLANE_ALIGN);
            end = offsets[k] + blocks * p.bytes;
        }
        (offsets, end)
    }

    /// Device bytes of a `rows x cols` matrix: the file's bytes plus the
    /// padding before each plane.
    pub(super) fn matrix_bytes(&self, rows: usize, cols: usize) -> usize {
        self.plane_offsets(rows, cols).1
    }

    /// Where row `row`'s part of each plane lies in a matrix at `base`.
    fn row_planes(&self, base: DevPtr, rows: usize, cols: usize, row: usize) -> Vec<DevPtr> {
        let (offsets, _) = self.plane_offsets(rows, cols);
        let row_blocks = row * (cols / self.unit);
        self.planes
            .iter()
            .zip(offsets)
            .map(|(p, at)| base + (at + row_blocks * p.bytes) as u64)
            .collect()
    }

    /// Device bytes of plane `k` of `blocks` (whole blocks of this type).
    pub(super) fn plane_bytes(&self, k: usize, blocks: &[u8]) -> usize {
        blocks.len() / self.block_bytes * self.planes[k].bytes
    }

    /// Writes plane `k`'s bytes `offset..offset + dst.len()` from `blocks`.
    pub(super) fn fill_plane(&self, k: usize, blocks: &[u8], offset: usize, dst: &mut [u8]) {
        let Plane { bytes: per, at } = self.planes[k];
        let mut done = 0;
        while done < dst.len() {
            let e = offset + done;
            let (block, within) = (e / per, e % per);
            let n = (per - within).min(dst.len() - done);
            let src = block * self.block_bytes + at + within;
            dst[done..done + n].copy_from_slice(&blocks[src..src + n]);
            done += n;
        }
    }

    /// Checks that `name`'s blocks are whole blocks of this type for
    /// `elements` weights.
    pub(super) fn check(
        &self,
        name: &str,
        ty: GgmlType,
        bytes: usize,
        elements: usize,
    ) -> Result<(), CudaError> {
        if ty != self.ty || bytes != elements / self.unit * self.block_bytes {
            return Err(CudaError::Unsupported(format!(
                "{name}: expected {elements} weights in {} blocks, the file has {bytes} bytes of {}",
                self.ty.name(),
                ty.name()
            )));
        }
        Ok(())
    }
}

/// How a kept matrix group is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kept {
    /// Every part Q8_0: one planar matrix.
    Q8,
    /// Every part in a 4- to 6-bit type: a header and row segments, the
    /// file tensors' formats in part order.
    Kq(Vec<&'static BlockFormat>),
}

/// Which layer matrices keep their GGUF blocks on the device; the rest
/// (other types, float storage) expand to bf16 at load.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NativeBlocks {
    /// Per layer, per matrix group (q/k/v, o, gate/up, down).
    layers: Vec<[Option<Kept>; 4]>,
    /// The embedding table and the untied LM head, when kept: their
    /// tensor name and format (4- to 6-bit types; the token lookup reads
    /// them with `embed_kq`, the head is a GEMV or a chunked expansion).
    tables: Vec<(&'static str, &'static BlockFormat)>,
}

/// The embedding table's tensor (the LM head when tied).
pub(super) const EMBED: &str = "model.embed_tokens.weight";
/// The untied LM head's tensor.
pub(super) const LM_HEAD: &str = "lm_head.weight";

/// How layer `layer`'s group `g` can be kept, from its tensors' types.
fn plan_group(
    config: &ModelConfig,
    source: &dyn TensorSource,
    layer: usize,
    g: usize,
) -> Option<Kept> {
    let (_, cols) = group_shape(config, MATRIX_GROUPS[g]);
    let formats = group_tensors(layer, g)
        .map(|name| {
            block_format(source.stored_type(&name)?).filter(|f| cols.is_multiple_of(f.unit))
        })
        .collect::<Option<Vec<_>>>()?;
    let q8 = |f: &&BlockFormat| f.ty == GgmlType::Q8_0;
    if formats.iter().all(q8) {
        return Some(Kept::Q8);
    }
    if formats.iter().any(q8) {
        return None;
    }
    // The gated GEMV reads a gate row and an up row together, in one type.
    let gate_up = MATRIX_GROUPS[g] == "gate_up";
    (!gate_up || formats.windows(2).all(|w| w[0] == w[1])).then_some(Kept::Kq(formats))
}

impl NativeBlocks {
    /// Nothing kept: every matrix in bf16.
    pub const fn none() -> Self {
        Self {
            layers: Vec::new(),
            tables: Vec::new(),
        }
    }

    /// The matrices of `source` whose file tensors are all stored in kept
    /// types (all Q8_0, or all 4- to 6-bit types; gate and up alike), read
    /// from its metadata.
    pub fn plan(config: &ModelConfig, source: &dyn TensorSource) -> Self {
        let layers = (0..config.num_layers)
            .map(|layer| std::array::from_fn(|g| plan_group(config, source, layer, g)))
            .collect();
        // A tensor-parallel rank's vocabulary slice stays bf16.
        let names: &[&'static str] = match config.shard {
            Some(_) => &[],
            None if config.tie_word_embeddings => &[EMBED],
            None => &[EMBED, LM_HEAD],
        };
        let tables = names
            .iter()
            .filter_map(|name| {
                let f = block_format(source.stored_type(name)?)?;
                (f.ty != GgmlType::Q8_0 && config.hidden_size.is_multiple_of(f.unit))
                    .then_some((*name, f))
            })
            .collect();
        Self { layers, tables }
    }

    /// The rows of table `name`.
    fn table_rows(config: &ModelConfig, name: &str) -> usize {
        if name == EMBED {
            config.vocab_size
        } else {
            config.lm_head_rows()
        }
    }

    /// Whether the embedding table is kept (the token lookup reads blocks).
    pub fn keeps_embedding(&self) -> bool {
        self.tables.iter().any(|(n, _)| *n == EMBED)
    }

    /// Matrices kept in their blocks (the tables included).
    pub fn count(&self) -> usize {
        self.layers.iter().flatten().filter(|k| k.is_some()).count() + self.tables.len()
    }

    /// How layer `layer`'s matrix group `group` (an index into the groups
    /// q/k/v, o, gate/up, down) is kept.
    fn kept(&self, layer: usize, group: usize) -> Option<&Kept> {
        self.layers.get(layer)?[group].as_ref()
    }

    /// Whether file tensor `name` goes into a kept matrix.
    pub(super) fn keeps_tensor(&self, name: &str) -> bool {
        self.tables.iter().any(|(n, _)| *n == name)
            || matrix_part(name)
                .is_some_and(|(layer, group, _)| self.kept(layer, group_index(group)).is_some())
    }

    /// The kept matrices: `(layer, group index, how, (rows, cols))`.
    fn matrices<'a>(
        &'a self,
        config: &'a ModelConfig,
    ) -> impl Iterator<Item = (usize, usize, &'a Kept, (usize, usize))> + 'a {
        self.layers
            .iter()
            .enumerate()
            .flat_map(move |(layer, kept)| {
                kept.iter().enumerate().filter_map(move |(g, k)| {
                    Some((layer, g, k.as_ref()?, group_shape(config, MATRIX_GROUPS[g])))
                })
            })
    }

    /// Bytes of the kept matrices in the weights arena.
    pub(super) fn bytes(&self, config: &ModelConfig) -> usize {
        Arena::size_of(
            self.matrices(config)
                .map(|(_, g, kept, (rows, cols))| kept_bytes(config, g, kept, rows, cols))
                .chain(self.tables.iter().map(|(name, f)| {
                    let rows = Self::table_rows(config, name);
                    kq_offsets(&[(f, 0, rows)], config.hidden_size).1
                })),
        )
    }

    /// Elements of the largest kept matrix: the bf16 scratch that products
    /// beyond the GEMV's sizes expand it into.
    pub fn max_elements(&self, config: &ModelConfig) -> usize {
        self.matrices(config)
            .map(|(_, _, _, (r, c))| r * c)
            .max()
            .unwrap_or(0)
    }
}

/// A k-quant matrix's row segment: `(format, first row, rows)`.
type Segment = (&'static BlockFormat, usize, usize);

/// A layer k-quant matrix's row segments: maximal runs of parts of one
/// type.
fn segments(config: &ModelConfig, g: usize, formats: &[&'static BlockFormat]) -> Vec<Segment> {
    let group = MATRIX_GROUPS[g];
    let (rows, _) = group_shape(config, group);
    let start = |part: usize| {
        if part == 0 {
            0
        } else if part == formats.len() {
            rows
        } else {
            fused_offset_rows(config, group, part)
        }
    };
    let mut out: Vec<Segment> = Vec::new();
    for (part, &format) in formats.iter().enumerate() {
        let (r0, r1) = (start(part), start(part + 1));
        match out.last_mut() {
            Some(last) if last.0 == format => last.2 += r1 - r0,
            _ => out.push((format, r0, r1 - r0)),
        }
    }
    out
}

/// Where each segment of a k-quant matrix of `cols` columns starts (after
/// the header, at a plane boundary), and the matrix's device bytes.
fn kq_offsets(segments: &[Segment], cols: usize) -> (Vec<usize>, usize) {
    let mut at = KQ_HEADER_BYTES;
    let starts = segments
        .iter()
        .map(|(f, _, rows)| {
            let start = at.next_multiple_of(PLANE_ALIGN);
            at = start + f.matrix_bytes(*rows, cols);
            start
        })
        .collect();
    (starts, at)
}

/// Device bytes of a kept matrix.
fn kept_bytes(config: &ModelConfig, g: usize, kept: &Kept, rows: usize, cols: usize) -> usize {
    match kept {
        Kept::Q8 => FORMATS[0].matrix_bytes(rows, cols),
        Kept::Kq(formats) => kq_offsets(&segments(config, g, formats), cols).1,
    }
}

/// A kept matrix in the weights arena.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PlacedMatrix {
    base: DevPtr,
    cols: usize,
    /// `(format, first row, rows, base)` of each segment (one for Q8_0,
    /// whose base is the matrix's).
    segments: Vec<(&'static BlockFormat, usize, usize, DevPtr)>,
}

/// Where a file tensor's blocks go: its type and each plane's destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PlacedBlocks {
    pub(super) format: &'static BlockFormat,
    pub(super) planes: Vec<DevPtr>,
}

/// Every kept matrix's place, the address ranges of each kind (a weight
/// pointer inside one is Q8_0, or a k-quant header) and the headers'
/// bytes to upload.
pub(super) struct BlocksLayout {
    layers: Vec<[Option<PlacedMatrix>; 4]>,
    /// The kept tables, by tensor name.
    tables: Vec<(&'static str, PlacedMatrix)>,
    pub(super) q8_region: Option<(DevPtr, DevPtr)>,
    pub(super) kq_region: Option<(DevPtr, DevPtr)>,
    pub(super) headers: Vec<(DevPtr, Vec<u8>)>,
    /// Each k-quant matrix's base, device bytes and type.
    pub(super) kq_matrices: Vec<(DevPtr, KqMatrixInfo)>,
}

/// The `KqMatrix` header of kquant.cuh for `segments`.
fn kq_header(segments: &[(&'static BlockFormat, usize, usize, DevPtr)]) -> Vec<u8> {
    let mut h = Vec::with_capacity(KQ_HEADER_BYTES);
    for k in 0..KQ_MAX_SEGMENTS {
        let (ty, row, rows, base) = segments
            .get(k)
            .map(|(f, r, n, b)| (f.ty.id() as i32, *r as i32, *n as i32, *b))
            .unwrap_or((0, 0, 0, 0));
        h.extend(base.to_le_bytes());
        for v in [row, rows, ty, 0] {
            h.extend(v.to_le_bytes());
        }
    }
    h.extend((segments.len() as i32).to_le_bytes());
    h.extend(0i32.to_le_bytes());
    h
}

/// The GGML type id of every segment, when they share one.
fn single_type(segments: &[(&'static BlockFormat, usize, usize, DevPtr)]) -> Option<u32> {
    let first = segments.first()?.0.ty.id();
    segments
        .iter()
        .all(|(f, ..)| f.ty.id() == first)
        .then_some(first)
}

/// `bytes` from `take`, extending `range` (one kind's address range) to
/// cover them.
fn claim(
    take: &mut dyn FnMut(usize) -> Result<DevPtr, CudaError>,
    range: &mut Option<(DevPtr, DevPtr)>,
    bytes: usize,
) -> Result<DevPtr, CudaError> {
    let base = take(bytes)?;
    range.get_or_insert((base, base)).1 = base + bytes as u64;
    Ok(base)
}

impl BlocksLayout {
    /// Takes the kept matrices from `arena`: the Q8_0 ones, then the
    /// k-quant ones, each kind in one range; `None` when nothing is kept.
    pub(super) fn place(
        config: &ModelConfig,
        arena: &mut Arena,
        native: &NativeBlocks,
    ) -> Result<Option<Self>, CudaError> {
        Self::place_with(config, native, &mut |bytes| arena.take(bytes))
    }

    /// [`BlocksLayout::place`] with `take` handing out the addresses.
    fn place_with(
        config: &ModelConfig,
        native: &NativeBlocks,
        take: &mut dyn FnMut(usize) -> Result<DevPtr, CudaError>,
    ) -> Result<Option<Self>, CudaError> {
        if native.count() == 0 {
            return Ok(None);
        }
        let mut layout = Self {
            layers: vec![Default::default(); config.num_layers],
            tables: Vec::new(),
            q8_region: None,
            kq_region: None,
            headers: Vec::new(),
            kq_matrices: Vec::new(),
        };
        // The Q8_0 matrices in one range.
        let mut range = None;
        for (layer, g, kept, (rows, cols)) in native.matrices(config) {
            if *kept == Kept::Q8 {
                let q8 = &FORMATS[0];
                let base = claim(take, &mut range, q8.matrix_bytes(rows, cols))?;
                let segments = vec![(q8, 0, rows, base)];
                layout.layers[layer][g] = Some(PlacedMatrix {
                    base,
                    cols,
                    segments,
                });
            }
        }
        layout.q8_region = range.take();
        // The k-quant matrices, then the tables, in another.
        for (layer, g, kept, (_, cols)) in native.matrices(config) {
            if let Kept::Kq(formats) = kept {
                let m = layout.place_kq(segments(config, g, formats), cols, take, &mut range)?;
                layout.layers[layer][g] = Some(m);
            }
        }
        for &(name, format) in &native.tables {
            let rows = NativeBlocks::table_rows(config, name);
            let segment = vec![(format, 0, rows)];
            let m = layout.place_kq(segment, config.hidden_size, take, &mut range)?;
            layout.tables.push((name, m));
        }
        layout.kq_region = range;
        Ok(Some(layout))
    }

    /// Takes a k-quant matrix of `segments` x `cols` (its header and
    /// their planes), and records its header's bytes and its size.
    fn place_kq(
        &mut self,
        segments: Vec<Segment>,
        cols: usize,
        take: &mut dyn FnMut(usize) -> Result<DevPtr, CudaError>,
        range: &mut Option<(DevPtr, DevPtr)>,
    ) -> Result<PlacedMatrix, CudaError> {
        let (starts, bytes) = kq_offsets(&segments, cols);
        let base = claim(take, range, bytes)?;
        let segments: Vec<_> = segments
            .into_iter()
            .zip(starts)
            .map(|((f, first, rows), at)| (f, first, rows, base + at as u64))
            .collect();
        self.headers.push((base, kq_header(&segments)));
        let single_type = single_type(&segments);
        self.kq_matrices
            .push((base, KqMatrixInfo { bytes, single_type }));
        Ok(PlacedMatrix {
            base,
            cols,
            segments,
        })
    }

    /// Where file tensor `name`'s blocks go, when its matrix is kept.
    pub(super) fn destinations(&self, config: &ModelConfig, name: &str) -> Option<PlacedBlocks> {
        let (m, row) = match self.table(name) {
            Some(m) => (m, 0),
            None => {
                let (layer, group, part) = matrix_part(name)?;
                let m = self.layers.get(layer)?[group_index(group)].as_ref()?;
                let row = if part == 0 {
                    0
                } else {
                    fused_offset_rows(config, group, part)
                };
                (m, row)
            }
        };
        let (format, start, rows, base) = *m
            .segments
            .iter()
            .rev()
            .find(|(_, start, _, _)| *start <= row)?;
        Some(PlacedBlocks {
            format,
            planes: format.row_planes(base, rows, m.cols, row - start),
        })
    }

    /// The pointer the model reads for a kept matrix whose first tensor is
    /// `name` (its base: the Q8_0 quants or the k-quant header).
    pub(super) fn home(&self, name: &str) -> Option<DevPtr> {
        if let Some(m) = self.table(name) {
            return Some(m.base);
        }
        let (layer, group, _) = matrix_part(name)?;
        Some(self.layers.get(layer)?[group_index(group)].as_ref()?.base)
    }

    /// The kept table of tensor `name`.
    fn table(&self, name: &str) -> Option<&PlacedMatrix> {
        self.tables.iter().find(|(n, _)| *n == name).map(|(_, m)| m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::scales_offset;

    /// Two Q8_0 blocks, scales 0x0102 and 0x0304, quants 0..32 and 100..132.
    fn two_blocks() -> Vec<u8> {
        let mut b = vec![0x02, 0x01];
        b.extend(0u8..32);
        b.extend([0x04, 0x03]);
        b.extend(100u8..132);
        b
    }

    fn format(ty: GgmlType) -> &'static BlockFormat {
        block_format(ty).unwrap_or(&FORMATS[0])
    }

    #[test]
    fn a_matrix_has_one_type_only_when_every_segment_shares_it() {
        let (q4k, q6k) = (format(GgmlType::Q4_K), format(GgmlType::Q6_K));
        // q and k in Q4_K, v in Q6_K (a Q4_K_M layer's q/k/v): the kernels of
        // every type take it.
        let mixed = [(q4k, 0, 4096, 0), (q6k, 4096, 1024, 1 << 20)];
        assert_eq!(single_type(&mixed), None);
        let gate_up = [(q4k, 0, 28672, 0)];
        assert_eq!(single_type(&gate_up), Some(GgmlType::Q4_K.id()));
        let two_of_one = [(q6k, 0, 4096, 0), (q6k, 4096, 1024, 1 << 20)];
        assert_eq!(single_type(&two_of_one), Some(GgmlType::Q6_K.id()));
        assert_eq!(single_type(&[]), None);
    }

    #[test]
    fn blocks_split_into_planes_from_any_offset() {
        let blocks = two_blocks();
        let q8 = format(GgmlType::Q8_0);
        assert_eq!(q8.plane_bytes(0, &blocks), 64);
        assert_eq!(q8.plane_bytes(1, &blocks), 4);
        let mut all = vec![0u8; 64];
        q8.fill_plane(0, &blocks, 0, &mut all);
        let want: Vec<u8> = (0u8..32).chain(100..132).collect();
        assert_eq!(all, want);
        let mut piece = [0u8; 4];
        q8.fill_plane(0, &blocks, 30, &mut piece);
        assert_eq!(piece, [30, 31, 100, 101]);
        let mut scales = [0u8; 3];
        q8.fill_plane(1, &blocks, 1, &mut scales);
        assert_eq!(scales, [0x01, 0x04, 0x03]);
    }

    /// Every type's planes cover each byte of its blocks exactly once, so
    /// the device holds the file's bytes, reordered.
    #[test]
    fn planes_partition_every_block() {
        for f in &FORMATS {
            let blocks: Vec<u8> = (0..3 * f.block_bytes)
                .map(|i| (i * 7 % 251) as u8)
                .collect();
            let mut seen = vec![0usize; blocks.len()];
            let mut total = 0;
            for (k, p) in f.planes.iter().enumerate() {
                let mut out = vec![0u8; f.plane_bytes(k, &blocks)];
                f.fill_plane(k, &blocks, 0, &mut out);
                for (e, byte) in out.iter().enumerate() {
                    let src = e / p.bytes * f.block_bytes + p.at + e % p.bytes;
                    assert_eq!(*byte, blocks[src], "{:?} plane {k}", f.ty);
                    seen[src] += 1;
                }
                total += out.len();
            }
            assert_eq!(total, blocks.len(), "{:?}", f.ty);
            assert!(seen.iter().all(|n| *n == 1), "{:?}", f.ty);
            assert_eq!(f.ty.block_size(), f.unit, "{:?}", f.ty);
            assert_eq!(f.ty.type_size(), f.block_bytes, "{:?}", f.ty);
        }
    }

    #[test]
    fn planes_start_at_256_byte_boundaries() {
        let q8 = format(GgmlType::Q8_0);
        assert_eq!(q8.plane_offsets(3, 64).0[1], scales_offset(3, 64));
        assert_eq!(q8.matrix_bytes(3, 64), 256 + 3 * 2 * 2);
        // A 4096-wide Q8_0 row: 4096 quant bytes and 256 scale bytes (the
        // file's 4352 = 128 blocks of 34).
        assert_eq!(q8.matrix_bytes(1, 4096), 4096 + 256);
        // Q6_K, 2 rows of 512: ql 512, qh 256, scales 64, d 8.
        let q6 = format(GgmlType::Q6_K);
        assert_eq!(q6.plane_offsets(2, 512), ([0, 512, 768, 1024], 1032));
    }

    #[test]
    fn a_wrong_type_or_length_is_named() {
        let q8 = format(GgmlType::Q8_0);
        assert!(q8.check("w", GgmlType::Q8_0, 68, 64).is_ok());
        let e = q8
            .check("w", GgmlType::Q4_0, 36, 64)
            .unwrap_err()
            .to_string();
        assert!(e.contains("w:") && e.contains("Q4_0"), "{e}");
        assert!(q8.check("w", GgmlType::Q8_0, 34, 64).is_err());
    }

    /// A Q4_K_M-style file: Q4_K, with v_proj and down_proj in Q6_K.
    const Q4KM: crate::test_configs::TypedFile = crate::test_configs::TypedFile(|name| {
        if name.ends_with("v_proj.weight") || name.ends_with("down_proj.weight") {
            GgmlType::Q6_K
        } else {
            GgmlType::Q4_K
        }
    });

    /// Each file tensor's planes land in its segment at its rows, after the
    /// header, and the model reads the header.
    #[test]
    fn q_k_and_v_land_in_their_segments() {
        let c = crate::test_configs::llama8b();
        let native = NativeBlocks::plan(&c, &Q4KM);
        let mut next = 1u64 << 32;
        let layout = BlocksLayout::place_with(&c, &native, &mut |bytes| {
            let at = next;
            next += bytes.next_multiple_of(256) as u64;
            Ok(at)
        });
        let Ok(Some(layout)) = layout else {
            panic!("nothing placed");
        };
        let (d, q, kv) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let name = |leaf: &str| format!("model.layers.1.self_attn.{leaf}.weight");
        let base = layout.home(&name("q_proj")).unwrap_or_default();
        assert_eq!(layout.home(&name("v_proj")), Some(base));
        let part = |leaf: &str| {
            layout
                .destinations(&c, &name(leaf))
                .map(|b| (b.format.ty, b.planes))
        };
        let q4 = format(GgmlType::Q4_K);
        let Some((GgmlType::Q4_K, qp)) = part("q_proj") else {
            panic!("q_proj");
        };
        assert_eq!(qp[0], base + KQ_HEADER_BYTES as u64);
        let Some((GgmlType::Q4_K, kp)) = part("k_proj") else {
            panic!("k_proj");
        };
        // k's rows follow q's in the first segment's planes.
        let seg_rows = q + kv;
        let row_blocks = (q * d / 256) as u64;
        assert_eq!(kp[0], qp[0] + row_blocks * 128);
        assert_eq!(kp[1], qp[1] + row_blocks * 16);
        assert_eq!(
            qp[1],
            qp[0] + (seg_rows * d / 2).next_multiple_of(256) as u64
        );
        // v starts the second segment, in Q6_K, after the first's planes.
        let Some((GgmlType::Q6_K, vp)) = part("v_proj") else {
            panic!("v_proj");
        };
        let first_end = KQ_HEADER_BYTES + q4.matrix_bytes(seg_rows, d);
        assert_eq!(vp[0], base + first_end.next_multiple_of(256) as u64);
        assert_eq!(vp.len(), 4);
        let header = layout
            .headers
            .iter()
            .find(|(at, _)| *at == base)
            .map(|(_, h)| h.clone())
            .unwrap_or_default();
        assert_eq!(header[72..76], 2i32.to_le_bytes());
        assert_eq!(header[24..32], vp[0].to_le_bytes());
        // The tables: Q4_K embeddings and LM head, kept beside the layers.
        assert!(layout.home(EMBED).is_some() && layout.home(LM_HEAD).is_some());
        assert!(layout.kq_region.is_some() && layout.q8_region.is_none());
    }

    #[test]
    fn the_header_names_each_segment() {
        let q4 = format(GgmlType::Q4_K);
        let q6 = format(GgmlType::Q6_K);
        let h = kq_header(&[(q4, 0, 10, 0x1000), (q6, 10, 4, 0x2000)]);
        assert_eq!(h.len(), 3 * 24 + 8);
        let int = |at: usize| i32::from_le_bytes(h[at..at + 4].try_into().unwrap_or_default());
        assert_eq!(
            u64::from_le_bytes(h[24..32].try_into().unwrap_or_default()),
            0x2000
        );
        assert_eq!((int(32), int(36), int(40)), (10, 4, 14));
        assert_eq!((int(8), int(12), int(16)), (0, 10, 12));
        assert_eq!(int(72), 2);
    }
}
