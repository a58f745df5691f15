//! AWQ and GPTQ checkpoints (4-bit, the safetensors layouts AutoAWQ,
//! AutoGPTQ and GPTQModel publish) as GGUF Q4_1 blocks, for the native Q4_1
//! kernels, or dequantized exactly to f32.
//!
//! The layouts, as the published code packs and unpacks them:
//!
//! - AWQ, GEMM version (AutoAWQ `awq/modules/linear/gemm.py`,
//!   `WQLinear_GEMM.from_linear`; `awq/utils/packing_utils.py`,
//!   `dequantize_gemm`; vLLM `vllm/model_executor/layers/quantization/
//!   awq_triton.py`): `qweight` int32 `[in, out/8]`, `qzeros` int32
//!   `[in/g, out/8]`, `scales` f16 `[in/g, out]`. Word `c` of a row holds
//!   outputs `8c..8c+8`: the packer puts output `8c + order_map[n]` in bits
//!   `4n..4n+4`, `order_map = [0, 2, 4, 6, 1, 3, 5, 7]`, so output `8c + j`
//!   is in nibble [`AWQ_NIBBLE`]`[j]` (`AWQ_REVERSE_ORDER`; vLLM's kernel
//!   shifts by `reverse_awq_order * 4`). Zeros are packed the same way and
//!   stored as they are: `w[i, o] = (q - z) * s` (`dequantize_gemm`; vLLM's
//!   `(iweights - zeros) * scales`), the linear weight is `wᵀ`, `[out, in]`.
//! - GPTQ (AutoGPTQ `auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py`,
//!   `QuantLinear.pack` and its torch dequantization): `qweight` int32
//!   `[in/8, out]`, input `i` in bits `4(i % 8)` of row `i / 8`; `qzeros`
//!   int32 `[groups, out/8]`, output `o` in bits `4(o % 8)` of column
//!   `o / 8`; `scales` f16 `[groups, out]`; `g_idx` int32 `[in]`, `i / g`
//!   unless quantized in activation order; `w = (q - z) * s`. The v1 packer
//!   stores `z - 1` (`zeros -= 1`) and readers add the 1 back with a 4-bit
//!   wrap, `(stored + 1) & 15`, as exllamav2 does
//!   (`exllamav2_ext/cuda/q_gemm_kernel_gptq.cuh`: `(zeros[0] + 1) & 0x0F`)
//!   and AutoGPTQ's triton (`(zeros + 1) & maxq`) and HPU kernels; its torch
//!   fallbacks (`qlinear_cuda.py`) mask before adding and read a stored 15
//!   as 16. Only a zero point of 0 is stored as 15, and the v1 packer cannot
//!   store that one intact (its `-1` as uint32 sets every higher bit of the
//!   word), so the two readings differ only on words it already broke.
//!   GPTQModel's v2 (`checkpoint_format` "gptq_v2") stores `z` itself (its
//!   `convert_gptq_v1_to_v2_format_module` adds 1 to every nibble).
//! - `group_size` -1: one group over all inputs (both packers).
//!
//! A Q4_1 block (ggml `block_q4_1 { f16 d, m; u8 qs[16]; }`, `w = d q + m`,
//! weight `j` in the low nibble of `qs[j]`, weight `j + 16` in its high
//! nibble) is 32 inputs of one output row, inside one group since groups are
//! multiples of 32 inputs: `d = s` (the f16 itself, exact), `q` as stored,
//! `m = -z s` rounded to f16. `z s` is exact in f32 (at most 4 + 11
//! significant bits), so the one error is that rounding: at most half an f16
//! ulp of `|z s|`, i.e. `2^-11 |z s| <= 15 * 2^-11 s` (`M_ERROR_PER_STEP`):
//! under 0.74 % of one quantization step `s`, the same for every weight of
//! the block (the worst case, about 0.73 %, is reached: see the test
//! `q4_1_m_rounding_stays_within_the_stated_bound` in `hf.rs`). The f32
//! path ([`Packed::dequantize`]) computes `(q - z) s` exactly instead.

