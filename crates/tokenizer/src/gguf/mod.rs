//! GGUF vocabulary (`tokenizer.ggml.*`) → an equivalent Hugging Face
//! `tokenizers` pipeline.
//!
//! The target is llama.cpp's own tokenization (`src/llama-vocab.cpp`), checked
//! id-for-id against its conformance suite (`tests/conformance.rs`):
//!
//! - `gpt2` (byte-level BPE): the GGUF merges, the pre-tokenizer regexes that
//!   llama.cpp picks for `tokenizer.ggml.pre` ([`pre`]), then GPT-2's byte→char
//!   map. Llama-3-style vocabularies emit whole words found in the vocabulary
//!   without merging (`ignore_merges`).
//! - `llama` (SentencePiece BPE): spaces become `▁` (plus one in front when
//!   `add_space_prefix`), then llama.cpp's `llm_tokenizer_spm` repeatedly
//!   merges the adjacent pair whose concatenation is the token with the highest
//!   score, leftmost first. A BPE model whose merges are every split of every
//!   token, ranked by that token's score, does the same (the approach of
//!   transformers' GGUF converter). Characters with no token fall back to
//!   `<0xXX>` byte tokens.
//!
//! In both, control tokens become special added tokens and user-defined ones
//! non-special added tokens, both matched verbatim in the input before the
//! model runs, like llama.cpp's `tokenizer_st_partition`.

mod pre;

use std::collections::{BTreeMap, HashMap, HashSet};

use ingot_models::gguf::GgufFile;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as NormSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::tokenizer::{post_processor, TokenInfo, TokenizerParts, EOG_TEXTS};
use crate::{Tokenizer, TokenizerError};

/// llama.cpp's `LLAMA_TOKEN_TYPE_*` (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_i64(t: i64) -> TokenType {
        match t {
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            // 0 (undefined), 1 (normal) and anything newer.
            _ => TokenType::Normal,
        }
    }
}

