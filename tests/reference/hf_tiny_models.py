#!/usr/bin/env python3
"""Tiny random Hugging Face models (and two GGUF ones) plus an independent numpy reference forward pass.

    python tests/reference/hf_tiny_models.py --out DIR [--only llama3,qwen3]

writes DIR/<name>/ for each model: `config.json` (the fields transformers writes for that architecture,
sorted, indent 2), the weights as safetensors (written by hand below: 8-byte little-endian header length,
JSON header with `__metadata__ {"format": "pt"}` padded with spaces to 8 bytes, raw little-endian data),
and `expected.json` with the prompt, the reference logits and greedy tokens. The `*_gguf` models write
`model.gguf` and `expected.json` only (see "GGUF" below). Deterministic: numpy's PCG64 seeded per model,
so the same numpy (and, for the GGUF models, gguf-py) version always writes the same bytes.

| name          | architecture        | notable                                                              | dtype |
|---------------|---------------------|----------------------------------------------------------------------|-------|
| llama3        | LlamaForCausalLM    | untied lm_head, rope_theta 5e5, llama3 rope scaling (orig. ctx 64)   | f32   |
| qwen2         | Qwen2ForCausalLM    | q/k/v biases, tied embeddings                                        | bf16  |
| qwen3         | Qwen3ForCausalLM    | head_dim 32 != hidden/heads (16), q_norm/k_norm per head before RoPE | f16   |
| sharded       | LlamaForCausalLM    | 2 shards + model.safetensors.index.json, legacy `"type": "linear"`   | f32   |
| qwen3moe      | Qwen3MoeForCausalLM | 3 layers, qwen3 attention (head_dim 32, q/k norm); 8 experts top-2,  | bf16  |
|               |                     | expert ff 32, norm_topk_prob false; layer 1 dense (mlp_only_layers)  |       |
| mixtral       | MixtralForCausalLM  | 2 layers, llama attention (head_dim 16); 4 experts top-2,            | f32   |
|               |                     | expert ff 64 (= intermediate_size), always renormalised              |       |
| qwen3moe_gguf | GGUF `qwen3moe`     | 2 layers, all sparse, 8 experts top-2, expert ff 32, renormalised    | Q8_0  |
| mixtral_gguf  | GGUF `llama`        | Mixtral as llama.cpp converts it: 2 layers, 4 experts top-2, ff 64,  | Q8_0  |
|               |                     | q/k rows permuted                                                    |       |

All: hidden 64, 4 query heads / 2 kv heads (GQA), intermediate (dense MLP) 128, vocab 300,
max_position_embeddings 256, untied lm_head except qwen2.

The forward pass shares no code with the Rust engine and follows transformers' modeling_{llama,qwen2,qwen3,
qwen3_moe,mixtral}.py (4.51): RMSNorm `w * x / sqrt(mean(x^2) + eps)`; q/k/v projections (+ bias for Qwen2);
Qwen3(-MoE) RMSNorm of each head of q and k (weights `[head_dim]`) *before* RoPE; RoPE in the "rotate
half" layout (`x*cos + rotate_half(x)*sin`, `emb = cat(freqs, freqs)`) with inv_freq from
modeling_rope_utils (`_compute_default_rope_parameters` over head_dim,
`_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`); GQA (q head h reads kv head
h // (heads / kv_heads)); causal softmax attention scaled by head_dim^-0.5; `down(silu(gate(x)) * up(x))`;
final norm; lm_head or the tied embedding. Every step recomputes the whole sequence (no KV cache), unlike
the engine.

Mixture of experts (Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock), on h = post_attention_layernorm(x):
router logits `h @ gate.T` (`mlp.gate.weight` / `block_sparse_moe.gate.weight`, `[experts, hidden]`);
p = softmax over all experts; the top-k experts by p; their k weights divided by their sum if
`norm_topk_prob` (Qwen3-MoE: the config field; Mixtral and llama.cpp's qwen3moe: always);
out = sum_k w_k * down_e(silu(gate_e(h)) * up_e(h)) with the expert's gate/up/down = `gate_proj`/
`up_proj`/`down_proj` (Qwen3-MoE `mlp.experts.{e}.`) or `w1`/`w3`/`w2` (Mixtral
`block_sparse_moe.experts.{e}.`). Qwen3-MoE layer i is sparse iff `i not in mlp_only_layers and
num_experts > 0 and (i + 1) % decoder_sparse_step == 0`, else a dense MLP of width intermediate_size
(`mlp.gate_proj/up_proj/down_proj`); every Mixtral layer is sparse.
Top-k tie rule: among equal probabilities the LOWER expert index is taken first (a stable sort by
descending probability, `np.argsort(-p, kind="stable")[:k]`; transformers leaves this to torch.topk).
Every MoE model has one sparse layer with two experts whose router rows are identical (TIES) and whose
expert weights differ, so the rule is exercised: the prompt is chosen so that the tie decides the k-th
slot (one of the pair in, the other out) at least once and every expert of every sparse layer is chosen
by some token; stderr reports the counts. Router logits are computed as row-by-row dot products, so
identical rows give bit-identical logits. The router weights have std 2/sqrt(hidden) (router logits
std ~2: decisive but varied routing); each expert is scaled like the dense MLP.

Numerics: float64 throughout. Weights are the values stored in the file (bf16/f16 rounded, upcast; Q8_0
dequantized), so the only difference to an f32 engine is its own f32 rounding. RoPE angles: float64
inv_freq times position.

GGUF (`qwen3moe_gguf`, `mixtral_gguf`): `model.gguf` (GGUF v3, gguf-py's GGUFWriter, no tokenizer) with the
metadata and tensor names llama.cpp's convert_hf_to_gguf.py writes: general.architecture, general.name,
general.file_type 7 (MOSTLY_Q8_0), general.quantization_version 2, `<arch>.block_count, context_length,
embedding_length, attention.head_count, attention.head_count_kv, rope.freq_base,
attention.layer_norm_rms_epsilon, expert_count, expert_used_count`, plus for qwen3moe `feed_forward_length`
(128, the dense width), `expert_feed_forward_length` (32), `attention.key_length`/`value_length` (32), and
for llama (Mixtral) `vocab_size`, `feed_forward_length` (the expert width, 64), `rope.dimension_count`.
Tensors: token_embd, output_norm, output, blk.{i}.attn_norm, attn_q, attn_k, attn_v, attn_output,
(qwen3moe: attn_q_norm, attn_k_norm), ffn_norm (= post_attention_layernorm), ffn_gate_inp (the router,
ggml ne [hidden, experts]), ffn_gate_exps / ffn_up_exps (ne [hidden, ff, experts]), ffn_down_exps
(ne [ff, hidden, experts]), all `.weight`. Matrices and expert stacks are Q8_0 (gguf-py's quantizer);
norms and routers F32, as llama-quantize leaves them. For `llama`, q and k rows are permuted as
LlamaModel.permute does (`W.reshape(n_head, 2, hd/2, hidden).swapaxes(1, 2)`, n_kv_head for k) so that
ggml's adjacent-pair RoPE computes HF's rotate_half. The reference runs on the dequantized file contents
mapped back to HF names and layout (q/k un-permuted), with eps as the stored f32; the script reads the
file back and checks every tensor. Both GGUF models have only sparse layers and renormalised top-k.

expected.json: {"name", "architecture", "torch_dtype", "prompt_ids": [20 ids], "greedy_ids": [8 ids],
"logits": [[vocab floats] x 8] (row k = logits that pick greedy_ids[k]; row 0 = after the prompt),
"margins": [8 floats, top1 - top2 of each row], "min_margin", "logit_scale": max |row 0|}; MoE models
also "routing": {"<layer>": [[e0, e1] per prompt token]}, the experts each sparse layer chose in the
forward pass of the whole prompt (in descending probability, ties lower id first); GGUF models have
"architecture" = general.architecture, "torch_dtype" null and "format": "gguf".
The prompt is the first of a deterministic sequence of random prompts whose 8 greedy steps all have a
top1 - top2 margin >= MIN_MARGIN, so an engine's rounding cannot flip a greedy token. MoE prompts
also need every routing decision of the run (prompt and fed-back tokens) to have a router-logit gap
>= MIN_ROUTER_GAP between chosen and unchosen experts (the tied pair excepted), and GGUF prompts need
the same routing and greedy tokens when every Q8_0 matmul's input is Q8_0 round-tripped (as int8
activation kernels see it; largest logit change then ~0.15).
"""
import argparse
import json
import os
import sys

