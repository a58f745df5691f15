//! Fuzzing the GGUF reader as property tests (issue 37): valid files built by
//! the test writer, then corrupted (bytes flipped, counts and lengths made
//! huge, offsets moved, type ids changed, the file cut short) and random
//! bytes behind a valid magic. The reader must never panic, never claim
//! memory the file's size does not back, and refuse with an error that
//! names the problem; whatever it accepts must be readable in full.
//!
//! `INGOT_FUZZ_CASES` sets the number of cases per property (CI runs the
//! small default; docs/benchmarks.md records a long run).

use ingot_testkit::fuzz_runner;
use proptest::prelude::*;

use super::reader::parse;
use super::tests::{f32_bytes, sample, Builder};
use super::*;

/// One corruption of a file's bytes.
#[derive(Debug, Clone)]
enum Mutation {
    /// XOR a byte.
    Flip(usize, u8),
    /// Overwrite 8 bytes (a length, count, dimension or offset) with a
    /// hostile value.
    Word(usize, u64),
    /// Overwrite 4 bytes (a type id, a version, a dimension count).
    Half(usize, u32),
    /// Cut the file.
    Truncate(usize),
    /// Insert bytes (shifts everything after).
    Insert(usize, Vec<u8>),
}

fn hostile_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(u64::MAX),
        Just(u64::MAX / 2),
        Just(1 << 32),
        Just(1 << 40),
        Just(i64::MAX as u64 + 1),
        0..512u64,
        any::<u64>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(at, x)| Mutation::Flip(at, x)),
        (any::<usize>(), hostile_u64()).prop_map(|(at, v)| Mutation::Word(at, v)),
        (
            any::<usize>(),
            prop_oneof![0..40u32, Just(u32::MAX), any::<u32>()]
        )
            .prop_map(|(at, v)| Mutation::Half(at, v)),
        any::<usize>().prop_map(Mutation::Truncate),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(at, b)| Mutation::Insert(at, b)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let len = bytes.len().max(1);
    match m {
        Mutation::Flip(at, x) => {
            if let Some(b) = bytes.get_mut(at % len) {
                *b ^= x;
            }
        }
        Mutation::Word(at, v) => {
            let at = at % len;
            for (b, v) in bytes.iter_mut().skip(at).zip(v.to_le_bytes()) {
                *b = v;
            }
        }
        Mutation::Half(at, v) => {
            let at = at % len;
            for (b, v) in bytes.iter_mut().skip(at).zip(v.to_le_bytes()) {
                *b = v;
            }
        }
        Mutation::Truncate(at) => bytes.truncate(at % len),
        Mutation::Insert(at, extra) => {
            let at = at % len;
            bytes.splice(at..at, extra.iter().copied());
        }
    }
}