/// FIM tokens that llama.cpp also stops on (`<|fim_pad|>`, repo and file
/// separators), so that code models do not run on into the next file.
const FIM_EOG_TEXTS: &[&str] = &[
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

/// The `tokenizer.*` metadata of a GGUF file, read once.
struct GgufVocab {
    model: String,
    pre: Option<String>,
    tokens: Vec<String>,
    types: Vec<TokenType>,
    scores: Option<Vec<f32>>,
    merges: Option<Vec<String>>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    stop_keys: Vec<u32>,
    add_bos: Option<bool>,
    add_eos: Option<bool>,
    add_space_prefix: Option<bool>,
    chat_template: Option<String>,
    named_templates: BTreeMap<String, String>,
}

const KEY_TOKENS: &str = "tokenizer.ggml.tokens";

impl GgufVocab {
    fn read(file: &GgufFile) -> Result<GgufVocab, TokenizerError> {
        let model = file
            .get_str("tokenizer.ggml.model")
            .ok_or_else(|| TokenizerError::MissingMetadata {
                key: "tokenizer.ggml.model".into(),
            })?
            .to_owned();
        let raw_tokens =
            file.get_str_array(KEY_TOKENS)
                .ok_or_else(|| TokenizerError::MissingMetadata {
                    key: KEY_TOKENS.into(),
                })?;
        // llama.cpp renames empty tokens so that every text maps to one id.
        let tokens: Vec<String> = raw_tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if t.is_empty() {
                    format!("[EMPTY_{i}]")
                } else {
                    (*t).to_owned()
                }
            })
            .collect();
        let n = tokens.len();
        let mut types: Vec<TokenType> = match file.get_i64_array("tokenizer.ggml.token_type") {
            Some(t) if t.len() >= n => t[..n].iter().map(|&t| TokenType::from_i64(t)).collect(),
            Some(t) => {
                return Err(TokenizerError::InvalidMetadata {
                    key: "tokenizer.ggml.token_type".into(),
                    message: format!("{} entries for {n} tokens", t.len()),
                })
            }
            None => vec![TokenType::Normal; n],
        };
        // llama.cpp marks end-of-generation tokens as control whatever the
        // file says, so plain-text input never produces them.
        // (Except `</s>` where it is ordinary text, see `plain_s`.)
        let plain_s = plain_s(&tokens);
        for (t, ty) in tokens.iter().zip(types.iter_mut()) {
            let eog = EOG_TEXTS.contains(&t.as_str()) && !(plain_s && t == "</s>");
            if eog && matches!(ty, TokenType::Normal | TokenType::UserDefined) {
                *ty = TokenType::Control;
            }
        }
        let scores = match file.get_f32_array("tokenizer.ggml.scores") {
            Some(s) if s.len() < n => {
                return Err(TokenizerError::InvalidMetadata {
                    key: "tokenizer.ggml.scores".into(),
                    message: format!("{} entries for {n} tokens", s.len()),
                })
            }
            other => other,
        };
        let merges = file
            .get_str_array("tokenizer.ggml.merges")
            .map(|m| m.into_iter().map(str::to_owned).collect());
        let id = |name: &str| -> Option<u32> {
            let key = format!("tokenizer.ggml.{name}");
            let v = file.get_u64(&key)?;
            match u32::try_from(v) {
                Ok(v) if (v as usize) < n => Some(v),
                _ => {
                    tracing::warn!(
                        key,
                        id = v,
                        vocab = n,
                        "special token id out of range; ignored"
                    );
                    None
                }
            }
        };
        // llama.cpp's per-model defaults, kept only where they name a
        // control token (its gpt2 default of 11 is Falcon's <|endoftext|>).
        let default = |i: u32| -> Option<u32> {
            (types.get(i as usize) == Some(&TokenType::Control)).then_some(i)
        };
        let (bos_d, eos_d, unk_d) = match model.as_str() {
            "llama" => (
                default(1),
                default(2),
                Some(0).filter(|&i| (i as usize) < n),
            ),
            "gpt2" => (default(11), default(11), None),
            _ => (None, None, None),
        };
        let stop_keys = [
            "eot_token_id",
            "eom_token_id",
            "fim_pad_token_id",
            "fim_rep_token_id",
            "fim_sep_token_id",
        ]
        .iter()
        .filter_map(|k| id(k))
        .collect();
        let mut named_templates = BTreeMap::new();
        if let Some(names) = file.get_str_array("tokenizer.chat_templates") {
            for name in names {
                if let Some(t) = file.get_str(&format!("tokenizer.chat_template.{name}")) {
                    named_templates.insert(name.to_owned(), t.to_owned());
                }
            }
        }
        Ok(GgufVocab {
            pre: file.get_str("tokenizer.ggml.pre").map(str::to_owned),
            scores,
            merges,
            bos: id("bos_token_id").or(bos_d),
            eos: id("eos_token_id").or(eos_d),
            unk: id("unknown_token_id").or(unk_d),
            pad: id("padding_token_id"),
            stop_keys,
            add_bos: file.get_bool("tokenizer.ggml.add_bos_token"),
            add_eos: file.get_bool("tokenizer.ggml.add_eos_token"),
            add_space_prefix: file.get_bool("tokenizer.ggml.add_space_prefix"),
            chat_template: file.get_str("tokenizer.chat_template").map(str::to_owned),
            named_templates,
            model,
            tokens,
            types,
        })
    }

    fn info(&self, id: Option<u32>) -> Option<TokenInfo> {
        let id = id?;
        Some(TokenInfo {
            id,
            text: self.tokens.get(id as usize)?.clone(),
        })
    }

    /// The vocabulary as the BPE model wants it.
    fn vocab(&self) -> Vocab {
        self.tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect()
    }

    /// Control, unknown and user-defined tokens, matched in the raw input
    /// before the model runs. Only user-defined ones are non-special.
    fn added_tokens(&self) -> Vec<AddedToken> {
        self.tokens
            .iter()
            .zip(&self.types)
            .filter_map(|(text, ty)| match ty {
                TokenType::Control | TokenType::Unknown => {
                    Some(AddedToken::from(text.clone(), true).normalized(false))
                }
                TokenType::UserDefined => {
                    Some(AddedToken::from(text.clone(), false).normalized(false))
                }
                _ => None,
            })
            .collect()
    }

    /// All ids that end generation: EOS, EOT/EOM/FIM keys, and tokens whose
    /// text llama.cpp recognises as end-of-generation.
    fn stop_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .eos
            .into_iter()
            .chain(self.stop_keys.iter().copied())
            .collect();
        let has = |text: &str| self.tokens.iter().any(|t| t == text);
        // llama.cpp's two exceptions: in harmony-style vocabularies `<|end|>`
        // ends a message, not the turn; gemma4/plamo use `</s>` as text.
        let harmony = has("<|return|>") && has("<|call|>") || has("<|calls|>") && has("<|flush|>");
        let plain_s = plain_s(&self.tokens);
        for (i, t) in self.tokens.iter().enumerate() {
            let t = t.as_str();
            if (t == "<|end|>" && harmony) || (t == "</s>" && plain_s) {
                continue;
            }
            if EOG_TEXTS.contains(&t) || FIM_EOG_TEXTS.contains(&t) {
                ids.push(i as u32);
            }
        }
        let mut seen = HashSet::new();
        ids.retain(|id| seen.insert(*id));
        ids
    }
}

