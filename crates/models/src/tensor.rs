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
