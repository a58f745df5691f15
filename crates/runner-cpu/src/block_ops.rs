//! The CPU's [`DecoderOps`]: each block runs its own norms (nothing to fuse
//! across blocks on the CPU, so [`NextNorm`] is not used) over the f32
//! residual stream in the workspace.

use ingot_arch::{
    AttentionSpec, DecoderOps, EmbedSpec, HeadSpec, MlpSpec, MoeSpec, NextNorm, RopeTable,
};
use ingot_kv_cache::KvLayout;
use ingot_models::ModelConfig;
use ingot_runner::{ForwardBatch, RunnerError};

use crate::attention::{paged_attention, AttentionShape, LayerKv, TokenSite};
use crate::matrix::Matrix;
use crate::{grow, ops, Layer, Mlp, Workspace};

/// One step's view of the runner: weights read-only, KV and workspace
/// written.
pub(crate) struct CpuOps<'a, 'b> {
    pub config: &'a ModelConfig,
    pub embed: &'a Matrix,
    /// `None` when tied to `embed`.
    pub lm_head: Option<&'a Matrix>,
    /// Layers whose input hidden states land in `ws.captured`.
    pub capture: &'a [usize],
    pub norm: &'a [f32],
    pub layers: &'a [Layer],
    /// One K/V tensor per slice of a page (see [`KvLayout`]).
    pub kv: &'a mut [LayerKv],
    pub layout: &'a KvLayout,
    pub block_size: usize,
    /// Attention's softmax from the 8-lane exp (`model.cpu_fast_exp`).
    pub fast_exp: bool,
    /// `[position, head_dim / 2]` tables.
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    /// The same for [`RopeTable::Local`]; empty when the model has none.
    pub local_cos: &'a [f32],
    pub local_sin: &'a [f32],
    pub ws: &'a mut Workspace,
    pub batch: &'a ForwardBatch<'b>,
    /// Per layer group, per token row: the sequence's table of that group
    /// and the token's position.
    pub sites: Vec<Vec<TokenSite<'b>>>,
    /// Logits written by [`DecoderOps::logits`].
    pub logits_len: usize,
}

fn unsupported(what: &str) -> RunnerError {
    RunnerError::Backend(format!("the CPU backend does not implement {what} yet"))
}

impl CpuOps<'_, '_> {
    fn tokens(&self) -> usize {
        self.ws.positions.len()
    }

    /// Copies the residual stream entering `layer` into `ws.captured`
    /// when it is a captured layer.
    fn capture_input(&mut self, layer: usize) {
        let (t, d) = (self.tokens(), self.config.hidden_size);
        let width = self.capture.len() * d;
        let ws = &mut *self.ws;
        // A layer may be named twice (a small model's middle and high).
        for (slot, _) in self.capture.iter().enumerate().filter(|(_, &l)| l == layer) {
            for (row, x) in ws.x[..t * d].chunks_exact(d).enumerate() {
                let at = row * width + slot * d;
                ws.captured[at..at + d].copy_from_slice(x);
            }
        }
    }

