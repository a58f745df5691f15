//! Parsing a GGUF file: header, metadata and tensor infos, over a memory map.
//!
//! Layout (<https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>):
//! `"GGUF"`, `u32 version`, `u64 n_tensors`, `u64 n_kv`, then `n_kv`
//! key/value pairs, then `n_tensors` tensor infos (name, `u32 n_dims`,
//! `u64 dims[n_dims]`, `u32 type`, `u64 offset`), padding to
//! `general.alignment`, and the tensor data. Offsets are relative to the
//! start of the data section; [`TensorInfo::offset`] is made absolute.
//!
//! Nothing here trusts the file: every length is checked against the bytes
//! that remain before anything is allocated, arithmetic is overflow-checked,
//! and every tensor's data must lie inside the file, apart from every
//! other tensor's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::{dequantize_into, GgmlType, GgufError, MetaValue, TensorInfo};

/// Alignment of the data section when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most this many dimensions (`GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Arrays of arrays deeper than this are rejected (they are unused in practice).
const MAX_ARRAY_DEPTH: usize = 4;

/// An opened GGUF file (version 2 or 3, little-endian), memory-mapped.
///
/// Opening parses and validates the header, all metadata and all tensor infos;
/// tensor data is read lazily from the map.
pub struct GgufFile {
    mmap: Mmap,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("bytes", &self.mmap.len())
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens, maps and parses `path`.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only. Like every mmap-based model loader we
        // assume the file is not truncated or rewritten while it is open;
        // that is documented for users and not something we can prevent.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        let parsed = parse(&mmap)?;
        tracing::debug!(
            path = %path.display(),
            version = parsed.version,
            tensors = parsed.tensors.len(),
            metadata = parsed.metadata.len(),
            "opened GGUF file"
        );
        Ok(GgufFile {
            mmap,
            version: parsed.version,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            by_name: parsed
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect(),
            metadata: parsed.metadata,
            tensors: parsed.tensors,
        })
    }

    /// The format version: 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of tensor data in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        &self.metadata
    }

    /// The metadata value under `key`.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// The string under `key`.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// The integer under `key`, of any integer type, if non-negative.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// The number under `key`, of any integer or float type.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    /// The boolean under `key`.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    /// The array of strings under `key` (`None` if any element is not a string).
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(MetaValue::as_str)
            .collect()
    }

    /// The array of numbers under `key` as f32 (`None` if any element is not
    /// a number). Integers and f64 are converted with `as`.
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(|v| match *v {
                MetaValue::F32(x) => Some(x),
                _ => v.as_f64().map(|x| x as f32),
            })
            .collect()
    }

    /// The array of integers under `key` (`None` if any element is not an
    /// integer or does not fit in i64).
    pub fn get_i64_array(&self, key: &str) -> Option<Vec<i64>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(MetaValue::as_i64)
            .collect()
    }

    /// `general.architecture`, e.g. `"llama"`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The position of the tensor named `name` in [`GgufFile::tensors`].
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The raw bytes of `t`'s data. `t` must come from this file; for any
    /// other info whose range lies outside the file this is empty.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> &[u8] {
        usize::try_from(t.offset)
            .ok()
            .and_then(|start| self.mmap.get(start..start.checked_add(t.n_bytes)?))
            .unwrap_or_default()
    }

    /// Dequantizes the tensor `name` to f32, in ggml order (`dims[0]` is the
    /// fastest-varying).
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let t = self.tensor(name).ok_or_else(|| GgufError::TensorNotFound {
            name: name.to_string(),
        })?;
        if !t.ggml_type.can_dequantize() {
            return Err(GgufError::UnsupportedType {
                tensor: t.name.clone(),
                ty: t.ggml_type,
            });
        }
        let mut out = vec![0.0f32; t.n_elements()];
        dequantize_into(t.ggml_type, self.tensor_bytes(t), &mut out)?;
        Ok(out)
    }
}

/// What [`parse`] extracts from the bytes of a file.
#[derive(Debug)]
pub(super) struct Parsed {
    pub(super) version: u32,
    pub(super) alignment: u64,
    pub(super) data_offset: u64,
    pub(super) metadata: BTreeMap<String, MetaValue>,
    pub(super) tensors: Vec<TensorInfo>,
}

