//! Prompts for `ingot bench serve`: seeded, synthetic, with exact token
//! counts when a tokenizer is given.
//!
//! A dataset is an endless seeded stream of [`Conversation`]s (one turn
//! each, except `multiturn`); the same options and seed give the same
//! prompts. Lengths are drawn uniformly from `[len·(1−r), len·(1+r)]` with
//! `r = --range-ratio` (vLLM's `RandomDataset`).
//!
//! - `random`: each prompt is `--input-len` tokens of random text. Text is
//!   made like vLLM's `RandomDataset`: sample ids uniformly from the
//!   vocabulary minus special tokens, decode, re-encode, then cut or pad the
//!   ids and repeat (at most 10 times) until the re-encoded text has exactly
//!   the target length. For `/v1/completions` the tokens the tokenizer adds
//!   itself (BOS) are part of the length, so the server's `prompt_tokens` is
//!   `--input-len`; for chat, the length is the user message's (the server
//!   adds its template around it).
//! - `sharegpt`: random text whose lengths follow a log-normal fit of
//!   ShareGPT (the conversations vLLM, SGLang and the vLLM paper benchmark
//!   with): input median 98, σ 1.0; output median 245, σ 0.8 (natural log).
//!   The medians are chosen so that the means, exp(μ + σ²/2), are the
//!   ShareGPT means reported in the vLLM paper (Kwon et al., SOSP 2023,
//!   §6.1 and Fig. 11: 161.31 input and 337.99 output tokens); the σ are
//!   ours, picked to give the long right tails of that figure's histograms.
//!   As in vLLM's ShareGPT loader, inputs are kept within 4..=1024 tokens
//!   and input + output within 2048 (here by clamping instead of
//!   rejecting). `--sharegpt-output-len` fixes the output length.
//!   `--input-len`, `--output-len` and `--range-ratio` are not used.
//! - `prefix`: `--prefix-groups` G random prefixes of `--prefix-len` P
//!   tokens; prompt i is prefix `i mod G` followed by a unique random suffix
//!   of `--input-len` tokens (measures prefix caching).
//! - `multiturn`: conversations of `--turns` T user messages of
//!   `--input-len` tokens each. A turn's prompt is the previous prompt, the
//!   previous response's text, then the new message (chat: the messages
//!   so far); its requests run one after another.
//! - `duplicate`: random prompts, of which a fraction `--duplicate-fraction`
//!   F (evenly spread: request i is a repeat when ⌊(i+1)F⌋ > ⌊iF⌋) are exact
//!   repeats (text and output length) of an earlier unique prompt, chosen
//!   uniformly. The workload for measuring ingot's response cache and
//!   request coalescing: F bounds the hit rate, and repeats that arrive
//!   while their original still runs are coalesced.
//!
//! Without a tokenizer, text is random common English words (most are one
//! token in BPE vocabularies, so lengths are close but not exact); records
//! then take `prompt_tokens` from the server's usage.

use std::sync::Arc;

use ingot_tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::BenchError;

/// Which synthetic workload to generate.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetKind {
    /// Random text of `--input-len` tokens.
    Random,
    /// Random text with ShareGPT-like (log-normal) lengths.
    Sharegpt,
    /// Groups of prompts sharing a `--prefix-len` prefix.
    Prefix,
    /// Conversations of `--turns` sequential requests.
    Multiturn,
    /// A `--duplicate-fraction` of exact repeats: measures the response
    /// cache (hit rate and coalescing in the report).
    Duplicate,
}

/// The shape of a dataset.
#[derive(Debug, Clone)]
pub struct DatasetConfig {
    /// Which workload.
    pub kind: DatasetKind,
    /// Prompt (or suffix, or user message) tokens.
    pub input_len: usize,
    /// Tokens to generate (`max_tokens`).
    pub output_len: usize,
    /// Lengths are uniform within ±ratio of the above.
    pub range_ratio: f64,
    /// `prefix`: number of shared prefixes.
    pub prefix_groups: usize,
    /// `prefix`: tokens in each shared prefix.
    pub prefix_len: usize,
    /// `prefix`: draw each request's prefix at random instead of in turn.
    pub prefix_random: bool,
    /// `multiturn`: requests per conversation.
    pub turns: usize,
    /// `duplicate`: fraction of prompts that repeat an earlier one.
    pub duplicate_fraction: f64,
    /// `sharegpt`: a fixed output length instead of the distribution.
    pub sharegpt_output_len: Option<usize>,
    /// Count the tokens the tokenizer adds (BOS) in the prompt length
    /// (`/v1/completions`; not for chat, where the template adds its own).
    pub count_special: bool,
    /// RNG seed.
    pub seed: u64,
}