use half::f16;
use rayon::prelude::*;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::Value;

use crate::ModelError;

/// Weights of a Q4_1 block.
const BLOCK: usize = 32;
/// Bytes of a Q4_1 block: f16 `d`, f16 `m`, 16 bytes of nibbles.
const BLOCK_BYTES: usize = 20;

/// Output rows one task unpacks: a multiple of 8 (AWQ packs 8 outputs a
/// word), 64 so that the words read for one input (AWQ) or 8 inputs (GPTQ)
/// fill a cache line.
const ROWS_PER_TASK: usize = 64;

/// The nibble of an AWQ word holding output `8c + j`, by `j`
/// (`AWQ_REVERSE_ORDER`, the inverse of the packer's `order_map`).
const AWQ_NIBBLE: [u32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// The largest error of a Q4_1 block's `m`, in quantization steps `s`:
/// half an f16 ulp of `|z s| <= 15 s`, `15 * 2^-11`.
#[cfg(test)]
pub(crate) const M_ERROR_PER_STEP: f32 = 15.0 / 2048.0;

/// The packer of a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    /// AutoAWQ's GEMM packing.
    Awq,
    /// AutoGPTQ / GPTQModel packing.
    Gptq,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Awq => "AWQ",
            Method::Gptq => "GPTQ",
        }
    }
}

/// The 4-bit scheme of an AWQ or GPTQ checkpoint, from its
/// `quantization_config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Int4Config {
    method: Method,
    /// Inputs per group; `None`: one group over all inputs (`group_size` -1).
    group: Option<usize>,
    /// Added (mod 16) to a stored zero nibble: 1 for GPTQ v1, else 0.
    zero_offset: u32,
}

fn refuse(message: String) -> ModelError {
    ModelError::UnsupportedQuantization(message)
}

/// An integer setting, under any of `keys`.
fn int(v: &Value, keys: &[&str]) -> Option<i64> {
    keys.iter().find_map(|k| v.get(k)?.as_i64())
}

/// A string setting, lower-cased.
fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key)?.as_str().map(str::to_ascii_lowercase)
}

/// A boolean setting.
fn flag(v: &Value, key: &str) -> Option<bool> {
    v.get(key)?.as_bool()
}

impl Int4Config {
    /// The scheme of `quantization_config` `v` (of `config.json`, or a whole
    /// `quantize_config.json`, whose packer `implied` names when it has no
    /// `quant_method`). `None` for the FP8 schemes, which load tensor by
    /// tensor from their dtypes; anything else not AWQ/GPTQ 4-bit in a
    /// layout we read is refused by name.
    pub(crate) fn from_json(
        v: &Value,
        implied: Option<Method>,
    ) -> Result<Option<Self>, ModelError> {
        let method = match text(v, "quant_method").as_deref() {
            Some("awq") => Method::Awq,
            Some("gptq") => Method::Gptq,
            Some("fp8" | "fbgemm_fp8" | "compressed-tensors") => return Ok(None),
            Some(other) => {
                return Err(refuse(format!(
                    "quantization_config quant_method '{other}' (AWQ and GPTQ 4-bit and FP8 \
                     checkpoints load)"
                )))
            }
            None => {
                implied.ok_or_else(|| refuse("quantization_config has no quant_method".into()))?
            }
        };
        let name = method.name();
        match int(v, &["bits", "w_bit"]) {
            Some(4) => {}
            bits => {
                return Err(refuse(format!(
                    "{name} bits={}: only 4-bit checkpoints load; use a 4-bit one",
                    shown(bits)
                )))
            }
        }
        let group = match int(v, &["group_size", "q_group_size"]) {
            Some(-1) => None,
            Some(g) if g > 0 && g % BLOCK as i64 == 0 => Some(g as usize),
            g => {
                return Err(refuse(format!(
                    "{name} group_size={}: groups must be a multiple of 32 inputs (one Q4_1 \
                     block) or -1; use a checkpoint with group_size 32, 64, 128 or -1",
                    shown(g)
                )))
            }
        };
        let zero_offset = match method {
            Method::Awq => awq_checks(v)?,
            Method::Gptq => gptq_zero_offset(v)?,
        };
        Ok(Some(Self {
            method,
            group,
            zero_offset,
        }))
    }