/// A bounds-checked little-endian reader. `what` names the item being read,
/// for error messages.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    what: String,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], GgufError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(GgufError::truncated(format!(
                "{} needs {n} bytes at byte {} but the file has {} bytes",
                self.what,
                self.pos,
                self.buf.len()
            )));
        };
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, GgufError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A length or count that must fit in memory.
    fn len(&mut self) -> Result<usize, GgufError> {
        let n = self.u64()?;
        usize::try_from(n)
            .map_err(|_| GgufError::malformed(format!("{} declares a length of {n}", self.what)))
    }

    /// `u64 len` then `len` bytes. Invalid UTF-8 is replaced, as tokenizer
    /// vocabularies in the wild occasionally hold raw bytes.
    fn string(&mut self) -> Result<String, GgufError> {
        let n = self.len()?;
        let bytes = self.take(n)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    /// Fails unless `count` items of at least `min_size` bytes each can fit
    /// in what remains, so a corrupt count cannot trigger a huge allocation.
    fn check_count(&self, count: usize, min_size: usize, items: &str) -> Result<(), GgufError> {
        if count > self.remaining() / min_size {
            return Err(GgufError::truncated(format!(
                "{} declares {count} {items} at byte {}, more than the {} bytes left in the file can hold",
                self.what,
                self.pos,
                self.remaining()
            )));
        }
        Ok(())
    }
}

/// Value type ids (`enum gguf_type`).
const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

/// The smallest encoding of a value of type `ty`, or `None` for an unknown type.
fn min_value_size(ty: u32) -> Option<usize> {
    Some(match ty {
        T_U8 | T_I8 | T_BOOL => 1,
        T_U16 | T_I16 => 2,
        T_U32 | T_I32 | T_F32 => 4,
        T_U64 | T_I64 | T_F64 | T_STRING => 8,
        T_ARRAY => 12,
        _ => return None,
    })
}

fn read_value(c: &mut Cursor<'_>, ty: u32, depth: usize) -> Result<MetaValue, GgufError> {
    Ok(match ty {
        T_U8 => MetaValue::U8(c.u8()?),
        T_I8 => MetaValue::I8(c.u8()? as i8),
        T_U16 => MetaValue::U16(c.u16()?),
        T_I16 => MetaValue::I16(c.u16()? as i16),
        T_U32 => MetaValue::U32(c.u32()?),
        T_I32 => MetaValue::I32(c.u32()? as i32),
        T_F32 => MetaValue::F32(f32::from_bits(c.u32()?)),
        T_BOOL => MetaValue::Bool(c.u8()? != 0),
        T_STRING => MetaValue::String(c.string()?),
        T_U64 => MetaValue::U64(c.u64()?),
        T_I64 => MetaValue::I64(c.u64()? as i64),
        T_F64 => MetaValue::F64(f64::from_bits(c.u64()?)),
        T_ARRAY => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::malformed(format!(
                    "{} nests arrays more than {MAX_ARRAY_DEPTH} deep",
                    c.what
                )));
            }
            let elem_ty = c.u32()?;
            let min_size = min_value_size(elem_ty).ok_or_else(|| {
                GgufError::malformed(format!(
                    "{} has unknown array element type {elem_ty}",
                    c.what
                ))
            })?;
            let count = c.len()?;
            c.check_count(count, min_size, "array elements")?;
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                items.push(read_value(c, elem_ty, depth + 1)?);
            }
            MetaValue::Array(items)
        }
        _ => {
            return Err(GgufError::malformed(format!(
                "{} has unknown value type {ty}",
                c.what
            )))
        }
    })
}

