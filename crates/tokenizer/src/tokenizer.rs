//! [`Tokenizer`]: text ↔ token ids for one model, plus what the engine needs
//! to know about its special tokens and chat template.
//!
//! A thin wrapper over Hugging Face `tokenizers`, loaded either from a HF
//! model directory ([`Tokenizer::from_hf_dir`], see [`crate::hf`]) or from the
//! vocabulary embedded in a GGUF file ([`Tokenizer::from_gguf`], see
//! [`crate::gguf`]). Every method takes `&self` and the type is `Send + Sync`,
//! so one instance (in an `Arc`) serves all request threads.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use ingot_core::TokenId;
use ingot_models::gguf::GgufFile;
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::processors::PostProcessorWrapper;

use crate::TokenizerError;

/// One token: its id and its text as stored in the vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    /// The id.
    pub id: TokenId,
    /// The vocabulary entry (byte-level or `▁` form, not decoded text).
    pub text: String,
}

/// The special tokens of a tokenizer, for `ingot inspect` and for callers
/// that want them in one place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning of sequence.
    pub bos: Option<TokenInfo>,
    /// End of sequence as the tokenizer declares it.
    pub eos: Option<TokenInfo>,
    /// Unknown token.
    pub unk: Option<TokenInfo>,
    /// Padding token.
    pub pad: Option<TokenInfo>,
    /// Every token that ends generation (EOS, end-of-turn, ...), see
    /// [`Tokenizer::eos_ids`].
    pub stop: Vec<TokenInfo>,
    /// Whether `encode(.., true)` prepends BOS.
    pub add_bos: bool,
    /// Whether `encode(.., true)` appends EOS.
    pub add_eos: bool,
    /// How many tokens are special (skipped by `decode(.., true)`).
    pub n_special: usize,
}

/// Everything a loader hands to [`Tokenizer::from_parts`].
pub(crate) struct TokenizerParts {
    pub inner: tokenizers::Tokenizer,
    pub kind: String,
    pub bos: Option<TokenInfo>,
    pub eos: Option<TokenInfo>,
    pub unk: Option<TokenInfo>,
    pub pad: Option<TokenInfo>,
    pub stop_ids: Vec<TokenId>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub chat_template: Option<String>,
    pub named_templates: BTreeMap<String, String>,
}

