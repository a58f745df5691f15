//! Loading a tokenizer from a Hugging Face model directory.
//!
//! - `tokenizer.json`: the whole pipeline, loaded by `tokenizers`.
//! - `tokenizer_config.json`: `chat_template` (a string, or a list of
//!   `{name, template}` of which we take `default`), `bos_token`/`eos_token`
//!   (a string or an `AddedToken` object with `content`), and
//!   `add_bos_token`/`add_eos_token`, which, when present, decide whether
//!   BOS/EOS are added, as transformers' `update_post_processor` does.
//!   A template may also live in `chat_template.jinja` or
//!   `chat_template.json` (newer transformers).
//! - `generation_config.json` (optional): `eos_token_id`, an int or a list,
//!   adds stop ids.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::models::ModelWrapper;
use tokenizers::DecoderWrapper;

use crate::tokenizer::{post_processor, TokenInfo, TokenizerParts, EOG_TEXTS};
use crate::{Tokenizer, TokenizerError};

pub(crate) fn from_hf_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
    let tokenizer_json = dir.join("tokenizer.json");
    if !tokenizer_json.is_file() {
        return Err(TokenizerError::Io {
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            path: tokenizer_json,
        });
    }
    let mut inner = tokenizers::Tokenizer::from_file(&tokenizer_json).map_err(|e| {
        TokenizerError::InvalidFile {
            path: tokenizer_json.clone(),
            message: e.to_string(),
        }
    })?;
    let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
    let generation = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);

    let token = |key: &str| -> Option<TokenInfo> {
        let text = match config.get(key)? {
            Value::String(s) => s.clone(),
            Value::Object(o) => o.get("content")?.as_str()?.to_owned(),
            _ => return None,
        };
        let id = inner.token_to_id(&text)?;
        Some(TokenInfo { id, text })
    };
    let (bos, eos, unk, pad) = (
        token("bos_token"),
        token("eos_token"),
        token("unk_token"),
        token("pad_token"),
    );

    let (mut add_bos, mut add_eos) = probe_bos_eos(&inner, bos.as_ref(), eos.as_ref());
    let want_bos = config.get("add_bos_token").and_then(Value::as_bool);
    let want_eos = config.get("add_eos_token").and_then(Value::as_bool);
    if want_bos.is_some_and(|w| w != add_bos) || want_eos.is_some_and(|w| w != add_eos) {
        add_bos = want_bos.unwrap_or(add_bos) && bos.is_some();
        add_eos = want_eos.unwrap_or(add_eos) && eos.is_some();
        let pp = post_processor(
            if add_bos { bos.as_ref() } else { None },
            if add_eos { eos.as_ref() } else { None },
        )?;
        inner.with_post_processor(pp);
    }

    let mut stop_ids: Vec<u32> = eos.iter().map(|t| t.id).collect();
    match generation.get("eos_token_id") {
        Some(Value::Number(n)) => stop_ids.extend(n.as_u64().and_then(|n| u32::try_from(n).ok())),
        Some(Value::Array(a)) => stop_ids.extend(
            a.iter()
                .filter_map(Value::as_u64)
                .filter_map(|n| u32::try_from(n).ok()),
        ),
        _ => {}
    }
    let mut specials: Vec<(u32, String)> = inner
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special && EOG_TEXTS.contains(&t.content.as_str()))
        .map(|(id, t)| (id, t.content))
        .collect();
    specials.sort();
    stop_ids.extend(specials.into_iter().map(|(id, _)| id));
    let mut seen = std::collections::HashSet::new();
    stop_ids.retain(|id| seen.insert(*id));

    let (chat_template, named_templates) = chat_templates(dir, &config)?;
    let kind = describe(&inner);
    Tokenizer::from_parts(TokenizerParts {
        inner,
        kind,
        bos,
        eos,
        unk,
        pad,
        stop_ids,
        add_bos,
        add_eos,
        chat_template,
        named_templates,
    })
}

/// Reads a JSON file; `Ok(None)` when it does not exist.
fn read_json(path: &Path) -> Result<Option<Value>, TokenizerError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TokenizerError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TokenizerError::InvalidFile {
            path: path.to_owned(),
            message: e.to_string(),
        })
}

/// Whether the loaded pipeline adds BOS / EOS, found by encoding a probe.
fn probe_bos_eos(
    inner: &tokenizers::Tokenizer,
    bos: Option<&TokenInfo>,
    eos: Option<&TokenInfo>,
) -> (bool, bool) {
    let ids = |special: bool| -> Vec<u32> {
        inner
            .encode_fast("a", special)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    };
    let (with, without) = (ids(true), ids(false));
    let added = with.len() > without.len();
    let first = added && bos.is_some_and(|b| with.first() == Some(&b.id));
    let last = added && eos.is_some_and(|e| with.last() == Some(&e.id));
    (first, last)
}

