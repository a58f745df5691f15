//! Sampling on the device: each row's knobs, random bits and seen tokens go
//! up in one copy from pinned memory, and `sample_rows` writes the picked
//! ids where the greedy argmax writes them, so only ids come back (and,
//! for rows that ask, 42 words of logprobs). Rows under a grammar first
//! have their refused tokens set to -inf by `apply_token_masks`, from
//! bitsets staged the same way, and rows with a `logit_bias` then have it
//! added by `apply_logit_bias` (one sparse add over the batch). Both run
//! on the stream after the forward pass (a replayed graph or a
//! launch-ahead step included), before the sampler and its logprobs.

use ingot_core::{TokenId, MAX_LOGIT_BIAS};
use ingot_runner::{Logprobs, RowSampling, TokenLogprob};

use crate::device::{Arena, Arg, DevPtr, Gpu, Kernel, Pinned};
use crate::CudaError;

/// 32-bit words of one row's `SampleParams` (see `sampling.cu`).
const PARAM_WORDS: usize = 12;
/// Threads of one `sample_rows` block (its `SAMPLE_THREADS`).
const SAMPLE_THREADS: u32 = 512;
/// Most alternatives per row (the kernel's `MAX_TOP_LOGPROBS`, the API's limit).
const MAX_TOP_LOGPROBS: usize = 20;
/// 32-bit words of one row's `RowLogprobs`: chosen, count, ids, values.
const LOGPROB_WORDS: usize = 2 + 2 * MAX_TOP_LOGPROBS;

/// Threads of one `apply_token_masks` block.
const MASK_THREADS: u32 = 256;
/// Threads of one `apply_logit_bias` block.
const BIAS_THREADS: u32 = 256;
/// 32-bit words of one bias entry: row, token, bias bits.
const BIAS_WORDS: usize = 3;

/// The device side of sampling: parameters and seen tokens, staged, and
/// the logprobs coming back.
pub struct DeviceSampler {
    kernel: Kernel,
    mask_kernel: Kernel,
    /// Grammar masks (`mask_words` per row) then their row indices, staged
    /// and on the device.
    masks_dev: DevPtr,
    masks_host: Pinned<u32>,
    mask_words: usize,
    bias_kernel: Kernel,
    /// Bias entries of every biased row, staged and on the device.
    bias_dev: DevPtr,
    bias_host: Pinned<u32>,
    /// Parameters and seen pairs (uploaded each step).
    dev: DevPtr,
    host: Pinned<u32>,
    /// The seen tokens' logits before the penalties (device scratch).
    seen_raw: DevPtr,
    /// `RowLogprobs` per row, and their host copy.
    logprobs_dev: DevPtr,
    logprobs_host: Pinned<u32>,
    max_rows: usize,
    arena: Arena,
}

impl DeviceSampler {
    /// Room for `max_rows` rows of `vocab` logits and `max_seen` (token,
    /// count) pairs in all.
    pub fn new(
        gpu: &Gpu,
        max_rows: usize,
        max_seen: usize,
        vocab: usize,
    ) -> Result<Self, CudaError> {
        let words = Self::words(max_rows, max_seen);
        let lp_words = max_rows * LOGPROB_WORDS;
        let mask_words = vocab.div_ceil(32);
        let staged_masks = max_rows * (mask_words + 1);
        let bias_words = max_rows * MAX_LOGIT_BIAS * BIAS_WORDS;
        let pieces = [
            words * 4,
            max_seen * 4,
            lp_words * 4,
            staged_masks * 4,
            bias_words * 4,
        ];
        let mut arena = Arena::new(gpu, "sampling", Arena::size_of(pieces))?;
        Ok(Self {
            kernel: gpu.kernel("sample_rows")?,
            mask_kernel: gpu.kernel("apply_token_masks")?,
            masks_dev: arena.take(pieces[3])?,
            masks_host: Pinned::new(gpu, staged_masks)?,
            mask_words,
            bias_kernel: gpu.kernel("apply_logit_bias")?,
            bias_dev: arena.take(pieces[4])?,
            bias_host: Pinned::new(gpu, bias_words)?,
            dev: arena.take(pieces[0])?,
            host: Pinned::new(gpu, words)?,
            seen_raw: arena.take(pieces[1])?,
            logprobs_dev: arena.take(pieces[2])?,
            logprobs_host: Pinned::new(gpu, lp_words)?,
            max_rows,
            arena,
        })
    }

