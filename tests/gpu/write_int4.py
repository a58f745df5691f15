#!/usr/bin/env python3
"""Writes a Llama-shaped AWQ, GPTQ or FP8 checkpoint (a Hugging Face
directory) with random quantized weights, for load and speed benchmarks
(numpy and safetensors only: no AutoAWQ, AutoGPTQ or llm-compressor, no
network):

    python3 tests/gpu/write_int4.py --config CONFIG.json --tokenizer DIR \
        --out OUT_DIR --method awq|gptq|fp8 [--group 128] [--layers N]

fp8: each decoder matrix is compressed-tensors' FP8 layout, `weight` e4m3
[out, in] and `weight_scale` f32 [out, 1] (a scale per output channel),
quantization_config `compressed-tensors`; the e4m3 values are normals of
rms ~112 rounded to e4m3 and the scales ~0.02 / 112, so weights are ~0.02.

Each decoder matrix [out, in] is stored in its method's published layout
(crates/models/src/int4.rs has both): AWQ GEMM (AutoAWQ's WQLinear_GEMM)
`qweight` int32 [in, out/8], `qzeros` int32 [in/g, out/8] (random zero
points 6..10), `scales` f16 [in/g, out]; GPTQ v1 (AutoGPTQ's QuantLinear,
sym, desc_act false) `qweight` int32 [in/8, out], `qzeros` int32
[in/g, out/8] holding z - 1 = 7 in every nibble, `scales` f16 [in/g, out],
`g_idx` int32 [in] = i // g. Quants are random words (random nibbles in any
order), scales ~SCALE, so the weights (q - z) * s are ~0.02 in magnitude.
Embeddings, LM head and norms are f16. config.json is CONFIG.json with the
method's `quantization_config` (and --layers); DIR's tokenizer files are
copied. One ~2 GB shard is made and written at a time
(model-0000i-of-0000n.safetensors and model.safetensors.index.json; one
model.safetensors if it all fits), values sliced from random pools at
random offsets as write_gguf.py does: an 8B takes a few GB of memory.
"""
import argparse
import glob
import json
import os
import shutil

import numpy as np

from write_gguf import sliced

SHARD_BYTES = 2 << 30
# (q - z) has an rms of ~4.8 for random q and z 6..10 (8 for GPTQ), s is
# SCALE * U(0.5, 1.5): weights of rms ~0.02.
SCALE = 0.004
TOKENIZER_FILES = ["tokenizer*", "special_tokens_map.json", "generation_config.json"]


def linears(c):
    """(module, out, in) of one decoder layer's matrices."""
    d, ff = c["hidden_size"], c["intermediate_size"]
    heads, kvh = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim", d // heads)
    return [("self_attn.q_proj", heads * hd, d), ("self_attn.k_proj", kvh * hd, d),
            ("self_attn.v_proj", kvh * hd, d), ("self_attn.o_proj", d, heads * hd),
            ("mlp.gate_proj", ff, d), ("mlp.up_proj", ff, d), ("mlp.down_proj", d, ff)]