/// One request's new user text and how much to generate for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// The prompt (single-turn) or the new user message (multi-turn).
    pub text: String,
    /// Tokens of `text` (exact with a tokenizer, with BOS when counted).
    pub tokens: usize,
    /// `max_tokens`.
    pub output_len: usize,
}

/// Requests that run one after another (a single turn outside `multiturn`).
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    /// In order.
    pub turns: Vec<Turn>,
}

/// Log-normal ShareGPT fit, see the module doc: (median, σ) of ln(tokens).
const SHAREGPT_INPUT: (f64, f64) = (97.84, 1.0);
const SHAREGPT_OUTPUT: (f64, f64) = (245.43, 0.8);
/// vLLM's ShareGPT filter bounds.
const SHAREGPT_MIN: usize = 4;
const SHAREGPT_MAX_INPUT: usize = 1024;
const SHAREGPT_MAX_TOTAL: usize = 2048;

/// An endless seeded stream of conversations.
pub struct Dataset {
    cfg: DatasetConfig,
    text: TextSource,
    rng: ChaCha8Rng,
    /// Conversations made so far.
    made: usize,
    /// `prefix`: the shared prefixes and their token counts.
    prefixes: Vec<(String, usize)>,
    /// `duplicate`: the unique prompts so far.
    uniques: Vec<Turn>,
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset")
            .field("cfg", &self.cfg)
            .field("made", &self.made)
            .finish_non_exhaustive()
    }
}

impl Dataset {
    /// Checks `cfg` and prepares the stream (`prefix` makes its prefixes).
    pub fn new(
        cfg: DatasetConfig,
        tokenizer: Option<Arc<Tokenizer>>,
    ) -> Result<Dataset, BenchError> {
        let bad = |m: &str| Err(BenchError::Options(m.into()));
        if !(0.0..1.0).contains(&cfg.range_ratio) {
            return bad("--range-ratio must be in [0, 1)");
        }
        if cfg.kind != DatasetKind::Sharegpt && (cfg.input_len == 0 || cfg.output_len == 0) {
            return bad("--input-len and --output-len must be positive");
        }
        if cfg.sharegpt_output_len == Some(0) {
            return bad("--sharegpt-output-len must be positive");
        }
        if cfg.kind == DatasetKind::Prefix && (cfg.prefix_groups == 0 || cfg.prefix_len == 0) {
            return bad("--prefix-groups and --prefix-len must be positive");
        }
        if cfg.kind == DatasetKind::Multiturn && cfg.turns == 0 {
            return bad("--turns must be positive");
        }
        if !(0.0..1.0).contains(&cfg.duplicate_fraction) {
            return bad("--duplicate-fraction must be in [0, 1)");
        }
        let text = TextSource::new(tokenizer, cfg.count_special)?;
        let mut ds = Dataset {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            text,
            made: 0,
            prefixes: Vec::new(),
            uniques: Vec::new(),
        };
        if ds.cfg.kind == DatasetKind::Prefix {
            for _ in 0..ds.cfg.prefix_groups {
                let text = ds.text.random(&mut ds.rng, ds.cfg.prefix_len)?;
                let tokens = ds.text.count(&text, false)?;
                ds.prefixes.push((text, tokens));
            }
        }
        Ok(ds)
    }

    /// Conversations holding exactly `n` requests (`multiturn`: the last
    /// one cut short).
    pub fn take_requests(&mut self, n: usize) -> Result<Vec<Conversation>, BenchError> {
        let mut out = Vec::new();
        let mut left = n;
        while left > 0 {
            let mut c = self.next_conversation()?;
            c.turns.truncate(left);
            left -= c.turns.len();
            out.push(c);
        }
        Ok(out)
    }

