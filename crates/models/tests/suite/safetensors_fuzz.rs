//! Fuzzing the safetensors reader as property tests (issue 37): headers
//! generated with hostile header lengths, dtypes, shapes and offsets
//! (overlapping, out of range, overflowing), then cut short or corrupted.
//! Opening and loading must never panic and never claim memory the file
//! does not back; what is refused is an error naming the file.
//!
//! `INGOT_FUZZ_CASES` sets the number of cases (CI runs the small default).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use ingot_models::hf::SafetensorsSource;
use ingot_models::TensorSource;
use ingot_testkit::fuzz_runner;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// A directory holding one `model.safetensors`, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn with(bytes: &[u8]) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ingot-st-fuzz-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
        Self(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dtype() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("F32".to_string()),
        Just("F16".to_string()),
        Just("BF16".to_string()),
        Just("I64".to_string()),
        Just("U8".to_string()),
        Just("BOOL".to_string()),
        Just("F8_E4M3".to_string()),
        Just("F64".to_string()),
        "[A-Z0-9_]{0,6}",
    ]
}

fn dim() -> impl Strategy<Value = u64> {
    prop_oneof![
        0..6u64,
        Just(u64::MAX),
        Just(1 << 32),
        Just(usize::MAX as u64 / 2 + 1),
    ]
}

fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![0..96u64, Just(u64::MAX), Just(1 << 40)]
}

/// One tensor entry: name, dtype, shape, [begin, end].
fn entry() -> impl Strategy<Value = (String, String, Vec<u64>, (u64, u64))> {
    (
        "[a-c]{1,2}",
        dtype(),
        proptest::collection::vec(dim(), 0..4),
        (offset(), offset()),
    )
}

/// A file: header length field (true length unless overridden), header,
/// data, then a cut.
fn file() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(entry(), 0..5),
        prop_oneof![
            3 => Just(None),
            1 => prop_oneof![Just(u64::MAX), Just(1 << 40), 0..200u64].prop_map(Some),
        ],
        proptest::collection::vec(any::<u8>(), 0..96),
        prop_oneof![3 => Just(None), 1 => any::<usize>().prop_map(Some)],
        any::<bool>(),
    )
        .prop_map(|(entries, header_len, data, cut, metadata)| {
            let mut header = Map::new();
            if metadata {
                header.insert("__metadata__".into(), json!({"format": "pt"}));
            }
            for (name, dtype, shape, (begin, end)) in entries {
                header.insert(
                    name,
                    json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}),
                );
            }
            let header = Value::Object(header).to_string();
            let len = header_len.unwrap_or(header.len() as u64);
            let mut bytes = len.to_le_bytes().to_vec();
            bytes.extend(header.as_bytes());
            bytes.extend(data);
            if let Some(cut) = cut {
                bytes.truncate(cut % (bytes.len() + 1));
            }
            bytes
        })
}

/// A well-formed file (contiguous offsets, data of the right length) of
/// tensors of several dtypes, then some of its bytes changed or cut.
fn valid_then_corrupted() -> impl Strategy<Value = Vec<u8>> {
    let tensor = (
        prop_oneof![
            Just(("F32", 4)),
            Just(("F16", 2)),
            Just(("BF16", 2)),
            Just(("I64", 8))
        ],
        proptest::collection::vec(0..4u64, 0..3),
    );
    (
        proptest::collection::vec(tensor, 1..4),
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
        prop_oneof![3 => Just(None), 1 => any::<usize>().prop_map(Some)],
    )
        .prop_map(|(tensors, flips, cut)| {
            let mut header = Map::new();
            let mut at = 0u64;
            for (i, ((dtype, size), shape)) in tensors.into_iter().enumerate() {
                let n = shape.iter().product::<u64>() * size;
                header.insert(
                    ["a", "b", "c"][i % 3].to_string(),
                    json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + n]}),
                );
                at += n;
            }
            let header = Value::Object(header).to_string();
            let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
            bytes.extend(header.as_bytes());
            bytes.extend((0..at).map(|i| i as u8));
            for (i, x) in flips {
                let len = bytes.len();
                bytes[i % len] ^= x;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut % (bytes.len() + 1));
            }
            bytes
        })
}

#[test]
fn hostile_safetensors_headers_never_panic() {
    fuzz_runner(200)
        .run(&prop_oneof![file(), valid_then_corrupted()], |bytes| {
            let dir = Dir::with(&bytes);
            match SafetensorsSource::open(&dir.0) {
                Err(e) => prop_assert!(e.to_string().contains("model.safetensors"), "{e}"),
                Ok(source) => {
                    let _ = source.dtype_summary();
                    for name in ["a", "b", "c", "aa", "ab", "bc", "ca"] {
                        if !source.contains(name) {
                            continue;
                        }
                        match source.load(name) {
                            // Whatever loads is backed by the file's bytes.
                            Ok(t) => prop_assert!(t.len() <= bytes.len()),
                            Err(e) => prop_assert!(!e.to_string().is_empty()),
                        }
                        let _ = source.load_bf16(name);
                    }
                }
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

/// A header length past the end of the file is refused without reading
/// (or allocating) that much.
#[test]
fn a_huge_header_length_is_refused() {
    for len in [u64::MAX, 1 << 40, 100] {
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend(b"{}");
        let dir = Dir::with(&bytes);
        let Err(e) = SafetensorsSource::open(&dir.0) else {
            panic!("a header length of {len} was accepted");
        };
        assert!(e.to_string().contains("model.safetensors"), "{e}");
    }
}