import numpy as np

VOCAB, HIDDEN, HEADS, KV_HEADS, FF, MAX_POS = 300, 64, 4, 2, 128, 256
PROMPT_LEN, GREEDY = 20, 8
MIN_MARGIN = 0.05
MIN_DISTINCT = 4  # greedy tokens that differ, so decoding is not stuck on one token
TRANSFORMERS_VERSION = "4.51.3"


def llama_config(layers, dtype, tie, rope_theta, rope_scaling):
    return {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "head_dim": HIDDEN // HEADS, "hidden_act": "silu",
        "hidden_size": HIDDEN, "initializer_range": 0.02, "intermediate_size": FF,
        "max_position_embeddings": MAX_POS, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": HEADS, "num_hidden_layers": layers, "num_key_value_heads": KV_HEADS,
        "pretraining_tp": 1, "rms_norm_eps": 1e-5, "rope_scaling": rope_scaling, "rope_theta": rope_theta,
        "tie_word_embeddings": tie, "torch_dtype": dtype, "transformers_version": TRANSFORMERS_VERSION,
        "use_cache": True, "vocab_size": VOCAB,
    }


def qwen2_config(layers, dtype):
    return {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": HIDDEN, "initializer_range": 0.02, "intermediate_size": FF,
        "max_position_embeddings": MAX_POS, "max_window_layers": layers, "model_type": "qwen2",
        "num_attention_heads": HEADS, "num_hidden_layers": layers, "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": MAX_POS,
        "tie_word_embeddings": True, "torch_dtype": dtype, "transformers_version": TRANSFORMERS_VERSION,
        "use_cache": True, "use_sliding_window": False, "vocab_size": VOCAB,
    }


