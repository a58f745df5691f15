//! The model's vocabulary as llguidance sees it: every token's bytes in a
//! trie (special tokens marked so plain text never spells them), and the
//! model's own tokenizer for the text llguidance tokenizes itself.

use std::sync::Arc;

use ingot_core::TokenId;
use ingot_tokenizer::Tokenizer;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

use crate::GrammarError;

/// Our tokenizer behind llguidance's tokenizer seam.
struct ModelVocab {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for ModelVocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Forced bytes can stop inside a character (a 4-byte literal of a
        // regex): text goes through the tokenizer, other bytes through the
        // trie, never as U+FFFD, which the grammar then refuses. A
        // tokenizer failure leaves the text to llguidance's own walk.
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer.encode(text, false).unwrap_or_default()
        })
    }
}

/// Tokens that bring a JSON answer to its end fastest, for answers about
/// to run out of tokens. Bitsets as masks.
#[derive(Debug, Clone, Default)]
pub(crate) struct Closers {
    /// `"` then only `}` and `]`: ends a string (and maybe containers).
    pub quote: Vec<u32>,
    /// Only `}` and `]`: ends objects and arrays.
    pub container: Vec<u32>,
    /// Made of `}], ` with a `,` (no quote): outside a string, ends a
    /// value where more must follow (a quote there would open a string,
    /// such as a key `","`).
    pub separating: Vec<u32>,
    /// Those starting with `"`: inside a string, the ones that end it (a
    /// bare `,` there is only more text).
    pub quote_separating: Vec<u32>,
    /// Single letters: allowed only inside a string (or key), so they tell
    /// that a `"` would end one rather than open one.
    pub letters: Vec<TokenId>,
    /// The end-of-sequence tokens (the grammar allows them once complete).
    pub eos: Vec<TokenId>,
    /// Each token's length in bytes (capped at 255).
    pub lens: Vec<u8>,
}

impl Closers {
    fn new(words: &[Vec<u8>], eos: &[TokenId]) -> Self {
        let n = words.len().div_ceil(32);
        let mut c = Self {
            quote: vec![0u32; n],
            container: vec![0u32; n],
            separating: vec![0u32; n],
            quote_separating: vec![0u32; n],
            letters: Vec::new(),
            eos: eos.to_vec(),
            lens: words.iter().map(|w| w.len().min(255) as u8).collect(),
        };
        for (id, w) in words.iter().enumerate() {
            let closes = |b: &u8| matches!(b, b'}' | b']');
            let set = match w.as_slice() {
                [] => continue,
                [b'"', rest @ ..] if rest.iter().all(closes) => &mut c.quote,
                _ if w.iter().all(closes) => &mut c.container,
                _ if w.contains(&b',')
                    && w.iter()
                        .all(|b| matches!(b, b'"' | b'}' | b']' | b',' | b' ')) =>
                {
                    match (w[0], w.contains(&b'"')) {
                        (b'"', _) => &mut c.quote_separating,
                        (_, false) => &mut c.separating,
                        // ` ",`: opens a string wherever it is allowed.
                        _ => continue,
                    }
                }
                [b'q' | b'x' | b'z' | b'k' | b'j'] => {
                    c.letters.push(id as TokenId);
                    continue;
                }
                _ => continue,
            };
            set[id / 32] |= 1 << (id % 32);
        }
        c
    }

    /// The allowed token with the most bytes (an end-of-sequence token
    /// when it is the only one); `None` when the mask is empty.
    pub fn longest_allowed(&self, mask: &[u32]) -> Option<TokenId> {
        let allowed = mask.iter().enumerate().flat_map(|(w, &bits)| {
            (0..32)
                .filter(move |b| bits & (1 << b) != 0)
                .map(move |b| (w * 32 + b) as TokenId)
        });
        allowed.max_by_key(|&t| self.lens.get(t as usize).copied().unwrap_or(0))
    }
}

/// Indexes `tokenizer`'s vocabulary. Token bytes come from the tokenizer's
/// own serialised form (byte-level BPE and SentencePiece byte fallback are
/// both decoded by llguidance), so GGUF and Hugging Face tokenizers agree.
pub(crate) fn token_env(
    tokenizer: Arc<Tokenizer>,
) -> Result<(TokEnv, Closers, Unwritable), GrammarError> {
    let vocab_err = |e: &dyn std::fmt::Display| GrammarError::Vocabulary(e.to_string());
    let json = tokenizer.hf().to_string(false).map_err(|e| vocab_err(&e))?;
    let value: serde_json::Value = serde_json::from_str(&json).map_err(|e| vocab_err(&e))?;
    let mut words =
        llguidance::token_bytes_from_tokenizer_json(&value).map_err(|e| vocab_err(&e))?;
    let size = words.len().max(tokenizer.vocab_size());
    words.resize(size, Vec::new());
    let eos = tokenizer.eos_ids().to_vec();
    let first = *eos.first().ok_or_else(|| {
        GrammarError::Vocabulary("the tokenizer has no end-of-sequence token".into())
    })?;
    let info = TokRxInfo::new(size as u32, first);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
    let closers = Closers::new(&words, &eos);
    let unwritable = Unwritable::new(&words);
    Ok((
        Arc::new(ModelVocab { trie, tokenizer }),
        closers,
        unwritable,
    ))
}

/// The bytes no token has: a grammar whose text needs one can never be
/// followed (SmolLM2's vocabulary lacks some UTF-8 lead bytes, so it cannot
/// write U+80000 and above). llguidance finds out only when it forces
/// those bytes, mid-answer; [`Unwritable::check`] finds out at compile time.
#[derive(Debug, Clone)]
pub(crate) struct Unwritable([bool; 256]);

impl Unwritable {
    fn new(words: &[Vec<u8>]) -> Self {
        let mut seen = [false; 256];
        for w in words {
            for &b in w {
                seen[b as usize] = true;
            }
        }
        Self(seen.map(|s| !s))
    }

    /// A character of `text` the vocabulary cannot write, named.
    pub(crate) fn check(&self, text: &str) -> Result<(), GrammarError> {
        for c in text.chars() {
            let mut buf = [0u8; 4];
            let bytes = c.encode_utf8(&mut buf).as_bytes();
            if let Some(b) = bytes.iter().find(|&&b| self.0[b as usize]) {
                return Err(GrammarError::Invalid(format!(
                    "it needs the character {c:?} (U+{:04X}), which this model's vocabulary cannot write (no token has the byte 0x{b:02X})",
                    c as u32
                )));
            }
        }
        Ok(())
    }
}