    fn words(max_rows: usize, max_seen: usize) -> usize {
        max_rows * PARAM_WORDS + 2 * max_seen
    }

    /// Device bytes reserved.
    pub fn bytes(&self) -> usize {
        self.arena.size()
    }

    /// Stages `rows`, uploads them and enqueues the kernel, which applies
    /// the penalties to `logits` in place, writes one id per row to `out`
    /// and, for rows that ask, their logprobs; those are then copied back
    /// (read them with [`Self::logprobs`] once the stream has passed here).
    /// `masks` (one per row, or empty) are applied first, then the rows'
    /// logit biases.
    pub fn launch(
        &mut self,
        gpu: &Gpu,
        rows: &[RowSampling<'_>],
        masks: &[Option<Vec<u32>>],
        logits: DevPtr,
        vocab: usize,
        out: DevPtr,
    ) -> Result<(), CudaError> {
        self.apply_masks(gpu, masks, logits, vocab)?;
        self.apply_bias(gpu, rows, logits, vocab)?;
        let used = encode_rows(self.host.as_mut_slice(), self.max_rows, rows)?;
        gpu.upload(self.dev, &self.host.as_slice()[..used])?;
        let seen = self.dev + (rows.len() * PARAM_WORDS * 4) as u64;
        let args = [
            Arg::Ptr(logits),
            Arg::I32(vocab as i32),
            Arg::Ptr(self.dev),
            Arg::Ptr(seen),
            Arg::Ptr(out),
            Arg::Ptr(self.seen_raw),
            Arg::Ptr(self.logprobs_dev),
        ];
        gpu.launch(
            &self.kernel,
            (rows.len() as u32, 1, 1),
            SAMPLE_THREADS,
            0,
            &args,
        )?;
        if rows.iter().any(|r| r.params.logprobs.is_some()) {
            let host = &mut self.logprobs_host.as_mut_slice()[..rows.len() * LOGPROB_WORDS];
            gpu.download(host, self.logprobs_dev)?;
        }
        Ok(())
    }

    /// Stages the rows' grammar masks and enqueues `apply_token_masks` on
    /// them (nothing when no row has one).
    fn apply_masks(
        &mut self,
        gpu: &Gpu,
        masks: &[Option<Vec<u32>>],
        logits: DevPtr,
        vocab: usize,
    ) -> Result<(), CudaError> {
        let count = encode_masks(
            self.masks_host.as_mut_slice(),
            self.mask_words,
            self.max_rows,
            masks,
        )?;
        if count == 0 {
            return Ok(());
        }
        let words = self.mask_words;
        // Staged as [count masks][count row indices]; upload just those.
        let host = self.masks_host.as_slice();
        let (bits, rows_at) = (count * words, self.max_rows * words);
        gpu.upload(self.masks_dev, &host[..bits])?;
        let rows_dev = self.masks_dev + (rows_at * 4) as u64;
        gpu.upload(rows_dev, &host[rows_at..rows_at + count])?;
        let args = [
            Arg::Ptr(logits),
            Arg::I32(vocab as i32),
            Arg::Ptr(self.masks_dev),
            Arg::I32(words as i32),
            Arg::Ptr(rows_dev),
        ];
        gpu.launch(
            &self.mask_kernel,
            (count as u32, 1, 1),
            MASK_THREADS,
            0,
            &args,
        )
    }

    /// Stages the rows' logit biases and enqueues `apply_logit_bias` on
    /// them (nothing when no row has one).
    fn apply_bias(
        &mut self,
        gpu: &Gpu,
        rows: &[RowSampling<'_>],
        logits: DevPtr,
        vocab: usize,
    ) -> Result<(), CudaError> {
        let count = encode_bias(self.bias_host.as_mut_slice(), rows)?;
        if count == 0 {
            return Ok(());
        }
        gpu.upload(
            self.bias_dev,
            &self.bias_host.as_slice()[..count * BIAS_WORDS],
        )?;
        let args = [
            Arg::Ptr(logits),
            Arg::I32(vocab as i32),
            Arg::Ptr(self.bias_dev),
            Arg::I32(count as i32),
        ];
        let blocks = count.div_ceil(BIAS_THREADS as usize) as u32;
        gpu.launch(&self.bias_kernel, (blocks, 1, 1), BIAS_THREADS, 0, &args)
    }

    /// Row `i`'s logprobs from the last launch (which must have asked).
    pub fn logprobs(&self, i: usize) -> Logprobs {
        decode_logprobs(&self.logprobs_host.as_slice()[i * LOGPROB_WORDS..(i + 1) * LOGPROB_WORDS])
    }
}

/// Writes the constrained rows' masks (each cut or padded with zeros to
/// `words`) from the start of `staging` and their row indices from word
/// `max_rows * words`; returns how many rows are constrained.
fn encode_masks(
    staging: &mut [u32],
    words: usize,
    max_rows: usize,
    masks: &[Option<Vec<u32>>],
) -> Result<usize, CudaError> {
    if masks.len() > max_rows || staging.len() < max_rows * (words + 1) {
        return Err(CudaError::Unsupported(format!(
            "{} masked rows exceed the staging buffer of {max_rows}",
            masks.len()
        )));
    }
    let (bits, rows) = staging.split_at_mut(max_rows * words);
    let mut count = 0;
    for (row, mask) in masks.iter().enumerate() {
        let Some(mask) = mask else { continue };
        let dst = &mut bits[count * words..(count + 1) * words];
        let n = mask.len().min(words);
        dst[..n].copy_from_slice(&mask[..n]);
        dst[n..].fill(0);
        rows[count] = row as u32;
        count += 1;
    }
    Ok(count)
}

/// Writes every row's bias entries (row, token, bias bits) into `staging`;
/// returns how many there are.
fn encode_bias(staging: &mut [u32], rows: &[RowSampling<'_>]) -> Result<usize, CudaError> {
    let count: usize = rows.iter().map(|r| r.params.logit_bias.len()).sum();
    if count * BIAS_WORDS > staging.len() {
        return Err(CudaError::Unsupported(format!(
            "{count} logit_bias entries exceed the staging buffer"
        )));
    }
    let entries = rows.iter().enumerate().flat_map(|(row, r)| {
        r.params
            .logit_bias
            .iter()
            .map(move |&(token, bias)| [row as u32, token, bias.to_bits()])
    });
    for (dst, entry) in staging.chunks_exact_mut(BIAS_WORDS).zip(entries) {
        dst.copy_from_slice(&entry);
    }
    Ok(count)
}

/// One `RowLogprobs` (see `sampling.cu`).
fn decode_logprobs(words: &[u32]) -> Logprobs {
    let count = (words[1] as usize).min(MAX_TOP_LOGPROBS);
    let (ids, values) = words[2..].split_at(MAX_TOP_LOGPROBS);
    Logprobs {
        chosen: f32::from_bits(words[0]),
        top: ids[..count]
            .iter()
            .zip(&values[..count])
            .map(|(&token, &v)| TokenLogprob {
                token: token as TokenId,
                logprob: f32::from_bits(v),
            })
            .collect(),
    }
}

/// Writes the rows' parameters, then all seen pairs, into `words`; returns
/// the words used.
fn encode_rows(
    words: &mut [u32],
    max_rows: usize,
    rows: &[RowSampling<'_>],
) -> Result<usize, CudaError> {
    let seen_total: usize = rows.iter().map(|r| r.seen.len()).sum();
    let used = rows.len() * PARAM_WORDS + 2 * seen_total;
    if rows.len() > max_rows || used > words.len() {
        return Err(CudaError::Unsupported(format!(
            "{} sampling rows with {seen_total} seen tokens exceed the staging buffer",
            rows.len()
        )));
    }
    let (params, seen) = words.split_at_mut(rows.len() * PARAM_WORDS);
    let mut start = 0;
    for (r, words) in rows.iter().zip(params.chunks_exact_mut(PARAM_WORDS)) {
        let p = r.params;
        let top_k = u32::try_from(p.top_k)
            .unwrap_or(u32::MAX)
            .min(i32::MAX as u32);
        words.copy_from_slice(&[
            p.temperature.to_bits(),
            p.top_p.to_bits(),
            p.min_p.to_bits(),
            p.repetition_penalty.to_bits(),
            p.frequency_penalty.to_bits(),
            p.presence_penalty.to_bits(),
            top_k,
            start as u32,
            r.seen.len() as u32,
            // -1: no logprobs.
            p.logprobs
                .map_or(u32::MAX, |n| n.min(MAX_TOP_LOGPROBS) as u32),
            r.random as u32,
            (r.random >> 32) as u32,
        ]);
        for (i, &(token, count)) in r.seen.iter().enumerate() {
            seen[2 * (start + i)] = token;
            seen[2 * (start + i) + 1] = count;
        }
        start += r.seen.len();
    }
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_core::SamplingParams;

    #[test]
    fn rows_are_laid_out_as_the_kernel_reads_them() {
        let seen_a = [(5, 0), (9, 2)];
        let seen_b = [(7, 1)];
        let sampled = SamplingParams {
            temperature: 0.5,
            top_k: 40,
            ..SamplingParams::GREEDY
        };
        let nucleus = SamplingParams {
            top_p: 0.9,
            logprobs: Some(3),
            ..SamplingParams::GREEDY
        };
        let rows = [
            RowSampling {
                params: &sampled,
                seen: &seen_a,
                random: 0x0123_4567_89ab_cdef,
            },
            RowSampling {
                params: &nucleus,
                seen: &seen_b,
                random: 0,
            },
        ];
        let mut words = vec![0u32; 64];
        let used = encode_rows(&mut words, 4, &rows).unwrap();
        assert_eq!(used, 2 * PARAM_WORDS + 6);
        assert_eq!(f32::from_bits(words[0]), 0.5);
        assert_eq!(words[6], 40);
        assert_eq!((words[7], words[8], words[9]), (0, 2, u32::MAX));
        assert_eq!((words[10], words[11]), (0x89ab_cdef, 0x0123_4567));
        assert_eq!(f32::from_bits(words[PARAM_WORDS + 1]), 0.9);
        assert_eq!(
            (
                words[PARAM_WORDS + 7],
                words[PARAM_WORDS + 8],
                words[PARAM_WORDS + 9]
            ),
            (2, 1, 3)
        );
        assert_eq!(&words[2 * PARAM_WORDS..used], &[5, 0, 9, 2, 7, 1]);
    }

    #[test]
    fn logprobs_are_read_as_the_kernel_writes_them() {
        let mut words = vec![0u32; LOGPROB_WORDS];
        words[0] = (-0.5f32).to_bits();
        words[1] = 2;
        words[2..4].copy_from_slice(&[7, 3]);
        words[2 + MAX_TOP_LOGPROBS] = (-0.25f32).to_bits();
        words[3 + MAX_TOP_LOGPROBS] = (-1.5f32).to_bits();
        let lp = decode_logprobs(&words);
        assert_eq!(lp.chosen, -0.5);
        assert_eq!(
            lp.top,
            [
                TokenLogprob {
                    token: 7,
                    logprob: -0.25
                },
                TokenLogprob {
                    token: 3,
                    logprob: -1.5
                }
            ]
        );
    }

    #[test]
    fn masks_are_staged_with_their_rows() {
        let masks = [None, Some(vec![0b101, 7, 9]), None, Some(vec![1])];
        let mut staging = vec![u32::MAX; 4 * 3];
        let count = encode_masks(&mut staging, 2, 4, &masks).unwrap();
        assert_eq!(count, 2);
        // Cut to 2 words; padded with zeros.
        assert_eq!(&staging[..4], &[0b101, 7, 1, 0]);
        assert_eq!(&staging[8..10], &[1, 3]);
        assert!(encode_masks(&mut staging, 2, 4, &vec![None; 5]).is_err());
    }

    #[test]
    fn biases_are_staged_with_their_rows() {
        let biased = SamplingParams {
            logit_bias: vec![(3, -100.0), (9, 2.5)],
            ..SamplingParams::GREEDY
        };
        let rows = [
            RowSampling::GREEDY,
            RowSampling {
                params: &biased,
                ..RowSampling::GREEDY
            },
        ];
        let mut staging = vec![0u32; 3 * BIAS_WORDS];
        assert_eq!(encode_bias(&mut staging, &rows).unwrap(), 2);
        assert_eq!(
            &staging[..6],
            &[1, 3, (-100f32).to_bits(), 1, 9, 2.5f32.to_bits()]
        );
        assert!(encode_bias(&mut staging[..3], &rows).is_err());
    }

    #[test]
    fn too_many_seen_tokens_is_an_error() {
        let seen = [(1, 1); 8];
        let rows = [RowSampling {
            seen: &seen,
            ..RowSampling::GREEDY
        }];
        assert!(encode_rows(&mut [0u32; 20], 4, &rows).is_err());
    }
}
