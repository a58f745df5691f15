#!/usr/bin/env python3
"""Where SmolLM2's FP8 error comes from, on the CPU: the f32 numpy Llama
forward of llama_reference.py with its layer matrices fake-quantized the
way the CUDA backend stores them, against unquantized f32 and against
bf16-rounded weights (what `--device cuda` without `--quantization` runs).

    python3 tests/reference/fp8_recipes.py --model SmolLM2-135M-Instruct.Q4_1.gguf

For each recipe: prefill logits rel_l2 (same definition as
tests/gpu/compare_fp8.py: |a - b| / |b| over the vocabulary) and how many of
the 20 prompts' 32-token greedy continuations equal the reference's.

Fake quantization mirrors crates/kernels-cuda/cuda/fp8.cu: weights first
rounded to bf16 (the CUDA loader's staging), then per output row (or per
block) s = absmax / 448 (f32) and q = e4m3(w / s), round to nearest even,
saturating; the matrices are fused the way the CUDA loader fuses them
(q|k|v, gate|up), which matters only for 128x128 blocks. Activations: the
inputs of every layer matmul are rounded to bf16, the q/k/v and gate/up
outputs and the KV cache too (bf16 on CUDA); the residual stays f32. With
`act_fp8`, prefills of more than 8 tokens (GEMV_MAX_TOKENS: shorter ones take
the GEMV, which reads bf16 activations) quantize the matmul inputs per token
to e4m3 as the cuBLASLt FP8 GEMM path does.

--lm-head measures `model.fp8_lm_head` instead: the tied LM head
fake-quantized per vocabulary row from the bf16 embedding table (as the CUDA
loader quantizes it), alone and on top of the FP8 layers, the latter also
against the FP8 layers with the bf16 head.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_fp8 import PROMPTS  # noqa: E402
from llama_reference import GgufTokenizer, Llama  # noqa: E402

E4M3_MAX = np.float32(448.0)
GEMV_MAX_TOKENS = 8
GROUPS = ["qkv", "o_proj", "gate_up", "down"]


def to_bf16(x):
    """Round float32 to the nearest bf16 (ties to even), returned as float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def to_e4m3(x):
    """Round float32 to e4m3fn (bias 7, 3 mantissa bits, subnormals below
    2^-6, max 448), ties to even, saturating; returned as float32."""
    a = np.abs(x).astype(np.float32)
    _, e = np.frexp(np.maximum(a, np.float32(2.0**-6)))  # a = m * 2^e, m in [0.5, 1)
    step = np.ldexp(np.float32(1.0), (e - 1 - 3).astype(np.int32)).astype(np.float32)
    q = np.minimum(np.round(a / step) * step, E4M3_MAX)  # np.round: half to even
    return np.copysign(q, x).astype(np.float32)


def quantize_blocks(w, rows, cols):
    """Fake-quantized w with one scale per rows x cols block; rows=None:
    one scale per row within each cols-wide slice."""
    w = to_bf16(w)
    R, C = w.shape
    step = R if rows is None else rows
    out = np.empty_like(w)
    for r0 in range(0, R, step):
        for c0 in range(0, C, cols):
            b = w[r0:r0 + step, c0:c0 + cols]
            m = np.abs(b).max(axis=1 if rows is None else None, keepdims=True)
            s = np.where(m > 0, m / E4M3_MAX, np.float32(1.0)).astype(np.float32)
            out[r0:r0 + step, c0:c0 + cols] = to_e4m3(b / s) * s
    return out


def quantize_rows(w):
    """Per output channel (the CUDA recipe), vectorised."""
    w = to_bf16(w)
    m = np.abs(w).max(axis=1, keepdims=True)
    s = np.where(m > 0, m / E4M3_MAX, np.float32(1.0)).astype(np.float32)
    return to_e4m3(w / s) * s