    /// The next conversation.
    pub fn next_conversation(&mut self) -> Result<Conversation, BenchError> {
        let i = self.made;
        self.made += 1;
        let turns = match self.cfg.kind {
            DatasetKind::Random => vec![self.random_turn()?],
            DatasetKind::Sharegpt => vec![self.sharegpt_turn()?],
            DatasetKind::Prefix => {
                let suffix_len = self.sample_len(self.cfg.input_len);
                let output_len = self.sample_len(self.cfg.output_len);
                let group = if self.cfg.prefix_random {
                    self.rng.random_range(0..self.prefixes.len())
                } else {
                    i % self.prefixes.len()
                };
                let (prefix, prefix_tokens) = self.prefixes[group].clone();
                let want = self.text.special_added() + prefix_tokens + suffix_len;
                // Tokens may merge across the seam: a few tries for a suffix
                // that keeps the total exact, else the count as it is.
                let mut turn = None;
                for _ in 0..5 {
                    let text = prefix.clone() + &self.text.random(&mut self.rng, suffix_len)?;
                    let tokens = self.text.count(&text, true)?;
                    let exact = tokens == want;
                    turn = Some(Turn {
                        text,
                        tokens,
                        output_len,
                    });
                    if exact {
                        break;
                    }
                }
                turn.into_iter().collect()
            }
            DatasetKind::Multiturn => {
                let mut turns = vec![self.random_turn()?];
                for _ in 1..self.cfg.turns {
                    let len = self.sample_len(self.cfg.input_len);
                    let text = self.text.random(&mut self.rng, len)?;
                    let tokens = self.text.count(&text, false)?;
                    turns.push(Turn {
                        text,
                        tokens,
                        output_len: self.sample_len(self.cfg.output_len),
                    });
                }
                turns
            }
            DatasetKind::Duplicate => {
                let f = self.cfg.duplicate_fraction;
                let repeat = ((i + 1) as f64 * f).floor() > (i as f64 * f).floor();
                if repeat && !self.uniques.is_empty() {
                    let k = self.rng.random_range(0..self.uniques.len());
                    vec![self.uniques[k].clone()]
                } else {
                    let t = self.random_turn()?;
                    self.uniques.push(t.clone());
                    vec![t]
                }
            }
        };
        Ok(Conversation { turns })
    }

    /// A prompt of `--input-len` (±ratio) tokens, specials included.
    fn random_turn(&mut self) -> Result<Turn, BenchError> {
        let len = self.sample_len(self.cfg.input_len);
        let output_len = self.sample_len(self.cfg.output_len);
        self.prompt_of_len(len, output_len)
    }

    fn sharegpt_turn(&mut self) -> Result<Turn, BenchError> {
        let input = lognormal(&mut self.rng, SHAREGPT_INPUT)
            .clamp(SHAREGPT_MIN as f64, SHAREGPT_MAX_INPUT as f64)
            .round() as usize;
        let output = lognormal(&mut self.rng, SHAREGPT_OUTPUT)
            .clamp(SHAREGPT_MIN as f64, (SHAREGPT_MAX_TOTAL - input) as f64)
            .round() as usize;
        self.prompt_of_len(input, self.cfg.sharegpt_output_len.unwrap_or(output))
    }

    fn prompt_of_len(&mut self, len: usize, output_len: usize) -> Result<Turn, BenchError> {
        let body = len.saturating_sub(self.text.special_added()).max(1);
        let text = self.text.random(&mut self.rng, body)?;
        let tokens = self.text.count(&text, true)?;
        Ok(Turn {
            text,
            tokens,
            output_len,
        })
    }

    /// Uniform in `[len·(1−r), len·(1+r)]`, at least 1.
    fn sample_len(&mut self, len: usize) -> usize {
        let r = self.cfg.range_ratio;
        if r == 0.0 {
            return len.max(1);
        }
        let lo = (len as f64 * (1.0 - r)).floor() as usize;
        let hi = (len as f64 * (1.0 + r)).ceil() as usize;
        self.rng.random_range(lo..=hi.max(lo)).max(1)
    }
}

/// A log-normal sample with the given (median, σ).
fn lognormal(rng: &mut ChaCha8Rng, (median, sigma): (f64, f64)) -> f64 {
    // Box–Muller; 1 − u is in (0, 1], so the log is finite.
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    median * (sigma * z).exp()
}

/// Where random text comes from.
enum TextSource {
    /// A tokenizer: exact lengths.
    Tokens {
        tokenizer: Arc<Tokenizer>,
        /// Ids to sample from: the vocabulary minus special tokens.
        ids: Vec<u32>,
        /// Tokens `encode(.., true)` adds (BOS/EOS), when counted.
        special: usize,
    },
    /// Common words, about one token each.
    Words,
}

