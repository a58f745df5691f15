//! An EAGLE-3 draft head on the CPU ([`ingot_models::eagle`] has the
//! layout): `fc` fuses the target's three hidden rows into one, the head's
//! decoder layer reads the normed token embedding beside the normed fused
//! row, and its output row drafts a token (and feeds the next position).

use std::sync::Arc;

use ingot_arch::Activation;
use ingot_core::TokenId;
use ingot_models::eagle::{EagleHeadConfig, EagleHeadWeights};
use ingot_runner::{argmax, DraftHead, HeadBatch, HeadInput, KvCacheShape, RunnerError};

use crate::attention::{paged_attention, AttentionShape, LayerKv, TokenSite, MAX_HEAD_DIM};
use crate::matrix::{Matrix, WeightDtype};
use crate::quant::QuantKind;
use crate::{float_matrix, grow, layer_kv, ops, Workspace};

/// How a head stores its matrices.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadStorage {
    /// Float matrices' type.
    pub dtype: WeightDtype,
    /// Q8_0 blocks on the native kernels instead (where the target runs
    /// them).
    pub quantize: bool,
}

impl HeadStorage {
    /// Rows of `cols` weights as this storage keeps them.
    fn matrix(self, data: Vec<f32>, cols: usize) -> Matrix {
        let kind = self.quantize.then_some(QuantKind::Q8_0);
        float_matrix(data, cols, kind, (self.dtype, false))
    }
}

/// The head's weights, KV pool and buffers.
pub(crate) struct CpuEagleHead {
    config: EagleHeadConfig,
    /// The head's own embedding or the target's.
    embed: Arc<Matrix>,
    /// `[hidden, 3 hidden]`.
    fc: Matrix,
    input_norm: Vec<f32>,
    hidden_norm: Vec<f32>,
    /// `[q_dim + 2 kv_dim, 2 hidden]`.
    qkv: Matrix,
    o_proj: Matrix,
    post_norm: Vec<f32>,
    /// `[2 ff, hidden]`: gate rows then up rows.
    gate_up: Matrix,
    down: Matrix,
    norm: Vec<f32>,
    lm_head: Matrix,
    draft_to_target: Vec<u32>,
    kv: LayerKv,
    kv_shape: KvCacheShape,
    cos: Vec<f32>,
    sin: Vec<f32>,
    fast_exp: bool,
    /// The residual stream (`x`) and the layer's buffers, as the target's.
    ws: Workspace,
    /// The token embeddings of a batch.
    embedded: Vec<f32>,
    /// `[normed embedding | normed fused row]` per token: q/k/v's input.
    wide: Vec<f32>,
}

impl CpuEagleHead {
    /// The head of `weights`, sharing `target_embed` unless it has its own,
    /// with a KV pool of `kv_tokens` positions in blocks of `block_size`.
    pub fn new(
        config: EagleHeadConfig,
        w: EagleHeadWeights,
        target_embed: Arc<Matrix>,
        (kv_tokens, block_size): (usize, usize),
        storage: HeadStorage,
    ) -> Result<Self, RunnerError> {
        let c = &config.layer;
        if c.head_dim > MAX_HEAD_DIM || block_size == 0 {
            return Err(RunnerError::Backend(format!(
                "the EAGLE head's head_dim {} is beyond the CPU attention's {MAX_HEAD_DIM}",
                c.head_dim
            )));
        }
        let num_blocks = kv_tokens.div_ceil(block_size).max(1);
        let kv = layer_kv(num_blocks * block_size * c.kv_dim())?;
        let (cos, sin) = c.rope.tables(c.head_dim, c.max_context);
        let (d, ff, fw) = (c.hidden_size, c.intermediate_size, config.feature_width());
        let m = |data, cols| storage.matrix(data, cols);
        Ok(Self {
            embed: match w.embed {
                Some(e) => Arc::new(m(e.data, d)),
                None => target_embed,
            },
            fc: m(w.fc.data, fw),
            input_norm: w.input_norm.data,
            hidden_norm: w.hidden_norm.data,
            qkv: m(
                [w.q_proj.data, w.k_proj.data, w.v_proj.data].concat(),
                2 * d,
            ),
            o_proj: m(w.o_proj.data, c.q_dim()),
            post_norm: w.post_attention_norm.data,
            gate_up: m([w.gate_proj.data, w.up_proj.data].concat(), d),
            down: m(w.down_proj.data, ff),
            norm: w.norm.data,
            lm_head: m(w.lm_head.data, d),
            draft_to_target: w.draft_to_target,
            kv,
            kv_shape: KvCacheShape {
                num_blocks,
                block_size,
            },
            cos,
            sin,
            fast_exp: false,
            ws: Workspace::default(),
            embedded: Vec::new(),
            wide: Vec::new(),
            config,
        })
    }