def quantize_tokens(x):
    """Per-token e4m3 activations (quantize_rows_e4m3 on the bf16 rows)."""
    return quantize_rows(x)


class Model:
    """The reference forward on fused, swappable layer matrices."""

    def __init__(self, base):
        self.b = base
        w = base.w
        self.f32 = []  # per layer: {group: f32 matrix}
        for l in range(base.n_layer):
            p = f"blk.{l}."
            self.f32.append({
                "qkv": np.concatenate([w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"]]),
                "o_proj": w[p + "attn_output.weight"],
                "gate_up": np.concatenate([w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"]]),
                "down": w[p + "ffn_down.weight"],
            })
        self.bf16 = [{g: to_bf16(m) for g, m in layer.items()} for layer in self.f32]
        self.emb_bf16 = to_bf16(w["token_embd.weight"])
        self.set_weights(self.f32, act="f32")

    def set_weights(self, layers, act, head=None):
        """act: "f32" (exact), "bf16" (bf16 matmul inputs) or "fp8" (bf16, and
        per-token e4m3 inputs in prefills of more than GEMV_MAX_TOKENS).
        head: the LM head's matrix (default: the embeddings as act has them)."""
        self.layers, self.act, self.head_w = layers, act, head
        self.emb = self.b.w["token_embd.weight"] if act == "f32" else self.emb_bf16

    def round(self, x):
        return x if self.act == "f32" else to_bf16(x)

    def lin(self, x, w, prefill=True):
        if self.act == "fp8" and prefill and x.shape[0] > GEMV_MAX_TOKENS:
            x = quantize_tokens(x)
        else:
            x = self.round(x)
        return x @ w.T

    def new_cache(self, n_ctx):
        return self.b.new_cache(n_ctx)

    def forward(self, ids, start, cache):
        b = self.b
        T, hd = len(ids), b.head_dim
        nq, nkv = b.n_head * hd, b.n_kv * hd
        pos = np.arange(start, start + T)
        x = self.emb[np.asarray(ids)].astype(np.float32)
        kc, vc = cache
        S = start + T
        mask = np.where(np.arange(S)[None, :] <= pos[:, None], 0.0, -np.inf).astype(np.float32)
        group = b.n_head // b.n_kv
        for l, m in enumerate(self.layers):
            p = f"blk.{l}."
            h = b.rms_norm(x, b.w[p + "attn_norm.weight"])
            qkv = self.round(self.lin(h, m["qkv"]))
            q = b.rope(qkv[:, :nq].reshape(T, b.n_head, hd), pos)
            kc[l, start:S] = self.round(b.rope(qkv[:, nq:nq + nkv].reshape(T, b.n_kv, hd), pos))
            vc[l, start:S] = qkv[:, nq + nkv:].reshape(T, b.n_kv, hd)
            k, v = np.repeat(kc[l, :S], group, axis=1), np.repeat(vc[l, :S], group, axis=1)
            scores = np.einsum("thd,shd->hts", q, k) * np.float32(1.0 / np.sqrt(hd)) + mask[None]
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs = scores / scores.sum(axis=-1, keepdims=True)
            attn = np.einsum("hts,shd->thd", probs, v).reshape(T, nq)
            x = x + self.lin(attn, m["o_proj"])
            h = b.rms_norm(x, b.w[p + "ffn_norm.weight"])
            gu = self.round(self.lin(h, m["gate_up"]))
            g, u = gu[:, : gu.shape[1] // 2], gu[:, gu.shape[1] // 2:]
            x = x + self.lin((g / (1 + np.exp(-g))) * u, m["down"])
        return self.head(x[-1])

    def head(self, x):
        x = self.b.rms_norm(x, self.b.w["output_norm.weight"])
        w_out = self.b.w_out if self.act == "f32" else self.emb_bf16  # tied LM head, bf16 on CUDA
        if self.head_w is not None:
            w_out = self.head_w
        return self.round(x) @ w_out.T

    def decode(self, tokens, positions, caches):
        """One decode step of len(tokens) independent sequences (each a
        batch-1 GEMV step on CUDA: bf16 activations); returns their logits.
        Batched only to read the weights once per step."""
        b = self.b
        B, hd = len(tokens), b.head_dim
        nq, nkv = b.n_head * hd, b.n_kv * hd
        x = self.emb[np.asarray(tokens)].astype(np.float32)
        group = b.n_head // b.n_kv
        for l, m in enumerate(self.layers):
            p = f"blk.{l}."
            h = b.rms_norm(x, b.w[p + "attn_norm.weight"])
            qkv = self.round(self.lin(h, m["qkv"], prefill=False))
            attn = np.empty((B, nq), np.float32)
            for i, (pos, (kc, vc)) in enumerate(zip(positions, caches)):
                at = np.array([pos])
                q = b.rope(qkv[i:i + 1, :nq].reshape(1, b.n_head, hd), at)
                kc[l, pos] = self.round(b.rope(qkv[i:i + 1, nq:nq + nkv].reshape(1, b.n_kv, hd), at))[0]
                vc[l, pos] = qkv[i, nq + nkv:].reshape(b.n_kv, hd)
                k = np.repeat(kc[l, :pos + 1], group, axis=1)
                v = np.repeat(vc[l, :pos + 1], group, axis=1)
                scores = np.einsum("hd,shd->hs", q[0], k) * np.float32(1.0 / np.sqrt(hd))
                probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
                probs /= probs.sum(axis=-1, keepdims=True)
                attn[i] = np.einsum("hs,shd->hd", probs, v).reshape(nq)
            x = x + self.lin(attn, m["o_proj"], prefill=False)
            h = b.rms_norm(x, b.w[p + "ffn_norm.weight"])
            gu = self.round(self.lin(h, m["gate_up"], prefill=False))
            g, u = gu[:, : gu.shape[1] // 2], gu[:, gu.shape[1] // 2:]
            x = x + self.lin((g / (1 + np.exp(-g))) * u, m["down"], prefill=False)
        return self.head(x)


def prefill_logits(model, ids):
    return model.forward(ids, 0, model.new_cache(len(ids))).astype(np.float64)


def greedy_all(model, prompts, n):
    """[(prefill logits, n greedy ids)] per prompt; decode steps batched
    across prompts (each row independent, as n batch-1 runs)."""
    caches = [model.new_cache(len(ids) + n) for ids in prompts]
    logits = np.stack([model.forward(ids, 0, c) for ids, c in zip(prompts, caches)])
    first, outs = logits.astype(np.float64), [[] for _ in prompts]
    for step in range(n):
        nxt = [int(np.argmax(row)) for row in logits]
        for out, t in zip(outs, nxt):
            out.append(t)
        if step + 1 < n:
            logits = model.decode(nxt, [len(ids) + step for ids in prompts], caches)
    return list(zip(first, outs))


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def same_prefix(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))


def score(model, prompts, refs, n):
    """rel_l2 and greedy agreement against each reference in refs {name: [(logits, ids)]}."""
    runs = greedy_all(model, prompts, n)
    row = {}
    for name, ref in refs.items():
        rl = [rel_l2(first, r[0]) for (first, _), r in zip(runs, ref)]
        sp = [same_prefix(out, r[1]) for (_, out), r in zip(runs, ref)]
        row[name] = {"mean_rel_l2": float(np.mean(rl)), "max_rel_l2": float(np.max(rl)),
                     "agree": sum(s == n for s in sp), "mean_same_prefix": float(np.mean(sp))}
    return runs, row


def mixed(model, quant, keep):
    """Layers quantized by `quant`, except (layer, group) pairs in keep (bf16)."""
    return [{g: (model.bf16[l][g] if (l, g) in keep else quant[l][g]) for g in GROUPS}
            for l in range(len(model.f32))]


def sensitivity(model, quant, prompts, ref_bf16):
    """Mean prefill-logit rel_l2 vs bf16 with only one (layer, group) matrix
    in FP8 (everything else bf16): how much that matrix alone moves the logits."""
    out = {}
    for l in range(len(model.f32)):
        for g in GROUPS:
            layers = [dict(layer) for layer in model.bf16]
            layers[l][g] = quant[l][g]
            model.set_weights(layers, "bf16")
            out[(l, g)] = float(np.mean([rel_l2(prefill_logits(model, ids), r[0])
                                         for ids, r in zip(prompts, ref_bf16)]))
    return out


def cached_refs(model, prompts, n, path):
    """The f32 and bf16 runs (and (a)'s row), from `path` when it holds them."""
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        if saved["prompts"] == prompts and saved["tokens"] == n:
            back = {k: [(np.asarray(a), ids) for a, ids in saved[k]] for k in ("f32", "bf16")}
            return back["f32"], back["bf16"], saved["row_bf16"]
    model.set_weights(model.f32, "f32")
    ref_f32, _ = score(model, prompts, {}, n)
    model.set_weights(model.bf16, "bf16")
    ref_bf16, row_bf16 = score(model, prompts, {"f32": ref_f32}, n)
    if path:
        dump = {k: [(a.tolist(), ids) for a, ids in v] for k, v in (("f32", ref_f32), ("bf16", ref_bf16))}
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"prompts": prompts, "tokens": n, "row_bf16": row_bf16, **dump}, f)
    return ref_f32, ref_bf16, row_bf16


def ranking(model, per_row, prompts, ref_bf16, path):
    """Matrices by sensitivity, most first: from `path` (a --sensitivity-only
    output) when given, else measured on the first 10 prompts' prefills."""
    if path:
        while not os.path.exists(path) or os.path.getsize(path) == 0:  # a ranking run still going
            time.sleep(10)
        with open(path, encoding="utf-8") as f:
            return [(l, g) for l, g, _ in json.load(f)]
    sens = sensitivity(model, per_row, prompts[:10], ref_bf16[:10])
    return sorted(sens, key=sens.get, reverse=True)


def lm_head_recipes(model, per_row, prompts, refs, n, table, t0):
    """model.fp8_lm_head: the tied head per-row e4m3 from the bf16 table,
    with bf16 layers, then with FP8 layers (also against FP8 layers alone)."""
    head = quantize_rows(model.emb_bf16)
    for label, layers, head_w in (
            ("(b) FP8 per-channel layers, bf16 head (weight-only)", per_row, None),
            ("(f) bf16 layers, FP8 LM head", model.bf16, head),
            ("(g) FP8 per-channel layers + FP8 LM head", per_row, head)):
        model.set_weights(layers, "bf16", head_w)
        runs, row = score(model, prompts, refs, n)
        table.append((label, row))
        print(f"{label}: {json.dumps(row)} [{time.time() - t0:.0f}s]", file=sys.stderr, flush=True)
        if layers is per_row and head_w is None:
            refs = {**refs, "fp8": runs}
    print(f"(g) against (b): {json.dumps(table[-1][1].get('fp8'))}", file=sys.stderr, flush=True)


def print_table(table, count):
    print(f"{'recipe':75} {'vs bf16: rel_l2 mean/max, agree':>34} {'vs f32: rel_l2 mean/max, agree':>34}")
    for label, row in table:
        cells = []
        for ref in ("bf16", "f32"):
            r = row.get(ref)
            cells.append("-" if r is None else
                         f"{r['mean_rel_l2']:.2e}/{r['max_rel_l2']:.2e} {r['agree']:2d}/{count}")
        print(f"{label:75} {cells[0]:>34} {cells[1]:>34}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--json", help="write the table here as JSON too")
    ap.add_argument("--refs", help="cache of the f32 and bf16 runs (JSON; reused when it matches)")
    ap.add_argument("--ranking", help="a --sensitivity-only output to use instead of measuring")
    ap.add_argument("--lm-head", action="store_true",
                    help="only the FP8 LM head recipes (model.fp8_lm_head)")
    ap.add_argument("--sensitivity-only", action="store_true",
                    help="only rank the matrices (prefill rel_l2 vs bf16 with one matrix in FP8)")
    args = ap.parse_args()
    t0 = time.time()
    base = Llama(args.model, np.float32)
    tok = GgufTokenizer(base.meta)
    prompts = [tok.encode(p) for p in PROMPTS[: args.prompts]]
    print(f"prompt lengths {[len(p) for p in prompts]}", file=sys.stderr)
    model = Model(base)
    n = args.tokens
    per_row = [{g: quantize_rows(m) for g, m in layer.items()} for layer in model.f32]
    if args.sensitivity_only:
        model.set_weights(model.bf16, "bf16")
        ref = [(prefill_logits(model, ids), None) for ids in prompts[:10]]
        sens = sensitivity(model, per_row, prompts[:10], ref)
        print(json.dumps([[l, g, sens[(l, g)]] for l, g in sorted(sens, key=sens.get, reverse=True)]))
        return
    ref_f32, ref_bf16, row_bf16 = cached_refs(model, prompts, n, args.refs)
    refs = {"f32": ref_f32, "bf16": ref_bf16}
    table = [("(a) bf16 weights + bf16 activations", {**row_bf16, "bf16": None})]
    print(f"(a): {json.dumps(row_bf16)} [{time.time() - t0:.0f}s]", file=sys.stderr, flush=True)

    def run(label, layers, act):
        model.set_weights(layers, act)
        _, row = score(model, prompts, refs, n)
        table.append((label, row))
        print(f"{label}: {json.dumps(row)} [{time.time() - t0:.0f}s]", file=sys.stderr, flush=True)

    if args.lm_head:
        lm_head_recipes(model, per_row, prompts, refs, n, table, t0)
        print_table(table, len(prompts))
        return
    L = len(model.f32)
    # Most telling first (the CPU here is slow): each row costs a full 20 x 32 run.
    run("(b) FP8 per-channel, bf16 activations (weight-only)", per_row, "bf16")
    run("(e1) per-channel, down_proj kept bf16", mixed(model, per_row, {(l, "down") for l in range(L)}), "bf16")
    ranked = ranking(model, per_row, prompts, ref_bf16, args.ranking)
    print("most sensitive:", ranked[:16], file=sys.stderr)
    for k in (16, 40):
        run(f"(e3) per-channel, {k} most sensitive matrices kept bf16", mixed(model, per_row, set(ranked[:k])), "bf16")
    blk128 = [{g: quantize_blocks(m, None, 128) for g, m in layer.items()} for layer in model.f32]
    run("(d1) FP8 1x128 blocks, bf16 activations", blk128, "bf16")
    del blk128
    run("(c) FP8 per-channel + e4m3 per-token prefill activations (current CUDA)", per_row, "fp8")
    keep = {(l, g) for l in (0, 1, L - 2, L - 1) for g in GROUPS}
    run("(e2) per-channel, first+last 2 layers kept bf16", mixed(model, per_row, keep), "bf16")
    for k in (80,):
        run(f"(e3) per-channel, {k} most sensitive matrices kept bf16", mixed(model, per_row, set(ranked[:k])), "bf16")
    blk2 = [{g: quantize_blocks(m, 128, 128) for g, m in layer.items()} for layer in model.f32]
    run("(d2) FP8 128x128 blocks, bf16 activations", blk2, "bf16")
    del blk2
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"table": [{"recipe": r, **row} for r, row in table],
                       "ranking": ranked}, f, indent=1)
    print_table(table, len(prompts))
    print(f"total {time.time() - t0:.0f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