    /// Inputs per group of a weight with `cols` inputs.
    pub(crate) fn group_size(&self, cols: usize) -> usize {
        self.group.unwrap_or(cols)
    }

    /// How `ingot inspect` names the weights: "AWQ int4 g128", "GPTQ int4 g-1".
    pub(crate) fn label(&self) -> String {
        let group = self.group.map_or(-1, |g| g as i64);
        format!("{} int4 g{group}", self.method.name())
    }

    /// The input features of a linear layer whose `qweight` has `shape`.
    pub(crate) fn cols_of(&self, shape: &[usize]) -> Option<usize> {
        let &[first, _] = shape else { return None };
        Some(match self.method {
            Method::Awq => first,
            Method::Gptq => first.saturating_mul(8),
        })
    }
}

fn shown(v: Option<i64>) -> String {
    v.map_or_else(|| "(missing)".to_string(), |v| v.to_string())
}

/// AWQ settings other than bits and groups: GEMM packing, zero points.
fn awq_checks(v: &Value) -> Result<u32, ModelError> {
    let version = text(v, "version").unwrap_or_else(|| "gemm".into());
    if version != "gemm" {
        return Err(refuse(format!(
            "AWQ version '{version}': only the GEMM packing loads (GEMV, GEMV-fast, Marlin and \
             exllama pack differently); use a GEMM checkpoint"
        )));
    }
    if flag(v, "zero_point") == Some(false) {
        return Err(refuse(
            "AWQ zero_point=false: only AWQ with zero points (the default) loads".into(),
        ));
    }
    Ok(0)
}

/// GPTQ settings other than bits and groups: the packing, and what it adds
/// to a stored zero.
fn gptq_zero_offset(v: &Value) -> Result<u32, ModelError> {
    if flag(v, "is_marlin_format") == Some(true) {
        return Err(refuse(
            "GPTQ is_marlin_format=true: Marlin-repacked weights do not load; use the \
             checkpoint as GPTQ packed it"
                .into(),
        ));
    }
    if let Some(dtype) = text(v, "pack_dtype").filter(|d| d != "int32") {
        return Err(refuse(format!(
            "GPTQ pack_dtype '{dtype}': only int32 packing loads"
        )));
    }
    match text(v, "checkpoint_format").as_deref() {
        None | Some("gptq") => Ok(1),
        Some("gptq_v2") => Ok(0),
        Some(other) => Err(refuse(format!(
            "GPTQ checkpoint_format '{other}': only the gptq and gptq_v2 packings load"
        ))),
    }
}

/// The files of one AWQ/GPTQ linear layer `<prefix>.weight`.
pub(crate) struct Int4Tensors<'a> {
    /// `<prefix>.qweight`.
    pub qweight: TensorView<'a>,
    /// `<prefix>.qzeros`.
    pub qzeros: TensorView<'a>,
    /// `<prefix>.scales`.
    pub scales: TensorView<'a>,
    /// `<prefix>.g_idx`, when the file has one.
    pub g_idx: Option<TensorView<'a>>,
}

/// One AWQ/GPTQ linear layer, its shapes checked.
pub(crate) struct Packed<'a> {
    method: Method,
    zero_offset: u32,
    prefix: &'a str,
    /// Output features: the rows of the linear weight.
    pub rows: usize,
    /// Input features: its columns.
    pub cols: usize,
    group: usize,
    /// GPTQ act order: each input's group, when `g_idx` is not `i / group`.
    act_order: Option<Vec<u32>>,
    qweight: &'a [u8],
    qzeros: &'a [u8],
    scales: &'a [u8],
}