    /// Attention's softmax from the 8-lane exp, as the target's.
    pub fn with_fast_exp(self, fast_exp: bool) -> Self {
        Self { fast_exp, ..self }
    }

    /// The batch's rows checked against the head's context, pool and input
    /// widths; returns the token sites.
    fn check<'b>(&self, batch: &HeadBatch<'b>) -> Result<Vec<TokenSite<'b>>, RunnerError> {
        ingot_runner::check_head_batch(&self.config, self.kv_shape, batch)?;
        Ok(batch
            .chunks
            .iter()
            .flat_map(|c| {
                (0..c.tokens.len()).map(|i| TokenSite {
                    block_table: c.block_table,
                    pos: c.start_pos + i,
                })
            })
            .collect())
    }

    /// The fused rows into `ws.x`, and the wide input of q/k/v.
    fn fuse_inputs(&mut self, batch: &HeadBatch<'_>) {
        let c = &self.config.layer;
        let (t, d, eps) = (batch.num_tokens(), c.hidden_size, c.rms_norm_eps);
        let ws = &mut self.ws;
        for buf in [&mut ws.x, &mut ws.proj, &mut self.embedded] {
            grow(buf, t * d);
        }
        grow(&mut self.wide, t * 2 * d);
        match batch.input {
            HeadInput::Target(rows) => {
                let fw = self.config.feature_width();
                self.fc.linear(rows, &mut ws.x, (t, fw, d), &mut ws.acts);
            }
            HeadInput::Own(rows) => ws.x[..t * d].copy_from_slice(rows),
        }
        let tokens = batch.chunks.iter().flat_map(|c| c.tokens);
        for (row, &tok) in tokens.enumerate() {
            self.embed
                .row_into(tok as usize, &mut self.embedded[row * d..(row + 1) * d]);
        }
        for row in 0..t {
            let wide = &mut self.wide[row * 2 * d..(row + 1) * 2 * d];
            let (e, h) = wide.split_at_mut(d);
            let r = row * d..(row + 1) * d;
            ops::rms_norm_row(&self.embedded[r.clone()], &self.input_norm, eps, e);
            ops::rms_norm_row(&ws.x[r], &self.hidden_norm, eps, h);
        }
    }

    /// q/k/v, rope and the KV write, attention, o_proj into the residual.
    fn attention(&mut self, sites: &[TokenSite<'_>]) {
        let c = &self.config.layer;
        let (t, d) = (sites.len(), c.hidden_size);
        let (qd, kvd, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
        let (qkv_w, half, bs) = (qd + 2 * kvd, hd / 2, self.kv_shape.block_size);
        let ws = &mut self.ws;
        grow(&mut ws.qkv, t * qkv_w);
        grow(&mut ws.q, t * qd);
        grow(&mut ws.attn, t * qd);
        self.qkv
            .linear(&self.wide, &mut ws.qkv, (t, 2 * d, qkv_w), &mut ws.acts);
        for (row, site) in sites.iter().enumerate() {
            let r = &mut ws.qkv[row * qkv_w..(row + 1) * qkv_w];
            let (q, rest) = r.split_at_mut(qd);
            let (k, v) = rest.split_at_mut(kvd);
            let p = site.pos;
            let (cos, sin) = (
                &self.cos[p * half..(p + 1) * half],
                &self.sin[p * half..(p + 1) * half],
            );
            ops::rope_in_place(q, hd, cos, sin);
            ops::rope_in_place(k, hd, cos, sin);
            let slot = site.block_table[p / bs] as usize * bs + p % bs;
            self.kv.k[slot * kvd..(slot + 1) * kvd].copy_from_slice(k);
            self.kv.v[slot * kvd..(slot + 1) * kvd].copy_from_slice(v);
            ws.q[row * qd..(row + 1) * qd].copy_from_slice(q);
        }
        let shape = AttentionShape {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: hd,
            block_size: bs,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
            pages_per_block: 1,
            part: 0,
            fast_exp: self.fast_exp,
        };
        paged_attention(
            shape,
            &ws.q[..t * qd],
            &self.kv,
            sites,
            &mut ws.attn[..t * qd],
        );
        self.o_proj
            .linear(&ws.attn, &mut ws.proj, (t, qd, d), &mut ws.acts);
        ops::add_in_place(&mut ws.x[..t * d], &ws.proj[..t * d]);
    }

    /// The MLP block into the residual.
    fn mlp(&mut self, t: usize) {
        let c = &self.config.layer;
        let (d, ff) = (c.hidden_size, c.intermediate_size);
        let ws = &mut self.ws;
        ws.gated_mlp(
            (t, d, ff),
            (&self.post_norm, c.rms_norm_eps),
            (&self.gate_up, &self.down),
            Activation::Silu,
        );
        ops::add_in_place(&mut ws.x[..t * d], &ws.proj[..t * d]);
    }

    /// Each chunk's last row of the residual stream.
    fn last_rows(&self, batch: &HeadBatch<'_>) -> Vec<f32> {
        let d = self.config.layer.hidden_size;
        let mut rows = Vec::with_capacity(batch.chunks.len() * d);
        let mut end = 0;
        for chunk in &batch.chunks {
            end += chunk.tokens.len();
            rows.extend_from_slice(&self.ws.x[(end - 1) * d..end * d]);
        }
        rows
    }
}

impl DraftHead for CpuEagleHead {
    fn config(&self) -> &EagleHeadConfig {
        &self.config
    }

    fn kv_cache_shape(&self) -> KvCacheShape {
        self.kv_shape
    }

    fn forward(&mut self, batch: &HeadBatch<'_>) -> Result<Vec<f32>, RunnerError> {
        let sites = self.check(batch)?;
        if sites.is_empty() {
            return Ok(Vec::new());
        }
        // On a pool thread, as the target's forward (one wake-up per kernel
        // otherwise).
        rayon::scope(|_| {
            self.fuse_inputs(batch);
            self.attention(&sites);
            self.mlp(sites.len());
        });
        Ok(self.last_rows(batch))
    }

    fn pick(&mut self, rows: &[f32]) -> Result<Vec<TokenId>, RunnerError> {
        let c = &self.config.layer;
        let (d, dv) = (c.hidden_size, self.config.draft_vocab_size);
        let n = ingot_runner::head_rows(rows, d)?;
        let ws = &mut self.ws;
        grow(&mut ws.last, n * d);
        grow(&mut ws.logits, n * dv);
        ops::rms_norm(rows, &self.norm, c.rms_norm_eps, &mut ws.last[..n * d]);
        rayon::scope(|_| {
            self.lm_head
                .linear(&ws.last, &mut ws.logits, (n, d, dv), &mut ws.acts)
        });
        Ok(ws.logits[..n * dv]
            .chunks_exact(dv)
            .map(|row| self.draft_to_target[argmax(row) as usize])
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_models::dummy::DummySource;
    use ingot_models::{eagle, HostTensor, LlamaShape, ModelConfig};
    use ingot_runner::{ForwardBatch, SequenceChunk};

    const F32: HeadStorage = HeadStorage {
        dtype: WeightDtype::F32,
        quantize: false,
    };

    fn target() -> ModelConfig {
        ModelConfig {
            max_context: 64,
            ..ModelConfig::llama(LlamaShape {
                hidden: 32,
                intermediate: 48,
                layers: 6,
                heads: 4,
                kv_heads: 2,
                head_dim: 8,
                vocab: 50,
            })
        }
    }

    /// The random head's weights (the same for every call).
    fn weights(config: &EagleHeadConfig) -> EagleHeadWeights {
        let source = DummySource::with_shapes(eagle::expected_shapes(config), 7);
        eagle::load_weights(&source, config).unwrap()
    }

    /// A seeded value in [-0.5, 0.5).
    fn noise(i: usize, seed: u64) -> f32 {
        let h = (i as u64 ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ((h >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    fn matvec(w: &HostTensor, x: &[f64]) -> Vec<f64> {
        w.data
            .chunks_exact(x.len())
            .map(|row| row.iter().zip(x).map(|(&a, b)| a as f64 * b).sum())
            .collect()
    }

    fn rms(x: &[f64], w: &HostTensor, eps: f64) -> Vec<f64> {
        let s = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
        x.iter()
            .zip(&w.data)
            .map(|(v, &g)| v * s * g as f64)
            .collect()
    }

    fn rope(x: &mut [f64], hd: usize, pos: usize, theta: f64) {
        let half = hd / 2;
        for head in x.chunks_exact_mut(hd) {
            for i in 0..half {
                let angle = pos as f64 * theta.powf(-2.0 * i as f64 / hd as f64);
                let (c, s) = (angle.cos(), angle.sin());
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * c - b * s;
                head[i + half] = b * c + a * s;
            }
        }
    }

    /// One sequence's rows `(token, fused row)` from position 0, in f64:
    /// each row's output row and draft.
    fn reference(
        config: &EagleHeadConfig,
        w: &EagleHeadWeights,
        embed: &HostTensor,
        rows: &[(u32, Vec<f64>)],
    ) -> Vec<(Vec<f64>, u32)> {
        let c = &config.layer;
        let (d, hd, eps) = (c.hidden_size, c.head_dim, c.rms_norm_eps as f64);
        let group = c.num_heads / c.num_kv_heads;
        let (mut keys, mut values, mut queries) = (Vec::new(), Vec::new(), Vec::new());
        for (pos, (tok, g)) in rows.iter().enumerate() {
            let e: Vec<f64> = embed.data[*tok as usize * d..(*tok as usize + 1) * d]
                .iter()
                .map(|&v| v as f64)
                .collect();
            let wide = [rms(&e, &w.input_norm, eps), rms(g, &w.hidden_norm, eps)].concat();
            let (mut q, mut k) = (matvec(&w.q_proj, &wide), matvec(&w.k_proj, &wide));
            rope(&mut q, hd, pos, c.rope.theta as f64);
            rope(&mut k, hd, pos, c.rope.theta as f64);
            queries.push(q);
            keys.push(k);
            values.push(matvec(&w.v_proj, &wide));
        }
        let mut out = Vec::new();
        for (pos, (_, g)) in rows.iter().enumerate() {
            let mut attn = vec![0.0; c.q_dim()];
            for h in 0..c.num_heads {
                let kvh = h / group;
                let q = &queries[pos][h * hd..(h + 1) * hd];
                let scores: Vec<f64> = (0..=pos)
                    .map(|p| {
                        let k = &keys[p][kvh * hd..(kvh + 1) * hd];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let top = scores.iter().cloned().fold(f64::MIN, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f64 = weights.iter().sum();
                for (p, wt) in weights.iter().enumerate() {
                    let v = &values[p][kvh * hd..(kvh + 1) * hd];
                    for i in 0..hd {
                        attn[h * hd + i] += wt / total * v[i];
                    }
                }
            }
            let o = matvec(&w.o_proj, &attn);
            let x: Vec<f64> = g.iter().zip(&o).map(|(a, b)| a + b).collect();
            let xn = rms(&x, &w.post_attention_norm, eps);
            let (gate, up) = (matvec(&w.gate_proj, &xn), matvec(&w.up_proj, &xn));
            let act: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let down = matvec(&w.down_proj, &act);
            let x2: Vec<f64> = x.iter().zip(&down).map(|(a, b)| a + b).collect();
            let logits = matvec(&w.lm_head, &rms(&x2, &w.norm, eps));
            let best = (0..logits.len())
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
                .unwrap_or(0);
            out.push((x2, w.draft_to_target[best]));
        }
        out
    }

    fn close(a: &[f32], b: &[f64]) -> bool {
        let err: f64 = a.iter().zip(b).map(|(&x, y)| (x as f64 - y).powi(2)).sum();
        let norm: f64 = b.iter().map(|y| y * y).sum();
        (err / norm).sqrt() < 1e-5
    }

    /// The head over the target's rows, then over its own row (a draft),
    /// then over the target's row of that position again (the verified
    /// token replacing the draft's KV) matches a float64 forward pass of
    /// the published EAGLE-3 layer over the same rows.
    #[test]
    fn head_matches_a_float64_reference_and_verified_rows_replace_drafted_ones() {
        let target = target();
        let config = eagle::head_like(&target);
        let (d, fw) = (config.layer.hidden_size, config.feature_width());
        let embed_values: Vec<f32> = (0..target.vocab_size * d).map(|i| noise(i, 1)).collect();
        let embed = HostTensor::new(vec![target.vocab_size, d], embed_values.clone());
        let shared = Arc::new(Matrix::F32(embed_values));
        let mut head =
            CpuEagleHead::new(config.clone(), weights(&config), shared, (64, 4), F32).unwrap();
        let w = weights(&config);
        let fuse = |feat: &[f32]| -> Vec<f64> {
            let x: Vec<f64> = feat.iter().map(|&v| v as f64).collect();
            matvec(&w.fc, &x)
        };
        let mut pool = ingot_kv_cache::BlockPool::new(16, 4, false);
        let mut tables = pool.new_tables();
        pool.reserve_groups(&mut tables, 0, 8).unwrap();
        let features: Vec<f32> = (0..6 * fw).map(|i| 2.0 * noise(i, 3)).collect();
        let next = [5u32, 9, 13, 2, 40, 17];
        // Positions 0..5 from the target.
        let mut run = |chunk, input| {
            let hidden = head
                .forward(&HeadBatch {
                    chunks: vec![chunk],
                    input,
                })
                .unwrap();
            let picks = head.pick(&hidden).unwrap();
            (hidden, picks)
        };
        let first = run(
            SequenceChunk::with_tables(&next[..5], 0, &tables),
            HeadInput::Target(&features[..5 * fw]),
        );
        let mut rows: Vec<(u32, Vec<f64>)> = (0..5)
            .map(|p| (next[p], fuse(&features[p * fw..(p + 1) * fw])))
            .collect();
        let want = reference(&config, &w, &embed, &rows);
        assert!(close(&first.0, &want[4].0));
        assert_eq!(first.1, vec![want[4].1]);
        // Position 5 drafted from the head's own row, after its draft.
        let drafted = run(
            SequenceChunk::with_tables(&first.1, 5, &tables),
            HeadInput::Own(&first.0),
        );
        let own: Vec<f64> = first.0.iter().map(|&v| v as f64).collect();
        rows.push((first.1[0], own));
        let want = reference(&config, &w, &embed, &rows);
        assert!(close(&drafted.0, &want[5].0));
        assert_eq!(drafted.1, vec![want[5].1]);
        // The target verified position 5 with another token: its row
        // replaces the draft's.
        let verified = run(
            SequenceChunk::with_tables(&next[5..], 5, &tables),
            HeadInput::Target(&features[5 * fw..]),
        );
        rows[5] = (next[5], fuse(&features[5 * fw..]));
        let want = reference(&config, &w, &embed, &rows);
        assert!(close(&verified.0, &want[5].0));
        assert_eq!(verified.1, vec![want[5].1]);
        assert_ne!(drafted.0, verified.0);
    }

    #[test]
    fn rows_of_the_wrong_width_are_refused() {
        let config = eagle::head_like(&target());
        let embed = Arc::new(Matrix::F32(vec![0.0; 50 * 32]));
        let mut head =
            CpuEagleHead::new(config.clone(), weights(&config), embed, (16, 4), F32).unwrap();
        let mut pool = ingot_kv_cache::BlockPool::new(4, 4, false);
        let mut tables = pool.new_tables();
        pool.reserve_groups(&mut tables, 0, 4).unwrap();
        let err = head
            .forward(&HeadBatch {
                chunks: vec![SequenceChunk::with_tables(&[1, 2], 0, &tables)],
                input: HeadInput::Target(&[0.0; 32]),
            })
            .unwrap_err();
        assert!(
            err.to_string().contains("hidden values for 2 tokens"),
            "{err}"
        );
    }

    /// The runner hands out the residual stream entering each named layer
    /// for every token: layer 0's input is the embedding, a layer named
    /// twice fills both slots, and a layer past the model is refused.
    #[test]
    fn the_runner_captures_the_input_of_named_layers() {
        use ingot_runner::ModelRunner;
        let config = target();
        let source = DummySource::new(&config, 3);
        let weights = ingot_models::LlamaWeights::load(&config, &source, &|_, _| {}).unwrap();
        let embed = weights.embed_tokens.clone();
        let opts = crate::CpuRunnerConfig {
            num_blocks: 4,
            block_size: 4,
            weight_dtype: WeightDtype::F32,
        };
        let mut runner = crate::CpuRunner::new(config, weights, opts).unwrap();
        assert!(runner.capture_hidden(&[6]).is_err());
        runner.capture_hidden(&[0, 4, 4]).unwrap();
        let tables = ingot_runner::solo_tables(&runner, 3).unwrap();
        let batch = ForwardBatch {
            chunks: vec![SequenceChunk::with_tables(&[7, 8, 9], 0, &tables)],
            ..ForwardBatch::default()
        };
        runner.forward(&batch).unwrap();
        let d = 32;
        let rows = runner.captured_hidden();
        assert_eq!(rows.len(), 3 * 3 * d);
        for (i, row) in rows.chunks_exact(3 * d).enumerate() {
            let token = 7 + i;
            assert_eq!(&row[..d], &embed.data[token * d..(token + 1) * d]);
            assert_eq!(&row[d..2 * d], &row[2 * d..]);
            assert_ne!(&row[..d], &row[d..2 * d]);
        }
    }
}