/// Frequent English words; with a leading space each is one token in the
/// common BPE vocabularies (GPT-2, Llama, Qwen, SmolLM), so n words ≈ n tokens.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at",
    "from", "his", "her", "it", "an", "were", "are", "which", "this", "be", "or", "has", "had",
    "not", "but", "their", "first", "one", "new", "after", "who", "they", "have", "been", "also",
    "its", "two", "all", "more", "when", "time", "other", "there", "into", "would", "during",
    "most", "only", "over", "some", "year", "city", "world", "state", "team", "school", "music",
    "film", "game", "work", "life", "water", "house", "family", "people", "group", "river",
    "church", "book", "story", "war", "king", "road", "line", "light", "small", "large", "great",
    "long", "high", "early", "later", "north", "south", "east", "west", "three", "four", "five",
    "many", "such", "made", "used", "known", "called", "found", "became",
];

impl TextSource {
    fn new(
        tokenizer: Option<Arc<Tokenizer>>,
        count_special: bool,
    ) -> Result<TextSource, BenchError> {
        let Some(tokenizer) = tokenizer else {
            return Ok(TextSource::Words);
        };
        let ids: Vec<u32> = (0..tokenizer.vocab_size() as u32)
            .filter(|&id| !tokenizer.is_special(id) && tokenizer.id_to_token(id).is_some())
            .collect();
        if ids.is_empty() {
            return Err(BenchError::Options(
                "--tokenizer: the vocabulary has no ordinary tokens".into(),
            ));
        }
        let special = if count_special {
            let with = encode(&tokenizer, "a", true)?.len();
            with.saturating_sub(encode(&tokenizer, "a", false)?.len())
        } else {
            0
        };
        Ok(TextSource::Tokens {
            tokenizer,
            ids,
            special,
        })
    }

    /// Tokens the server's tokenizer adds to a prompt on its own.
    fn special_added(&self) -> usize {
        match self {
            TextSource::Tokens { special, .. } => *special,
            TextSource::Words => 0,
        }
    }

    /// Tokens of `text`; with `with_special`, plus what the tokenizer adds.
    fn count(&self, text: &str, with_special: bool) -> Result<usize, BenchError> {
        match self {
            TextSource::Tokens {
                tokenizer, special, ..
            } => {
                Ok(encode(tokenizer, text, false)?.len() + if with_special { *special } else { 0 })
            }
            TextSource::Words => Ok(text.split_whitespace().count()),
        }
    }

    /// Random text of `len` tokens (exact unless 10 rounds did not converge,
    /// which `count` then shows).
    fn random(&self, rng: &mut ChaCha8Rng, len: usize) -> Result<String, BenchError> {
        let (tokenizer, ids) = match self {
            TextSource::Words => {
                // Each word with its leading space, so texts concatenate.
                let mut text = String::with_capacity(len * 6);
                for _ in 0..len {
                    text.push(' ');
                    text.push_str(WORDS[rng.random_range(0..WORDS.len())]);
                }
                return Ok(text);
            }
            TextSource::Tokens { tokenizer, ids, .. } => (tokenizer, ids),
        };
        let pick = |n: usize, rng: &mut ChaCha8Rng| -> Vec<u32> {
            (0..n)
                .map(|_| ids[rng.random_range(0..ids.len())])
                .collect()
        };
        let mut tokens = pick(len, rng);
        let mut text = String::new();
        for _ in 0..10 {
            text = decode(tokenizer, &tokens)?;
            let again = encode(tokenizer, &text, false)?;
            if again.len() == len {
                break;
            }
            tokens = again;
            if tokens.len() > len {
                tokens.truncate(len);
            } else {
                let more = pick(len - tokens.len(), rng);
                tokens.extend(more);
            }
        }
        Ok(text)
    }
}

fn encode(t: &Tokenizer, text: &str, special: bool) -> Result<Vec<u32>, BenchError> {
    t.encode(text, special)
        .map_err(|e| BenchError::Options(format!("--tokenizer: {e}")))
}

