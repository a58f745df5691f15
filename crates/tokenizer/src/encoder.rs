//! Tokenizers of encoder (embedding) models: a Hugging Face `tokenizer.json`
//! (WordPiece for BERT) applied whole, with its post-processor's [CLS] and
//! [SEP], and without the truncation or padding the file may configure, so
//! an over-long input is reported instead of silently cut.

use std::path::Path;

use crate::TokenizerError;

/// An encoder model's tokenizer.
pub struct EncoderTokenizer {
    inner: tokenizers::Tokenizer,
}

impl EncoderTokenizer {
    /// Loads `dir/tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let path = dir.join("tokenizer.json");
        let mut inner =
            tokenizers::Tokenizer::from_file(&path).map_err(|e| TokenizerError::InvalidFile {
                path: path.clone(),
                message: e.to_string(),
            })?;
        inner
            .with_truncation(None)
            .map_err(|e| TokenizerError::InvalidFile {
                path: path.clone(),
                message: e.to_string(),
            })?;
        inner.with_padding(None);
        Ok(Self { inner })
    }

    /// The ids of `text`, special tokens included.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode_fast(text, true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::backend("encode", e))
    }
}
