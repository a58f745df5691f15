//! Prompt logprobs of one request (`SamplingParams::prompt_logprobs`):
//! which positions of a scheduled chunk to score, and the collected
//! scores until the whole prompt is done.
//!
//! The logits at position `p` score the prompt token at `p + 1`, so a
//! prompt of `n` tokens has `n - 1` scored positions (the first token has
//! no logprob). A sequence that is preempted recomputes its prompt; the
//! positions already collected are then skipped.

use ingot_core::TokenId;
use ingot_runner::Logprobs;

use crate::handle::PromptLogprob;

/// The scores collected so far for one prompt.
#[derive(Debug)]
pub struct PromptScores {
    /// Alternatives per position.
    top: usize,
    prompt_len: usize,
    /// `scores[p]`: the prompt token at `p + 1` given the ones before it.
    scores: Vec<Logprobs>,
    /// The finished list was handed out.
    delivered: bool,
}

impl PromptScores {
    /// Scores for a prompt of `prompt_len` tokens with `top` alternatives.
    pub fn new(prompt_len: usize, top: usize) -> Self {
        Self {
            top,
            prompt_len,
            scores: Vec::with_capacity(prompt_len.saturating_sub(1)),
            delivered: false,
        }
    }

    /// Alternatives per position.
    pub fn top(&self) -> usize {
        self.top
    }

    /// For a chunk at `start..start + len` of `tokens` (the sequence's
    /// tokens): the tokens that follow its positions that still need a
    /// score, counted from `start`, or `None` when it has none.
    pub fn next_tokens<'t>(
        &self,
        tokens: &'t [TokenId],
        start: usize,
        len: usize,
    ) -> Option<&'t [TokenId]> {
        let last = self.prompt_len.saturating_sub(1).min(start + len);
        (self.scores.len() < last && start < last).then(|| &tokens[start + 1..last + 1])
    }

    /// Takes the scores of positions `start..` (from `next_tokens`).
    pub fn record(&mut self, start: usize, scores: Vec<Logprobs>) {
        for (p, s) in (start..).zip(scores) {
            if p == self.scores.len() {
                self.scores.push(s);
            }
        }
    }

    /// The whole prompt's entries (the first token without a logprob),
    /// once every position is scored; `None` before and after.
    pub fn take_finished(&mut self, prompt: &[TokenId]) -> Option<Vec<PromptLogprob>> {
        if self.delivered || self.scores.len() + 1 < self.prompt_len {
            return None;
        }
        self.delivered = true;
        let first = prompt.first().map(|&token| PromptLogprob {
            token,
            logprob: None,
            top_logprobs: Vec::new(),
        });
        let rest = prompt[1..]
            .iter()
            .zip(std::mem::take(&mut self.scores))
            .map(|(&token, s)| PromptLogprob {
                token,
                logprob: Some(s.chosen),
                top_logprobs: s.top,
            });
        Some(first.into_iter().chain(rest).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(x: f32) -> Logprobs {
        Logprobs {
            chosen: x,
            top: Vec::new(),
        }
    }

    #[test]
    fn chunks_score_their_positions_up_to_the_last_prompt_token() {
        let tokens = [10, 11, 12, 13, 14, 99];
        let mut s = PromptScores::new(5, 0);
        // First chunk: positions 0..3 score tokens 1..4.
        assert_eq!(s.next_tokens(&tokens, 0, 3), Some(&tokens[1..4]));
        s.record(0, vec![lp(-1.0), lp(-2.0), lp(-3.0)]);
        assert!(s.take_finished(&tokens[..5]).is_none());
        // Last chunk: position 3 scores token 4; position 4 is the prompt's last.
        assert_eq!(s.next_tokens(&tokens, 3, 2), Some(&tokens[4..5]));
        s.record(3, vec![lp(-4.0)]);
        let done = s.take_finished(&tokens[..5]).unwrap();
        assert_eq!(done.len(), 5);
        assert_eq!(done[0].logprob, None);
        assert_eq!((done[4].token, done[4].logprob), (14, Some(-4.0)));
        assert!(s.take_finished(&tokens[..5]).is_none(), "handed out once");
        // Decode steps after the prompt score nothing.
        assert_eq!(s.next_tokens(&tokens, 5, 1), None);
    }

    #[test]
    fn a_recomputed_prompt_keeps_the_first_scores() {
        let tokens = [1, 2, 3, 4];
        let mut s = PromptScores::new(4, 0);
        s.record(0, vec![lp(-1.0), lp(-2.0)]);
        // Preempted and recomputed from 0: only position 2 is new.
        assert_eq!(s.next_tokens(&tokens, 0, 4), Some(&tokens[1..4]));
        s.record(0, vec![lp(-9.0), lp(-9.0), lp(-3.0)]);
        let done = s.take_finished(&tokens).unwrap();
        let got: Vec<_> = done.iter().map(|p| p.logprob).collect();
        assert_eq!(got, vec![None, Some(-1.0), Some(-2.0), Some(-3.0)]);
    }

    #[test]
    fn a_one_token_prompt_is_done_at_once() {
        let mut s = PromptScores::new(1, 0);
        assert_eq!(s.next_tokens(&[7], 0, 1), None);
        assert_eq!(s.take_finished(&[7]).unwrap().len(), 1);
    }
}
