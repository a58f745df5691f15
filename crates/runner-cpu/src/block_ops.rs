//! The CPU's [`DecoderOps`]: each block runs its own norms (nothing to fuse
//! across blocks on the CPU, so [`NextNorm`] is not used) over the f32
//! residual stream in the workspace.

use ingot_arch::{AttentionSpec, DecoderOps, EmbedSpec, HeadSpec, MlpSpec, NextNorm};
use ingot_models::ModelConfig;
use ingot_runner::{ForwardBatch, RunnerError};

use crate::attention::{paged_attention, AttentionShape, LayerKv, TokenSite};
use crate::matrix::Matrix;
use crate::{grow, ops, Layer, Workspace};

/// One step's view of the runner: weights read-only, KV and workspace
/// written.
pub(crate) struct CpuOps<'a, 'b> {
    pub config: &'a ModelConfig,
    pub embed: &'a Matrix,
    /// `None` when tied to `embed`.
    pub lm_head: Option<&'a Matrix>,
    pub norm: &'a [f32],
    pub layers: &'a [Layer],
    pub kv: &'a mut [LayerKv],
    pub block_size: usize,
    /// `[position, head_dim / 2]` tables.
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub ws: &'a mut Workspace,
    pub batch: &'a ForwardBatch<'b>,
    /// Per token row: its sequence's block table and position.
    pub sites: Vec<TokenSite<'b>>,
    /// Logits written by [`DecoderOps::logits`].
    pub logits_len: usize,
}

fn unsupported(what: &str) -> RunnerError {
    RunnerError::Backend(format!("the CPU backend does not implement {what} yet"))
}

impl CpuOps<'_, '_> {
    fn tokens(&self) -> usize {
        self.sites.len()
    }

    /// q/k/v projection (+ bias), q/k norm, rope and the paged KV write of
    /// every token row; the queries land in `ws.q`.
    fn project_qkv(&mut self, layer: usize, spec: &AttentionSpec) {
        let c = self.config;
        let (d, qd, kvd, hd) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.head_dim);
        let qkv_w = qd + 2 * kvd;
        let (t, half) = (self.tokens(), hd / 2);
        let (l, ws) = (&self.layers[layer], &mut *self.ws);
        let kv = &mut self.kv[layer];
        ops::rms_norm(
            &ws.x[..t * d],
            &l.attn_norm,
            c.rms_norm_eps,
            &mut ws.xn[..t * d],
        );
        l.qkv
            .linear(&ws.xn, &mut ws.qkv, (t, d, qkv_w), &mut ws.acts);
        if let Some(bias) = l.qkv_bias.as_ref().filter(|_| spec.qkv_bias) {
            ops::add_bias(&mut ws.qkv[..t * qkv_w], bias);
        }
        for row in 0..t {
            let r = &mut ws.qkv[row * qkv_w..(row + 1) * qkv_w];
            let (q, rest) = r.split_at_mut(qd);
            let (k, v) = rest.split_at_mut(kvd);
            if let Some((qn, kn)) = l.qk_norm.as_ref().filter(|_| spec.qk_norm) {
                ops::rms_norm_heads_in_place(q, qn, c.rms_norm_eps);
                ops::rms_norm_heads_in_place(k, kn, c.rms_norm_eps);
            }
            let p = ws.positions[row];
            let (cos, sin) = (
                &self.cos[p * half..(p + 1) * half],
                &self.sin[p * half..(p + 1) * half],
            );
            ops::rope_in_place(q, hd, cos, sin);
            ops::rope_in_place(k, hd, cos, sin);
            let slot = ws.slots[row];
            kv.k[slot * kvd..(slot + 1) * kvd].copy_from_slice(k);
            kv.v[slot * kvd..(slot + 1) * kvd].copy_from_slice(v);
            ws.q[row * qd..(row + 1) * qd].copy_from_slice(q);
        }
    }
}

impl DecoderOps for CpuOps<'_, '_> {
    type Error = RunnerError;