fn decode(t: &Tokenizer, ids: &[u32]) -> Result<String, BenchError> {
    t.decode(ids, false)
        .map_err(|e| BenchError::Options(format!("--tokenizer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(kind: DatasetKind) -> DatasetConfig {
        DatasetConfig {
            kind,
            input_len: 20,
            output_len: 5,
            range_ratio: 0.0,
            prefix_groups: 2,
            prefix_len: 10,
            prefix_random: false,
            turns: 3,
            duplicate_fraction: 0.5,
            sharegpt_output_len: None,
            count_special: true,
            seed: 7,
        }
    }

    fn take(kind: DatasetKind, n: usize) -> Vec<Conversation> {
        Dataset::new(cfg(kind), None)
            .unwrap()
            .take_requests(n)
            .unwrap()
    }

    #[test]
    fn seeded_and_shaped() {
        let a = take(DatasetKind::Random, 5);
        assert_eq!(a, take(DatasetKind::Random, 5));
        assert_eq!(a.len(), 5);
        assert!(a
            .iter()
            .all(|c| c.turns.len() == 1 && c.turns[0].tokens == 20 && c.turns[0].output_len == 5));
        assert_ne!(a[0].turns[0].text, a[1].turns[0].text);
    }

    #[test]
    fn multiturn_counts_requests_not_conversations() {
        let c = take(DatasetKind::Multiturn, 7);
        let turns: Vec<usize> = c.iter().map(|c| c.turns.len()).collect();
        assert_eq!(turns, [3, 3, 1]);
    }

    #[test]
    fn prefix_groups_share_their_prefix() {
        let mut d = Dataset::new(cfg(DatasetKind::Prefix), None).unwrap();
        let c = d.take_requests(4).unwrap();
        let text = |i: usize| c[i].turns[0].text.as_str();
        let (p0, p1) = (&d.prefixes[0].0, &d.prefixes[1].0);
        assert_ne!(p0, p1);
        assert!(text(0).starts_with(p0.as_str()) && text(2).starts_with(p0.as_str()));
        assert!(text(1).starts_with(p1.as_str()) && text(3).starts_with(p1.as_str()));
        assert_ne!(text(0), text(2));
        assert!(c.iter().all(|c| c.turns[0].tokens == 30));
    }

    #[test]
    fn random_prefixes_are_not_in_turn_but_all_used() {
        let mut d = Dataset::new(
            DatasetConfig {
                prefix_groups: 4,
                prefix_random: true,
                ..cfg(DatasetKind::Prefix)
            },
            None,
        )
        .unwrap();
        let c = d.take_requests(64).unwrap();
        let groups: Vec<usize> = c
            .iter()
            .map(|c| {
                let t = &c.turns[0].text;
                d.prefixes.iter().position(|p| t.starts_with(&p.0)).unwrap()
            })
            .collect();
        assert!((0..4).all(|g| groups.contains(&g)), "{groups:?}");
        let in_turn: Vec<usize> = (0..64).map(|i| i % 4).collect();
        assert_ne!(groups, in_turn);
    }

    #[test]
    fn duplicates_are_exact_repeats_at_the_given_fraction() {
        let c = take(DatasetKind::Duplicate, 10);
        let texts: Vec<&str> = c.iter().map(|c| c.turns[0].text.as_str()).collect();
        let unique: std::collections::HashSet<&str> = texts.iter().copied().collect();
        assert_eq!(unique.len(), 5);
    }

    #[test]
    fn sharegpt_lengths_follow_the_fit() {
        let mut d = Dataset::new(cfg(DatasetKind::Sharegpt), None).unwrap();
        let mut ins = Vec::new();
        let mut outs = Vec::new();
        for _ in 0..2000 {
            let t = &d.next_conversation().unwrap().turns[0];
            ins.push(t.tokens);
            outs.push(t.output_len);
            assert!((SHAREGPT_MIN..=SHAREGPT_MAX_INPUT).contains(&t.tokens));
            assert!(t.tokens + t.output_len <= SHAREGPT_MAX_TOTAL);
        }
        ins.sort_unstable();
        outs.sort_unstable();
        let (mi, mo) = (ins[1000] as f64, outs[1000] as f64);
        assert!((80.0..120.0).contains(&mi), "input median {mi}");
        assert!((210.0..280.0).contains(&mo), "output median {mo}");
        let mean = ins.iter().sum::<usize>() as f64 / 2000.0;
        assert!((135.0..185.0).contains(&mean), "input mean {mean}");
    }

    #[test]
    fn range_ratio_spreads_lengths() {
        let mut c = cfg(DatasetKind::Random);
        c.range_ratio = 0.5;
        let mut d = Dataset::new(c, None).unwrap();
        let lens: Vec<usize> = (0..200)
            .map(|_| d.next_conversation().unwrap().turns[0].tokens)
            .collect();
        assert!(lens.iter().all(|&l| (10..=30).contains(&l)));
        assert!(lens.iter().min() < Some(&13) && lens.iter().max() > Some(&27));
    }

    #[test]
    fn bad_options_are_named() {
        let mut c = cfg(DatasetKind::Duplicate);
        c.duplicate_fraction = 1.0;
        let e = Dataset::new(c, None).unwrap_err().to_string();
        assert!(e.contains("--duplicate-fraction"), "{e}");
    }
}
