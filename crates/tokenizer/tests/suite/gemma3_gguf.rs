//! The Gemma 3 270M GGUF's embedded vocabulary (`tokenizer.ggml.model` =
//! "llama": SentencePiece-style BPE with byte fallback, `▁` for spaces, no
//! space prefix, BOS added) against Gemma 3's own `tokenizer.json` through
//! the Python `tokenizers` package: same ids with and without BOS, same
//! decoded text, same streaming.

use std::sync::Arc;

use ingot_models::gguf::GgufFile;
use ingot_tokenizer::Tokenizer;
use serde_json::json;

use crate::{common, python};

fn texts() -> Vec<&'static str> {
    let mut t = vec![
        "",
        " ",
        "  ",
        "Hello world",
        " Hello world",
        "   Hello\n\n  world  ",
        "\n\n\n",
        "\t\tindented\ttabs",
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
        "<bos>text after a written BOS",
        "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
        "3333333 3.14159 1e-5 1,000,000",
        "The quick brown fox jumps over the lazy dog.",
        "ÅÄÖ åäö ÆØ æø Ł ł Ő ő Ș ș",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕮𝖔𝖉𝖊 🜁🜂🜃 \u{1F9EA}\u{200D}",
        "control \u{0007} bell and \u{001B}[0m escape",
        "नमस्ते दुनिया • Привет, мир! • Γειά σου Κόσμε",
        "https://example.com/path?query=1&x=%20y#frag",
        "a\u{00A0}non-breaking\u{2009}thin\u{3000}ideographic space",
    ];
    t.extend_from_slice(common::STREAM_TEXTS);
    t
}

#[test]
fn gemma3_gguf_vocabulary_matches_tokenizer_json() {
    let gguf = common::fetch("fetch-gemma3-gguf");
    let file = GgufFile::open(&gguf).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&file).unwrap());
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(tok.bos_id(), Some(2));
    assert!(tok.special_tokens().add_bos);
    let dir = common::fetch("fetch-hf-tokenizers").join("gemma3");
    let texts = texts();
    let want = python::run(
        "hf_tokenize_reference.py",
        &json!({"dir": dir.to_str().unwrap(), "texts": texts}),
    );
    for (i, text) in texts.iter().enumerate() {
        let with: Vec<u32> = serde_json::from_value(want["with"][i].clone()).unwrap();
        let without: Vec<u32> = serde_json::from_value(want["without"][i].clone()).unwrap();
        assert_eq!(tok.encode(text, true).unwrap(), with, "{text:?} (with BOS)");
        assert_eq!(tok.encode(text, false).unwrap(), without, "{text:?}");
        assert_eq!(
            tok.decode(&without, true).unwrap(),
            want["decoded"][i].as_str().unwrap(),
            "decode {text:?}"
        );
        common::check_streaming(&tok, &without, true).unwrap_or_else(|e| panic!("{e}"));
    }
}
