#!/usr/bin/env python3
"""Tiny random Hugging Face model directories plus an independent numpy reference forward pass.

    python tests/reference/hf_tiny_models.py --out DIR [--only llama3,qwen3]

writes DIR/<name>/ for each model: `config.json` (the fields transformers writes for that architecture,
sorted, indent 2), the weights as safetensors (written by hand below: 8-byte little-endian header length,
JSON header with `__metadata__ {"format": "pt"}` padded with spaces to 8 bytes, raw little-endian data),
and `expected.json` with the prompt, the reference logits and greedy tokens. Deterministic: numpy's PCG64
seeded per model, so the same numpy version always writes the same bytes.

| name    | architecture      | notable                                                                  | dtype |
|---------|-------------------|--------------------------------------------------------------------------|-------|
| llama3  | LlamaForCausalLM  | untied lm_head, rope_theta 5e5, llama3 rope scaling (orig. context 64)   | f32   |
| qwen2   | Qwen2ForCausalLM  | q/k/v biases, tied embeddings                                            | bf16  |
| qwen3   | Qwen3ForCausalLM  | head_dim 32 != hidden/heads (16), q_norm/k_norm per head before RoPE     | f16   |
| sharded | LlamaForCausalLM  | 2 shards + model.safetensors.index.json, legacy `"type": "linear"` rope  | f32   |

All: hidden 64, 4 query heads / 2 kv heads (GQA), intermediate 128, vocab 300, max_position_embeddings 256.

The forward pass shares no code with the Rust engine and follows transformers' modeling_{llama,qwen2,qwen3}.py:
RMSNorm `w * x / sqrt(mean(x^2) + eps)`; q/k/v projections (+ bias for Qwen2); Qwen3 RMSNorm of each
head of q and k (weights `[head_dim]`) *before* RoPE; RoPE in the "rotate half" layout
(`x*cos + rotate_half(x)*sin`, `emb = cat(freqs, freqs)`) with inv_freq from modeling_rope_utils
(`_compute_default_rope_parameters` over head_dim, `_compute_linear_scaling_rope_parameters`,
`_compute_llama3_parameters`); GQA (q head h reads kv head h // (heads / kv_heads)); causal softmax
attention scaled by head_dim^-0.5; `down(silu(gate(x)) * up(x))`; final norm; lm_head or the tied
embedding. Every step recomputes the whole sequence (no KV cache), unlike the engine.

Numerics: float64 throughout. Weights are the values stored in the file (bf16/f16 rounded, upcast), so the
only difference to an f32 engine is its own f32 rounding. RoPE angles: float64 inv_freq times position.

expected.json: {"name", "architecture", "torch_dtype", "prompt_ids": [20 ids], "greedy_ids": [8 ids],
"logits": [[vocab floats] x 8] (row k = logits that pick greedy_ids[k]; row 0 = after the prompt),
"margins": [8 floats, top1 - top2 of each row], "min_margin", "logit_scale": max |row 0|}.
The prompt is the first of a deterministic sequence of random prompts whose 8 greedy steps all have a
top1 - top2 margin >= MIN_MARGIN, so an engine's rounding cannot flip a greedy token.
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


# name -> (seed, config). llama3's original context (64) puts its 8 frequencies (head_dim 16, wavelengths
# 6.3, 32, 167, ... tokens) in all three bands of the llama3 rule: kept (< 16), smoothed (16..64),
# divided by 8 (> 64), so the scaling changes the angles at the prompt's positions.
MODELS = {
    "llama3": (31, llama_config(2, "float32", False, 500000.0, {
        "factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
        "original_max_position_embeddings": 64, "rope_type": "llama3"})),
    "qwen2": (32, qwen2_config(2, "bfloat16")),
    "qwen3": (33, qwen3_config(3, "float16", 32)),
    "sharded": (34, llama_config(3, "float32", False, 10000.0, {"factor": 2.0, "type": "linear"})),
}


class Spec:
    """The architecture facts the forward pass needs, read from config.json like transformers does."""

    def __init__(self, cfg):
        self.arch = cfg["architectures"][0]
        self.layers, self.heads, self.kv_heads = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // self.heads
        self.eps = cfg["rms_norm_eps"]
        self.tie = cfg["tie_word_embeddings"]
        # Qwen2 always has q/k/v biases (and none on o_proj); `attention_bias` elsewhere also adds an
        # o_proj bias, which this reference does not implement.
        assert not cfg.get("attention_bias", False), "attention_bias (q/k/v/o biases) is not modelled"
        self.qkv_bias = self.arch == "Qwen2ForCausalLM"
        self.qk_norm = self.arch == "Qwen3ForCausalLM"
        self.inv_freq = inv_freq(cfg, self.head_dim)


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

def random_weights(spec, rng):
    """Float64 weights in HF names and PyTorch shapes (`[out, in]`). Scales give O(1) activations, attention
    scores with std ~1.5 (so attention is neither uniform nor one-hot) and logits with std ~3.
    With tied embeddings a random model predicts its input token again (the token's own embedding is
    most similar to the residual it starts); scaling o_proj/down_proj up by 4 lets the layers dominate."""
    d, hd = HIDDEN, spec.head_dim
    res = 4.0 if spec.tie else 1.0
    q, kv = spec.heads * hd, spec.kv_heads * hd
    nrm = lambda *s, std=1.0: rng.standard_normal(s) * std
    gain = lambda n: 1.0 + 0.25 * rng.standard_normal(n)  # norm weights != 1, so a skipped norm shows
    w = {"model.embed_tokens.weight": nrm(VOCAB, d, std=3.0 / np.sqrt(d) if spec.tie else 1.0)}
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
        w[p + "mlp.gate_proj.weight"] = nrm(FF, d, std=1.0 / np.sqrt(d))
        w[p + "mlp.up_proj.weight"] = nrm(FF, d, std=1.0 / np.sqrt(d))
        w[p + "mlp.down_proj.weight"] = nrm(d, FF, std=res / np.sqrt(FF))
    w["model.norm.weight"] = gain(d)
    if not spec.tie:
        w["lm_head.weight"] = nrm(VOCAB, d, std=3.0 / np.sqrt(d))
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


# ---- the reference forward pass (float64) ----

def rms_norm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def forward(spec, w, ids):
    """Logits of every position of `ids` (a fresh full-sequence pass): (T, vocab)."""
    T, hd, group = len(ids), spec.head_dim, spec.heads // spec.kv_heads
    freqs = np.arange(T, dtype=np.float64)[:, None] * spec.inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]  # (T, 1, hd)
    causal = np.where(np.arange(T)[None, :] <= np.arange(T)[:, None], 0.0, -np.inf)
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], spec.eps)
        q, k, v = (h @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
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
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], spec.eps)
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], spec.eps)
    return x @ w["model.embed_tokens.weight" if spec.tie else "lm_head.weight"].T


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


def build(name, out):
    seed, cfg = MODELS[name]
    rng = np.random.default_rng(seed)
    spec = Spec(cfg)
    stored = save_model(out, cfg, random_weights(spec, rng), shards=2 if name == "sharded" else 1)
    for attempt in range(100):
        prompt = [int(t) for t in rng.integers(3, VOCAB, PROMPT_LEN)]
        out_ids, rows, margins = greedy(spec, stored, prompt)
        if min(margins) >= MIN_MARGIN and len(set(out_ids)) >= MIN_DISTINCT:
            break
    else:
        sys.exit(f"{name}: no prompt with all margins >= {MIN_MARGIN} and {MIN_DISTINCT} distinct tokens")
    expected = {
        "name": name, "architecture": cfg["architectures"][0], "torch_dtype": cfg["torch_dtype"],
        "prompt_ids": prompt, "greedy_ids": out_ids, "logits": [r.tolist() for r in rows],
        "margins": margins, "min_margin": min(margins), "logit_scale": float(np.max(np.abs(rows[0]))),
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
    print(f"{name}: prompt try {attempt}, greedy {out_ids}, min margin {min(margins):.4f}, "
          f"logit std {np.std(rows[0]):.2f}, max |logit| {expected['logit_scale']:.2f}", file=sys.stderr)


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
