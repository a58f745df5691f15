//! The BERT-family encoder (`BertModel`: all-MiniLM-L6-v2, bge, e5, …),
//! written once over [`EncoderOps`].
//!
//! Post-LN transformer: token = word + learned position + token-type rows,
//! LayerNorm; per layer, biased q/k/v, bidirectional attention within each
//! sequence, output projection + residual + LayerNorm, then a GELU (erf)
//! FFN + residual + LayerNorm. The sentence vector pools the last states
//! (mean over the sequence's tokens, or [CLS]) and, as sentence-transformers'
//! `Normalize` module does, scales it to unit length.
//!
//! Sequences are packed without padding: a batch is its sequences' tokens
//! back to back plus their lengths, so no token attends across sequences
//! and padding costs nothing.

use ingot_models::bert::{BertConfig, Pooling};
use ingot_models::{HostTensor, ModelError};

use crate::{ArchError, Embedder};

/// Sequences packed back to back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncoderBatch {
    /// Every sequence's token ids, in order.
    pub tokens: Vec<u32>,
    /// Tokens of each sequence.
    pub seq_lens: Vec<usize>,
}

impl EncoderBatch {
    /// Packs `sequences`.
    pub fn pack(sequences: &[Vec<u32>]) -> Self {
        Self {
            tokens: sequences.iter().flatten().copied().collect(),
            seq_lens: sequences.iter().map(Vec::len).collect(),
        }
    }

    /// Each token's position inside its sequence.
    pub fn positions(&self) -> Vec<u32> {
        self.seq_lens.iter().flat_map(|&n| 0..n as u32).collect()
    }
}

/// A linear layer: `y = x · weightᵀ + bias`.
pub struct Linear<W> {
    /// `[out, in]`.
    pub weight: W,
    /// `[out]`.
    pub bias: W,
}

/// LayerNorm's scale and shift.
pub struct Norm<W> {
    /// γ.
    pub weight: W,
    /// β.
    pub bias: W,
}

/// Attention's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    /// Heads.
    pub count: usize,
    /// Width of one head.
    pub dim: usize,
}

/// The block-level operations the encoder is written in. `Act` holds one
/// row per token (or per sequence after pooling); every op must give each
/// row a result that does not depend on the other sequences in the batch.
pub trait EncoderOps: Send + Sync {
    /// A weight (matrix or vector) as the backend keeps it.
    type Weight: Send + Sync;
    /// Activations: rows × width.
    type Act;

    /// Where it runs.
    fn device_name(&self) -> &str;
    /// Takes a host tensor in.
    fn weight(&self, tensor: HostTensor) -> Result<Self::Weight, ArchError>;
    /// Row `t` of the result is `Σ_j tables[j].0[tables[j].1[t]]`.
    fn gather_sum(&self, tables: &[(&Self::Weight, &[u32])]) -> Result<Self::Act, ArchError>;
    /// `x · weightᵀ + bias`.
    fn linear(&self, x: &Self::Act, layer: &Linear<Self::Weight>) -> Result<Self::Act, ArchError>;
    /// Bidirectional scaled-dot-product attention of each sequence over
    /// itself; `qkv` rows are `[q | k | v]`, each `heads.count × heads.dim`.
    fn attention(
        &self,
        qkv: &Self::Act,
        heads: Heads,
        batch: &EncoderBatch,
    ) -> Result<Self::Act, ArchError>;
    /// `x = LayerNorm(x + residual)` (or of `x` alone).
    fn add_layer_norm(
        &self,
        x: &mut Self::Act,
        residual: Option<&Self::Act>,
        norm: &Norm<Self::Weight>,
        eps: f32,
    ) -> Result<(), ArchError>;
    /// `x = GELU(x)`, the exact (erf) form.
    fn gelu(&self, x: &mut Self::Act) -> Result<(), ArchError>;
    /// One row per sequence: the mean of its rows, or its first row.
    fn pool(
        &self,
        x: &Self::Act,
        pooling: Pooling,
        batch: &EncoderBatch,
    ) -> Result<Self::Act, ArchError>;
    /// Scales every row to unit L2 norm.
    fn l2_normalize(&self, x: &mut Self::Act) -> Result<(), ArchError>;
    /// The rows, copied to the host.
    fn to_host(&self, x: &Self::Act) -> Result<Vec<f32>, ArchError>;
}

