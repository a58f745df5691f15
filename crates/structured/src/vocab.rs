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
        // llguidance asks only for text it knows to be UTF-8 (grammar
        // literals); a tokenizer failure leaves the literal to the trie.
        self.tokenizer
            .encode(&String::from_utf8_lossy(s), false)
            .unwrap_or_default()
    }
}

/// Indexes `tokenizer`'s vocabulary. Token bytes come from the tokenizer's
/// own serialised form (byte-level BPE and SentencePiece byte fallback are
/// both decoded by llguidance), so GGUF and Hugging Face tokenizers agree.
pub(crate) fn token_env(tokenizer: Arc<Tokenizer>) -> Result<TokEnv, GrammarError> {
    let vocab_err = |e: &dyn std::fmt::Display| GrammarError::Vocabulary(e.to_string());
    let json = tokenizer.hf().to_string(false).map_err(|e| vocab_err(&e))?;
    let value: serde_json::Value = serde_json::from_str(&json).map_err(|e| vocab_err(&e))?;
    let mut words =
        llguidance::token_bytes_from_tokenizer_json(&value).map_err(|e| vocab_err(&e))?;
    let size = words.len().max(tokenizer.vocab_size());
    words.resize(size, Vec::new());
    let eos = tokenizer.eos_ids();
    let first = *eos.first().ok_or_else(|| {
        GrammarError::Vocabulary("the tokenizer has no end-of-sequence token".into())
    })?;
    let info = TokRxInfo::new(size as u32, first);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
    Ok(Arc::new(ModelVocab { trie, tokenizer }))
}