    /// q/k/v projection (+ bias), q/k norm, rope and the paged KV write of
    /// every token row; the queries land in `ws.q`.
    fn project_qkv(&mut self, layer: usize, spec: &AttentionSpec) {
        let c = self.config;
        let (d, qd, kvd, hd) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.head_dim);
        let qkv_w = qd + 2 * kvd;
        let (t, half) = (self.tokens(), hd / 2);
        let (l, ws) = (&self.layers[layer], &mut *self.ws);
        let site = self.layout.site(layer);
        let kv = &mut self.kv[site.slice];
        let sites = &self.sites[site.group];
        let bs = self.block_size;
        let (cos_table, sin_table) = match spec.rope {
            RopeTable::Global => (self.cos, self.sin),
            RopeTable::Local => (self.local_cos, self.local_sin),
        };
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
        for (row, token) in sites.iter().enumerate().take(t) {
            let r = &mut ws.qkv[row * qkv_w..(row + 1) * qkv_w];
            let (q, rest) = r.split_at_mut(qd);
            let (k, v) = rest.split_at_mut(kvd);
            if let Some((qn, kn)) = l.qk_norm.as_ref().filter(|_| spec.qk_norm) {
                ops::rms_norm_heads_in_place(q, qn, c.rms_norm_eps);
                ops::rms_norm_heads_in_place(k, kn, c.rms_norm_eps);
            }
            let p = token.pos;
            let (cos, sin) = (
                &cos_table[p * half..(p + 1) * half],
                &sin_table[p * half..(p + 1) * half],
            );
            ops::rope_in_place(q, hd, cos, sin);
            ops::rope_in_place(k, hd, cos, sin);
            let block = token.block_table[(p / bs) * site.pages_per_block + site.part];
            let slot = block as usize * bs + p % bs;
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
        let c = self.config;
        let (d, qd, kvd, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let t = self.batch.num_tokens();
        let ws = &mut *self.ws;
        grow(&mut ws.x, t * d);
        grow(&mut ws.xn, t * d);
        grow(&mut ws.qkv, t * (qd + 2 * kvd));
        grow(&mut ws.q, t * qd);
        grow(&mut ws.attn, t * qd);
        grow(&mut ws.proj, t * d);
        grow(&mut ws.gate_up, t * 2 * ff);
        grow(&mut ws.act, t * ff);
        grow(&mut ws.captured, t * self.capture.len() * d);
        ws.positions.clear();
        let groups = self.layout.groups().len();
        self.sites = vec![Vec::with_capacity(t); groups];
        for chunk in &self.batch.chunks {
            for (i, &tok) in chunk.tokens.iter().enumerate() {
                let pos = chunk.start_pos + i;
                let row = ws.positions.len();
                ws.positions.push(pos);
                let x = &mut ws.x[row * d..(row + 1) * d];
                self.embed.row_into(tok as usize, x);
                if let Some(scale) = spec.scale {
                    x.iter_mut().for_each(|v| *v *= scale);
                }
                for (g, sites) in self.sites.iter_mut().enumerate() {
                    let block_table = match g {
                        0 => chunk.block_table,
                        _ => chunk.group_tables[g - 1].blocks(),
                    };
                    sites.push(TokenSite { block_table, pos });
                }
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
        if spec.softcap.is_some() {
            return Err(unsupported("attention score soft-capping"));
        }
        if spec.rope == RopeTable::Local && self.local_cos.is_empty() {
            return Err(unsupported("a local rope table without a local rope base"));
        }
        self.capture_input(layer);
        self.project_qkv(layer, spec);
        let site = self.layout.site(layer);
        let c = self.config;
        let (t, d, qd) = (self.tokens(), c.hidden_size, c.q_dim());
        let shape = AttentionShape {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            block_size: self.block_size,
            scale: c
                .block
                .attention_scale
                .unwrap_or(1.0 / (c.head_dim as f32).sqrt()),
            window: spec.window,
            pages_per_block: site.pages_per_block,
            part: site.part,
            fast_exp: self.fast_exp,
        };
        let ws = &mut *self.ws;
        let kv = &self.kv[site.slice];
        paged_attention(
            shape,
            &ws.q[..t * qd],
            kv,
            &self.sites[site.group],
            &mut ws.attn[..t * qd],
        );
        let l = &self.layers[layer];
        l.o_proj
            .linear(&ws.attn, &mut ws.proj, (t, qd, d), &mut ws.acts);
        let post = post_norm(spec.post_norm, l.post_norms.as_ref().map(|(a, _)| a))?;
        add_residual(ws, post, (t, d), c.rms_norm_eps);
        Ok(())
    }

    fn mlp(&mut self, layer: usize, spec: &MlpSpec, _next: NextNorm) -> Result<(), RunnerError> {
        let c = self.config;
        let (t, d, ff) = (self.tokens(), c.hidden_size, c.intermediate_size);
        let (l, ws) = (&self.layers[layer], &mut *self.ws);
        let Mlp::Dense { gate_up, down } = &l.mlp else {
            return Err(unsupported("a dense MLP on a layer of experts"));
        };
        ws.gated_mlp(
            (t, d, ff),
            (&l.mlp_norm, c.rms_norm_eps),
            (gate_up, down),
            spec.act,
        );
        let post = post_norm(spec.post_norm, l.post_norms.as_ref().map(|(_, m)| m))?;
        add_residual(ws, post, (t, d), c.rms_norm_eps);
        Ok(())
    }

    fn moe(&mut self, layer: usize, spec: &MoeSpec, _next: NextNorm) -> Result<(), RunnerError> {
        let c = self.config;
        let (t, d) = (self.tokens(), c.hidden_size);
        let (l, ws) = (&self.layers[layer], &mut *self.ws);
        let Mlp::Experts(experts) = &l.mlp else {
            return Err(unsupported("experts on a dense layer"));
        };
        ops::rms_norm(
            &ws.x[..t * d],
            &l.mlp_norm,
            c.rms_norm_eps,
            &mut ws.xn[..t * d],
        );
        experts.forward(
            spec,
            &ws.xn[..t * d],
            &mut ws.proj[..t * d],
            (t, d),
            &mut ws.experts,
            &mut ws.acts,
        );
        add_residual(ws, None, (t, d), c.rms_norm_eps);
        Ok(())
    }

    /// Final norm and LM head of each chunk's last token, then of every
    /// scored position.
    fn logits(&mut self, spec: &HeadSpec) -> Result<(), RunnerError> {
        let c = self.config;
        // A tensor-parallel rank computes its rows of the head only.
        let (d, vocab) = (c.hidden_size, c.lm_head_rows());
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
        if let Some(cap) = spec.softcap {
            ops::softcap_in_place(&mut ws.logits[..n * vocab], cap);
        }
        self.logits_len = n * vocab;
        Ok(())
    }
}

/// The post-norm weights a block's spec asks for, or an error when the
/// model did not load them.
fn post_norm(wanted: bool, weights: Option<&Vec<f32>>) -> Result<Option<&[f32]>, RunnerError> {
    match (wanted, weights) {
        (false, _) => Ok(None),
        (true, Some(w)) => Ok(Some(w)),
        (true, None) => Err(unsupported("a post-norm the model has no weights for")),
    }
}

/// Adds the block output in `ws.proj` (`[t, d]`) to the residual stream,
/// through its post-norm when it has one.
fn add_residual(ws: &mut Workspace, post: Option<&[f32]>, (t, d): (usize, usize), eps: f32) {
    if let Some(w) = post {
        ops::rms_norm(&ws.proj[..t * d], w, eps, &mut ws.xn[..t * d]);
        ops::add_in_place(&mut ws.x[..t * d], &ws.xn[..t * d]);
    } else {
        ops::add_in_place(&mut ws.x[..t * d], &ws.proj[..t * d]);
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
