//! Dense tensors in host memory: f32 values, or bf16 bytes ready to copy.

use std::borrow::Cow;

/// Row-major f32 data with its shape (outermost dimension first, as in PyTorch).
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values.
    pub data: Vec<f32>,
}

impl HostTensor {
    /// Wraps data; the caller guarantees `data.len()` matches `shape`.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Self { shape, data }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the tensor holds no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// An FP8 checkpoint's weight kept as it is stored: e4m3 bytes and one
/// f32 scale per row (a per-tensor scale repeated), so that `w[r][c] =
/// e4m3(bytes[r * cols + c]) * row_scales[r]` exactly, for backends with
/// e4m3 kernels: no float copy is made.
#[derive(Debug, Clone)]
pub struct E4m3Tensor {
    /// `[rows, cols]`.
    pub shape: Vec<usize>,
    /// The e4m3 bytes, row-major.
    pub bytes: Vec<u8>,
    pub row_scales: Vec<f32>,
}

/// A tensor kept in its file's ggml block format (Q4_0, Q4_K, ...), for
/// backends with native quantized kernels: no f32 copy is ever made.
#[derive(Debug, Clone)]
pub struct QuantTensor {
    /// The storage type of every block.
    pub ggml_type: crate::gguf::GgmlType,
    /// Dimensions, outermost first (a linear weight is `[rows, cols]`; each
    /// row is `cols / block_size` whole blocks).
    pub shape: Vec<usize>,
    /// The blocks, row-major.
    pub data: BlockData,
}

/// Where the bytes of a [`QuantTensor`] live.
#[derive(Clone)]
pub enum BlockData {
    /// A copy (made when rows had to be reordered at load).
    Owned(Vec<u8>),
    /// Borrowed from the memory-mapped file: pages are shared with the page
    /// cache and only count once.
    Mapped {
        /// The file, kept open while the tensor lives.
        file: std::sync::Arc<crate::gguf::GgufFile>,
        /// Index into [`crate::gguf::GgufFile::tensors`].
        index: usize,
    },
    /// A byte range of other blocks (one expert of a stack): the bytes are
    /// shared, not copied.
    Range {
        /// The whole.
        of: std::sync::Arc<BlockData>,
        /// Bytes of `of` this holds.
        range: std::ops::Range<usize>,
    },
}

impl BlockData {
    /// The raw blocks.
    pub fn bytes(&self) -> &[u8] {
        match self {
            BlockData::Owned(v) => v,
            BlockData::Mapped { file, index } => file
                .tensors()
                .get(*index)
                .map(|t| file.tensor_bytes(t))
                .unwrap_or_default(),
            BlockData::Range { of, range } => of.bytes().get(range.clone()).unwrap_or_default(),
        }
    }

    /// `parts` equal consecutive byte ranges of these blocks (the experts
    /// of a stacked tensor), sharing them; `None` when the bytes do not
    /// divide evenly.
    pub fn split(self, parts: usize) -> Option<Vec<BlockData>> {
        let len = self.bytes().len();
        if parts == 0 || !len.is_multiple_of(parts) {
            return None;
        }
        let (of, each) = (std::sync::Arc::new(self), len / parts);
        Some(
            (0..parts)
                .map(|i| BlockData::Range {
                    of: of.clone(),
                    range: i * each..(i + 1) * each,
                })
                .collect(),
        )
    }
}

impl std::fmt::Debug for BlockData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockData::Owned(v) => write!(f, "Owned({} bytes)", v.len()),
            BlockData::Mapped { index, .. } => write!(f, "Mapped(tensor {index})"),
            BlockData::Range { of, range } => write!(f, "Range({of:?}[{range:?}])"),
        }
    }
}

/// A tensor already in bf16: little-endian bf16 bytes, borrowed from the
/// file's map when stored as such, so a device loader can copy it without
/// the f32 round trip of [`HostTensor`].
#[derive(Debug, Clone, PartialEq)]
pub struct Bf16Tensor<'a> {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// `2 * shape.iter().product()` bytes, row-major.
    pub bytes: Cow<'a, [u8]>,
}