/// Parses `bytes`: an error must name its problem; an accepted file must
/// keep every tensor inside the file and dequantize without panicking.
fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    match parse(bytes) {
        Err(e) => {
            prop_assert!(!e.to_string().is_empty());
        }
        Ok(parsed) => {
            for t in &parsed.tensors {
                let end = t.offset.checked_add(t.n_bytes as u64);
                prop_assert!(
                    end.is_some_and(|e| e <= bytes.len() as u64),
                    "tensor {} at {} + {} outside {} bytes",
                    t.name,
                    t.offset,
                    t.n_bytes,
                    bytes.len()
                );
                // An accepted tensor's element count is backed by its bytes,
                // so dequantizing it claims memory in proportion to the file.
                let per_block = t.ggml_type.block_size() / t.ggml_type.type_size().max(1) + 1;
                prop_assert!(t.n_elements() <= (t.n_bytes + 1) * per_block);
                if t.ggml_type.can_dequantize() {
                    let start = t.offset as usize;
                    let data = &bytes[start..start + t.n_bytes];
                    let mut out = vec![0.0f32; t.n_elements()];
                    if let Err(e) = dequantize_into(t.ggml_type, data, &mut out) {
                        prop_assert!(!e.to_string().is_empty());
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn corrupted_files_never_panic() {
    // The parser tests' file: metadata of every kind, tensors of several types.
    let base = sample().build();
    prop_assert_ok(parse(&base).map(|_| ()));
    let strategy = proptest::collection::vec(mutation(), 1..6);
    fuzz_runner(1000)
        .run(&strategy, |mutations| {
            let mut bytes = base.clone();
            for m in &mutations {
                apply(&mut bytes, m);
            }
            check(&bytes)
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn random_bytes_after_the_header_never_panic() {
    let strategy = (
        prop_oneof![Just(2u32), Just(3u32), any::<u32>()],
        0..8u64,
        0..8u64,
        proptest::collection::vec(any::<u8>(), 0..512),
    );
    fuzz_runner(1000)
        .run(&strategy, |(version, n_tensors, n_kv, rest)| {
            let mut bytes = b"GGUF".to_vec();
            bytes.extend(version.to_le_bytes());
            bytes.extend(n_tensors.to_le_bytes());
            bytes.extend(n_kv.to_le_bytes());
            bytes.extend(rest);
            check(&bytes)
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Tensor infos written by hand: any dimensions, type ids and offsets
/// (overlapping, unaligned, past the end, overflowing), over data of any
/// length.
#[test]
fn hostile_tensor_infos_never_panic() {
    let dim = prop_oneof![0..70u64, Just(u64::MAX), Just(1 << 31), Just(1 << 62)];
    let offset = prop_oneof![
        (0..8u64).prop_map(|k| k * 32),
        0..300u64,
        Just(u64::MAX - 31),
        Just(u64::MAX)
    ];
    let ty = prop_oneof![Just(0u32), Just(1), Just(8), Just(12), Just(30), 0..45u32];
    let info = (
        "[ab]{1,2}",
        proptest::collection::vec(dim, 0..6),
        ty,
        offset,
    );
    let strategy = (
        proptest::collection::vec(info, 0..5),
        proptest::collection::vec(any::<u8>(), 0..300),
        prop_oneof![
            Just(None),
            Just(Some(1u32)),
            Just(Some(3)),
            Just(Some(64)),
            Just(Some(0))
        ],
    );
    fuzz_runner(1000)
        .run(&strategy, |(infos, data, alignment)| {
            let mut b = b"GGUF".to_vec();
            b.extend(3u32.to_le_bytes());
            b.extend((infos.len() as u64).to_le_bytes());
            b.extend(u64::from(alignment.is_some()).to_le_bytes());
            if let Some(a) = alignment {
                let key = b"general.alignment";
                b.extend((key.len() as u64).to_le_bytes());
                b.extend(key);
                b.extend(4u32.to_le_bytes());
                b.extend(a.to_le_bytes());
            }
            for (name, dims, ty, offset) in &infos {
                b.extend((name.len() as u64).to_le_bytes());
                b.extend(name.as_bytes());
                b.extend((dims.len() as u32).to_le_bytes());
                for d in dims {
                    b.extend(d.to_le_bytes());
                }
                b.extend(ty.to_le_bytes());
                b.extend(offset.to_le_bytes());
            }
            let align = alignment.filter(|a| a.is_power_of_two()).unwrap_or(32) as usize;
            b.resize(b.len().next_multiple_of(align), 0);
            b.extend(data);
            check(&b)
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

fn prop_assert_ok(r: Result<(), GgufError>) {
    if let Err(e) = r {
        panic!("the unmutated file must parse: {e}");
    }
}

/// Hostile counts and lengths are refused by name before anything is
/// allocated, however large they claim to be.
#[test]
fn huge_counts_and_lengths_are_refused_by_name() {
    let header = |n_tensors: u64, n_kv: u64| {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(n_tensors.to_le_bytes());
        b.extend(n_kv.to_le_bytes());
        b
    };
    let message = |bytes: &[u8]| match parse(bytes) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    assert!(message(&header(0, u64::MAX)).contains("metadata entries"));
    assert!(message(&header(u64::MAX, 0)).contains("tensors"));
    // A key length of 2^62.
    let mut b = header(0, 1);
    b.extend((1u64 << 62).to_le_bytes());
    b.extend([0; 16]);
    assert!(message(&b).contains("metadata entry #0"));
    // An array of 2^60 u64s.
    let mut b = header(0, 1);
    b.extend(1u64.to_le_bytes());
    b.push(b'k');
    b.extend(9u32.to_le_bytes());
    b.extend(10u32.to_le_bytes());
    b.extend((1u64 << 60).to_le_bytes());
    assert!(message(&b).contains("array elements"));
}

/// Two tensors over the same bytes: refused, naming both, as llama.cpp's
/// reader refuses them (before issue 37 they were accepted).
#[test]
fn overlapping_tensor_data_is_refused_by_name() {
    let mut bytes = Builder::new()
        .tensor("first", &[8], GgmlType::F32, f32_bytes(&[0.0; 8]))
        .tensor("second", &[8], GgmlType::F32, f32_bytes(&[1.0; 8]))
        .build();
    // The second info's offset (32) is the file's last 8 bytes before the
    // padding to the data section; point it at 0, into the first tensor.
    let data = bytes.len() - 64;
    let at = (0..data)
        .rev()
        .find(|&i| bytes[i..i + 8] == 32u64.to_le_bytes())
        .unwrap_or_else(|| panic!("no offset 32 in the infos"));
    bytes[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    match parse(&bytes) {
        Ok(_) => panic!("overlapping tensors were accepted"),
        Err(e) => {
            let m = e.to_string();
            assert!(
                m.contains("'first'") && m.contains("'second'") && m.contains("overlaps"),
                "{m}"
            );
        }
    }
}