/// A model's tokenizer. Cheap to share: wrap it in an `Arc`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    kind: String,
    special: SpecialTokens,
    stop_ids: Vec<TokenId>,
    special_ids: HashSet<TokenId>,
    vocab_size: usize,
    chat_template: Option<String>,
    named_templates: BTreeMap<String, String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.special.bos)
            .field("stop_ids", &self.stop_ids)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json`, `tokenizer_config.json` (chat template, BOS/EOS,
    /// `add_bos_token`/`add_eos_token`) and, when present,
    /// `generation_config.json` (extra EOS ids) from a Hugging Face model
    /// directory.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        crate::hf::from_hf_dir(dir)
    }

    /// Builds the tokenizer embedded in a GGUF file's `tokenizer.ggml.*`
    /// metadata. It reproduces llama.cpp's tokenization of `gpt2` (byte-level
    /// BPE) and `llama` (SentencePiece BPE) vocabularies; other tokenizer
    /// models are refused with [`TokenizerError::UnsupportedModel`].
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        crate::gguf::from_gguf(file)
    }

    pub(crate) fn from_parts(p: TokenizerParts) -> Result<Tokenizer, TokenizerError> {
        let added = p.inner.get_added_tokens_decoder();
        let special_ids: HashSet<TokenId> = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| *id)
            .collect();
        let vocab_size = p
            .inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&m| m as usize + 1);
        let stop = p
            .stop_ids
            .iter()
            .filter_map(|&id| {
                Some(TokenInfo {
                    id,
                    text: p.inner.id_to_token(id)?,
                })
            })
            .collect();
        Ok(Tokenizer {
            special: SpecialTokens {
                bos: p.bos,
                eos: p.eos,
                unk: p.unk,
                pad: p.pad,
                stop,
                add_bos: p.add_bos,
                add_eos: p.add_eos,
                n_special: special_ids.len(),
            },
            inner: p.inner,
            kind: p.kind,
            stop_ids: p.stop_ids,
            special_ids,
            vocab_size,
            chat_template: p.chat_template,
            named_templates: p.named_templates,
        })
    }

    /// Token ids for `text`. Special tokens written in the text (e.g.
    /// `<|im_start|>` in a rendered chat template) become their ids, as in
    /// Hugging Face. `add_special_tokens` adds BOS/EOS as the tokenizer is
    /// configured to ([`SpecialTokens::add_bos`]).
    pub fn encode(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<TokenId>, TokenizerError> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizerError::backend("encode", e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text for `ids`; `skip_special_tokens` leaves out special tokens.
    /// Incomplete UTF-8 (a cut multi-byte character) decodes to U+FFFD; use
    /// [`crate::IncrementalDecoder`] for streaming.
    pub fn decode(
        &self,
        ids: &[TokenId],
        skip_special_tokens: bool,
    ) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::backend("decode", e))
    }

    /// The BOS id, if the tokenizer has one.
    pub fn bos_id(&self) -> Option<TokenId> {
        self.special.bos.as_ref().map(|t| t.id)
    }

    /// Every id that ends generation: EOS, plus end-of-turn/end-of-message
    /// tokens (`<|eot_id|>`, `<|im_end|>`, `<end_of_turn>`, ...) and, for HF
    /// directories, `generation_config.json`'s `eos_token_id`s.
    pub fn eos_ids(&self) -> &[TokenId] {
        &self.stop_ids
    }

    /// One past the largest id (model vocabulary plus added tokens).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The id of a vocabulary entry or added token.
    pub fn token_to_id(&self, token: &str) -> Option<TokenId> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary entry of an id (not decoded: byte-level or `▁` form).
    pub fn id_to_token(&self, id: TokenId) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether `id` is a special token (skipped by `decode(.., true)`).
    pub fn is_special(&self, id: TokenId) -> bool {
        self.special_ids.contains(&id)
    }

    /// The default chat template (Jinja source), if the model ships one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// This tokenizer with `source` as its only chat template (the
    /// operator's `--chat-template`): the model's default and named ones
    /// are dropped, so requests with tools use it too.
    pub fn with_chat_template(mut self, source: String) -> Self {
        self.chat_template = Some(source);
        self.named_templates.clear();
        self
    }

    /// A named chat template (e.g. `tool_use`, `rag`), if the model ships one.
    pub fn named_chat_template(&self, name: &str) -> Option<&str> {
        self.named_templates.get(name).map(String::as_str)
    }

    /// What kind of tokenizer this is, e.g. `gpt2 BPE (pre: smollm)`,
    /// `llama SPM` or `tokenizer.json: BPE (byte-level)`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The special tokens, for display.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// The underlying Hugging Face tokenizer.
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Token texts that llama.cpp treats as end-of-generation
/// (`special_eog_ids` in `llama_vocab::impl::load`).
pub(crate) const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<｜end▁of▁sentence｜>",
    "</s>",
];

/// A post-processor that adds `bos` before and `eos` after each sequence
/// (`None`: neither is added), like transformers' `update_post_processor`.
pub(crate) fn post_processor(
    bos: Option<&TokenInfo>,
    eos: Option<&TokenInfo>,
) -> Result<Option<PostProcessorWrapper>, TokenizerError> {
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    // Template pieces are named "bos"/"eos" rather than by token text, which
    // may contain the ':' that the template syntax splits on.
    let piece = |name: &str, seq: u32| vec![format!("{name}:{seq}")];
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = Vec::new();
    for (seq, name) in [(0, "$A"), (1, "$B")] {
        let part = if seq == 0 { &mut single } else { &mut pair };
        if bos.is_some() {
            part.extend(piece("bos", seq));
        }
        part.push(format!("{name}:{seq}"));
        if eos.is_some() {
            part.extend(piece("eos", seq));
        }
    }
    let pair = [single.clone(), pair].concat();
    for (name, t) in [("bos", bos), ("eos", eos)] {
        if let Some(t) = t {
            let st = SpecialToken::new(name.to_owned(), vec![t.id], vec![t.text.clone()])
                .map_err(|e| TokenizerError::backend("build", e))?;
            specials.push(st);
        }
    }
    let tp = TemplateProcessing::builder()
        .try_single(single)
        .and_then(|b| b.try_pair(pair))
        .map_err(|e| TokenizerError::backend("build", e))?
        .special_tokens(specials)
        .build()
        .map_err(|e| TokenizerError::backend("build", e))?;
    Ok(Some(tp.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
        assert_send_sync::<crate::ChatTemplate>();
        assert_send_sync::<crate::IncrementalDecoder>();
    }

    #[test]
    fn post_processor_names_pieces_not_texts() {
        // A token text with ':' would break a text-based template.
        let bos = TokenInfo {
            id: 7,
            text: "<sentinel:0>".into(),
        };
        assert!(post_processor(Some(&bos), None).unwrap().is_some());
        assert!(post_processor(None, None).unwrap().is_none());
    }
}