/// The default template and the named ones.
fn chat_templates(
    dir: &Path,
    config: &Value,
) -> Result<(Option<String>, BTreeMap<String, String>), TokenizerError> {
    let mut named = BTreeMap::new();
    let mut default = None;
    match config.get("chat_template") {
        Some(Value::String(s)) => default = Some(s.clone()),
        Some(Value::Array(list)) => {
            for item in list {
                let name = item.get("name").and_then(Value::as_str);
                let template = item.get("template").and_then(Value::as_str);
                if let (Some(name), Some(template)) = (name, template) {
                    named.insert(name.to_owned(), template.to_owned());
                }
            }
            default = named.get("default").cloned();
        }
        _ => {}
    }
    if default.is_none() {
        let jinja: PathBuf = dir.join("chat_template.jinja");
        match std::fs::read_to_string(&jinja) {
            Ok(t) => default = Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(TokenizerError::Io {
                    path: jinja,
                    source,
                })
            }
        }
    }
    if default.is_none() {
        if let Some(v) = read_json(&dir.join("chat_template.json"))? {
            default = v
                .get("chat_template")
                .and_then(Value::as_str)
                .map(str::to_owned);
        }
    }
    Ok((default, named))
}

/// E.g. `tokenizer.json: BPE (byte-level)`.
fn describe(inner: &tokenizers::Tokenizer) -> String {
    let byte_level = matches!(inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
    let model = match inner.get_model() {
        ModelWrapper::BPE(b) if b.byte_fallback => "BPE (byte fallback)",
        ModelWrapper::BPE(_) if byte_level => "BPE (byte-level)",
        ModelWrapper::BPE(_) => "BPE",
        ModelWrapper::WordPiece(_) => "WordPiece",
        ModelWrapper::Unigram(_) => "Unigram",
        ModelWrapper::WordLevel(_) => "WordLevel",
    };
    format!("tokenizer.json: {model}")
}

#[cfg(test)]
mod tests {
    use tokenizers::models::bpe::BPE;
    use tokenizers::AddedToken;

    use super::*;

    /// A throwaway model directory with a tiny tokenizer.json.
    fn model_dir(config: &str, generation: Option<&str>) -> PathBuf {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ingot-hf-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let vocab: tokenizers::models::bpe::Vocab = [
            ("<s>", 0),
            ("</s>", 1),
            ("a", 2),
            ("b", 3),
            ("<|eot_id|>", 4),
        ]
        .into_iter()
        .map(|(t, i)| (t.to_owned(), i))
        .collect();
        let model = BPE::builder()
            .vocab_and_merges(vocab, vec![])
            .build()
            .unwrap();
        let mut tk = tokenizers::Tokenizer::new(model);
        tk.add_special_tokens(["<s>", "</s>", "<|eot_id|>"].map(|t| AddedToken::from(t, true)))
            .unwrap();
        tk.save(dir.join("tokenizer.json"), false).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), config).unwrap();
        if let Some(g) = generation {
            std::fs::write(dir.join("generation_config.json"), g).unwrap();
        }
        dir
    }

    #[test]
    fn config_forms() {
        let dir = model_dir(
            r#"{"bos_token": {"content": "<s>", "lstrip": false, "__type": "AddedToken"},
                "eos_token": "</s>", "add_bos_token": true,
                "chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]}"#,
            Some(r#"{"eos_token_id": [1, 3]}"#),
        );
        let tok = Tokenizer::from_hf_dir(&dir).unwrap();
        assert_eq!(tok.bos_id(), Some(0));
        assert_eq!(tok.encode("ab", true).unwrap(), [0, 2, 3]);
        assert_eq!(tok.encode("ab", false).unwrap(), [2, 3]);
        assert_eq!(tok.eos_ids(), [1, 3, 4]);
        assert_eq!(tok.chat_template(), Some("D"));
        assert_eq!(tok.named_chat_template("tool_use"), Some("T"));
        assert!(tok.special_tokens().add_bos && !tok.special_tokens().add_eos);
        assert_eq!(tok.kind(), "tokenizer.json: BPE");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn template_file_and_single_eos_id() {
        let dir = model_dir(
            r#"{"eos_token": "</s>", "add_eos_token": true}"#,
            Some(r#"{"eos_token_id": 4}"#),
        );
        std::fs::write(dir.join("chat_template.jinja"), "J").unwrap();
        let tok = Tokenizer::from_hf_dir(&dir).unwrap();
        assert_eq!(tok.bos_id(), None);
        assert_eq!(tok.encode("a", true).unwrap(), [2, 1]);
        assert_eq!(tok.eos_ids(), [1, 4]);
        assert_eq!(tok.chat_template(), Some("J"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn missing_and_broken_files() {
        let missing = std::env::temp_dir().join("ingot-hf-test-does-not-exist");
        let err = Tokenizer::from_hf_dir(&missing).unwrap_err();
        assert!(err.to_string().contains("tokenizer.json"), "{err}");
        let dir = model_dir("{not json", None);
        let err = Tokenizer::from_hf_dir(&dir).unwrap_err();
        assert!(matches!(err, TokenizerError::InvalidFile { .. }), "{err}");
        assert!(err.to_string().contains("tokenizer_config.json"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
