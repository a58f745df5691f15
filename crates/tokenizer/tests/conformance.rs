//! llama.cpp's tokenizer conformance suite against our GGUF tokenizers.
//!
//! The vocab-only GGUFs `ggml-vocab-*.gguf` come with `.gguf.inp` (test
//! strings separated by `"\n__ggml_vocab_test__\n"`) and `.gguf.out` (one
//! line of ids per string). llama.cpp's `tests/test-tokenizer-0.cpp`
//! tokenizes with `add_special = false` and `parse_special = false`: no BOS,
//! and control tokens written in the text are not matched (none of the
//! strings contains one). They are fetched with
//! `scripts/fetch-llama-cpp-sdist`.
//!
//! Out of scope: `bert-bge` (WordPiece, tokenizer model `bert`) and
//! `gemma-4` (model `gemma4`, SentencePiece-style BPE over raw UTF-8); both
//! must be refused with an error naming the model.

// Helpers outside #[test] fns unwrap too: this is a test binary.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ingot_models::gguf::GgufFile;
use ingot_tokenizer::{IncrementalDecoder, Tokenizer, TokenizerError};

fn vocab_path(name: &str) -> PathBuf {
    common::fetch("fetch-llama-cpp-sdist").join(format!("ggml-vocab-{name}.gguf"))
}

/// The (input, expected ids) pairs, parsed as test-tokenizer-0.cpp does.
fn read_cases(gguf: &Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(gguf.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(sep) {
            Some(next) => {
                inputs.push(inp[pos..pos + next].to_owned());
                pos += next + sep.len();
            }
            None => {
                inputs.push(inp[pos..].to_owned());
                break;
            }
        }
    }
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(inputs.len(), outputs.len(), "{}", gguf.display());
    inputs.into_iter().zip(outputs).collect()
}

fn load(name: &str) -> Tokenizer {
    let file = GgufFile::open(&vocab_path(name)).unwrap();
    Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every case tokenizes to llama.cpp's ids, and streaming detokenization of
/// those ids matches the full decode.
fn conformance(name: &str) {
    let tok = Arc::new(load(name));
    let cases = read_cases(&vocab_path(name));
    let mut failures = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode(text, false).unwrap();
        if &got != want {
            failures.push(format!("  {text:?}\n    want {want:?}\n    got  {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name} ({}): {} of {} cases differ from llama.cpp:\n{}",
        tok.kind(),
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    for text in cases
        .iter()
        .map(|(t, _)| t.as_str())
        .chain(common::STREAM_TEXTS.iter().copied())
    {
        let ids = tok.encode(text, false).unwrap();
        common::check_streaming(&tok, &ids, true).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn llama_spm() {
    conformance("llama-spm");
}

#[test]
fn phi_3() {
    conformance("phi-3");
}

#[test]
fn llama_bpe() {
    conformance("llama-bpe");
}

#[test]
fn qwen2() {
    conformance("qwen2");
}

#[test]
fn qwen35() {
    conformance("qwen35");
}

#[test]
fn gpt_2() {
    conformance("gpt-2");
}

#[test]
fn mpt() {
    conformance("mpt");
}

#[test]
fn starcoder() {
    conformance("starcoder");
}

#[test]
fn refact() {
    conformance("refact");
}

#[test]
fn command_r() {
    conformance("command-r");
}

#[test]
fn falcon() {
    conformance("falcon");
}

#[test]
fn deepseek_llm() {
    conformance("deepseek-llm");
}

#[test]
fn deepseek_coder() {
    conformance("deepseek-coder");
}

#[test]
fn unsupported_models_are_named() {
    for (name, model) in [
        ("bert-bge", "bert"),
        ("gemma-4", "gemma4"),
        ("nomic-bert-moe", "t5"),
    ] {
        let file = GgufFile::open(&vocab_path(name)).unwrap();
        match Tokenizer::from_gguf(&file) {
            Err(e @ TokenizerError::UnsupportedModel { .. }) => {
                assert!(e.to_string().contains(&format!("'{model}'")), "{e}")
            }
            other => panic!("{name}: expected UnsupportedModel, got {other:?}"),
        }
    }
}

#[test]
fn special_tokens_and_bos() {
    let spm = load("llama-spm");
    assert_eq!(spm.kind(), "llama SPM");
    assert_eq!(spm.bos_id(), Some(1));
    assert_eq!(spm.eos_ids(), [2]);
    assert_eq!(spm.encode("Hello world", true).unwrap(), [1, 15043, 3186]);
    assert_eq!(spm.decode(&[1, 15043, 3186], true).unwrap(), "Hello world");
    assert!(spm.is_special(1) && !spm.is_special(15043));

    let l3 = load("llama-bpe");
    assert_eq!(l3.kind(), "gpt2 BPE (pre: llama-bpe)");
    assert_eq!(
        l3.encode("Hello world", true).unwrap(),
        [128000, 9906, 1917]
    );
    // <|end_of_text|> and <|eot_id|> both end generation.
    let eos = l3.eos_ids();
    for id in [128001, 128009] {
        assert!(eos.contains(&id), "{id} not in {eos:?}");
    }
    assert_eq!(l3.vocab_size(), 128256);
    // Special tokens written in the text are parsed (HF semantics).
    assert_eq!(
        l3.encode("<|start_header_id|>user<|end_header_id|>", false)
            .unwrap(),
        [128006, 882, 128007]
    );

    let q = load("qwen2");
    assert_eq!(
        q.encode("Hello", true).unwrap(),
        [9707],
        "qwen2 adds no BOS"
    );
    let phi = load("phi-3");
    assert!(
        phi.eos_ids().contains(&32007),
        "<|end|> stops phi-3: {:?}",
        phi.eos_ids()
    );
}

/// SentencePiece's `▁`: the first token of a text loses its space (as in the
/// full decode), a continuation of a prompt keeps it; byte-fallback pieces
/// of an emoji are held back until the character is complete.
#[test]
fn spm_streaming_spaces_and_bytes() {
    let tok = Arc::new(load("llama-spm"));
    let ids = tok.encode("Hello 🦙 world", false).unwrap();
    let stream = |mut dec: IncrementalDecoder| -> Vec<String> {
        let mut chunks: Vec<String> = ids.iter().filter_map(|&id| dec.step(id).unwrap()).collect();
        chunks.extend(dec.finish().unwrap());
        chunks
    };
    let fresh = stream(IncrementalDecoder::new(tok.clone(), true));
    assert_eq!(fresh, ["Hello", " ", "🦙", " world"]);
    let prompt = tok.encode("Say:", true).unwrap();
    let continued = stream(IncrementalDecoder::with_prompt(tok.clone(), &prompt, true));
    assert_eq!(continued.concat(), " Hello 🦙 world");
}