/// Little-endian word `k` of `bytes` (in bounds: shapes are checked first).
fn word(bytes: &[u8], k: usize) -> u32 {
    let b = &bytes[4 * k..4 * k + 4];
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn check_dtype(name: &str, view: &TensorView<'_>, want: Dtype) -> Result<(), ModelError> {
    if view.dtype() == want {
        return Ok(());
    }
    Err(ModelError::UnsupportedDtype {
        name: name.to_string(),
        dtype: format!("{:?} (AWQ/GPTQ stores it as {want:?})", view.dtype()),
    })
}

fn check_shape(name: &str, view: &TensorView<'_>, want: &[usize]) -> Result<(), ModelError> {
    if view.shape() == want {
        return Ok(());
    }
    Err(ModelError::ShapeMismatch {
        name: name.to_string(),
        expected: want.to_vec(),
        got: view.shape().to_vec(),
    })
}

impl<'a> Packed<'a> {
    /// Checks the tensors of `<prefix>.weight` against each other and
    /// `config`: dtypes, shapes, and a `g_idx` (if any) naming groups that
    /// exist.
    pub(crate) fn new(
        config: &Int4Config,
        prefix: &'a str,
        t: Int4Tensors<'a>,
    ) -> Result<Self, ModelError> {
        let name = |s: &str| format!("{prefix}.{s}");
        check_dtype(&name("qweight"), &t.qweight, Dtype::I32)?;
        check_dtype(&name("qzeros"), &t.qzeros, Dtype::I32)?;
        check_dtype(&name("scales"), &t.scales, Dtype::F16)?;
        let (rows, cols) = match (config.method, t.qweight.shape()) {
            (Method::Awq, &[cols, words]) => (words.saturating_mul(8), cols),
            (Method::Gptq, &[words, rows]) => (rows, words.saturating_mul(8)),
            (_, got) => {
                return Err(ModelError::ShapeMismatch {
                    name: name("qweight"),
                    expected: vec![0, 0],
                    got: got.to_vec(),
                })
            }
        };
        if rows == 0 || cols == 0 || !rows.is_multiple_of(8) {
            return Err(refuse(format!(
                "{prefix}: a {rows} x {cols} weight (AWQ/GPTQ pack whole words of 8 outputs)"
            )));
        }
        let group = config.group_size(cols);
        let groups = cols.div_ceil(group);
        check_shape(&name("scales"), &t.scales, &[groups, rows])?;
        check_shape(&name("qzeros"), &t.qzeros, &[groups, rows / 8])?;
        let act_order = match &t.g_idx {
            Some(g_idx) => act_order(prefix, g_idx, cols, group)?,
            None => None,
        };
        let packed = Self {
            method: config.method,
            zero_offset: config.zero_offset,
            prefix,
            rows,
            cols,
            group,
            act_order,
            qweight: t.qweight.data(),
            qzeros: t.qzeros.data(),
            scales: t.scales.data(),
        };
        packed.check_lengths()?;
        Ok(packed)
    }

    /// The byte lengths the shapes imply (safetensors checks them too; this
    /// keeps every index below in bounds whatever the file says).
    fn check_lengths(&self) -> Result<(), ModelError> {
        let groups = self.cols.div_ceil(self.group);
        let want = [
            (self.qweight.len(), self.rows * self.cols / 2),
            (self.qzeros.len(), groups * self.rows / 2),
            (self.scales.len(), groups * self.rows * 2),
        ];
        if want.iter().all(|(got, want)| got == want) {
            return Ok(());
        }
        Err(refuse(format!(
            "{}: tensor byte lengths do not match their shapes",
            self.prefix
        )))
    }

    /// The zero point of output `o` in group `g`.
    fn zero(&self, g: usize, o: usize) -> u32 {
        let w = word(self.qzeros, g * (self.rows / 8) + o / 8);
        let nibble = match self.method {
            Method::Awq => AWQ_NIBBLE[o % 8],
            Method::Gptq => (o % 8) as u32,
        };
        (((w >> (4 * nibble)) & 0xF) + self.zero_offset) & 0xF
    }

    /// The scale of output `o` in group `g`.
    fn scale(&self, g: usize, o: usize) -> f16 {
        let at = 2 * (g * self.rows + o);
        f16::from_le_bytes([self.scales[at], self.scales[at + 1]])
    }

    /// The quants of output rows `first..first + n` into `out` (`[n][cols]`,
    /// one byte each, input order; `first` and `n` multiples of 8). Inputs
    /// run in the outer loop, so the words read for each are adjacent.
    fn unpack_rows(&self, first: usize, out: &mut [u8]) {
        let (rows, cols) = (self.rows, self.cols);
        let n = out.len() / cols;
        match self.method {
            Method::Awq => {
                for i in 0..cols {
                    let words = i * (rows / 8) + first / 8;
                    for c in 0..n / 8 {
                        let w = word(self.qweight, words + c);
                        for (j, &nibble) in AWQ_NIBBLE.iter().enumerate() {
                            out[(8 * c + j) * cols + i] = ((w >> (4 * nibble)) & 0xF) as u8;
                        }
                    }
                }
            }
            Method::Gptq => {
                for k in 0..cols / 8 {
                    for r in 0..n {
                        let w = word(self.qweight, k * rows + first + r);
                        let eight = &mut out[r * cols + 8 * k..r * cols + 8 * k + 8];
                        for (m, q) in eight.iter_mut().enumerate() {
                            *q = ((w >> (4 * m)) & 0xF) as u8;
                        }
                    }
                }
            }
        }
    }

    /// Runs `f(o, quants of row o, out row o)` for every output row, in
    /// parallel over runs of [`ROWS_PER_TASK`] rows; `out` holds `row_len`
    /// items per row.
    fn per_row<T: Send>(
        &self,
        out: &mut [T],
        row_len: usize,
        f: impl Fn(usize, &[u8], &mut [T]) -> Result<(), ModelError> + Sync,
    ) -> Result<(), ModelError> {
        let cols = self.cols;
        out.par_chunks_mut(ROWS_PER_TASK * row_len)
            .enumerate()
            .try_for_each_init(
                || vec![0u8; ROWS_PER_TASK * cols],
                |quants, (t, dst)| {
                    let first = t * ROWS_PER_TASK;
                    let quants = &mut quants[..dst.len() / row_len * cols];
                    self.unpack_rows(first, quants);
                    let rows = quants.chunks_exact(cols).zip(dst.chunks_exact_mut(row_len));
                    rows.enumerate()
                        .try_for_each(|(j, (q, row))| f(first + j, q, row))
                },
            )
    }

    /// The weight `[rows, cols]` in f32: `(q - z) * s` exactly (small
    /// integers times an f16 are exact in f32).
    pub(crate) fn dequantize(&self) -> Result<Vec<f32>, ModelError> {
        let mut out = vec![0f32; self.rows * self.cols];
        let group = self.group;
        if let Some(groups) = &self.act_order {
            self.per_row(&mut out, self.cols, |o, quants, row| {
                for ((w, &q), &g) in row.iter_mut().zip(quants).zip(groups) {
                    let (z, s) = (self.zero(g as usize, o), self.scale(g as usize, o));
                    *w = (f32::from(q) - z as f32) * s.to_f32();
                }
                Ok(())
            })?;
            return Ok(out);
        }
        self.per_row(&mut out, self.cols, |o, quants, row| {
            let groups = quants.chunks(group).zip(row.chunks_mut(group));
            for (g, (qs, ws)) in groups.enumerate() {
                let (z, s) = (self.zero(g, o) as f32, self.scale(g, o).to_f32());
                for (w, &q) in ws.iter_mut().zip(qs) {
                    *w = (f32::from(q) - z) * s;
                }
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// The weight as Q4_1 blocks, row-major (`[rows, cols]`, `cols / 32`
    /// blocks a row); `None` when a row is not whole blocks, or in act order
    /// (32 adjacent inputs then need not share a scale).
    pub(crate) fn q4_1(&self) -> Result<Option<Vec<u8>>, ModelError> {
        if !self.cols.is_multiple_of(BLOCK) || self.act_order.is_some() {
            return Ok(None);
        }
        let row_len = self.cols / BLOCK * BLOCK_BYTES;
        let mut out = vec![0u8; self.rows * row_len];
        self.per_row(&mut out, row_len, |o, quants, row| {
            let blocks = quants
                .chunks_exact(BLOCK)
                .zip(row.chunks_exact_mut(BLOCK_BYTES));
            for (b, (qs, block)) in blocks.enumerate() {
                self.block(o, b * BLOCK / self.group, qs, block)?;
            }
            Ok(())
        })?;
        Ok(Some(out))
    }

    /// One Q4_1 block of output `o` in group `g`: `d = s`, `m = -z s`
    /// rounded to f16 (see the module notes for its error), nibbles as
    /// stored.
    fn block(&self, o: usize, g: usize, qs: &[u8], block: &mut [u8]) -> Result<(), ModelError> {
        let (z, s) = (self.zero(g, o), self.scale(g, o));
        let m = f16::from_f32(-(z as f32) * s.to_f32());
        if !m.is_finite() {
            return Err(refuse(format!(
                "{}: zero {z} times scale {s} (output {o}, group {g}) is past f16's range, \
                 which Q4_1's offset needs",
                self.prefix
            )));
        }
        block[..2].copy_from_slice(&s.to_le_bytes());
        block[2..4].copy_from_slice(&m.to_le_bytes());
        let (lo, hi) = qs.split_at(BLOCK / 2);
        for ((b, &l), &h) in block[4..].iter_mut().zip(lo).zip(hi) {
            *b = l | (h << 4);
        }
        Ok(())
    }
}

/// The groups a `g_idx` gives each input, when that is not `i / group`
/// (GPTQ act order, `desc_act`: inputs quantized in another order; such a
/// weight loads through its exact floats, having no Q4_1 form); `None`
/// when it is. A group past the scales' is refused by name.
pub(crate) fn act_order(
    prefix: &str,
    g_idx: &TensorView<'_>,
    cols: usize,
    group: usize,
) -> Result<Option<Vec<u32>>, ModelError> {
    let name = format!("{prefix}.g_idx");
    check_dtype(&name, g_idx, Dtype::I32)?;
    check_shape(&name, g_idx, &[cols])?;
    let groups = cols.div_ceil(group);
    let values: Vec<i32> = g_idx
        .data()
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if let Some((i, g)) = values
        .iter()
        .enumerate()
        .find(|&(_, &g)| usize::try_from(g).map_or(true, |g| g >= groups))
    {
        return Err(refuse(format!(
            "{name}[{i}] is {g}, but the weight has {groups} groups of scales"
        )));
    }
    let in_order = values
        .iter()
        .enumerate()
        .all(|(i, &g)| g as usize == i / group);
    Ok((!in_order).then(|| values.into_iter().map(|g| g as u32).collect()))
}

/// The scheme of the checkpoint in `dir`: `config.json`'s
/// `quantization_config`, else AutoGPTQ's `quantize_config.json` or
/// AutoAWQ's `quant_config.json`; `None` when there is none (or FP8).
pub(crate) fn read_config(dir: &std::path::Path) -> Result<Option<Int4Config>, ModelError> {
    let files = [
        ("config.json", None),
        ("quantize_config.json", Some(Method::Gptq)),
        ("quant_config.json", Some(Method::Awq)),
    ];
    for (file, implied) in files {
        let path = dir.join(file);
        if !path.is_file() {
            continue;
        }
        let bad = |message: String| ModelError::ConfigFile {
            path: path.clone(),
            message,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
        let value: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let quant = match implied {
            None => value.get("quantization_config").filter(|q| !q.is_null()),
            Some(_) => Some(&value),
        };
        if let Some(quant) = quant {
            return Int4Config::from_json(quant, implied);
        }
    }
    Ok(None)
}
