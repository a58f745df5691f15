//! `ingot generate --score TEXT`: the log-probability of a continuation
//! after the prompt, one decode step per token straight on the model
//! runner (the path every generated token takes; no batching, no prompt
//! logprobs). The reference the server's `echo` + `logprobs` answers (and
//! lm-evaluation-harness's loglikelihoods through them) are checked
//! against.

use anyhow::Context;
use ingot_core::TokenId;
use ingot_runner::sampling::log_sum_exp;
use ingot_runner::{argmax, ForwardBatch, ModelRunner, SequenceChunk};
use ingot_tokenizer::Tokenizer;

/// A continuation's score.
#[derive(Debug)]
pub struct Score {
    /// The prompt's tokens.
    pub context_ids: Vec<TokenId>,
    /// The continuation's tokens.
    pub continuation_ids: Vec<TokenId>,
    /// Each continuation token's logprob given everything before it.
    pub logprobs: Vec<f32>,
    /// Their sum: the continuation's loglikelihood.
    pub sum: f64,
    /// Every continuation token is the argmax at its position.
    pub greedy: bool,
}

/// Splits `context` + `continuation` into tokens the way evaluation
/// harnesses do (lm-evaluation-harness's `_encode_pair`): trailing
/// whitespace of the context moves to the continuation, the whole text is
/// encoded without special tokens, and the continuation is what follows
/// the context's own tokens.
pub fn split(
    tokenizer: &Tokenizer,
    context: &str,
    continuation: &str,
) -> anyhow::Result<(Vec<TokenId>, Vec<TokenId>)> {
    let trimmed = context.trim_end();
    let (context, continuation) = (
        trimmed,
        format!("{}{continuation}", &context[trimmed.len()..]),
    );
    anyhow::ensure!(!context.is_empty(), "--score needs a non-empty prompt");
    let whole = tokenizer.encode(&format!("{context}{continuation}"), false)?;
    let head = tokenizer.encode(context, false)?;
    anyhow::ensure!(
        whole.len() > head.len(),
        "the continuation {continuation:?} adds no tokens"
    );
    let tail = whole[head.len()..].to_vec();
    Ok((head, tail))
}

/// Scores `continuation` after `context` on `runner`: the context but its
/// last token as one prefill, then one decode step per scored token.
pub fn score(
    runner: &mut dyn ModelRunner,
    context: Vec<TokenId>,
    continuation: Vec<TokenId>,
) -> anyhow::Result<Score> {
    let ids: Vec<TokenId> = context.iter().chain(&continuation).copied().collect();
    let tables = ingot_runner::solo_tables(&*runner, ids.len())?;
    let batch = |start: usize, end: usize| ForwardBatch {
        chunks: vec![SequenceChunk::with_tables(&ids[start..end], start, &tables)],
        ..ForwardBatch::default()
    };
    let last = context.len() - 1;
    if last > 0 {
        runner.forward(&batch(0, last)).context("prefill failed")?;
    }
    let mut logprobs = Vec::with_capacity(continuation.len());
    let mut greedy = true;
    for p in last..ids.len() - 1 {
        let row = runner
            .forward(&batch(p, p + 1))
            .context("decode step failed")?;
        let next = ids[p + 1];
        logprobs.push(row[next as usize] - log_sum_exp(row));
        greedy &= argmax(row) == next;
    }
    Ok(Score {
        sum: logprobs.iter().map(|&l| f64::from(l)).sum(),
        context_ids: context,
        continuation_ids: continuation,
        logprobs,
        greedy,
    })
}

impl Score {
    /// The score as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "context_ids": self.context_ids,
            "continuation_ids": self.continuation_ids,
            "logprobs": self.logprobs,
            "sum": self.sum,
            "greedy": self.greedy,
        })
    }
}
