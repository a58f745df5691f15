#!/usr/bin/env python3
"""Writes a Llama- or Qwen3-MoE-shaped GGUF with random weights (numpy only;
the GPU machine has no gguf package and no network), for load and speed
benchmarks beside llama.cpp:

    python3 tests/gpu/write_gguf.py --config CONFIG.json --tokenizer DIR \
        --out model.gguf [--layers N] [--dtype bf16|f16|q8_0|q4_k_m]

Matrices are stored in --dtype (q8_0: llama.cpp's 34-byte blocks of 32,
d = absmax / 127 in f16 and the rounded int8 quants, as quantize_row_q8_0
writes them; q4_k_m: random Q4_K and Q6_K blocks, Q6_K where llama-quantize's
Q4_K_M puts it: attn_v and ffn_down of its "more bits" layers, and the output
matrix; for shapes too large to write in bf16 first), norms in f32, under llama.cpp's tensor
names; the tokenizer (DIR/tokenizer.json, a byte-level BPE such as
Llama 3's or Qwen3's) goes into the metadata the way llama.cpp's converter
puts it, padded with [PAD] tokens to the config's vocab_size. A config with
num_experts (Qwen3MoeForCausalLM) gives general.architecture `qwen3moe` as
convert_hf_to_gguf.py writes it: per-head q/k norms, an f32 router
(ffn_gate_inp) and the experts stacked as ffn_{gate,up,down}_exps.
Values are small normals (std 0.02) drawn once into a pool and sliced at
random offsets, so 16 GB are written in seconds, not minutes.
"""
import argparse
import json
import struct

import numpy as np

ALIGN = 32
T_U32, T_F32, T_BOOL, T_STR, T_ARR, T_I32 = 4, 6, 7, 8, 9, 5
GGML_F32, GGML_F16, GGML_Q8_0, GGML_BF16 = 0, 1, 8, 30
GGML_Q4_K, GGML_Q6_K = 12, 14
# Random k-quant blocks: (bytes a block of 256, f16 scale fields as (offset, size)).
K_BLOCKS = {GGML_Q4_K: (144, [(0, 2e-4), (2, 5e-4)]), GGML_Q6_K: (210, [(208, 2.5e-5)])}
UNIT_BYTES = {GGML_Q8_0: (32, 34), GGML_Q4_K: (256, 144), GGML_Q6_K: (256, 210)}


