//! The default test model's tokenizer: SmolLM2-135M-Instruct's GGUF
//! vocabulary (byte-level BPE, pre-tokenizer `smollm`) and its ChatML
//! template, which inserts a default system prompt.

use std::sync::Arc;

use ingot_models::gguf::GgufFile;
use ingot_tokenizer::{ChatMessage, ChatTemplate, IncrementalDecoder, Tokenizer};

use crate::common;

fn load() -> Arc<Tokenizer> {
    let path = common::fetch("fetch-test-model");
    let file = GgufFile::open(&path).unwrap();
    Arc::new(Tokenizer::from_gguf(&file).unwrap())
}

#[test]
fn vocabulary_and_special_tokens() {
    let tok = load();
    assert_eq!(tok.kind(), "gpt2 BPE (pre: smollm)");
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_ids()[0], 2, "<|im_end|> first: {:?}", tok.eos_ids());
    assert!(
        tok.eos_ids().contains(&0),
        "<|endoftext|> stops too: {:?}",
        tok.eos_ids()
    );
    let special = tok.special_tokens();
    assert!(!special.add_bos, "SmolLM2 GGUF sets add_bos_token=false");
    assert_eq!(
        special.eos.as_ref().map(|t| t.text.as_str()),
        Some("<|im_end|>")
    );
    let ids = tok.encode("Hello world", true).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), "Hello world");
    assert_ne!(ids.first(), Some(&1));
}

#[test]
fn template_inserts_the_default_system_prompt() {
    let tok = load();
    let template = ChatTemplate::for_tokenizer(&tok)
        .unwrap()
        .expect("template");
    let prompt = template
        .render(&[ChatMessage::new("user", "Hello!")], true, None)
        .unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    );
    let with_system = template
        .render(
            &[
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Hi"),
            ],
            false,
            None,
        )
        .unwrap();
    assert_eq!(
        with_system,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
    // The rendered prompt's special tokens become single ids.
    let ids = tok.encode(&prompt, false).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2);
    assert_eq!(tok.decode(&ids, false).unwrap(), prompt);
    assert_eq!(
        tok.decode(&ids, true).unwrap(),
        "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\n\
         user\nHello!\nassistant\n"
    );
}

#[test]
fn streaming_decode() {
    let tok = load();
    for text in common::STREAM_TEXTS {
        let ids = tok.encode(text, false).unwrap();
        common::check_streaming(&tok, &ids, true).unwrap();
    }
    // Continuing a prompt keeps the first token's leading space.
    let prompt = tok.encode("The answer is", false).unwrap();
    let answer = tok.encode(" forty-two 🦙", false).unwrap();
    let mut dec = IncrementalDecoder::with_prompt(tok.clone(), &prompt, true);
    let mut out = String::new();
    for &id in &answer {
        out.extend(dec.step(id).unwrap());
    }
    out.extend(dec.finish().unwrap());
    assert_eq!(out, " forty-two 🦙");
}
