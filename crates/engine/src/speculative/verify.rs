//! Verifying a sequence's proposals against the logits of the step that
//! ran them: one row per position, picked in order exactly as plain
//! decoding would pick it (grammar mask, penalties over the tokens taken so
//! far, temperature, truncation), the proposal given.

use ingot_core::TokenId;
use ingot_runner::sampling::{apply_mask, pick_row_given};
use ingot_runner::Pick;
use ingot_structured::Limit;

use crate::decoding::{lock_grammar, Decoding, TokenOutput};

/// What verifying one sequence's rows gave.
#[derive(Debug)]
pub(crate) struct Verified {
    /// The tokens taken, in order: kept proposals, then (unless the output
    /// ended on a proposal) one of the model's own. Ends at the first
    /// failure.
    pub outputs: Vec<Result<TokenOutput, String>>,
    /// How many proposals were kept (the first outputs).
    pub kept: usize,
}

/// Picks a sequence's tokens from its step's rows: `rows[j]` follows
/// position `start + j`; `draft[j]` was proposed to follow row `j` (one
/// row more than proposals). Each row is picked as plain decoding picks it
/// (see [`verify_picks`]). `close_near_limit`: masks head for the end of a
/// constrained output near its limit, as the mask thread's do.
pub(crate) fn verify_rows(
    decoding: &mut Decoding,
    rows: &[&[f32]],
    draft: &[TokenId],
    close_near_limit: bool,
    order: &mut Vec<u32>,
) -> Verified {
    let mut logits = Vec::new();
    verify_picks(decoding, rows.len(), draft, |j, decoding, proposal| {
        logits.clear();
        logits.extend_from_slice(rows[j]);
        mask_row(decoding, &mut logits, close_near_limit)?;
        let random = decoding.sampler_mut().draw_random();
        let row = decoding.sampler().row(random);
        Ok(pick_row_given(&mut logits, &row, proposal, order))
    })
}

/// [`verify_rows`] for a plain greedy sequence whose rows' argmax the
/// backend picked (`ids[j]`: row `j`'s).
pub(crate) fn verify_ids(decoding: &mut Decoding, ids: &[TokenId], draft: &[TokenId]) -> Verified {
    verify_picks(decoding, ids.len(), draft, |j, _, _| Ok(Pick::from(ids[j])))
}

/// Takes a sequence's picks in order: `pick(j, decoding, proposal)` picks
/// row `j` given `draft[j]` (from the output's state after the picks
/// before it). A pick that keeps its proposal moves on to the next row;
/// the first that replaces it, the last row, an ended output or a failure
/// stops.
fn verify_picks(
    decoding: &mut Decoding,
    rows: usize,
    draft: &[TokenId],
    mut pick: impl FnMut(usize, &mut Decoding, Option<TokenId>) -> Result<Pick, String>,
) -> Verified {
    let mut verified = Verified {
        outputs: Vec::with_capacity(rows),
        kept: 0,
    };
    for j in 0..rows {
        let proposal = draft.get(j).copied();
        let taken = pick(j, decoding, proposal).and_then(|p| {
            let kept = proposal == Some(p.token);
            Ok((decoding.accept_picked(p).map_err(|e| e.to_string())?, kept))
        });
        match taken {
            Ok((out, kept)) => {
                let ended = out.finish.is_some();
                verified.outputs.push(Ok(out));
                verified.kept += usize::from(kept);
                if ended || !kept {
                    break;
                }
            }
            Err(e) => {
                verified.outputs.push(Err(e));
                break;
            }
        }
    }
    verified
}

/// Applies the grammar's mask of the output's current state, if it has one.
fn mask_row(decoding: &Decoding, logits: &mut [f32], close: bool) -> Result<(), String> {
    let Some(grammar) = decoding.grammar() else {
        return Ok(());
    };
    let limit = if close { decoding.limit() } else { Limit::Far };
    let mask = lock_grammar(grammar)
        .and_then(|mut g| g.limit_mask(limit))
        .map_err(|e| e.to_string())?;
    apply_mask(logits, &mask);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use ingot_core::{SamplingParams, StopCriteria};
    use ingot_tokenizer::Tokenizer;

    use super::*;

    const VOCAB: usize = 49_152;
    /// Four ordinary tokens of the SmolLM2 vocabulary.
    const TOKENS: [TokenId; 4] = [300, 301, 302, 303];

    fn row(logits: [f32; 4]) -> Vec<f32> {
        let mut row = vec![f32::NEG_INFINITY; VOCAB];
        for (t, l) in TOKENS.iter().zip(logits) {
            row[*t as usize] = l;
        }
        row
    }

    fn softmax(l: [f32; 4]) -> [f64; 4] {
        let z: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
        l.map(|x| (x as f64).exp() / z)
    }

    #[test]
    fn two_verified_positions_keep_the_joint_distribution() {
        let gguf = ingot_models::gguf::GgufFile::open(&ingot_testkit::smollm2_gguf()).unwrap();
        let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf).unwrap());
        let (l0, l1, l2) = ([1.0, 0.3, 0.0, -0.5], [0.0, 0.9, 0.2, 0.4], [0.5; 4]);
        let rows = [row(l0), row(l1), row(l2)];
        let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        // Proposed: the second token, then the third.
        let draft = [TOKENS[1], TOKENS[2]];
        // Cells: a first token other than the proposal, or the proposal
        // then each second token (the third row is reached only past both).
        let (p0, p1) = (softmax(l0), softmax(l1));
        let mut want = Vec::new();
        for (i, p) in p0.iter().enumerate().filter(|(i, _)| *i != 1) {
            want.push(((i, None), *p));
        }
        for (j, p) in p1.iter().enumerate() {
            want.push(((1, Some(j)), p0[1] * p));
        }
        let mut counts = vec![0u64; want.len()];
        let trials = 4000;
        let mut order = Vec::new();
        for seed in 0..trials {
            let params = SamplingParams {
                seed: Some(seed),
                ..SamplingParams::default()
            };
            let stop = StopCriteria {
                max_tokens: 8,
                ..StopCriteria::default()
            };
            let mut d = Decoding::new(&[1, 2], params, stop, tokenizer.clone(), 64, None);
            let v = verify_rows(&mut d, &rows, &draft, false, &mut order);
            let picked: Vec<usize> = v
                .outputs
                .iter()
                .map(|o| {
                    let t = o.as_ref().unwrap().sampled.token;
                    TOKENS.iter().position(|&x| x == t).unwrap()
                })
                .collect();
            assert_eq!(
                v.kept,
                picked
                    .iter()
                    .zip(&draft)
                    .take_while(|(p, d)| TOKENS[**p] == **d)
                    .count()
            );
            let cell = (picked[0], picked.get(1).copied());
            counts[want.iter().position(|w| w.0 == cell).unwrap()] += 1;
        }
        let chi: f64 = counts
            .iter()
            .zip(&want)
            .map(|(&c, (_, p))| {
                let e = p * trials as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum();
        // Six degrees of freedom, significance 1e-4.
        assert!(chi < 27.86, "{counts:?} vs {want:?}: chi-square {chi:.1}");
    }
}