def sliced(rng, pool, n):
    """n values as runs of `pool` from random offsets."""
    parts, left = [], n
    while left:
        take = min(left, len(pool) // 2)
        start = int(rng.integers(0, len(pool) - take))
        parts.append(pool[start:start + take])
        left -= take
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def k_blocks(rng, ty, count):
    """`count` random blocks of k-quant type `ty` (every byte pattern is a
    valid block once its f16 scales are set to sane sizes)."""
    size, scales = K_BLOCKS[ty]
    b = rng.integers(0, 256, size=(count, size), dtype=np.uint8)
    for at, v in scales:
        b[:, at:at + 2] = (v * rng.uniform(0.5, 1.5, count)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return b


def more_bits(i, n):
    """llama.cpp's use_more_bits: the layers whose attn_v and ffn_down Q4_K_M keeps in Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q8_0_blocks(x):
    """Q8_0 blocks of the f32 values x (a multiple of 32), as bytes."""
    b = x.reshape(-1, 32).astype(np.float32)
    d = (np.abs(b).max(-1) / 127.0).astype(np.float16)
    inv = np.where(d == 0, 0.0, 1.0 / d.astype(np.float32))
    q = np.clip(np.rint(b * inv[:, None]), -127, 127).astype(np.int8)
    out = np.empty((len(b), 34), dtype=np.uint8)
    out[:, :2] = d.view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, ty, value):
    out = s(key) + struct.pack("<I", ty)
    if ty == T_U32:
        out += struct.pack("<I", value)
    elif ty == T_F32:
        out += struct.pack("<f", value)
    elif ty == T_BOOL:
        out += struct.pack("<?", value)
    elif ty == T_STR:
        out += s(value)
    elif ty == T_ARR:
        ety, items = value
        out += struct.pack("<IQ", ety, len(items))
        if ety == T_STR:
            out += b"".join(s(i) for i in items)
        elif ety == T_I32:
            out += np.asarray(items, dtype="<i4").tobytes()
    return out


def tokenizer_kvs(tok_dir, vocab_size, pre, bos, eos):
    tj = json.load(open(f"{tok_dir}/tokenizer.json"))
    vocab = dict(tj["model"]["vocab"])
    special = set()
    for t in tj.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
        if t.get("special"):
            special.add(t["id"])
    n = max(max(vocab.values()) + 1, vocab_size)
    tokens = [f"[PAD{i}]" for i in range(n)]
    for t, i in vocab.items():
        tokens[i] = t
    types = [3 if i in special else 1 for i in range(n)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    return n, [
        kv("tokenizer.ggml.model", T_STR, "gpt2"),
        kv("tokenizer.ggml.pre", T_STR, pre),
        kv("tokenizer.ggml.tokens", T_ARR, (T_STR, tokens)),
        kv("tokenizer.ggml.token_type", T_ARR, (T_I32, types)),
        kv("tokenizer.ggml.merges", T_ARR, (T_STR, merges)),
        kv("tokenizer.ggml.bos_token_id", T_U32, bos),
        kv("tokenizer.ggml.eos_token_id", T_U32, eos),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--dtype", choices=["bf16", "f16", "q8_0", "q4_k_m"], default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    c = json.load(open(a.config))
    layers = a.layers or c["num_hidden_layers"]
    d, ff = c["hidden_size"], c["intermediate_size"]
    heads, kvh = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim", d // heads)
    experts = c.get("num_experts", 0)
    arch = "qwen3moe" if experts else "llama"
    vocab = c["vocab_size"]
    # Llama: Llama 3 Instruct's ids as llama.cpp's converter writes them (eos the turn's end,
    # <|eot_id|>); Qwen3: the config's.
    pre, bos, eos = ("qwen2", c["bos_token_id"], c["eos_token_id"]) if experts else ("llama-bpe", 128000, 128009)
    n_vocab, tok = tokenizer_kvs(a.tokenizer, vocab, pre, bos, eos)
    assert n_vocab == vocab, (n_vocab, vocab)
    meta = [
        kv("general.architecture", T_STR, arch),
        kv("general.name", T_STR, f"random {arch} (benchmark)"),
        kv(f"{arch}.block_count", T_U32, layers),
        kv(f"{arch}.context_length", T_U32, c.get("max_position_embeddings", 8192)),
        kv(f"{arch}.embedding_length", T_U32, d),
        kv(f"{arch}.feed_forward_length", T_U32, ff),
        kv(f"{arch}.attention.head_count", T_U32, heads),
        kv(f"{arch}.attention.head_count_kv", T_U32, kvh),
        kv(f"{arch}.attention.key_length", T_U32, hd),
        kv(f"{arch}.attention.value_length", T_U32, hd),
        kv(f"{arch}.attention.layer_norm_rms_epsilon", T_F32, c.get("rms_norm_eps", 1e-5)),
        kv(f"{arch}.rope.freq_base", T_F32, c.get("rope_theta", 10000.0)),
    ] + tok
    if experts:
        assert c.get("norm_topk_prob", True) and not c.get("mlp_only_layers"), "llama.cpp's qwen3moe: all sparse, renormalised"
        meta += [
            kv(f"{arch}.expert_count", T_U32, experts),
            kv(f"{arch}.expert_used_count", T_U32, c["num_experts_per_tok"]),
            kv(f"{arch}.expert_feed_forward_length", T_U32, c["moe_intermediate_size"]),
        ]
    # (name, numpy shape: outermost first)
    shapes = [("token_embd.weight", (vocab, d))]
    for i in range(layers):
        b = f"blk.{i}."
        shapes += [
            (b + "attn_norm.weight", (d,)),
            (b + "attn_q.weight", (heads * hd, d)),
            (b + "attn_k.weight", (kvh * hd, d)),
            (b + "attn_v.weight", (kvh * hd, d)),
            (b + "attn_output.weight", (d, heads * hd)),
            (b + "ffn_norm.weight", (d,)),
        ]
        if experts:
            eff = c["moe_intermediate_size"]
            shapes += [
                (b + "attn_q_norm.weight", (hd,)),
                (b + "attn_k_norm.weight", (hd,)),
                (b + "ffn_gate_inp.weight", (experts, d)),
                (b + "ffn_gate_exps.weight", (experts, eff, d)),
                (b + "ffn_up_exps.weight", (experts, eff, d)),
                (b + "ffn_down_exps.weight", (experts, d, eff)),
            ]
        else:
            shapes += [
                (b + "ffn_gate.weight", (ff, d)),
                (b + "ffn_up.weight", (ff, d)),
                (b + "ffn_down.weight", (d, ff)),
            ]
    shapes += [("output_norm.weight", (d,)), ("output.weight", (vocab, d))]
    half = {"bf16": GGML_BF16, "f16": GGML_F16, "q8_0": GGML_Q8_0, "q4_k_m": GGML_Q4_K}[a.dtype]

    def type_of(name, shape):
        if len(shape) == 1 or name.endswith("ffn_gate_inp.weight"):  # norms, routers (as the converter)
            return GGML_F32
        if half != GGML_Q4_K:
            return half
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        six = name == "output.weight" or (
            layer >= 0 and name.endswith(("attn_v.weight", "ffn_down.weight")) and more_bits(layer, layers))
        return GGML_Q6_K if six else GGML_Q4_K

    infos, offset, plan = b"", 0, []
    for name, shape in shapes:
        ty = type_of(name, shape)
        numel = int(np.prod(shape))
        if ty in UNIT_BYTES:
            per, size = UNIT_BYTES[ty]
            nbytes = numel // per * size
        else:
            nbytes = numel * (4 if ty == GGML_F32 else 2)
        infos += s(name) + struct.pack("<I", len(shape))
        infos += b"".join(struct.pack("<Q", x) for x in reversed(shape))
        infos += struct.pack("<IQ", ty, offset)
        plan.append((name, shape, ty, nbytes))
        offset = (offset + nbytes + ALIGN - 1) // ALIGN * ALIGN
    rng = np.random.default_rng(a.seed)
    pool32 = (rng.standard_normal(1 << 26, dtype=np.float32) * 0.02)
    # Each tensor is runs of whole units (elements, or Q8_0 blocks) sliced
    # from one pool at random offsets.
    pools = {
        GGML_BF16: lambda: (pool32.view(np.uint32) >> 16).astype(np.uint16),
        GGML_F16: lambda: pool32.astype(np.float16).view(np.uint16),
        GGML_Q8_0: lambda: q8_0_blocks(pool32),
        GGML_Q4_K: lambda: k_blocks(rng, GGML_Q4_K, 1 << 20),
    }
    pool = {half: pools[half]()}
    if half == GGML_Q4_K:
        pool[GGML_Q6_K] = k_blocks(rng, GGML_Q6_K, 1 << 20)
    unit = {ty: UNIT_BYTES.get(ty, (1, 2))[1] for ty in pool}
    with open(a.out, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(plan), len(meta)))
        f.write(b"".join(meta) + infos)
        f.write(b"\0" * (-f.tell() % ALIGN))
        for name, shape, ty, nbytes in plan:
            if ty == GGML_F32 and len(shape) == 1:
                data = (1.0 + 0.1 * rng.standard_normal(shape[0])).astype("<f4").tobytes()
            elif ty == GGML_F32:
                data = sliced(rng, pool32, nbytes // 4).astype("<f4").tobytes()
            else:
                data = sliced(rng, pool[ty], nbytes // unit[ty]).tobytes()
            f.write(data)
            f.write(b"\0" * (-f.tell() % ALIGN))
    print(f"wrote {a.out}: {arch}, {layers} layers, {a.dtype}, {offset / 1e9:.2f} GB of tensors")


if __name__ == "__main__":
    main()