def packed(prefix, rows, cols, method, group):
    """(name, dtype, shape) of one matrix's tensors in `method`'s layout."""
    g = cols if group == -1 else group
    assert rows % 8 == 0 and cols % 8 == 0 and cols % g == 0, (prefix, rows, cols, g)
    qweight = (cols, rows // 8) if method == "awq" else (cols // 8, rows)
    out = [(prefix + ".qweight", np.int32, qweight), (prefix + ".qzeros", np.int32, (cols // g, rows // 8)),
           (prefix + ".scales", np.float16, (cols // g, rows))]
    return out + ([(prefix + ".g_idx", np.int32, (cols,))] if method == "gptq" else [])


def fp8_linear(prefix, rows, cols):
    """(name, dtype, shape) of one matrix's tensors in compressed-tensors' FP8 layout
    (np.uint8 stands for the e4m3 bytes)."""
    return [(prefix + ".weight", np.uint8, (rows, cols)), (prefix + ".weight_scale", np.float32, (rows, 1))]


def e4m3_values():
    """The value of each e4m3 byte 0..0x7e (0x7f is NaN; the sign is bit 7)."""
    codes = np.arange(0x7f)
    exp, man = codes >> 3, (codes & 7).astype(np.float64)
    return np.where(exp == 0, man / 8 * 2.0 ** -6, (1 + man / 8) * 2.0 ** (exp - 7))


def e4m3_pool(rng, n):
    """n e4m3 bytes: normals of rms 112 rounded to the nearest e4m3 value."""
    v = np.clip(rng.standard_normal(n, dtype=np.float32) * 112, -448, 448)
    table = e4m3_values()
    mid = (table[1:] + table[:-1]) / 2
    code = np.searchsorted(mid, np.abs(v)).astype(np.uint8)
    return code | np.where(v < 0, 0x80, 0).astype(np.uint8)


SAFETENSORS_DTYPES = {np.dtype(np.uint8): "F8_E4M3", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
                      np.dtype(np.int32): "I32"}


def save_fp8(data, path):
    """Writes a safetensors shard whose uint8 tensors are e4m3 (F8_E4M3, which
    safetensors' numpy API cannot name): the format by hand, header then data."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for k, v in data.items():
        header[k] = {"dtype": SAFETENSORS_DTYPES[v.dtype], "shape": list(v.shape),
                     "data_offsets": [offset, offset + v.nbytes]}
        offset += v.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for v in data.values():
            f.write(np.ascontiguousarray(v).tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--method", choices=["awq", "gptq", "fp8"], required=True)
    ap.add_argument("--group", type=int, default=128, help="inputs per group (a multiple of 32), or -1")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    c = json.load(open(a.config))
    layers = a.layers or c["num_hidden_layers"]
    d, vocab = c["hidden_size"], c["vocab_size"]
    tensors = [("model.embed_tokens.weight", np.float16, (vocab, d))]
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.append((p + "input_layernorm.weight", np.float16, (d,)))
        tensors.append((p + "post_attention_layernorm.weight", np.float16, (d,)))
        for module, rows, cols in linears(c):
            tensors += (fp8_linear(p + module, rows, cols) if a.method == "fp8"
                        else packed(p + module, rows, cols, a.method, a.group))
    tensors.append(("model.norm.weight", np.float16, (d,)))
    if not c.get("tie_word_embeddings", False):
        tensors.append(("lm_head.weight", np.float16, (vocab, d)))

    # Shards: runs of tensors in module order, each under SHARD_BYTES (or one tensor).
    shards, size = [[]], 0
    for t in tensors:
        nbytes = np.dtype(t[1]).itemsize * int(np.prod(t[2]))
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    rng = np.random.default_rng(a.seed)
    normals = (rng.standard_normal(1 << 26, dtype=np.float32) * 0.02).astype(np.float16)
    words = rng.integers(0, 1 << 32, size=1 << 26, dtype=np.uint32).view(np.int32)
    e4m3 = e4m3_pool(rng, 1 << 26) if a.method == "fp8" else None

    def make(name, dtype, shape):
        n = int(np.prod(shape))
        if name.endswith("norm.weight"):
            return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float16)
        if dtype == np.uint8:
            return sliced(rng, e4m3, n).reshape(shape)
        if name.endswith(".weight_scale"):
            return (0.02 / 112 * rng.uniform(0.5, 1.5, shape)).astype(np.float32)
        if dtype == np.float16 and not name.endswith(".scales"):
            return sliced(rng, normals, n).reshape(shape)
        if name.endswith(".qweight"):
            return sliced(rng, words, n).reshape(shape)
        if name.endswith(".scales"):
            return (SCALE * rng.uniform(0.5, 1.5, shape)).astype(np.float16)
        if name.endswith(".g_idx"):
            return (np.arange(n) // (n if a.group == -1 else a.group)).astype(np.int32)
        if a.method == "gptq":  # qzeros: z - 1 = 7 in every nibble (sym)
            return np.full(shape, 0x77777777, dtype=np.int32)
        z = rng.integers(6, 11, size=shape + (8,), dtype=np.uint32)  # AWQ: any order
        return (z << (4 * np.arange(8, dtype=np.uint32))).sum(-1, dtype=np.uint32).view(np.int32)

    os.makedirs(a.out, exist_ok=True)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        data = {name: make(name, dtype, shape) for name, dtype, shape in shard}
        if a.method == "fp8":
            save_fp8(data, os.path.join(a.out, fname))
        else:
            from safetensors.numpy import save_file
            save_file(data, os.path.join(a.out, fname), metadata={"format": "pt"})
        total += sum(v.nbytes for v in data.values())
        weight_map.update({name: fname for name in data})
        del data
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        json.dump(index, open(os.path.join(a.out, "model.safetensors.index.json"), "w"), indent=2)

    if a.method == "fp8":
        scheme = {"weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
                              "dynamic": False},
                  "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                        "dynamic": True},
                  "targets": ["Linear"]}
        quant = {"quant_method": "compressed-tensors", "format": "float-quantized",
                 "config_groups": {"group_0": scheme}, "ignore": ["lm_head"]}
    elif a.method == "awq":
        quant = {"quant_method": "awq", "bits": 4, "group_size": a.group, "zero_point": True,
                 "version": "gemm", "modules_to_not_convert": None}
    else:
        quant = {"quant_method": "gptq", "bits": 4, "group_size": a.group, "desc_act": False, "sym": True,
                 "true_sequential": True, "damp_percent": 0.01, "static_groups": False,
                 "checkpoint_format": "gptq"}
    for pattern in TOKENIZER_FILES:
        for f in glob.glob(os.path.join(a.tokenizer, pattern)):
            shutil.copy(f, a.out)
    # Last: a directory with a config.json is complete.
    c.update(num_hidden_layers=layers, torch_dtype="float16", quantization_config=quant)
    json.dump(c, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    what = "fp8 (per channel)" if a.method == "fp8" else f"{a.method} g{a.group}"
    print(f"wrote {a.out}: {layers} layers, {what}, {total / 1e9:.2f} GB in {len(shards)} shard(s)")


if __name__ == "__main__":
    main()
