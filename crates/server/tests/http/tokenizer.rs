//! A tiny Hugging Face tokenizer written to a temp dir: byte-level BPE
//! whose vocabulary is the 256 GPT-2 byte characters (token id = byte
//! value, no merges, so ids are predictable) plus ChatML's special tokens.

use std::path::Path;
use std::sync::Arc;

use ingot_tokenizer::Tokenizer;
use serde_json::{json, Value};

/// `<|im_start|>`.
pub const IM_START: u32 = 256;
/// `<|im_end|>`, the EOS token.
pub const IM_END: u32 = 257;
/// `<|endoftext|>`, the BOS token.
pub const ENDOFTEXT: u32 = 258;
/// Bytes plus the three special tokens.
pub const VOCAB_SIZE: usize = 259;

const CHATML: &str = r"{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// The ids of `text` (one per byte).
pub fn ids(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// The ids of a one-turn ChatML conversation, as the template renders it.
pub fn chat_ids(role: &str, content: &str) -> Vec<u32> {
    let mut out = vec![IM_START];
    out.extend(ids(&format!("{role}\n{content}")));
    out.push(IM_END);
    out.extend(ids("\n"));
    out.push(IM_START);
    out.extend(ids("assistant\n"));
    out
}

/// The tokenizer, with a ChatML template or without any.
pub fn load(chat_template: bool) -> Arc<Tokenizer> {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), chat_template);
    Arc::new(Tokenizer::from_hf_dir(dir.path()).unwrap())
}

fn write(dir: &Path, chat_template: bool) {
    let json = |name: &str, v: &Value| std::fs::write(dir.join(name), v.to_string()).unwrap();
    json("tokenizer.json", &tokenizer_json());
    let mut config = json!({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"});
    if chat_template {
        config["chat_template"] = CHATML.into();
    }
    json("tokenizer_config.json", &config);
}

fn tokenizer_json() -> Value {
    let vocab: serde_json::Map<String, Value> = byte_chars()
        .iter()
        .enumerate()
        .map(|(b, c)| (c.to_string(), json!(b)))
        .collect();
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                            "trim_offsets": true, "use_regex": true});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            special(IM_START, "<|im_start|>"),
            special(IM_END, "<|im_end|>"),
            special(ENDOFTEXT, "<|endoftext|>"),
        ],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []}
    })
}

/// GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the
/// rest are shifted past U+0100, so every byte is one visible character.
fn byte_chars() -> Vec<char> {
    let printable =
        |b: u32| (0x21..=0x7e).contains(&b) || ((0xa1..=0xff).contains(&b) && b != 0xad);
    let mut shifted = 0;
    (0..256u32)
        .map(|b| {
            let code = if printable(b) {
                b
            } else {
                shifted += 1;
                255 + shifted
            };
            char::from_u32(code).unwrap()
        })
        .collect()
}