/// One encoder layer's weights.
pub struct BertLayer<W> {
    /// Fused `[query; key; value]`.
    pub qkv: Linear<W>,
    /// Attention output projection.
    pub attn_out: Linear<W>,
    /// LayerNorm after attention + residual.
    pub attn_norm: Norm<W>,
    /// FFN up (`intermediate.dense`).
    pub ffn_up: Linear<W>,
    /// FFN down (`output.dense`).
    pub ffn_down: Linear<W>,
    /// LayerNorm after the FFN + residual.
    pub ffn_norm: Norm<W>,
}

/// A BERT encoder on backend `O`.
pub struct Bert<O: EncoderOps> {
    ops: O,
    config: BertConfig,
    words: O::Weight,
    positions: O::Weight,
    token_types: O::Weight,
    embed_norm: Norm<O::Weight>,
    layers: Vec<BertLayer<O::Weight>>,
}

/// Reads tensors by their Hugging Face names, with the checkpoint's prefix
/// (`bert.` in some, none in sentence-transformers' exports) and shapes
/// checked.
struct Reader<'a, O: EncoderOps> {
    ops: &'a O,
    load: &'a dyn Fn(&str) -> Result<HostTensor, ModelError>,
    prefix: &'static str,
}

impl<O: EncoderOps> Reader<'_, O> {
    fn host(&self, name: &str, shape: &[usize]) -> Result<HostTensor, ArchError> {
        let full = format!("{}{name}", self.prefix);
        let t = (self.load)(&full)?;
        if t.shape != shape {
            return Err(ModelError::ShapeMismatch {
                name: full,
                expected: shape.to_vec(),
                got: t.shape,
            }
            .into());
        }
        Ok(t)
    }

    fn tensor(&self, name: &str, shape: &[usize]) -> Result<O::Weight, ArchError> {
        self.ops.weight(self.host(name, shape)?)
    }

    fn linear(&self, name: &str, out: usize, inp: usize) -> Result<Linear<O::Weight>, ArchError> {
        Ok(Linear {
            weight: self.tensor(&format!("{name}.weight"), &[out, inp])?,
            bias: self.tensor(&format!("{name}.bias"), &[out])?,
        })
    }

    fn norm(&self, name: &str, width: usize) -> Result<Norm<O::Weight>, ArchError> {
        Ok(Norm {
            weight: self.tensor(&format!("{name}.weight"), &[width])?,
            bias: self.tensor(&format!("{name}.bias"), &[width])?,
        })
    }

    /// q, k and v stacked into one `[3h, h]` linear: one matmul per layer.
    fn qkv(&self, layer: &str, h: usize) -> Result<Linear<O::Weight>, ArchError> {
        let (mut weight, mut bias) = (Vec::with_capacity(3 * h * h), Vec::with_capacity(3 * h));
        for part in ["query", "key", "value"] {
            let name = format!("{layer}.attention.self.{part}");
            weight.extend(self.host(&format!("{name}.weight"), &[h, h])?.data);
            bias.extend(self.host(&format!("{name}.bias"), &[h])?.data);
        }
        Ok(Linear {
            weight: self.ops.weight(HostTensor::new(vec![3 * h, h], weight))?,
            bias: self.ops.weight(HostTensor::new(vec![3 * h], bias))?,
        })
    }

    fn layer(&self, i: usize, c: &BertConfig) -> Result<BertLayer<O::Weight>, ArchError> {
        let (h, ff) = (c.hidden_size, c.intermediate_size);
        let p = format!("encoder.layer.{i}");
        Ok(BertLayer {
            qkv: self.qkv(&p, h)?,
            attn_out: self.linear(&format!("{p}.attention.output.dense"), h, h)?,
            attn_norm: self.norm(&format!("{p}.attention.output.LayerNorm"), h)?,
            ffn_up: self.linear(&format!("{p}.intermediate.dense"), ff, h)?,
            ffn_down: self.linear(&format!("{p}.output.dense"), h, ff)?,
            ffn_norm: self.norm(&format!("{p}.output.LayerNorm"), h)?,
        })
    }
}

