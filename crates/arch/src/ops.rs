//! The block-level operations an architecture file is written over.
//!
//! Each operation is one block of a pre-norm transformer, sized where the
//! CUDA backend's fused kernels already sit (an RMSNorm folded into the
//! GEMV that consumes it, q/k/v + rope + KV write in one GEMV, SwiGLU in
//! the gate/up GEMV, projections that accumulate into the residual), so a
//! backend keeps its fusions. The backend owns the weights (by layer index)
//! and the step's inputs; the residual stream lives inside it between calls.
//! Variants are picked by small spec structs; a backend returns a clear
//! "unsupported" error for a spec value it does not implement.
//!
//! # Adding an architecture
//!
//! 1. Add its [`ingot_models::Architecture`] variant and config fields, and
//!    load its weights in each backend (named by layer index).
//! 2. Write `src/<family>.rs` here: a `forward` that calls [`DecoderOps`]
//!    in order with the family's specs, and a `HEAD` (see
//!    [`crate::llama`]); route its variant in [`crate::forward`] and
//!    [`crate::head_spec`].
//! 3. Implement in each backend any spec value it reports as unsupported
//!    (e.g. a sliding window or a GELU activation). Nothing else is written
//!    per backend: the layer order lives only in the architecture file.
//!
//! A family whose blocks are not these (an encoder such as BERT: post-norm
//! LayerNorm blocks, bidirectional attention without a KV cache, a plain
//! GELU MLP, pooling) adds its own op trait here beside [`DecoderOps`],
//! with the same rules: blocks at the backends' fusion boundaries, specs
//! for the variants, one architecture file that calls them.

/// The norm that reads the residual stream next. A backend may apply it
/// already where the stream is written (the CUDA GEMVs leave the sums of
/// squares and the input pre-scaled by its weights); the op that owns the
/// norm still runs it when the writer did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextNorm {
    /// Layer `i`'s attention pre-norm.
    Attention(usize),
    /// Layer `i`'s MLP pre-norm.
    Mlp(usize),
    /// The final norm before the LM head.
    Final,
}

/// Which rotary table an attention layer uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeTable {
    /// The model's rope base (`ModelConfig::rope`).
    Global,
    /// A second base for local (sliding-window) layers.
    Local,
}

/// The gate activation of a gated MLP: `act(x·gate) · (x·up)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (Llama).
    Silu,
    /// GELU, tanh approximation (GeGLU, Gemma).
    GeluTanh,
}

/// Token embedding into the residual stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmbedSpec {
    /// Rows multiplied by this (Gemma: `sqrt(hidden)`); `None`: as stored.
    pub scale: Option<f32>,
}

/// One attention block: pre-norm → q/k/v (+ bias) → q/k norm → rope →
/// paged KV write → paged attention → o_proj → optional post-norm →
/// residual add.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionSpec {
    /// Bias on the q/k/v projections (Qwen2).
    pub qkv_bias: bool,
    /// RMSNorm per head on q and k (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// The rotary table.
    pub rope: RopeTable,
    /// Attend to at most this many most recent positions; `None`: all.
    pub window: Option<usize>,
    /// RMSNorm on the block's output before the residual add (Gemma).
    pub post_norm: bool,
    /// `cap · tanh(score / cap)` on attention scores; `None`: off.
    pub softcap: Option<f32>,
}

/// One gated MLP block: pre-norm → gate/up → activation → down →
/// optional post-norm → residual add.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlpSpec {
    /// The gate activation.
    pub act: Activation,
    /// RMSNorm on the block's output before the residual add (Gemma).
    pub post_norm: bool,
}

/// How a router turns its logits into expert weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Softmax over every expert's logit, then the top-k probabilities
    /// (Mixtral, Qwen3-MoE). Ties go to the lower expert index.
    SoftmaxTopK,
}

/// One mixture-of-experts MLP block: pre-norm → router logits → top-k
/// experts and their weights → each chosen expert's gated MLP → weighted
/// sum → residual add. A token's expert outputs are summed in ascending
/// expert order, so its result does not depend on the batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeSpec {
    /// The experts' gate activation.
    pub act: Activation,
    /// Router logits to weights.
    pub routing: Routing,
    /// Experts per token.
    pub top_k: usize,
    /// The top-k weights are divided by their sum.
    pub normalize: bool,
}

/// Final norm and LM head (tied or not, the backend knows).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadSpec {
    /// `cap · tanh(logit / cap)`; `None`: off.
    pub softcap: Option<f32>,
}

/// The operations a backend implements for one forward step. The backend
/// has laid out the step's tokens before the architecture's `forward`
/// runs; the calls arrive in layer order.
pub trait DecoderOps {
    /// The backend's error.
    type Error;

    /// Writes the embeddings of the step's tokens into the residual stream.
    fn embed(&mut self, spec: &EmbedSpec, next: NextNorm) -> Result<(), Self::Error>;

    /// Layer `layer`'s attention block, added into the residual stream.
    fn attention(
        &mut self,
        layer: usize,
        spec: &AttentionSpec,
        next: NextNorm,
    ) -> Result<(), Self::Error>;

    /// Layer `layer`'s MLP block, added into the residual stream.
    fn mlp(&mut self, layer: usize, spec: &MlpSpec, next: NextNorm) -> Result<(), Self::Error>;

    /// Layer `layer`'s mixture-of-experts MLP block, added into the
    /// residual stream.
    fn moe(&mut self, layer: usize, spec: &MoeSpec, next: NextNorm) -> Result<(), Self::Error>;

    /// The final norm and LM head of the rows the step returns logits for.
    fn logits(&mut self, spec: &HeadSpec) -> Result<(), Self::Error>;
}

impl AttentionSpec {
    /// The first feature beyond a Llama block that the spec asks for (a
    /// backend without it names it in its "unsupported" error).
    pub fn beyond_llama(&self) -> Option<&'static str> {
        if self.window.is_some() {
            Some("sliding-window attention")
        } else if self.post_norm {
            Some("a post-attention norm")
        } else if self.softcap.is_some() {
            Some("attention score soft-capping")
        } else if self.rope == RopeTable::Local {
            Some("a local rope table")
        } else {
            None
        }
    }
}

impl MlpSpec {
    /// As [`AttentionSpec::beyond_llama`].
    pub fn beyond_llama(&self) -> Option<&'static str> {
        if self.act != Activation::Silu {
            Some("a GELU-tanh MLP")
        } else if self.post_norm {
            Some("a post-MLP norm")
        } else {
            None
        }
    }
}

impl EmbedSpec {
    /// As [`AttentionSpec::beyond_llama`].
    pub fn beyond_llama(&self) -> Option<&'static str> {
        self.scale.map(|_| "scaled embeddings")
    }
}

impl HeadSpec {
    /// As [`AttentionSpec::beyond_llama`].
    pub fn beyond_llama(&self) -> Option<&'static str> {
        self.softcap.map(|_| "logit soft-capping")
    }
}