/// Whether `</s>` is ordinary text in this vocabulary (gemma4, plamo).
fn plain_s(tokens: &[String]) -> bool {
    tokens
        .iter()
        .any(|t| t == "<|tool_response>" || t == "<|plamo:eos|>")
}

/// Builds the tokenizer described by a GGUF file's metadata.
pub(crate) fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
    // Refuse unsupported models before reading a vocabulary they may lack.
    match file.get_str("tokenizer.ggml.model") {
        Some("gpt2" | "llama") | None => {}
        Some(other) => {
            return Err(TokenizerError::UnsupportedModel {
                model: other.to_owned(),
            })
        }
    }
    let v = GgufVocab::read(file)?;
    let (mut inner, kind, add_bos, add_space_prefix) = match v.model.as_str() {
        "gpt2" => {
            let spec = pre::pre_spec(v.pre.as_deref()).map_err(|reason| {
                TokenizerError::UnsupportedPreTokenizer {
                    pre: v.pre.clone().unwrap_or_default(),
                    reason,
                }
            })?;
            let inner = byte_level_bpe(&v, spec.regexes, spec.ignore_merges)?;
            let pre = v.pre.as_deref().unwrap_or("default");
            (
                inner,
                format!("gpt2 BPE (pre: {pre})"),
                v.add_bos.unwrap_or(spec.add_bos),
                false,
            )
        }
        "llama" => {
            let prefix = v.add_space_prefix.unwrap_or(true);
            let inner = sentencepiece_bpe(&v, prefix)?;
            (
                inner,
                "llama SPM".to_owned(),
                v.add_bos.unwrap_or(true),
                prefix,
            )
        }
        other => {
            return Err(TokenizerError::UnsupportedModel {
                model: other.to_owned(),
            })
        }
    };
    let add_eos = v.add_eos.unwrap_or(false);
    let bos = v.info(v.bos);
    let eos = v.info(v.eos);
    let pp = post_processor(
        if add_bos { bos.as_ref() } else { None },
        if add_eos { eos.as_ref() } else { None },
    )?;
    inner.with_post_processor(pp);
    tracing::debug!(
        kind,
        add_bos,
        add_eos,
        add_space_prefix,
        "built tokenizer from GGUF"
    );
    Tokenizer::from_parts(TokenizerParts {
        inner,
        kind,
        bos,
        eos,
        unk: v.info(v.unk),
        pad: v.info(v.pad),
        stop_ids: v.stop_ids(),
        add_bos,
        add_eos,
        chat_template: v.chat_template.clone(),
        named_templates: v.named_templates.clone(),
    })
}

fn backend(err: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::backend("build", err)
}

