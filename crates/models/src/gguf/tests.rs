//! Reader tests on GGUF files built in memory by a tiny writer.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use half::f16;

use super::reader::parse;
use super::*;

/// A minimal GGUF writer: little-endian, version 2 or 3.
pub(crate) struct Builder {
    version: u32,
    alignment: usize,
    kvs: Vec<(String, MetaValue)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

fn value_type(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend(x.to_le_bytes()),
        MetaValue::I16(x) => out.extend(x.to_le_bytes()),
        MetaValue::U32(x) => out.extend(x.to_le_bytes()),
        MetaValue::I32(x) => out.extend(x.to_le_bytes()),
        MetaValue::U64(x) => out.extend(x.to_le_bytes()),
        MetaValue::I64(x) => out.extend(x.to_le_bytes()),
        MetaValue::F32(x) => out.extend(x.to_le_bytes()),
        MetaValue::F64(x) => out.extend(x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::Array(items) => {
            out.extend(items.first().map_or(4, value_type).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}

impl Builder {
    pub(crate) fn new() -> Self {
        Self {
            version: 3,
            alignment: 32,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }

    pub(crate) fn kv(mut self, key: &str, value: MetaValue) -> Self {
        if key == "general.alignment" {
            self.alignment = value.as_u64().expect("integer alignment") as usize;
        }
        self.kvs.push((key.to_string(), value));
        self
    }

    pub(crate) fn tensor(mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), ty.id(), data));
        self
    }

    /// Returns the file bytes; tensor data is laid out in order, aligned.
    pub(crate) fn build(&self) -> Vec<u8> {
        self.build_with_infos_end().0
    }

    /// The file bytes and where the tensor infos end.
    fn build_with_infos_end(&self) -> (Vec<u8>, usize) {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        for (key, value) in &self.kvs {
            put_str(&mut out, key);
            out.extend(value_type(value).to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0usize;
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offset = (offset + data.len()).next_multiple_of(self.alignment);
        }
        let infos_end = out.len();
        for (_, _, _, data) in &self.tensors {
            out.resize(out.len().next_multiple_of(self.alignment), 0);
            out.extend(data);
        }
        (out, infos_end)
    }
}

/// A file in the temp dir, removed on drop.
pub(crate) struct TempFile(pub(crate) PathBuf);

impl TempFile {
    pub(crate) fn new(bytes: &[u8]) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("ingot-gguf-unit-{}-{n}.gguf", std::process::id()));
        std::fs::write(&path, bytes).expect("write temp file");
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub(crate) fn f32_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn q8_0_block(d: f32, qs: impl Fn(usize) -> i8) -> Vec<u8> {
    let mut b = f16::from_f32(d).to_le_bytes().to_vec();
    b.extend((0..32).map(|j| qs(j) as u8));
    b
}

pub(crate) fn sample() -> Builder {
    let mut q8 = q8_0_block(0.5, |j| j as i8 - 16);
    q8.extend(q8_0_block(-2.0, |j| (j % 3) as i8));
    Builder::new()
        .kv("general.architecture", MetaValue::String("llama".into()))
        .kv("llama.block_count", MetaValue::U32(30))
        .kv("llama.neg", MetaValue::I32(-3))
        .kv("llama.eps", MetaValue::F32(1e-5))
        .kv("llama.big", MetaValue::U64(1 << 40))
        .kv("llama.f64", MetaValue::F64(0.25))
        .kv("tokenizer.add_bos", MetaValue::Bool(true))
        .kv("small", MetaValue::I8(-1))
        .kv("medium", MetaValue::U16(65535))
        .kv(
            "tokenizer.tokens",
            MetaValue::Array(vec![
                MetaValue::String("a".into()),
                MetaValue::String("b".into()),
            ]),
        )
        .kv(
            "tokenizer.scores",
            MetaValue::Array(vec![MetaValue::F32(-1.5), MetaValue::F32(2.0)]),
        )
        .kv(
            "tokenizer.types",
            MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(-6)]),
        )
        .kv(
            "nested",
            MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::U8(1)])]),
        )
        .tensor("norm", &[3], GgmlType::F32, f32_bytes(&[1.0, -2.0, 0.5]))
        .tensor("embd", &[32, 2], GgmlType::Q8_0, q8)
        .tensor(
            "half",
            &[2, 1, 1],
            GgmlType::F16,
            [1.5f32, -0.25]
                .iter()
                .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                .collect(),
        )
}

