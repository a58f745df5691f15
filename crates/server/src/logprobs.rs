//! Token ids in logprob entries → the text and bytes clients expect.

use std::sync::Arc;

use ingot_engine::{GeneratedToken, PromptLogprob};
use ingot_protocol::completions::CompletionLogprobs;
use ingot_protocol::usage::TokenLogprobInfo;
use ingot_tokenizer::{IncrementalDecoder, Tokenizer};

/// The text of one token on its own (a partial UTF-8 character decodes as
/// U+FFFD, as in OpenAI's responses).
fn piece(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let text = tokenizer.decode(&[id], false).unwrap_or_default();
    let bytes = text.as_bytes().to_vec();
    (text, bytes)
}

/// The lowest logprob sent (vLLM's): a token the grammar or a logit bias
/// masks has -inf, which JSON cannot carry (`serde_json` writes null, which
/// no client's schema allows).
const MIN_LOGPROB: f32 = -9999.0;

/// `logprob` as a JSON number.
fn finite(logprob: f32) -> f32 {
    if logprob.is_nan() {
        MIN_LOGPROB
    } else {
        logprob.max(MIN_LOGPROB)
    }
}

/// Resolves a generated token's logprob entry.
pub fn resolve(tokenizer: &Tokenizer, t: &GeneratedToken) -> TokenLogprobInfo {
    let (token, bytes) = piece(tokenizer, t.token);
    TokenLogprobInfo {
        token,
        bytes,
        logprob: finite(t.logprob),
        top: t
            .top_logprobs
            .iter()
            .map(|a| {
                let (s, b) = piece(tokenizer, a.token);
                (s, b, finite(a.logprob))
            })
            .collect(),
    }
}

/// Appends a prompt's logprob entries (OpenAI's `echo` with `logprobs`),
/// each token at its character offset in the prompt decoded token by token.
pub fn push_prompt(
    out: &mut CompletionLogprobs,
    tokenizer: &Arc<Tokenizer>,
    prompt: &[PromptLogprob],
) {
    let mut detok = IncrementalDecoder::new(tokenizer.clone(), false);
    let mut offset = 0;
    for p in prompt {
        let (token, bytes) = piece(tokenizer, p.token);
        match p.logprob {
            None => out.push_first(token, offset),
            Some(logprob) => {
                let top = p
                    .top_logprobs
                    .iter()
                    .map(|a| {
                        let (s, b) = piece(tokenizer, a.token);
                        (s, b, finite(a.logprob))
                    })
                    .collect();
                let info = TokenLogprobInfo {
                    token,
                    bytes,
                    logprob: finite(logprob),
                    top,
                };
                out.push(&info, offset);
            }
        }
        // A token inside a multi-byte character shows up with the next.
        offset += detok.step(p.token).ok().flatten().map_or(0, |t| t.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_tokens_get_a_finite_logprob() {
        // Found by schemathesis over /openapi.json: a top alternative the
        // grammar masked was sent as null.
        assert_eq!(finite(f32::NEG_INFINITY), MIN_LOGPROB);
        assert_eq!(finite(f32::NAN), MIN_LOGPROB);
        assert_eq!(finite(-0.5), -0.5);
        assert_eq!(finite(0.0), 0.0);
    }
}
