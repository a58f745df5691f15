#!/usr/bin/env python3
"""Servable tiny random-weight Mixture-of-Experts models: real tokenizers, random weights.

    python tests/reference/moe_serve_models.py --out DIR [--qwen3-tokenizer DIR] [--smollm2-gguf FILE]

hf_tiny_models.py's MoE models have a 300-token vocabulary and no tokenizer, so `ingot serve` cannot
serve them. This script writes two that it can, with hf_tiny_models.py's random weights and writers:

| name          | format                         | tokenizer                                   | size         |
|---------------|--------------------------------|---------------------------------------------|--------------|
| qwen3moe_chat | HF dir, Qwen3MoeForCausalLM,   | Qwen3's tokenizer.json + tokenizer_config   | 19.5 MB      |
|               | bf16                           | (chat template), generation_config.json     | + 11 MB tok. |
| mixtral_chat  | GGUF `llama` + expert_count,   | every `tokenizer.*` key (ChatML template)   | 8.6 MB       |
|               | Q8_0 (norms, routers F32)      | copied from the SmolLM2-135M GGUF           |              |

- qwen3moe_chat: vocab 151936 (Qwen3's config.json; the tokenizer has 151669 ids, the rest padding),
  hidden 32, 2 layers, both sparse: 8 experts top-2 renormalised (norm_topk_prob true, as Qwen3-30B-A3B),
  moe_intermediate_size 32; 4 q heads / 2 kv heads, head_dim 32 (q width 128 != hidden, q/k norms);
  bos 151643 `<|endoftext|>`, eos 151645 `<|im_end|>` (generation_config: [151645, 151643]), as Qwen3
  ships them. Untied: embeddings and lm_head are two 151936 x 32 bf16 matrices (9.7 MB each). Hidden 32
  rather than 64 with tied embeddings (the same bytes): a random tied model keeps predicting tokens it
  has just seen (a token's own embedding is most similar to its residual) and its greedy answers run
  into one token repeated (4 random prompts, 24 greedy steps: runs of up to 8 of one token; untied: 24
  different tokens each).
- mixtral_chat: Mixtral as llama.cpp converts it (hf_tiny_models.save_gguf: q/k rows permuted, stacked
  `ffn_{gate,up,down}_exps`, `ffn_gate_inp` F32): vocab 49152, hidden 64, 2 layers, 4 experts top-2,
  expert width 64, head_dim 16, plus SmolLM2's gpt2 BPE vocabulary, merges, bos/eos/pad ids and chat
  template.

Both: context 4096, seeded numpy (deterministic bytes for one numpy / gguf-py version). The output rows
of special tokens (Qwen3: ids >= 151643, i.e. the added tokens and the padding rows no tokenizer id
maps to; SmolLM2: the 17 control tokens) are scaled by 0.1, so greedy decoding never picks one
(end of sequence, a chat marker, an id without text) and answers run to max_tokens with visible text.
The script checks with hf_tiny_models' float64 forward pass that greedy decoding of a fixed prompt
gives at least MIN_DISTINCT different tokens (it does not repeat one token forever) and prints the
tokens and the routing spread to stderr.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_tiny_models as tiny  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONTEXT = 4096
SPECIAL_SCALE = 0.1
STEPS, MIN_DISTINCT = 12, 10

QWEN3_VOCAB, QWEN3_BOS, QWEN3_EOS, QWEN3_FIRST_ADDED = 151936, 151643, 151645, 151643


def qwen3moe_config():
    cfg = tiny.qwen3_moe_config(2, "bfloat16", 32, 8, 2, 32, [], True)
    cfg.update(vocab_size=QWEN3_VOCAB, hidden_size=32, bos_token_id=QWEN3_BOS, eos_token_id=QWEN3_EOS,
               tie_word_embeddings=False, max_position_embeddings=CONTEXT)
    return cfg


def mixtral_config(vocab):
    cfg = tiny.mixtral_config(2, "float32", 4, 2, 64)
    cfg.update(vocab_size=vocab, max_position_embeddings=CONTEXT)
    return cfg


def suppress(rows, ids):
    rows[np.asarray(ids)] *= SPECIAL_SCALE


def check_greedy(name, spec, stored, prompt):
    """Greedy decoding with the float64 reference: not stuck on one token. Returns the tokens."""
    ids = list(prompt)
    for _ in range(STEPS):
        ids.append(int(np.argmax(tiny.forward(spec, stored, ids)[-1])))
    out = ids[len(prompt):]
    trace = {}
    tiny.forward(spec, stored, ids[:-1], trace)
    used = {layer: len(set(chosen.ravel().tolist())) for layer, (_, chosen) in trace.items()}
    print(f"{name}: reference greedy {out} ({len(set(out))} distinct), experts used per layer "
          f"{used} of {spec.experts} over {len(ids) - 1} tokens", file=sys.stderr)
    if len(set(out)) < MIN_DISTINCT:
        sys.exit(f"{name}: greedy decoding gives only {len(set(out))} distinct tokens of {STEPS}")
    return out


def write_qwen3moe(out, tokenizer_dir, seed=41):
    cfg = qwen3moe_config()
    spec = tiny.Spec(cfg)
    rng = np.random.default_rng(seed)
    weights = tiny.random_weights(spec, rng)
    suppress(weights["lm_head.weight"], np.arange(QWEN3_FIRST_ADDED, QWEN3_VOCAB))
    stored = tiny.save_model(out, cfg, weights, shards=1)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tokenizer_dir, f), os.path.join(out, f))
    generation = {"bos_token_id": QWEN3_BOS, "do_sample": True, "eos_token_id": [QWEN3_EOS, QWEN3_BOS],
                  "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                  "transformers_version": tiny.TRANSFORMERS_VERSION}
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        f.write(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    # "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n" in Qwen3's ids.
    check_greedy("qwen3moe_chat", spec, stored, [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198])


def gguf_metadata(path):
    """Every key of a GGUF file's metadata as {key: (value, type, sub_type or None)}, values as gguf-py's
    ReaderField.contents() gives them (lists for arrays). The GGUF v2/v3 layout read directly: gguf-py's
    GGUFReader takes ~5 s over SmolLM2's 98k tokenizer strings on CI's cores, this ~0.1 s."""
    import struct

    from gguf import GGUFValueType as T
    scalar = {T.UINT8: "B", T.INT8: "b", T.UINT16: "H", T.INT16: "h", T.UINT32: "I", T.INT32: "i",
              T.FLOAT32: "f", T.BOOL: "?", T.UINT64: "Q", T.INT64: "q", T.FLOAT64: "d"}
    with open(path, "rb") as f:
        magic, version, _tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
        assert magic == b"GGUF" and version in (2, 3), (path, magic, version)
        buf = f.read(64 << 20)  # the metadata comes first; SmolLM2's is ~2 MB
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        pos += n
        return buf[pos - n:pos].decode("utf-8")

    def value(t):
        nonlocal pos
        if t == T.STRING:
            return string()
        if t != T.ARRAY:
            return take(scalar[t])
        sub, n = T(take("I")), take("Q")
        if sub == T.STRING:
            return [string() for _ in range(n)]
        a = np.frombuffer(buf, "<" + scalar[sub], n, pos)
        pos += a.nbytes
        return a.tolist()

    out = {}
    for _ in range(n_kv):
        key, t = string(), T(take("I"))
        sub = T(struct.unpack_from("<I", buf, pos)[0]) if t == T.ARRAY else None
        out[key] = (value(t), t, sub)
    return out


def smollm2_tokenizer(path):
    """The `tokenizer.*` keys of the SmolLM2 GGUF as (key, value, type, sub_type), the vocabulary size
    and the ids of its control tokens."""
    from gguf import TokenType
    meta = gguf_metadata(path)
    kv = [(k, *v) for k, v in meta.items() if k.startswith("tokenizer.")]
    types = meta["tokenizer.ggml.token_type"][0]
    return kv, len(types), [i for i, t in enumerate(types) if t == TokenType.CONTROL]


def write_mixtral(out, smollm2_gguf, seed=42):
    kv, vocab, control = smollm2_tokenizer(smollm2_gguf)
    cfg = mixtral_config(vocab)
    spec = tiny.Spec(cfg)
    rng = np.random.default_rng(seed)
    weights = tiny.random_weights(spec, rng)
    suppress(weights["lm_head.weight"], control)

    def add_tokenizer(wr):
        for key, value, vtype, sub_type in kv:
            wr.add_key_value(key, value, vtype, sub_type=sub_type)

    os.makedirs(out, exist_ok=True)
    stored = tiny.save_gguf(os.path.join(out, "model.gguf"), "mixtral_chat", "llama", spec, cfg, weights,
                            add_metadata=add_tokenizer, read_back=False)
    spec.eps = float(np.float32(spec.eps))  # the GGUF stores eps as f32
    # "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n" in SmolLM2's ids.
    check_greedy("mixtral_chat", spec, stored, [1, 4093, 198, 19556, 2, 198, 1, 520, 9531, 198])


def fetched(script):
    return subprocess.run([os.path.join(REPO, "scripts", script)], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory to write qwen3moe_chat/ and mixtral_chat/ into")
    ap.add_argument("--qwen3-tokenizer", help="directory with Qwen3's tokenizer.json and tokenizer_config.json "
                    "(default: qwen3/ of scripts/fetch-hf-tokenizers)")
    ap.add_argument("--smollm2-gguf", help="the SmolLM2 GGUF to copy the tokenizer from "
                    "(default: scripts/fetch-test-model)")
    args = ap.parse_args()
    write_qwen3moe(os.path.join(args.out, "qwen3moe_chat"),
                   args.qwen3_tokenizer or os.path.join(fetched("fetch-hf-tokenizers"), "qwen3"))
    write_mixtral(os.path.join(args.out, "mixtral_chat"), args.smollm2_gguf or fetched("fetch-test-model"))


if __name__ == "__main__":
    main()