#[test]
fn parses_a_small_file() {
    let bytes = sample().build();
    let tmp = TempFile::new(&bytes);
    let f = GgufFile::open(&tmp.0).expect("open");
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset() % 32, 0);
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.metadata().len(), 13);
    assert_eq!(f.get_u64("llama.block_count"), Some(30));
    assert_eq!(f.get_u64("llama.neg"), None);
    assert_eq!(f.get_f64("llama.neg"), Some(-3.0));
    assert_eq!(f.get_f64("llama.eps"), Some(f64::from(1e-5f32)));
    assert_eq!(f.get_f64("llama.f64"), Some(0.25));
    assert_eq!(f.get_u64("llama.big"), Some(1 << 40));
    assert_eq!(f.get_u64("medium"), Some(65535));
    assert_eq!(f.get("small"), Some(&MetaValue::I8(-1)));
    assert_eq!(f.get_bool("tokenizer.add_bos"), Some(true));
    assert_eq!(f.get_bool("llama.block_count"), None);
    assert_eq!(f.get_str("general.architecture"), Some("llama"));
    assert_eq!(f.get_str("llama.block_count"), None);
    assert_eq!(f.get_str_array("tokenizer.tokens"), Some(vec!["a", "b"]));
    assert_eq!(f.get_str_array("tokenizer.scores"), None);
    assert_eq!(f.get_f32_array("tokenizer.scores"), Some(vec![-1.5, 2.0]));
    assert_eq!(f.get_f32_array("tokenizer.types"), Some(vec![1.0, -6.0]));
    assert_eq!(f.get_i64_array("tokenizer.types"), Some(vec![1, -6]));
    assert_eq!(f.get_i64_array("tokenizer.scores"), None);
    assert_eq!(
        f.get("nested"),
        Some(&MetaValue::Array(vec![MetaValue::Array(vec![
            MetaValue::U8(1)
        ])]))
    );
    assert_eq!(f.get("missing"), None);

    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["norm", "embd", "half"]);
    let embd = f.tensor("embd").expect("embd");
    assert_eq!(embd.dims, [32, 2]);
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    assert_eq!(embd.n_elements(), 64);
    assert_eq!(embd.n_bytes, 68);
    assert_eq!(embd.offset % 32, 0);
    assert_eq!(f.tensor_bytes(embd), &sample().tensors[1].3[..]);

    assert_eq!(f.dequantize("norm").expect("norm"), [1.0, -2.0, 0.5]);
    assert_eq!(f.dequantize("half").expect("half"), [1.5, -0.25]);
    let e = f.dequantize("embd").expect("embd");
    assert_eq!(e[0], -8.0);
    assert_eq!(e[31], 7.5);
    assert_eq!(e[32..35], [-0.0, -2.0, -4.0]);
    let err = f.dequantize("nope").unwrap_err();
    assert_eq!(err.to_string(), "GGUF file has no tensor 'nope'");
}

#[test]
fn reads_version_2_and_custom_alignment() {
    let mut b = sample().kv("general.alignment", MetaValue::U32(64));
    b.version = 2;
    let p = parse(&b.build()).expect("parse");
    assert_eq!(p.version, 2);
    assert_eq!(p.alignment, 64);
    assert_eq!(p.data_offset % 64, 0);
    for t in &p.tensors {
        assert_eq!(t.offset % 64, 0, "{}", t.name);
    }
    assert_eq!(p.tensors[1].offset, p.data_offset + 64);
}

#[test]
fn truncated_tensor_data_is_a_clear_error() {
    let bytes = sample().build();
    let cut = &bytes[..bytes.len() - 1];
    let tmp = TempFile::new(cut);
    let err = GgufFile::open(&tmp.0).unwrap_err();
    assert!(matches!(err, GgufError::Truncated { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "GGUF file truncated: tensor 'half' data ends at byte {} but file has {} bytes",
            bytes.len(),
            bytes.len() - 1
        )
    );
}

#[test]
fn every_prefix_of_a_file_is_rejected_without_panicking() {
    let bytes = sample().build();
    assert!(parse(&bytes).is_ok());
    for len in 0..bytes.len() {
        let err = parse(&bytes[..len]).expect_err("a prefix must not parse");
        assert!(
            matches!(err, GgufError::Truncated { .. }),
            "prefix {len}: {err}"
        );
    }
    let err = parse(&bytes[..10]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "GGUF file truncated: the GGUF header needs 8 bytes at byte 8 but the file has 10 bytes"
    );
}

#[test]
fn random_corruption_never_panics() {
    let bytes = sample().build();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut failures = 0;
    for _ in 0..3000 {
        let mut b = bytes.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % b.len() as u64) as usize;
            b[at] = next() as u8;
        }
        failures += usize::from(parse(&b).is_err());
    }
    assert!(failures > 0);
}

#[test]
fn header_errors() {
    let good = sample().build();
    let mut b = good.clone();
    b[0] = b'X';
    assert!(matches!(parse(&b), Err(GgufError::BadMagic)));
    let mut b = good.clone();
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    let err = parse(&b).unwrap_err();
    assert!(matches!(err, GgufError::UnsupportedVersion(1)), "{err}");
    assert!(err.to_string().contains("unsupported GGUF version 1"));
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(matches!(parse(&b), Err(GgufError::BigEndian)));
    b[4..8].copy_from_slice(&4u32.to_le_bytes());
    assert!(matches!(parse(&b), Err(GgufError::UnsupportedVersion(4))));
}

/// Header bytes with the given counts and nothing after them.
fn header(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(n_tensors.to_le_bytes());
    b.extend(n_kv.to_le_bytes());
    b
}

