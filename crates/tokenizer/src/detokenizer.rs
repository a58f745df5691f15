//! [`IncrementalDecoder`]: turns generated token ids into text one id at a
//! time, emitting only completed characters.
//!
//! Decoding token by token is wrong in two ways: a character can span tokens
//! (byte-level BPE pieces of an emoji, SentencePiece `<0xF0>` byte-fallback
//! tokens), and a token's text can depend on its neighbours (SentencePiece's
//! `▁` space marker, the leading space a decoder strips from the first
//! token). So, like vLLM's `detokenize_incrementally` and TGI's
//! `decode_token`, we keep two offsets into the ids: text is decoded from
//! `prefix_offset` (a few tokens of context) to the end and to `read_offset`
//! (what was already emitted), and the difference is emitted, unless the new
//! text ends in U+FFFD, which means a character is still incomplete.
//!
//! Invariant: the concatenation of every chunk returned by
//! [`step`](IncrementalDecoder::step) and [`finish`](IncrementalDecoder::finish)
//! equals `tokenizer.decode(all ids)` (for a decoder started with
//! [`new`](IncrementalDecoder::new)), and no chunk but the final flush
//! contains a U+FFFD that the full text does not.

use std::sync::Arc;

use ingot_core::TokenId;

use crate::{Tokenizer, TokenizerError};

/// How many prompt tokens [`IncrementalDecoder::with_prompt`] keeps as
/// context (vLLM's `INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET`).
const PROMPT_CONTEXT: usize = 5;

/// Streaming detokenizer for one sequence.
#[derive(Debug)]
pub struct IncrementalDecoder {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    /// The ids from `prefix_offset` on (earlier ones are dropped).
    ids: Vec<TokenId>,
    /// Start of the context window in `ids` (always 0 after compaction).
    prefix_offset: usize,
    /// End of what has been emitted, in `ids`.
    read_offset: usize,
}

impl IncrementalDecoder {
    /// A decoder whose output, concatenated, is `decode(generated ids)`:
    /// e.g. a SentencePiece first token `▁Hello` yields `Hello`.
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special_tokens: bool) -> IncrementalDecoder {
        IncrementalDecoder {
            tokenizer,
            skip_special_tokens,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// A decoder that continues a prompt: the last few prompt ids serve as
    /// context and are never emitted, so the first generated token keeps the
    /// leading space it has in the middle of a text (`▁Hello` → ` Hello`),
    /// as an OpenAI-style completion expects.
    pub fn with_prompt(
        tokenizer: Arc<Tokenizer>,
        prompt: &[TokenId],
        skip_special_tokens: bool,
    ) -> IncrementalDecoder {
        let tail = &prompt[prompt.len().saturating_sub(PROMPT_CONTEXT)..];
        IncrementalDecoder {
            tokenizer,
            skip_special_tokens,
            ids: tail.to_vec(),
            prefix_offset: 0,
            read_offset: tail.len(),
        }
    }

    /// Adds one generated id; returns the text it completes, if any.
    pub fn step(&mut self, id: TokenId) -> Result<Option<String>, TokenizerError> {
        self.ids.push(id);
        let prefix = self.decode(self.prefix_offset, self.read_offset)?;
        let full = self.decode(self.prefix_offset, self.ids.len())?;
        if full.len() <= prefix.len() || full.ends_with('\u{FFFD}') {
            // Nothing new (a skipped special token, an empty piece), or an
            // incomplete character: wait for more ids.
            return Ok(None);
        }
        let delta = suffix_after(&full, &prefix).to_owned();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.compact();
        Ok(Some(delta).filter(|d| !d.is_empty()))
    }

    /// Flushes text held back at the end of the sequence (an incomplete
    /// character decodes to U+FFFD here, as in the full decode).
    pub fn finish(&mut self) -> Result<Option<String>, TokenizerError> {
        if self.read_offset == self.ids.len() {
            return Ok(None);
        }
        let prefix = self.decode(self.prefix_offset, self.read_offset)?;
        let full = self.decode(self.prefix_offset, self.ids.len())?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        let delta = suffix_after(&full, &prefix);
        Ok((!delta.is_empty()).then(|| delta.to_owned()))
    }

    fn decode(&self, from: usize, to: usize) -> Result<String, TokenizerError> {
        self.tokenizer
            .decode(&self.ids[from..to], self.skip_special_tokens)
    }

    /// Drops ids before the context window so memory stays bounded.
    fn compact(&mut self) {
        if self.prefix_offset > 0 {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
    }
}

/// The part of `full` after `prefix`. Decoding more ids normally only
/// appends; where a decoder rewrites the end of the previous text instead,
/// emit from the longest common prefix (cut at a char boundary).
fn suffix_after<'a>(full: &'a str, prefix: &str) -> &'a str {
    if let Some(rest) = full.strip_prefix(prefix) {
        return rest;
    }
    let common = full
        .char_indices()
        .zip(prefix.chars())
        .find(|((_, a), b)| a != b)
        .map_or(prefix.len().min(full.len()), |((i, _), _)| i);
    let mut start = common;
    while !full.is_char_boundary(start) {
        start -= 1;
    }
    &full[start..]
}

#[cfg(test)]
mod tests {
    use super::suffix_after;

    #[test]
    fn suffix_after_prefix_or_common_part() {
        assert_eq!(suffix_after("Hello world", "Hello"), " world");
        assert_eq!(suffix_after("Hello world", "Help"), "lo world");
        assert_eq!(suffix_after("héllo", "hé"), "llo");
    }
}