    /// Lays out the step (positions, KV slots, workspace sizes) and copies
    /// the embedding rows into the residual stream.
    fn embed(&mut self, spec: &EmbedSpec, _next: NextNorm) -> Result<(), RunnerError> {
        if let Some(what) = spec.beyond_llama() {
            return Err(unsupported(what));
        }
        let c = self.config;
        let (d, qd, kvd, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let (t, bs) = (self.batch.num_tokens(), self.block_size);
        let ws = &mut *self.ws;
        grow(&mut ws.x, t * d);
        grow(&mut ws.xn, t * d);
        grow(&mut ws.qkv, t * (qd + 2 * kvd));
        grow(&mut ws.q, t * qd);
        grow(&mut ws.attn, t * qd);
        grow(&mut ws.proj, t * d);
        grow(&mut ws.gate_up, t * 2 * ff);
        grow(&mut ws.act, t * ff);
        ws.positions.clear();
        ws.slots.clear();
        self.sites.clear();
        for chunk in &self.batch.chunks {
            for (i, &tok) in chunk.tokens.iter().enumerate() {
                let pos = chunk.start_pos + i;
                let row = ws.positions.len();
                ws.positions.push(pos);
                ws.slots
                    .push(chunk.block_table[pos / bs] as usize * bs + pos % bs);
                self.embed
                    .row_into(tok as usize, &mut ws.x[row * d..(row + 1) * d]);
                self.sites.push(TokenSite {
                    block_table: chunk.block_table,
                    pos,
                });
            }
        }
        Ok(())
    }

    fn attention(
        &mut self,
        layer: usize,
        spec: &AttentionSpec,
        _next: NextNorm,
    ) -> Result<(), RunnerError> {
        if let Some(what) = spec.beyond_llama() {
            return Err(unsupported(what));
        }
        self.project_qkv(layer, spec);
        let c = self.config;
        let (t, d, qd) = (self.tokens(), c.hidden_size, c.q_dim());
        let shape = AttentionShape {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            block_size: self.block_size,
        };
        let ws = &mut *self.ws;
        let kv = &self.kv[layer];
        paged_attention(
            shape,
            &ws.q[..t * qd],
            kv,
            &self.sites,
            &mut ws.attn[..t * qd],
        );
        let l = &self.layers[layer];
        l.o_proj
            .linear(&ws.attn, &mut ws.proj, (t, qd, d), &mut ws.acts);
        ops::add_in_place(&mut ws.x[..t * d], &ws.proj[..t * d]);
        Ok(())
    }

    fn mlp(&mut self, layer: usize, spec: &MlpSpec, _next: NextNorm) -> Result<(), RunnerError> {
        if let Some(what) = spec.beyond_llama() {
            return Err(unsupported(what));
        }
        let c = self.config;
        let (t, d, ff) = (self.tokens(), c.hidden_size, c.intermediate_size);
        let (l, ws) = (&self.layers[layer], &mut *self.ws);
        ops::rms_norm(
            &ws.x[..t * d],
            &l.mlp_norm,
            c.rms_norm_eps,
            &mut ws.xn[..t * d],
        );
        l.gate_up
            .linear(&ws.xn, &mut ws.gate_up, (t, d, 2 * ff), &mut ws.acts);
        ops::silu_mul(&ws.gate_up[..t * 2 * ff], &mut ws.act[..t * ff], ff);
        l.down
            .linear(&ws.act, &mut ws.proj, (t, ff, d), &mut ws.acts);
        ops::add_in_place(&mut ws.x[..t * d], &ws.proj[..t * d]);
        Ok(())
    }

    /// Final norm and LM head of each chunk's last token, then of every
    /// scored position.
    fn logits(&mut self, spec: &HeadSpec) -> Result<(), RunnerError> {
        if let Some(what) = spec.beyond_llama() {
            return Err(unsupported(what));
        }
        let c = self.config;
        let (d, vocab) = (c.hidden_size, c.vocab_size);
        let rows = output_rows(self.batch);
        let n = rows.len();
        let ws = &mut *self.ws;
        grow(&mut ws.last, n * d);
        grow(&mut ws.logits, n * vocab);
        for (i, &row) in rows.iter().enumerate() {
            ops::rms_norm_row(
                &ws.x[row * d..(row + 1) * d],
                self.norm,
                c.rms_norm_eps,
                &mut ws.last[i * d..(i + 1) * d],
            );
        }
        let head = self.lm_head.unwrap_or(self.embed);
        head.linear(&ws.last, &mut ws.logits, (n, d, vocab), &mut ws.acts);
        self.logits_len = n * vocab;
        Ok(())
    }
}

/// Token rows whose logits the batch returns: each chunk's last token,
/// then every scored position.
fn output_rows(batch: &ForwardBatch<'_>) -> Vec<usize> {
    let mut first = Vec::with_capacity(batch.chunks.len());
    let mut end = 0;
    for chunk in &batch.chunks {
        first.push(end);
        end += chunk.tokens.len();
    }
    let mut rows: Vec<usize> = batch
        .chunks
        .iter()
        .zip(&first)
        .map(|(c, &f)| f + c.tokens.len() - 1)
        .collect();
    for s in &batch.score {
        rows.extend((0..s.next.len()).map(|i| first[s.chunk] + i));
    }
    rows
}
