//! Single-request generation on a runner: chunked prefill, then one decode
//! step per token. The building block of `ingot generate` and
//! `ingot bench latency`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ingot_core::{FinishReason, SamplingParams, StopCriteria, TokenId};
use ingot_kv_cache::BlockPool;
use ingot_runner::{ForwardBatch, ModelRunner, SequenceChunk};
use ingot_tokenizer::Tokenizer;

use crate::sequence::{Sequence, TokenOutput};
use crate::EngineError;

/// Timings and counts of one generation.
#[derive(Debug, Clone, Default)]
pub struct GenerationStats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Time to run the whole prompt and sample the first token.
    pub prefill: Duration,
    /// Time of each later decode step (forward + sampling).
    pub decode_steps: Vec<Duration>,
    /// Why generation ended.
    pub finish_reason: Option<FinishReason>,
}

/// Runs one sequence at a time on a runner.
pub struct Generator {
    runner: Box<dyn ModelRunner>,
    pool: BlockPool,
    tokenizer: Arc<Tokenizer>,
    /// Longest prefill chunk per forward pass.
    prefill_chunk: usize,
}

impl Generator {
    /// Wraps a runner; the block pool mirrors the runner's KV pool.
    pub fn new(
        runner: Box<dyn ModelRunner>,
        tokenizer: Arc<Tokenizer>,
        prefill_chunk: usize,
    ) -> Self {
        let shape = runner.kv_cache_shape();
        Self {
            pool: BlockPool::new(shape.num_blocks, shape.block_size, false),
            runner,
            tokenizer,
            prefill_chunk: prefill_chunk.max(1),
        }
    }

    /// The runner.
    pub fn runner(&self) -> &dyn ModelRunner {
        self.runner.as_ref()
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Generates from `prompt`, calling `on_token` for every sampled token.
    pub fn generate(
        &mut self,
        prompt: Vec<TokenId>,
        params: SamplingParams,
        criteria: StopCriteria,
        on_token: &mut dyn FnMut(&TokenOutput),
    ) -> Result<GenerationStats, EngineError> {
        params.validate()?;
        let max_context = self.runner.config().max_context;
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() + criteria.max_tokens.max(1) > max_context {
            return Err(EngineError::ContextExceeded {
                prompt_tokens: prompt.len(),
                max_tokens: criteria.max_tokens,
                max_context,
            });
        }
        let mut stats = GenerationStats {
            prompt_tokens: prompt.len(),
            ..Default::default()
        };
        let mut seq = Sequence::new(
            prompt,
            params,
            criteria,
            self.tokenizer.clone(),
            max_context,
        );
        let result = self.run(&mut seq, &mut stats, on_token);
        self.pool.release(&mut seq.block_table);
        result.map(|()| stats)
    }

    fn run(
        &mut self,
        seq: &mut Sequence,
        stats: &mut GenerationStats,
        on_token: &mut dyn FnMut(&TokenOutput),
    ) -> Result<(), EngineError> {
        let start = Instant::now();
        let mut logits = Vec::new();
        loop {
            let step_start = Instant::now();
            let pending = seq.pending_tokens();
            let n = pending.len().min(self.prefill_chunk);
            self.pool
                .reserve(&mut seq.block_table, seq.num_computed + n)?;
            let batch = ForwardBatch {
                chunks: vec![SequenceChunk {
                    tokens: &pending[..n],
                    start_pos: seq.num_computed,
                    block_table: seq.block_table.blocks(),
                }],
            };
            let row = self.runner.forward(&batch)?;
            seq.num_computed += n;
            if n < pending.len() {
                continue; // more prompt to prefill
            }
            logits.clear();
            logits.extend_from_slice(row);
            let out = seq.accept_logits(&mut logits)?;
            on_token(&out);
            if stats.completion_tokens == 0 {
                stats.prefill = start.elapsed();
            } else {
                stats.decode_steps.push(step_start.elapsed());
            }
            stats.completion_tokens += 1;
            if let Some(reason) = out.finish {
                stats.finish_reason = Some(reason);
                return Ok(());
            }
        }
    }
}