/// `gpt2`: byte-level BPE with the GGUF merges.
fn byte_level_bpe(
    v: &GgufVocab,
    regexes: &[&str],
    ignore_merges: bool,
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let raw = v
        .merges
        .as_ref()
        .ok_or_else(|| TokenizerError::MissingMetadata {
            key: "tokenizer.ggml.merges".into(),
        })?;
    let index: HashMap<&str, u32> = v
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i as u32))
        .collect();
    let mut merges: Merges = Vec::with_capacity(raw.len());
    let mut skipped = 0usize;
    for m in raw {
        // llama.cpp splits at the first space after the first byte, so a
        // merge's left part may itself be a space.
        let first = m.chars().next().map_or(0, char::len_utf8);
        let Some(pos) = m[first..].find(' ').map(|p| p + first) else {
            skipped += 1;
            continue;
        };
        let (a, b) = (&m[..pos], &m[pos + 1..]);
        // The BPE model refuses merges whose parts or result are not tokens;
        // llama.cpp would merge and then fall back to bytes, which the byte
        // tokens reproduce in all but contrived vocabularies.
        if index.contains_key(a)
            && index.contains_key(b)
            && index.contains_key(format!("{a}{b}").as_str())
        {
            merges.push((a.to_owned(), b.to_owned()));
        } else {
            skipped += 1;
        }
    }
    if skipped > 0 {
        tracing::debug!(
            skipped,
            "GGUF merges not usable (parts or result not in vocab)"
        );
    }
    let model = BPE::builder()
        .vocab_and_merges(v.vocab(), merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(backend)?;
    let mut pre: Vec<PreTokenizerWrapper> = Vec::with_capacity(regexes.len() + 1);
    for re in regexes {
        let split = Split::new(
            SplitPattern::Regex((*re).to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(backend)?;
        pre.push(split.into());
    }
    pre.push(ByteLevel::new(false, false, false).into());
    let mut tk = tokenizers::Tokenizer::new(model);
    tk.with_pre_tokenizer(Some(PreSequence::new(pre)));
    tk.with_decoder(Some(ByteLevel::new(false, false, false)));
    tk.add_tokens(v.added_tokens()).map_err(backend)?;
    Ok(tk)
}

/// `llama`: SentencePiece BPE, merges derived from the scores.
fn sentencepiece_bpe(
    v: &GgufVocab,
    add_space_prefix: bool,
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let scores = v
        .scores
        .as_ref()
        .ok_or_else(|| TokenizerError::MissingMetadata {
            key: "tokenizer.ggml.scores".into(),
        })?;
    let merges = merges_from_scores(&v.tokens, scores);
    let mut builder = BPE::builder()
        .vocab_and_merges(v.vocab(), merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = v.info(v.unk) {
        builder = builder.unk_token(unk.text);
    }
    let model = builder.build().map_err(backend)?;
    let mut norm: Vec<NormalizerWrapper> = Vec::with_capacity(2);
    if add_space_prefix {
        norm.push(Prepend::new("▁".to_owned()).into());
    }
    norm.push(Replace::new(" ", "▁").map_err(backend)?.into());
    let mut dec: Vec<DecoderWrapper> = vec![
        Replace::new("▁", " ").map_err(backend)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        dec.push(Strip::new(' ', 1, 0).into());
    }
    let mut tk = tokenizers::Tokenizer::new(model);
    tk.with_normalizer(Some(NormSequence::new(norm)))
        .map_err(backend)?;
    tk.with_decoder(Some(DecoderSequence::new(dec)));
    tk.add_tokens(v.added_tokens()).map_err(backend)?;
    Ok(tk)
}

/// Every split `(left, right)` of every token whose halves are both tokens,
/// ranked by the score of the whole token (highest first, then lowest id).
/// Ranked this way, BPE's "lowest rank, leftmost" merge order is SPM's
/// "highest score, leftmost" order.
fn merges_from_scores(tokens: &[String], scores: &[f32]) -> Merges {
    let index: HashMap<&str, u32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i as u32))
        .collect();
    let mut ranked: Vec<(f32, u32, usize)> = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        for (split, _) in t.char_indices().skip(1) {
            if index.contains_key(&t[..split]) && index.contains_key(&t[split..]) {
                ranked.push((scores[id], id as u32, split));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    ranked
        .into_iter()
        .map(|(_, id, split)| {
            let t = &tokens[id as usize];
            (t[..split].to_owned(), t[split..].to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_rank_by_score_of_the_whole_token() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let m = merges_from_scores(&tokens, &scores);
        let pairs: Vec<(&str, &str)> = m.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(pairs, [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]);
    }
}