#[test]
fn absurd_counts_and_lengths_are_rejected_before_allocating() {
    let err = parse(&header(0, u64::MAX)).unwrap_err();
    assert!(err.to_string().contains("metadata entries"), "{err}");
    let err = parse(&header(u64::MAX, 0)).unwrap_err();
    assert!(matches!(err, GgufError::Truncated { .. }), "{err}");

    // A key whose string length is near u64::MAX.
    let mut b = header(0, 1);
    b.extend((u64::MAX - 3).to_le_bytes());
    b.extend([0u8; 16]);
    assert!(matches!(parse(&b), Err(GgufError::Truncated { .. })));

    // An array of u64::MAX / 2 strings.
    let mut b = header(0, 1);
    put_str(&mut b, "k");
    b.extend(9u32.to_le_bytes());
    b.extend(8u32.to_le_bytes());
    b.extend((u64::MAX / 2).to_le_bytes());
    b.extend([0u8; 64]);
    let err = parse(&b).unwrap_err();
    assert!(
        err.to_string().contains("metadata key 'k' declares"),
        "{err}"
    );

    // Arrays nested deeper than we allow.
    let mut b = header(0, 1);
    put_str(&mut b, "deep");
    b.extend(9u32.to_le_bytes());
    for _ in 0..8 {
        b.extend(9u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
    }
    b.extend([0u8; 64]);
    assert!(matches!(parse(&b), Err(GgufError::Malformed { .. })));

    // Unknown value type.
    let mut b = header(0, 1);
    put_str(&mut b, "k");
    b.extend(13u32.to_le_bytes());
    b.extend([0u8; 16]);
    let err = parse(&b).unwrap_err();
    assert_eq!(
        err.to_string(),
        "malformed GGUF file: metadata key 'k' has unknown value type 13"
    );
}

#[test]
fn tensor_info_errors() {
    let f32_data = f32_bytes(&[0.0; 32]);
    let one = |dims: &[u64], ty: GgmlType| Builder::new().tensor("w", dims, ty, f32_data.clone());

    let err = parse(&one(&[1, 1, 1, 1, 1], GgmlType::F32).build()).unwrap_err();
    assert!(err.to_string().contains("5 dimensions"), "{err}");

    let err = parse(&one(&[16], GgmlType::Q8_0).build()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "malformed GGUF file: tensor 'w' has rows of 16 elements, not a multiple of the Q8_0 block size 32"
    );

    let err = parse(&one(&[u64::MAX, u64::MAX], GgmlType::F32).build()).unwrap_err();
    assert!(err.to_string().contains("too many elements"), "{err}");

    let mut b = one(&[32], GgmlType::F32);
    b.tensors[0].2 = 4; // Q4_2, removed from ggml long ago
    let err = parse(&b.build()).unwrap_err();
    assert!(matches!(err, GgufError::UnknownType { id: 4, .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "GGUF tensor 'w' has unknown ggml type id 4"
    );

    let dup = one(&[32], GgmlType::F32).tensor("w", &[32], GgmlType::F32, f32_data.clone());
    assert!(parse(&dup.build())
        .unwrap_err()
        .to_string()
        .contains("appears twice"));

    let dup = Builder::new()
        .kv("a", MetaValue::U8(1))
        .kv("a", MetaValue::U8(2));
    let err = parse(&dup.build()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "malformed GGUF file: metadata key 'a' appears twice"
    );

    let bad_align = one(&[32], GgmlType::F32).kv("general.alignment", MetaValue::U32(48));
    let err = parse(&bad_align.build()).unwrap_err();
    assert!(err.to_string().contains("power of two"), "{err}");

    // A tensor offset that is not a multiple of the alignment: patch the
    // last info's offset field, the 8 bytes before the infos end.
    let (mut b, infos_end) = one(&[32], GgmlType::F32).build_with_infos_end();
    b[infos_end - 8..infos_end].copy_from_slice(&4u64.to_le_bytes());
    let err = parse(&b).unwrap_err();
    assert_eq!(
        err.to_string(),
        "malformed GGUF file: tensor 'w' has offset 4, not a multiple of the alignment 32"
    );
}

#[test]
fn unsupported_types_parse_but_do_not_dequantize() {
    let b = Builder::new().tensor("iq", &[256], GgmlType::IQ2_XXS, vec![0u8; 66]);
    let tmp = TempFile::new(&b.build());
    let f = GgufFile::open(&tmp.0).expect("open");
    assert_eq!(f.tensor("iq").map(|t| t.ggml_type), Some(GgmlType::IQ2_XXS));
    let err = f.dequantize("iq").unwrap_err();
    assert!(matches!(
        err,
        GgufError::UnsupportedType {
            ty: GgmlType::IQ2_XXS,
            ..
        }
    ));
    assert_eq!(
        err.to_string(),
        "GGUF tensor 'iq' has ggml type IQ2_XXS, which ingot cannot dequantize yet"
    );
}

#[test]
fn missing_file_names_the_path() {
    let path = std::env::temp_dir().join("ingot-no-such-file.gguf");
    let err = GgufFile::open(&path).unwrap_err();
    assert!(matches!(err, GgufError::Io { .. }));
    assert!(err.to_string().contains("ingot-no-such-file.gguf"), "{err}");
}
