//! Tensor parallelism's maths on the CPU: rank runners (each loaded with
//! its rank's config from an [`ingot_models::parallel::ShardedSource`])
//! computed in turn, block by block, their residual updates summed after
//! every block as the GPUs' all-reduce sums them, and their LM-head rows
//! joined as the GPUs' all-gather joins them. Equal to the unsharded
//! forward up to f32 rounding: the sharding plan is checked without GPUs.

use ingot_arch::{AttentionSpec, DecoderOps, EmbedSpec, HeadSpec, MlpSpec, MoeSpec, NextNorm};
use ingot_runner::{ForwardBatch, RunnerError};

use crate::block_ops::CpuOps;
use crate::CpuRunner;

/// The full logits of `batch` (one row per chunk) from `ranks`, rank `r`
/// holding rank `r`'s share of the model.
pub fn forward_sharded(
    ranks: &mut [CpuRunner],
    batch: &ForwardBatch<'_>,
) -> Result<Vec<f32>, RunnerError> {
    let config = ranks
        .first()
        .map(|r| r.config.clone())
        .ok_or_else(|| RunnerError::Backend("no ranks".into()))?;
    if config.block.post_norms {
        // A post-norm normalises the summed output, not each rank's part.
        return Err(RunnerError::Backend(
            "the simulation sums block outputs; post-norm blocks are not covered".into(),
        ));
    }
    for r in ranks.iter() {
        ingot_runner::validate_grouped(&r.config, r.kv_shape, &r.layout, batch)?;
    }
    let mut shards = Shards(ranks.iter_mut().map(|r| r.ops(batch)).collect());
    ingot_arch::forward(&config, &mut shards)?;
    Ok(shards.joined_logits(batch.chunks.len()))
}

/// Every rank's ops for one step.
struct Shards<'a, 'b>(Vec<CpuOps<'a, 'b>>);

impl Shards<'_, '_> {
    /// Runs a block on every rank from the same residual, then gives each
    /// the residual plus the sum of the ranks' updates.
    fn summed(
        &mut self,
        mut block: impl FnMut(&mut CpuOps<'_, '_>) -> Result<(), RunnerError>,
    ) -> Result<(), RunnerError> {
        let Some(first) = self.0.first() else {
            return Ok(());
        };
        let n = first.ws.positions.len() * first.config.hidden_size;
        let before = first.ws.x[..n].to_vec();
        let mut total = before.clone();
        for op in &mut self.0 {
            block(op)?;
            for ((t, x), b) in total.iter_mut().zip(&op.ws.x[..n]).zip(&before) {
                *t += x - b;
            }
        }
        for op in &mut self.0 {
            op.ws.x[..n].copy_from_slice(&total);
        }
        Ok(())
    }

    /// `rows` rows of the full vocabulary from each rank's LM-head rows.
    fn joined_logits(&self, rows: usize) -> Vec<f32> {
        let Some(shard) = self.0.first().and_then(|op| op.config.shard) else {
            return self
                .0
                .first()
                .map_or_else(Vec::new, |op| op.ws.logits.clone());
        };
        let (vocab, per) = (shard.vocab, shard.vocab_rows);
        let mut out = vec![0.0; rows * vocab];
        for op in &self.0 {
            let Some(cols) = op.config.shard.map(|s| s.vocab_range()) else {
                continue;
            };
            for r in 0..rows {
                let src = &op.ws.logits[r * per..r * per + cols.len()];
                out[r * vocab + cols.start..r * vocab + cols.end].copy_from_slice(src);
            }
        }
        out
    }
}

impl DecoderOps for Shards<'_, '_> {
    type Error = RunnerError;

    fn embed(&mut self, spec: &EmbedSpec, next: NextNorm) -> Result<(), RunnerError> {
        self.0.iter_mut().try_for_each(|op| op.embed(spec, next))
    }

    fn attention(
        &mut self,
        layer: usize,
        spec: &AttentionSpec,
        next: NextNorm,
    ) -> Result<(), RunnerError> {
        self.summed(|op| op.attention(layer, spec, next))
    }

    fn mlp(&mut self, layer: usize, spec: &MlpSpec, next: NextNorm) -> Result<(), RunnerError> {
        self.summed(|op| op.mlp(layer, spec, next))
    }

    fn moe(&mut self, layer: usize, spec: &MoeSpec, next: NextNorm) -> Result<(), RunnerError> {
        self.summed(|op| op.moe(layer, spec, next))
    }

    fn logits(&mut self, spec: &HeadSpec) -> Result<(), RunnerError> {
        self.0.iter_mut().try_for_each(|op| op.logits(spec))
    }
}