def qwen3_config(layers, dtype, head_dim):
    return {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "head_dim": head_dim, "hidden_act": "silu",
        "hidden_size": HIDDEN, "initializer_range": 0.02, "intermediate_size": FF,
        "max_position_embeddings": MAX_POS, "max_window_layers": layers, "model_type": "qwen3",
        "num_attention_heads": HEADS, "num_hidden_layers": layers, "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": dtype, "transformers_version": TRANSFORMERS_VERSION,
        "use_cache": True, "use_sliding_window": False, "vocab_size": VOCAB,
    }


def qwen3_moe_config(layers, dtype, head_dim, experts, top_k, moe_ff, mlp_only_layers, norm_topk_prob):
    """transformers 4.51 Qwen3MoeConfig.to_dict (head_dim is a plain extra attribute there, as in
    Qwen3-30B-A3B's config.json); `intermediate_size` is the width of the dense MLP of mlp_only_layers."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "decoder_sparse_step": 1, "eos_token_id": 2, "head_dim": head_dim,
        "hidden_act": "silu", "hidden_size": HIDDEN, "initializer_range": 0.02, "intermediate_size": FF,
        "max_position_embeddings": MAX_POS, "max_window_layers": layers, "mlp_only_layers": mlp_only_layers,
        "model_type": "qwen3_moe", "moe_intermediate_size": moe_ff, "norm_topk_prob": norm_topk_prob,
        "num_attention_heads": HEADS, "num_experts": experts, "num_experts_per_tok": top_k,
        "num_hidden_layers": layers, "num_key_value_heads": KV_HEADS, "output_router_logits": False,
        "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": dtype,
        "transformers_version": TRANSFORMERS_VERSION, "use_cache": True, "use_sliding_window": False,
        "vocab_size": VOCAB,
    }


def mixtral_config(layers, dtype, experts, top_k, expert_ff):
    """transformers 4.51 MixtralConfig.to_dict; `intermediate_size` is the width of each expert."""
    return {
        "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
        "eos_token_id": 2, "head_dim": HIDDEN // HEADS, "hidden_act": "silu", "hidden_size": HIDDEN,
        "initializer_range": 0.02, "intermediate_size": expert_ff, "max_position_embeddings": MAX_POS,
        "model_type": "mixtral", "num_attention_heads": HEADS, "num_experts_per_tok": top_k,
        "num_hidden_layers": layers, "num_key_value_heads": KV_HEADS, "num_local_experts": experts,
        "output_router_logits": False, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": dtype, "transformers_version": TRANSFORMERS_VERSION,
        "use_cache": True, "vocab_size": VOCAB,
    }


# name -> (seed, config). llama3's original context (64) puts its 8 frequencies (head_dim 16, wavelengths
# 6.3, 32, 167, ... tokens) in all three bands of the llama3 rule: kept (< 16), smoothed (16..64),
# divided by 8 (> 64), so the scaling changes the angles at the prompt's positions.
# The *_gguf models are written as GGUF (GGUF_ARCH) instead of config.json + safetensors; their config
# here only drives the random weights and the reference forward pass.
MODELS = {
    "llama3": (31, llama_config(2, "float32", False, 500000.0, {
        "factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
        "original_max_position_embeddings": 64, "rope_type": "llama3"})),
    "qwen2": (32, qwen2_config(2, "bfloat16")),
    "qwen3": (33, qwen3_config(3, "float16", 32)),
    "sharded": (34, llama_config(3, "float32", False, 10000.0, {"factor": 2.0, "type": "linear"})),
    "qwen3moe": (35, qwen3_moe_config(3, "bfloat16", 32, 8, 2, 32, [1], False)),
    "mixtral": (36, mixtral_config(2, "float32", 4, 2, 64)),
    "qwen3moe_gguf": (37, qwen3_moe_config(2, "float32", 32, 8, 2, 32, [], True)),
    "mixtral_gguf": (38, mixtral_config(2, "float32", 4, 2, 64)),
}

# GGUF models: name -> general.architecture (as llama.cpp's convert_hf_to_gguf.py names them).
GGUF_ARCH = {"qwen3moe_gguf": "qwen3moe", "mixtral_gguf": "llama"}

# Routing ties: name -> (layer, expert, copy_of): after the random draw, router row `expert` of that
# (sparse) layer is set to row `copy_of`, so the two experts always get exactly the same router logit
# while their weights differ. Ties are broken towards the lower expert index (see route()).
TIES = {"qwen3moe": (2, 5, 2), "mixtral": (0, 3, 1), "qwen3moe_gguf": (1, 6, 0), "mixtral_gguf": (1, 2, 0)}
ROUTER_STD = 2.0  # times 1/sqrt(hidden): router logits with std ~2 (decisive but varied routing)
# Smallest router-logit gap between a chosen and an unchosen expert (the designated tie excepted) that a
# prompt may have, so an engine's rounding cannot change a routing decision: 0.01 for the HF models, 0.05
# for the GGUF ones. Engines that multiply Q8_0 weights with int8-quantized activations move router
# logits by up to ~0.06 here, more than a reachable gap (8 experts, 54 decisions), so GGUF prompts must
# also keep their routing and greedy tokens with Q8_0 round-tripped activations (q8_activations).
MIN_ROUTER_GAP = {False: 0.01, True: 0.05}


class Spec:
    """The architecture facts the forward pass needs, read from config.json like transformers does."""

    def __init__(self, cfg):
        self.arch = cfg["architectures"][0]
        self.layers, self.heads, self.kv_heads = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // self.heads
        self.eps = cfg["rms_norm_eps"]
        self.tie = cfg["tie_word_embeddings"]
        self.vocab, self.hidden = cfg["vocab_size"], cfg["hidden_size"]
        # Qwen2 always has q/k/v biases (and none on o_proj); `attention_bias` elsewhere also adds an
        # o_proj bias, which this reference does not implement.
        assert not cfg.get("attention_bias", False), "attention_bias (q/k/v/o biases) is not modelled"
        self.qkv_bias = self.arch == "Qwen2ForCausalLM"
        self.qk_norm = self.arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
        self.inv_freq = inv_freq(cfg, self.head_dim)
        self.ff = cfg["intermediate_size"]  # dense MLP width (Mixtral: the expert width, no dense layers)
        # Mixture of experts (modeling_qwen3_moe.py Qwen3MoeDecoderLayer / modeling_mixtral.py): which
        # layers are sparse, the module prefix and the expert projections (gate, up, down).
        self.sparse = [False] * self.layers
        if self.arch == "Qwen3MoeForCausalLM":
            self.experts, self.top_k = cfg["num_experts"], cfg["num_experts_per_tok"]
            self.moe_ff, self.norm_topk = cfg["moe_intermediate_size"], cfg["norm_topk_prob"]
            self.sparse = [i not in cfg["mlp_only_layers"] and self.experts > 0
                           and (i + 1) % cfg["decoder_sparse_step"] == 0 for i in range(self.layers)]
            self.moe_prefix, self.expert_proj = "mlp.", ("gate_proj", "up_proj", "down_proj")
        elif self.arch == "MixtralForCausalLM":
            self.experts, self.top_k = cfg["num_local_experts"], cfg["num_experts_per_tok"]
            self.moe_ff, self.norm_topk = cfg["intermediate_size"], True  # Mixtral always renormalises
            self.sparse = [True] * self.layers
            self.moe_prefix, self.expert_proj = "block_sparse_moe.", ("w1", "w3", "w2")


def inv_freq(cfg, dim):
    """transformers modeling_rope_utils: default, linear and llama3 rope parameters (in float64)."""
    freq = 1.0 / (cfg["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float64) / dim))
    rs = cfg.get("rope_scaling")
    kind = None if rs is None else rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return freq
    if kind == "linear":
        return freq / rs["factor"]
    assert kind == "llama3", kind
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * np.pi / freq
    out = np.where(wavelen > low_wavelen, freq / factor, freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, out)


# ---- random weights ----

def random_weights(spec, rng, dtype=np.float64):
    """Float64 weights in HF names and PyTorch shapes (`[out, in]`). Scales give O(1) activations, attention
    scores with std ~1.5 (so attention is neither uniform nor one-hot) and logits with std ~3.
    With tied embeddings a random model predicts its input token again (the token's own embedding is
    most similar to the residual it starts); scaling o_proj/down_proj up by 4 lets the layers dominate.
    `dtype=np.float32` draws float32 instead (other values, half the memory and time: benchmark models
    of hundreds of millions of weights, which have no reference pass)."""
    d, hd = spec.hidden, spec.head_dim
    res = 4.0 if spec.tie else 1.0
    q, kv = spec.heads * hd, spec.kv_heads * hd
    nrm = lambda *s, std=1.0: rng.standard_normal(s, dtype=dtype) * dtype(std)
    gain = lambda n: dtype(1.0) + dtype(0.25) * rng.standard_normal(n, dtype=dtype)  # != 1: a skipped norm shows
    w = {"model.embed_tokens.weight": nrm(spec.vocab, d, std=3.0 / np.sqrt(d) if spec.tie else 1.0)}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = gain(d)
        w[p + "self_attn.q_proj.weight"] = nrm(q, d, std=1.2 / np.sqrt(d))
        w[p + "self_attn.k_proj.weight"] = nrm(kv, d, std=1.2 / np.sqrt(d))
        w[p + "self_attn.v_proj.weight"] = nrm(kv, d, std=1.0 / np.sqrt(d))
        w[p + "self_attn.o_proj.weight"] = nrm(d, q, std=res / np.sqrt(q))
        if spec.qkv_bias:
            w[p + "self_attn.q_proj.bias"] = nrm(q, std=0.3)
            w[p + "self_attn.k_proj.bias"] = nrm(kv, std=0.3)
            w[p + "self_attn.v_proj.bias"] = nrm(kv, std=0.3)
        if spec.qk_norm:
            w[p + "self_attn.q_norm.weight"] = gain(hd)
            w[p + "self_attn.k_norm.weight"] = gain(hd)
        w[p + "post_attention_layernorm.weight"] = gain(d)
        if spec.sparse[i]:  # router, then each expert's gate, up, down (like a dense MLP each)
            m, (g, u, dn), ff = p + spec.moe_prefix, spec.expert_proj, spec.moe_ff
            w[m + "gate.weight"] = nrm(spec.experts, d, std=ROUTER_STD / np.sqrt(d))
            for e in range(spec.experts):
                w[m + f"experts.{e}.{g}.weight"] = nrm(ff, d, std=1.0 / np.sqrt(d))
                w[m + f"experts.{e}.{u}.weight"] = nrm(ff, d, std=1.0 / np.sqrt(d))
                w[m + f"experts.{e}.{dn}.weight"] = nrm(d, ff, std=res / np.sqrt(ff))
            continue
        w[p + "mlp.gate_proj.weight"] = nrm(spec.ff, d, std=1.0 / np.sqrt(d))
        w[p + "mlp.up_proj.weight"] = nrm(spec.ff, d, std=1.0 / np.sqrt(d))
        w[p + "mlp.down_proj.weight"] = nrm(d, spec.ff, std=res / np.sqrt(spec.ff))
    w["model.norm.weight"] = gain(d)
    if not spec.tie:
        w["lm_head.weight"] = nrm(spec.vocab, d, std=3.0 / np.sqrt(d))
    return w


def to_bf16_bits(x):
    """float64 -> bfloat16 bit patterns (round to nearest even via float32, as torch's .to(bfloat16))."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def encode(x, dtype):
    """(safetensors dtype, little-endian bytes, the stored values upcast to float64)."""
    if dtype == "float32":
        a = x.astype("<f4")
        return "F32", a.tobytes(), a.astype(np.float64)
    if dtype == "float16":
        a = x.astype("<f2")
        return "F16", a.tobytes(), a.astype(np.float64)
    assert dtype == "bfloat16", dtype
    bits = to_bf16_bits(x).astype("<u2")
    return "BF16", bits.tobytes(), (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, bytes). Data laid out in name order, header padded to 8 bytes."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        dt, shape, data = tensors[name]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for b in blobs:
            f.write(b)
    return off


def save_model(out, cfg, weights, shards):
    """Writes config.json and the weights; returns the stored weights as float64 (what the file holds)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    stored, encoded = {}, {}
    for name, x in weights.items():
        dt, data, back = encode(x, cfg["torch_dtype"])
        encoded[name], stored[name] = (dt, x.shape, data), back.reshape(x.shape)
    if shards == 1:
        write_safetensors(os.path.join(out, "model.safetensors"), encoded)
        return stored
    # Split by tensor order like save_pretrained's max_shard_size: a prefix of the names per shard.
    names = sorted(encoded, key=shard_order)
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: encoded[n] for n in names[s * per:(s + 1) * per]}
        total += write_safetensors(os.path.join(out, fname), part)
        weight_map.update({n: fname for n in part})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return stored


def shard_order(name):
    """Module order: embeddings, layer 0, layer 1, ..., final norm, lm_head."""
    if name.startswith("model.layers."):
        return (1, int(name.split(".")[2]), name)
    return (0 if "embed_tokens" in name else 2, 0, name)


# ---- GGUF (llama.cpp's layout, Q8_0) ----

def llama_permute(w, n_head):
    """convert_hf_to_gguf.py LlamaModel.permute: q/k rows reordered so that ggml's "normal" RoPE (adjacent
    pairs) computes what HF's rotate_half does on the original rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def save_gguf(path, name, arch, spec, cfg, weights, add_metadata=None, read_back=True, qtype="q8_0", keep=True):
    """Writes the weights as llama.cpp's converter (+ llama-quantize Q8_0) lays them out: matrices and the
    stacked expert tensors Q8_0 (gguf-py's quantizer), norms and routers F32; q/k rows permuted for the
    `llama` architecture. `add_metadata(writer)`, if given, adds more keys (a tokenizer) before the file is
    written. Returns what the file holds, dequantized to float64, in HF names and layout. `read_back`: check
    the file with gguf-py's reader (which parses every key: seconds with a 49k-token vocabulary).
    `qtype` "q4_0": the matrices Q4_0 instead (file type MOSTLY_Q4_0; unlike llama-quantize, the output
    matrix too). `keep=False`: nothing is dequantized or kept (large benchmark models); returns None."""
    import gguf
    from gguf.quants import dequantize, quantize
    Q = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[qtype]
    assert keep or not read_back, "read_back compares with the kept values"
    hd, E = spec.head_dim, spec.experts
    wr = gguf.GGUFWriter(path, arch)
    wr.add_name(name)
    wr.add_file_type({"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[qtype])
    wr.add_quantization_version(gguf.GGML_QUANT_VERSION)
    wr.add_block_count(spec.layers)
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_head_count(spec.heads)
    wr.add_head_count_kv(spec.kv_heads)
    wr.add_rope_freq_base(cfg["rope_theta"])
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    wr.add_expert_count(E)
    wr.add_expert_used_count(spec.top_k)
    if arch == "qwen3moe":  # Qwen3MoeModel: the dense width, the expert width, head_dim as key/value length
        assert all(spec.sparse) and spec.norm_topk, "llama.cpp's qwen3moe: every layer sparse, renormalised"
        wr.add_feed_forward_length(cfg["intermediate_size"])
        wr.add_expert_feed_forward_length(spec.moe_ff)
        wr.add_key_length(hd)
        wr.add_value_length(hd)
    else:  # LlamaModel on a Mixtral checkpoint: feed_forward_length is the expert width
        assert arch == "llama" and spec.moe_prefix == "block_sparse_moe."
        wr.add_vocab_size(spec.vocab)
        wr.add_feed_forward_length(spec.moe_ff)
        wr.add_rope_dimension_count(hd)
    written = {}

    def put(gname, a, quant):
        a32 = np.ascontiguousarray(a, dtype=np.float32)
        if quant:
            data = quantize(a32, Q)
            wr.add_tensor(gname, data, raw_dtype=Q)
            if not keep:
                return None
            back = dequantize(data, Q)
        else:
            wr.add_tensor(gname, a32)
            if not keep:
                return None
            back = a32.copy()
        assert back.shape == a.shape, (gname, back.shape, a.shape)
        written[gname] = back
        return back.astype(np.float64)

    st = {"model.embed_tokens.weight": put("token_embd.weight", weights["model.embed_tokens.weight"], True)}
    for i in range(spec.layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        norm = lambda hf, g: put(b + g + ".weight", weights[p + hf + ".weight"], False)
        st[p + "input_layernorm.weight"] = norm("input_layernorm", "attn_norm")
        for n, g in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_output")):
            x, heads = weights[p + f"self_attn.{n}_proj.weight"], spec.heads if n == "q" else spec.kv_heads
            if arch == "llama" and n in "qk":
                back = put(b + g + ".weight", llama_permute(x, heads), True)
                st[p + f"self_attn.{n}_proj.weight"] = llama_unpermute(back, heads) if keep else None
            else:
                st[p + f"self_attn.{n}_proj.weight"] = put(b + g + ".weight", x, True)
        if spec.qk_norm:
            for n in "qk":
                st[p + f"self_attn.{n}_norm.weight"] = norm(f"self_attn.{n}_norm", f"attn_{n}_norm")
        st[p + "post_attention_layernorm.weight"] = norm("post_attention_layernorm", "ffn_norm")
        m = p + spec.moe_prefix
        st[m + "gate.weight"] = norm(spec.moe_prefix + "gate", "ffn_gate_inp")  # the router, F32
        for proj, g in zip(spec.expert_proj, ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")):
            names = [m + f"experts.{e}.{proj}.weight" for e in range(E)]
            stacked = put(b + g + ".weight", np.stack([weights[n] for n in names]), True)  # [E, out, in]
            st.update(zip(names, stacked if keep else [None] * E))
    st["model.norm.weight"] = put("output_norm.weight", weights["model.norm.weight"], False)
    st["lm_head.weight"] = put("output.weight", weights["lm_head.weight"], True)
    if add_metadata:
        add_metadata(wr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    # Read the file back: every tensor dequantizes to exactly what the reference uses.
    for t in gguf.GGUFReader(path).tensors if read_back else []:
        got = dequantize(np.asarray(t.data), t.tensor_type).reshape(written[t.name].shape)
        assert np.array_equal(got, written[t.name]), t.name
    return st if keep else None


# ---- the reference forward pass (float64) ----

def rms_norm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def route(router_logits, top_k, norm_topk):
    """Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock routing: softmax over all experts, the top_k
    probabilities, renormalised to sum 1 if norm_topk. Ties (equal probabilities) go to the LOWER expert
    index (stable sort by descending probability). Returns (experts (T, k), weights (T, k))."""
    p = np.exp(router_logits - router_logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    chosen = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(p, chosen, axis=-1)
    if norm_topk:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return chosen, weights


def q8_activations(x):
    """Each row's blocks of 32 quantized to Q8_0 and back (gguf-py's quantizer): how an engine whose Q8_0
    kernels take int8 activations (llama.cpp, ingot's native path) sees a matmul input. Only used to pick a
    GGUF prompt whose routing and greedy tokens survive that; never in the reference values."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize
    q8 = GGMLQuantizationType.Q8_0
    return dequantize(quantize(np.ascontiguousarray(x, dtype=np.float32), q8), q8).astype(np.float64)


def moe(spec, w, m, h, trace=None, layer=None, aq=None):
    """Sum over each token's top-k experts of weight * down(silu(gate(h)) * up(h)); m: the module prefix,
    trace/layer/aq as in forward()."""
    # Router logits as row-by-row dot products (not one matmul), so two identical router rows give
    # bit-identical logits and the tie rule, not BLAS rounding, decides between them.
    router = np.sum(h[:, None, :] * w[m + "gate.weight"][None, :, :], axis=-1)
    chosen, weights = route(router, spec.top_k, spec.norm_topk)
    if trace is not None:
        trace[layer] = (router, chosen)
    g_name, u_name, d_name = spec.expert_proj
    out = np.zeros_like(h)
    for e in range(spec.experts):
        rows, slot = np.nonzero(chosen == e)
        if len(rows) == 0:
            continue
        x, p = aq(h[rows]), m + f"experts.{e}."
        g, u = x @ w[p + g_name + ".weight"].T, x @ w[p + u_name + ".weight"].T
        out[rows] += weights[rows, slot][:, None] * (aq(g / (1.0 + np.exp(-g)) * u) @ w[p + d_name + ".weight"].T)
    return out


def forward(spec, w, ids, trace=None, aq=None):
    """Logits of every position of `ids` (a fresh full-sequence pass): (T, vocab). `trace`, if a dict,
    receives {layer: (router logits (T, E), chosen experts (T, k))} for the sparse layers. `aq`, if given,
    is applied to the input of every matmul but the router's (see q8_activations)."""
    aq = aq or (lambda a: a)
    T, hd, group = len(ids), spec.head_dim, spec.heads // spec.kv_heads
    freqs = np.arange(T, dtype=np.float64)[:, None] * spec.inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]  # (T, 1, hd)
    causal = np.where(np.arange(T)[None, :] <= np.arange(T)[:, None], 0.0, -np.inf)
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], spec.eps)
        q, k, v = (aq(h) @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        if spec.qkv_bias:
            q, k, v = (t + w[p + f"self_attn.{n}_proj.bias"] for t, n in zip((q, k, v), "qkv"))
        q, k, v = q.reshape(T, spec.heads, hd), k.reshape(T, spec.kv_heads, hd), v.reshape(T, spec.kv_heads, hd)
        if spec.qk_norm:  # Qwen3: per head, before RoPE
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], spec.eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], spec.eps)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # repeat_kv: head h reads h // group
        scores = np.einsum("thd,shd->hts", q, k) * hd ** -0.5 + causal[None]
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", probs, v).reshape(T, spec.heads * hd)
        x = x + aq(attn) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], spec.eps)
        if spec.sparse[i]:
            x = x + moe(spec, w, p + spec.moe_prefix, h, trace, i, aq)
            continue
        g, u = aq(h) @ w[p + "mlp.gate_proj.weight"].T, aq(h) @ w[p + "mlp.up_proj.weight"].T
        x = x + aq(g / (1.0 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], spec.eps)
    return aq(x) @ w["model.embed_tokens.weight" if spec.tie else "lm_head.weight"].T