impl<O: EncoderOps> Bert<O> {
    /// Loads the weights through `load` (by Hugging Face name) onto `ops`.
    pub fn load(
        ops: O,
        config: BertConfig,
        load: &dyn Fn(&str) -> Result<HostTensor, ModelError>,
        contains: &dyn Fn(&str) -> bool,
    ) -> Result<Self, ArchError> {
        let prefix = if contains("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let c = &config;
        let h = c.hidden_size;
        let r = Reader {
            ops: &ops,
            load,
            prefix,
        };
        let words = r.tensor("embeddings.word_embeddings.weight", &[c.vocab_size, h])?;
        let positions = r.tensor(
            "embeddings.position_embeddings.weight",
            &[c.max_positions, h],
        )?;
        let token_types = r.tensor(
            "embeddings.token_type_embeddings.weight",
            &[c.type_vocab_size, h],
        )?;
        let embed_norm = r.norm("embeddings.LayerNorm", h)?;
        let layers = (0..c.num_layers)
            .map(|i| r.layer(i, c))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            ops,
            config,
            words,
            positions,
            token_types,
            embed_norm,
            layers,
        })
    }

    /// The config.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Sentence vectors of `batch`, one row per sequence.
    pub fn forward(&self, batch: &EncoderBatch) -> Result<Vec<f32>, ArchError> {
        self.forward_paced(batch, &mut || {})
    }

    /// [`Bert::forward`], calling `between` before every matmul and
    /// attention (the pieces whose time grows with the batch).
    pub fn forward_paced(
        &self,
        batch: &EncoderBatch,
        between: &mut dyn FnMut(),
    ) -> Result<Vec<f32>, ArchError> {
        let (ops, c) = (&self.ops, &self.config);
        between();
        let positions = batch.positions();
        let types = vec![0u32; batch.tokens.len()];
        let mut x = ops.gather_sum(&[
            (&self.words, &batch.tokens),
            (&self.positions, &positions),
            (&self.token_types, &types),
        ])?;
        ops.add_layer_norm(&mut x, None, &self.embed_norm, c.layer_norm_eps)?;
        let heads = Heads {
            count: c.num_heads,
            dim: c.head_dim(),
        };
        for layer in &self.layers {
            between();
            let qkv = ops.linear(&x, &layer.qkv)?;
            between();
            let attended = ops.attention(&qkv, heads, batch)?;
            between();
            let mut y = ops.linear(&attended, &layer.attn_out)?;
            ops.add_layer_norm(&mut y, Some(&x), &layer.attn_norm, c.layer_norm_eps)?;
            between();
            let mut up = ops.linear(&y, &layer.ffn_up)?;
            ops.gelu(&mut up)?;
            between();
            x = ops.linear(&up, &layer.ffn_down)?;
            ops.add_layer_norm(&mut x, Some(&y), &layer.ffn_norm, c.layer_norm_eps)?;
        }
        let mut pooled = ops.pool(&x, c.pooling, batch)?;
        if c.normalize {
            ops.l2_normalize(&mut pooled)?;
        }
        ops.to_host(&pooled)
    }

    fn check(&self, sequences: &[Vec<u32>]) -> Result<(), ArchError> {
        let c = &self.config;
        for (i, s) in sequences.iter().enumerate() {
            if s.is_empty() || s.len() > c.max_positions {
                return Err(ArchError::Input(format!(
                    "sequence {i} has {} tokens; this model takes 1 to {}",
                    s.len(),
                    c.max_positions
                )));
            }
            if let Some(t) = s.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(ArchError::Input(format!(
                    "token id {t} is out of the vocabulary (size {})",
                    c.vocab_size
                )));
            }
        }
        Ok(())
    }
}

impl<O: EncoderOps> Embedder for Bert<O> {
    fn embed(&self, sequences: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ArchError> {
        self.embed_paced(sequences, &mut || {})
    }

    fn embed_paced(
        &self,
        sequences: &[Vec<u32>],
        between: &mut dyn FnMut(),
    ) -> Result<Vec<Vec<f32>>, ArchError> {
        if sequences.is_empty() {
            return Ok(Vec::new());
        }
        self.check(sequences)?;
        let rows = self.forward_paced(&EncoderBatch::pack(sequences), between)?;
        Ok(rows
            .chunks_exact(self.config.hidden_size)
            .map(<[f32]>::to_vec)
            .collect())
    }

    fn dimensions(&self) -> usize {
        self.config.hidden_size
    }

    fn max_tokens(&self) -> usize {
        self.config.max_positions
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn device_name(&self) -> &str {
        self.ops.device_name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_sequences_with_their_own_positions() {
        let b = EncoderBatch::pack(&[vec![5, 6, 7], vec![8], vec![9, 10]]);
        assert_eq!(b.tokens, [5, 6, 7, 8, 9, 10]);
        assert_eq!(b.seq_lens, [3, 1, 2]);
        assert_eq!(b.positions(), [0, 1, 2, 0, 0, 1]);
    }
}
