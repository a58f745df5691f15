//! Prompt scoring: the logprob of each prompt token given the tokens before
//! it (OpenAI's legacy `echo` + `logprobs`, what lm-evaluation-harness's
//! loglikelihood tasks read). A forward pass returns a logits row for every
//! position of a scored chunk, in the same pass as the prefill (vLLM's
//! `prompt_logprobs`), so scoring a prompt costs no extra steps.

use ingot_core::TokenId;
use rayon::prelude::*;

use crate::sampling::{log_sum_exp, Logprobs, TokenLogprob};

/// A chunk of the batch whose positions are scored, not only its last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoredChunk<'a> {
    /// Index of the chunk in [`ForwardBatch::chunks`](crate::ForwardBatch).
    pub chunk: usize,
    /// The token that follows each of the chunk's first `next.len()`
    /// positions (at most the chunk's length): position `i`'s row is
    /// scored against `next[i]`.
    pub next: &'a [TokenId],
    /// Most likely alternatives to report per position.
    pub top: usize,
}

/// Logprobs of `next` and of the `top` most likely tokens under one row of
/// raw logits.
pub fn score_row(row: &[f32], next: TokenId, top: usize) -> Logprobs {
    let log_z = log_sum_exp(row);
    Logprobs {
        chosen: row
            .get(next as usize)
            .map_or(f32::NEG_INFINITY, |l| l - log_z),
        top: top_few(row, top)
            .into_iter()
            .map(|token| TokenLogprob {
                token,
                logprob: row[token as usize] - log_z,
            })
            .collect(),
    }
}

/// Scores every position of `scored` from `rows` (one row of `vocab`
/// logits per position, chunks in order), in parallel.
pub fn score_rows(rows: &[f32], vocab: usize, scored: &[ScoredChunk<'_>]) -> Vec<Vec<Logprobs>> {
    let mut offset = 0;
    scored
        .iter()
        .map(|s| {
            let span = &rows[offset * vocab..(offset + s.next.len()) * vocab];
            offset += s.next.len();
            span.par_chunks_exact(vocab)
                .zip(s.next.par_iter())
                .map(|(row, &next)| score_row(row, next, s.top))
                .collect()
        })
        .collect()
}

/// The `n` largest entries, largest first (ties: lower id first), in one
/// pass: `n` is small (at most 20), so an insertion into a short sorted
/// list beats sorting the vocabulary.
pub fn top_few(v: &[f32], n: usize) -> Vec<TokenId> {
    let mut best: Vec<(f32, TokenId)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return Vec::new();
    }
    for (i, &x) in v.iter().enumerate() {
        if best.len() == n && best[n - 1].0 >= x {
            continue;
        }
        // After every entry at least as large: equal values keep id order.
        let at = best.partition_point(|&(b, _)| b >= x);
        best.insert(at, (x, i as TokenId));
        best.truncate(n);
    }
    best.into_iter().map(|(_, id)| id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::top_n;

    #[test]
    fn top_few_matches_top_n_with_ties() {
        let v = [0.5, 2.0, -1.0, 2.0, 0.5, 3.0, f32::NEG_INFINITY, 0.5];
        for n in 0..=v.len() {
            assert_eq!(top_few(&v, n), top_n(&v, n), "n = {n}");
        }
    }

    #[test]
    fn scores_are_log_softmax_of_the_next_token() {
        let row = [1.0f32, 2.0, 3.0];
        let z = (1f32.exp() + 2f32.exp() + 3f32.exp()).ln();
        let s = score_row(&row, 0, 2);
        assert!((s.chosen - (1.0 - z)).abs() < 1e-6);
        assert_eq!(
            s.top.iter().map(|t| t.token).collect::<Vec<_>>(),
            vec![2, 1]
        );
        assert!((s.top[0].logprob - (3.0 - z)).abs() < 1e-6);
    }

    #[test]
    fn rows_are_split_by_chunk_in_order() {
        let rows = [0.0f32, 1.0, 5.0, 0.0, 0.0, 9.0];
        let scored = [
            ScoredChunk {
                chunk: 1,
                next: &[1, 1],
                top: 0,
            },
            ScoredChunk {
                chunk: 0,
                next: &[2],
                top: 1,
            },
        ];
        let s = score_rows(&rows, 2, &scored);
        assert_eq!(s.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 1]);
        assert!(s[0][0].chosen > -1.0 && s[0][1].chosen < -4.0);
        assert_eq!(s[1][0].top[0].token, 1);
        assert_eq!(s[1][0].chosen, f32::NEG_INFINITY, "out of the vocabulary");
    }
}