/// Parses and validates everything but the tensor data itself.
pub(super) fn parse(buf: &[u8]) -> Result<Parsed, GgufError> {
    let mut c = Cursor {
        buf,
        pos: 0,
        what: "the GGUF header".to_string(),
    };
    if c.take(4)? != b"GGUF" {
        return Err(GgufError::BadMagic);
    }
    let version = c.u32()?;
    if version.swap_bytes() <= 3 && version > 3 {
        return Err(GgufError::BigEndian);
    }
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = c.len()?;
    let n_kv = c.len()?;

    c.what = "the metadata count".to_string();
    // A key/value pair is at least an 8-byte key length and a 4-byte type.
    c.check_count(n_kv, 12, "metadata entries")?;
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        c.what = format!("metadata entry #{i}");
        let key = c.string()?;
        c.what = format!("metadata key '{key}'");
        let ty = c.u32()?;
        let value = read_value(&mut c, ty, 0)?;
        if metadata.insert(key, value).is_some() {
            return Err(GgufError::malformed(format!("{} appears twice", c.what)));
        }
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => v.as_u64().filter(|a| a.is_power_of_two()).ok_or_else(|| {
            GgufError::malformed(format!(
                "general.alignment must be a power of two, got {v:?}"
            ))
        })?,
    };

    c.what = "the tensor count".to_string();
    // A tensor info is at least name length, n_dims, type and offset.
    c.check_count(n_tensors, 24, "tensors")?;
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut relative_offsets = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        c.what = format!("tensor info #{i}");
        let name = c.string()?;
        c.what = format!("tensor info '{name}'");
        let (info, offset) = read_tensor_info(&mut c, name)?;
        tensors.push(info);
        relative_offsets.push(offset);
    }

    let end_of_infos = c.pos as u64;
    let data_offset = end_of_infos
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| GgufError::malformed("data section offset overflows"))?;
    let file_len = buf.len() as u64;
    let mut seen = HashSet::with_capacity(tensors.len());
    for (t, rel) in tensors.iter_mut().zip(relative_offsets) {
        if !seen.insert(t.name.as_str()) {
            return Err(GgufError::malformed(format!(
                "tensor '{}' appears twice",
                t.name
            )));
        }
        if !rel.is_multiple_of(alignment) {
            return Err(GgufError::malformed(format!(
                "tensor '{}' has offset {rel}, not a multiple of the alignment {alignment}",
                t.name
            )));
        }
        let start = data_offset.checked_add(rel);
        let end = start.and_then(|s| s.checked_add(t.n_bytes as u64));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => t.offset = start,
            _ => {
                return Err(GgufError::truncated(format!(
                    "tensor '{}' data ends at byte {} but file has {file_len} bytes",
                    t.name,
                    end.map_or_else(|| "(overflow)".to_string(), |e| e.to_string()),
                )))
            }
        }
    }

    // Each tensor owns its bytes: llama.cpp's reader requires them laid out
    // one after another, so overlapping data is a corrupt or hostile file.
    let mut ranges: Vec<(u64, u64, &str)> = tensors
        .iter()
        .filter(|t| t.n_bytes > 0)
        .map(|t| (t.offset, t.offset + t.n_bytes as u64, t.name.as_str()))
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        let [(a_start, a_end, a), (b_start, b_end, b)] = pair else {
            continue;
        };
        if b_start < a_end {
            return Err(GgufError::malformed(format!(
                "tensor '{b}' (bytes {b_start}..{b_end}) overlaps tensor '{a}' (bytes {a_start}..{a_end})"
            )));
        }
    }

    Ok(Parsed {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
    })
}

/// Reads the rest of a tensor info after its name. Returns the info (with
/// `offset` still to be made absolute) and the relative offset.
fn read_tensor_info(c: &mut Cursor<'_>, name: String) -> Result<(TensorInfo, u64), GgufError> {
    let n_dims = c.u32()?;
    if n_dims > MAX_DIMS {
        return Err(GgufError::malformed(format!(
            "tensor '{name}' has {n_dims} dimensions (ggml allows at most {MAX_DIMS})"
        )));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64()?);
    }
    let type_id = c.u32()?;
    let ggml_type = GgmlType::from_u32(type_id).ok_or_else(|| GgufError::UnknownType {
        tensor: name.clone(),
        id: type_id,
    })?;
    let offset = c.u64()?;

    let n_elements = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
        .filter(|&n| i64::try_from(n).is_ok())
        .ok_or_else(|| {
            GgufError::malformed(format!(
                "tensor '{name}' has too many elements: dims {dims:?}"
            ))
        })?;
    let (block_size, type_size) = (ggml_type.block_size(), ggml_type.type_size());
    let row = dims.first().copied().unwrap_or(1);
    if row % block_size as u64 != 0 {
        return Err(GgufError::malformed(format!(
            "tensor '{name}' has rows of {row} elements, not a multiple of the {ggml_type} block size {block_size}"
        )));
    }
    let n_bytes = (n_elements / block_size)
        .checked_mul(type_size)
        .ok_or_else(|| {
            GgufError::malformed(format!("tensor '{name}' is too large: dims {dims:?}"))
        })?;
    let info = TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        n_bytes,
    };
    Ok((info, offset))
}