def greedy(spec, w, prompt):
    """GREEDY argmax tokens (lowest id on ties), the logits row behind each, and its top1 - top2 margin."""
    ids, rows, margins = list(prompt), [], []
    for _ in range(GREEDY):
        logits = forward(spec, w, ids)[-1]
        top2 = np.sort(logits)[-2:]
        rows.append(logits)
        margins.append(float(top2[1] - top2[0]))
        ids.append(int(np.argmax(logits)))
    return ids[len(prompt):], rows, margins


def routing_stats(spec, trace, tie):
    """Routing decisions of one pass: per sparse layer the experts used, the smallest router-logit gap
    between a chosen and an unchosen expert (the designated tied pair excepted), and for the tied pair
    how often both were chosen and how often exactly one was (the tie rule decided the k-th slot)."""
    used, min_gap, both, decided = {}, np.inf, 0, 0
    for layer, (router, chosen) in trace.items():
        used[layer] = sorted({int(e) for e in chosen.ravel()})
        for t in range(router.shape[0]):
            inside = set(int(e) for e in chosen[t])
            for a in inside:
                for b in set(range(spec.experts)) - inside:
                    if tie and layer == tie[0] and {a, b} == {tie[1], tie[2]}:
                        continue
                    min_gap = min(min_gap, router[t, a] - router[t, b])
            if tie and layer == tie[0]:
                n = len(inside & {tie[1], tie[2]})
                both += n == 2
                decided += n == 1
    return used, float(min_gap), both, decided


