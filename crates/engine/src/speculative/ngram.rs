//! Prompt lookup (n-gram) proposals: where the sequence's last n tokens
//! occurred before (in the prompt or the output), guess that what followed
//! them then follows now. Costs no model; pays where the output copies its
//! input (editing code, repeating a list, quoting a document).

use ingot_core::TokenId;

use super::{Draft, ProposeRequest, Proposer};

/// Proposes the tokens that followed the latest earlier occurrence of the
/// longest suffix of `min..=max` tokens that occurred before (preferring
/// occurrences with a whole proposal after them).
#[derive(Debug, Clone)]
pub struct NgramProposer {
    min: usize,
    max: usize,
    /// Its guesses are rated by their match length (`rate_by_match`).
    rated: bool,
}

impl NgramProposer {
    /// Suffixes of `min..=max` tokens (each at least 1), longest tried first.
    pub fn new(min: usize, max: usize) -> Self {
        let min = min.max(1);
        Self {
            min,
            max: max.max(min),
            rated: false,
        }
    }

    /// Whether the engine rates this proposer's guesses by their match
    /// length ([`Proposer::rates_guesses`]).
    pub fn rating_guesses(self, rated: bool) -> Self {
        Self { rated, ..self }
    }
}

impl Proposer for NgramProposer {
    fn propose(&mut self, requests: &[ProposeRequest<'_>]) -> Vec<Draft> {
        requests
            .iter()
            .map(|r| self.lookup(r.tokens, r.max))
            .collect()
    }

    /// A guess is backed by its match: the longer, the likelier it holds
    /// (when asked to rate them).
    fn rates_guesses(&self) -> bool {
        self.rated
    }

    fn finds_nothing(&self, tokens: &[TokenId]) -> bool {
        self.lookup(tokens, 1).tokens.is_empty()
    }
}

impl NgramProposer {
    /// Up to `max` tokens after `tokens`' latest matching suffix, and that
    /// suffix's length.
    fn lookup(&self, tokens: &[TokenId], max: usize) -> Draft {
        let len = tokens.len();
        if max == 0 {
            return Draft::default();
        }
        for n in (self.min..=self.max.min(len.saturating_sub(1))).rev() {
            let suffix = &tokens[len - n..];
            // The latest occurrence followed by `max` tokens, else the
            // later one followed by most (each ending before the suffix
            // does): in a loop the latest would propose only up to the end.
            let full = (len - n).saturating_sub(max);
            let found = (0..full)
                .rev()
                .chain(full..len - n)
                .find(|&i| &tokens[i..i + n] == suffix);
            if let Some(i) = found {
                let from = i + n;
                return Draft {
                    tokens: tokens[from..(from + max).min(len)].to_vec(),
                    matched: n,
                };
            }
        }
        Draft::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_occurrence() {
        let p = NgramProposer::new(2, 3);
        // "1 2 3 4 5 | 1 2 3 9 | 1 2 3" -> the latest "1 2 3" went on with 9.
        let t = [1, 2, 3, 4, 5, 1, 2, 3, 9, 7, 1, 2, 3];
        let d = p.lookup(&t, 3);
        assert_eq!((d.tokens, d.matched), (vec![9, 7, 1], 3));
        assert_eq!(p.lookup(&t, 1).tokens, vec![9]);
    }

    #[test]
    fn longer_matches_win_and_short_ones_are_a_fallback() {
        let p = NgramProposer::new(1, 3);
        // The suffix "8 2" occurred once (then 5); "2" alone last went on with 6.
        let t = [8, 2, 5, 5, 2, 6, 0, 8, 2];
        let d = p.lookup(&t, 2);
        assert_eq!((d.tokens, d.matched), (vec![5, 5], 2));
        let p = NgramProposer::new(1, 1);
        let d = p.lookup(&t, 2);
        assert_eq!((d.tokens, d.matched), (vec![6, 0], 1));
    }

    /// One call answers every sequence, each from its own tokens.
    #[test]
    fn a_call_proposes_for_every_sequence() {
        let mut p = NgramProposer::new(1, 2);
        let (a, b) = ([4, 5, 6, 4], [1, 2, 3]);
        let requests = [
            ProposeRequest {
                seq: 1,
                tokens: &a,
                max: 2,
            },
            ProposeRequest {
                seq: 2,
                tokens: &b,
                max: 2,
            },
        ];
        let drafts = p.propose(&requests);
        assert_eq!(drafts[0].tokens, vec![5, 6]);
        assert_eq!(drafts[1], Draft::default());
    }

    #[test]
    fn nothing_to_copy_proposes_nothing() {
        let p = NgramProposer::new(2, 4);
        for (tokens, max) in [
            (&[1, 2, 3, 4, 5, 6][..], 4),
            (&[1], 4),
            (&[], 4),
            (&[1, 2, 1, 2], 0),
        ] {
            assert_eq!(p.lookup(tokens, max), Draft::default());
        }
        // Known without a guess, so the next step may launch ahead.
        assert!(p.finds_nothing(&[1, 2, 3, 4, 5, 6]) && p.finds_nothing(&[]));
        assert!(!p.finds_nothing(&[1, 2, 3, 1, 2]));
    }

    #[test]
    fn a_proposal_may_run_into_the_suffix() {
        // A loop: the latest match with a whole proposal after it; a short
        // one where no match has.
        let p = NgramProposer::new(2, 2);
        assert_eq!(p.lookup(&[7, 7, 7, 7], 4).tokens, vec![7, 7]);
        assert_eq!(p.lookup(&[7; 8], 4).tokens, vec![7; 4]);
        assert_eq!(p.lookup(&[1, 2, 1, 2, 1, 2], 4).tokens, vec![1, 2, 1, 2]);
        assert_eq!(p.lookup(&[1, 2, 1, 2, 1, 2], 3).tokens, vec![1, 2, 1]);
    }
}
