//! Token ids in logprob entries → the text and bytes clients expect.

use ingot_engine::GeneratedToken;
use ingot_protocol::usage::TokenLogprobInfo;
use ingot_tokenizer::Tokenizer;

/// The text of one token on its own (a partial UTF-8 character decodes as
/// U+FFFD, as in OpenAI's responses).
fn piece(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let text = tokenizer.decode(&[id], false).unwrap_or_default();
    let bytes = text.as_bytes().to_vec();
    (text, bytes)
}

/// Resolves a generated token's logprob entry.
pub fn resolve(tokenizer: &Tokenizer, t: &GeneratedToken) -> TokenLogprobInfo {
    let (token, bytes) = piece(tokenizer, t.token);
    TokenLogprobInfo {
        token,
        bytes,
        logprob: t.logprob,
        top: t
            .top_logprobs
            .iter()
            .map(|a| {
                let (s, b) = piece(tokenizer, a.token);
                (s, b, a.logprob)
            })
            .collect(),
    }
}