def build(name, out):
    seed, cfg = MODELS[name]
    rng = np.random.default_rng(seed)
    spec = Spec(cfg)
    weights = random_weights(spec, rng)
    tie = TIES.get(name)
    if tie:
        layer, e, src = tie
        assert spec.sparse[layer]
        router = weights[f"model.layers.{layer}.{spec.moe_prefix}gate.weight"]
        router[e] = router[src]
    if name in GGUF_ARCH:
        os.makedirs(out, exist_ok=True)
        stored = save_gguf(os.path.join(out, "model.gguf"), name, GGUF_ARCH[name], spec, cfg, weights)
        spec.eps = float(np.float32(spec.eps))  # the GGUF stores eps as f32
    else:
        stored = save_model(out, cfg, weights, shards=2 if name == "sharded" else 1)
    is_moe = any(spec.sparse)
    for attempt in range(100):
        prompt = [int(t) for t in rng.integers(3, VOCAB, PROMPT_LEN)]
        out_ids, rows, margins = greedy(spec, stored, prompt)
        if min(margins) < MIN_MARGIN or len(set(out_ids)) < MIN_DISTINCT:
            continue
        if not is_moe:
            break
        # Every routing decision of the whole run: the last pass covers the prompt and all fed-back tokens.
        trace, seq = {}, prompt + out_ids[:-1]
        forward(spec, stored, seq, trace)
        used, min_gap, both, decided = routing_stats(spec, trace, tie)
        all_used = all(len(u) == spec.experts for u in used.values())
        if min_gap < MIN_ROUTER_GAP[name in GGUF_ARCH] or decided < 1 or not all_used:
            continue
        if name not in GGUF_ARCH:
            break
        trace_q = {}
        logits_q = forward(spec, stored, seq, trace_q, q8_activations)
        same_routes = all(np.array_equal(trace[l][1], trace_q[l][1]) for l in trace)
        sim_err = float(np.max(np.abs(logits_q[len(prompt) - 1:] - np.array(rows))))
        if same_routes and [int(np.argmax(r)) for r in logits_q[len(prompt) - 1:]] == out_ids:
            break
    else:
        sys.exit(f"{name}: no prompt with all margins >= {MIN_MARGIN} and {MIN_DISTINCT} distinct tokens"
                 + (", router gaps, a decided tie and every expert used" if is_moe else "")
                 + (" (and stable under Q8_0 activations)" if name in GGUF_ARCH else ""))
    expected = {
        "name": name, "architecture": cfg["architectures"][0], "torch_dtype": cfg["torch_dtype"],
        "prompt_ids": prompt, "greedy_ids": out_ids, "logits": [r.tolist() for r in rows],
        "margins": margins, "min_margin": min(margins), "logit_scale": float(np.max(np.abs(rows[0]))),
    }
    if name in GGUF_ARCH:
        expected.update(architecture=GGUF_ARCH[name], torch_dtype=None, format="gguf")
    if is_moe:
        first = {}
        forward(spec, stored, prompt, first)
        expected["routing"] = {str(l): chosen.tolist() for l, (_, chosen) in first.items()}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
    print(f"{name}: prompt try {attempt}, greedy {out_ids}, min margin {min(margins):.4f}, "
          f"logit std {np.std(rows[0]):.2f}, max |logit| {expected['logit_scale']:.2f}", file=sys.stderr)
    if is_moe:
        T = len(prompt) + len(out_ids) - 1
        print(f"{name}: routing {T} tokens x {len(trace)} sparse layers = {T * len(trace)} decisions, "
              f"experts used per layer {{{', '.join(f'{l}: {len(u)}/{spec.experts}' for l, u in used.items())}}}, "
              f"min router gap {min_gap:.4f}; tie (layer {tie[0]}: expert {tie[1]} = expert {tie[2]}): "
              f"decided the k-th slot {decided}x, both chosen {both}x", file=sys.stderr)
    if name in GGUF_ARCH:
        print(f"{name}: with Q8_0 activations: same routing and greedy tokens, max |logit diff| {sim_err:.4f}",
              file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory to write <name>/ model directories into")
    ap.add_argument("--only", help="comma-separated model names (default: all)")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(MODELS)
    for n in names:
        if n not in MODELS:
            ap.error(f"unknown model {n!r} (known: {', '.join(MODELS)})")
        build(n, os.path.join(args.out, n))


if __name__ == "__main__":
    main()
