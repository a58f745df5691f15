#!/usr/bin/env python3
"""Independent numpy reference for llama-architecture GGUF models (written for SmolLM2-135M-Instruct).

Shares no code with the Rust engine. Weights are dequantized by the `gguf` PyPI package; the forward
pass is plain numpy in float32 (default) or float64. Tokenization uses the `tokenizers` package,
configured from the GGUF vocab/merges plus llama.cpp's pre-tokenizer for the GGUF's `tokenizer.ggml.pre`
(only "smollm" is known here), and is cross-checked against a small pure-Python BPE written below.
Chat prompts are rendered from the GGUF's own `tokenizer.chat_template` with jinja2 the way
transformers' apply_chat_template does (trim_blocks, lstrip_blocks, add_generation_prompt=True).

    python tests/reference/llama_reference.py --model M.gguf --prompts tests/fixtures/prompts.json \
        --out tests/fixtures/smollm2/ [--verify]
    python tests/reference/llama_reference.py --model M.gguf --chat "What is the capital of France?"
    python tests/reference/llama_reference.py --model M.gguf --prompt "The capital of France is"
See tests/reference/README.md for the fixture formats.
"""
import argparse
import json
import os
import sys
import time

import gguf
import jinja2.ext
import jinja2.sandbox
import numpy as np
import regex
from gguf.quants import dequantize
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

# llama.cpp (llama-vocab.cpp) pre-tokenizer regexes for LLAMA_VOCAB_PRE_TYPE_SMOLLM, applied in order:
# first every numeric char is split off on its own, then the GPT-2 pattern splits the remaining spans.
PRE_SPLITS = {
    "smollm": [r"\p{N}", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"],
}
CONTROL = 3  # llama.cpp token type of special/control tokens (<|im_start|>, ...)


def bytes_to_unicode():
    """GPT-2's byte -> printable char table used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class GgufTokenizer:
    def __init__(self, meta):
        assert meta["tokenizer.ggml.model"] == "gpt2", "only byte-level BPE (gpt2) vocabularies are supported"
        pre = meta["tokenizer.ggml.pre"]
        assert pre in PRE_SPLITS, f"unknown pre-tokenizer {pre!r}"
        self.tokens = meta["tokenizer.ggml.tokens"]
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
        self.ranks = {m: r for r, m in enumerate(merges)}
        self.specials = [t for t, ty in zip(self.tokens, meta["tokenizer.ggml.token_type"]) if ty == CONTROL]
        self.splits = [regex.compile(p) for p in PRE_SPLITS[pre]]
        # HF `tokenizers` equivalent of the llama.cpp smollm splits (same as SmolLM2's tokenizer.json).
        tok = Tokenizer(models.BPE(vocab=self.vocab, merges=merges))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in self.specials])
        self.hf = tok
        self.byte_map = bytes_to_unicode()
        self.special_re = regex.compile("|".join(regex.escape(s) for s in sorted(self.specials, key=len, reverse=True)))

    def encode(self, text):
        """Token ids of `text`; control tokens written in the text are recognised. Adds no BOS."""
        ids = self.hf.encode(text, add_special_tokens=False).ids
        py = self.encode_py(text)
        assert ids == py, f"tokenizers vs pure-python BPE disagree on {text!r}:\n{ids}\n{py}"
        return ids

    def decode(self, ids):
        return self.hf.decode(ids, skip_special_tokens=False)

    # ---- pure-python cross-check: llama.cpp-style split + textbook GPT-2 BPE ----
    def encode_py(self, text):
        ids, last = [], 0
        for m in self.special_re.finditer(text):
            ids += self._encode_plain(text[last:m.start()]) + [self.vocab[m.group()]]
            last = m.end()
        return ids + self._encode_plain(text[last:])

    def _encode_plain(self, text):
        pieces = [text] if text else []
        for pat in self.splits:  # unmatched gaps become pieces of their own, as in llama.cpp
            out = []
            for p in pieces:
                pos = 0
                for m in pat.finditer(p):
                    out += [p[pos:m.start()]] if m.start() > pos else []
                    out.append(m.group())
                    pos = m.end()
                out += [p[pos:]] if pos < len(p) else []
            pieces = out
        ids = []
        for p in pieces:
            word = [self.byte_map[b] for b in p.encode("utf-8")]
            while len(word) > 1:
                best = min(range(len(word) - 1), key=lambda i: self.ranks.get((word[i], word[i + 1]), 1 << 30))
                if (word[best], word[best + 1]) not in self.ranks:
                    break
                word[best:best + 2] = [word[best] + word[best + 1]]
            ids += [self.vocab[w] for w in word]
        return ids


def render_chat(template, messages, bos, eos):
    """transformers' apply_chat_template rendering (ImmutableSandboxedEnvironment, trim/lstrip blocks)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = lambda msg: (_ for _ in ()).throw(jinja2.exceptions.TemplateError(msg))
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=bos, eos_token=eos)


class Llama:
    def __init__(self, path, dtype):
        reader = gguf.GGUFReader(path)
        self.meta = {k: f.contents() for k, f in reader.fields.items()}
        assert self.meta["general.architecture"] == "llama"
        m, self.dtype = self.meta, dtype
        self.n_layer = m["llama.block_count"]
        self.n_head, self.n_kv = m["llama.attention.head_count"], m["llama.attention.head_count_kv"]
        self.d_model = m["llama.embedding_length"]
        self.head_dim = self.d_model // self.n_head
        self.eps = m["llama.attention.layer_norm_rms_epsilon"]  # stored as f32, used exactly as stored
        self.rope_base = m.get("llama.rope.freq_base", 10000.0)
        assert m.get("llama.rope.dimension_count", self.head_dim) == self.head_dim
        self.w = {}
        for t in reader.tensors:
            # ggml lists dims fastest-first; numpy wants (rows, cols) = (out_features, in_features)
            a = dequantize(t.data, t.tensor_type).reshape(tuple(int(d) for d in reversed(t.shape)))
            self.w[t.name] = np.ascontiguousarray(a, dtype=dtype)
        self.w_out = self.w.get("output.weight", self.w["token_embd.weight"])  # tied embeddings
        # rope tables: angle(pos, i) = pos * base^(-2i/head_dim), computed in float64 then cast
        self.inv_freq = self.rope_base ** (-np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)

    def rms_norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.dtype(self.eps)) * w

    def rope(self, x, pos):
        """ggml rope mode 0 ("normal"): rotates adjacent pairs (x[2i], x[2i+1]). x: (T, heads, head_dim).
        GGUF llama q/k weights are stored permuted for exactly this layout, so no un-permuting is needed."""
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]
        cos, sin = np.cos(ang).astype(self.dtype)[:, None, :], np.sin(ang).astype(self.dtype)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def new_cache(self, n_ctx):
        shape = (self.n_layer, n_ctx, self.n_kv, self.head_dim)
        return np.zeros(shape, self.dtype), np.zeros(shape, self.dtype)

    def forward(self, ids, start, cache):
        """Runs tokens `ids` at positions start.. (writing the KV cache); returns the last position's logits."""
        T, hd, w = len(ids), self.head_dim, self.w
        pos = np.arange(start, start + T)
        x = w["token_embd.weight"][np.asarray(ids)]
        kc, vc = cache
        S = start + T
        mask = np.where(np.arange(S)[None, :] <= pos[:, None], 0.0, -np.inf).astype(self.dtype)  # (T, S) causal
        group = self.n_head // self.n_kv  # q head h reads kv head h // group
        for l in range(self.n_layer):
            p = f"blk.{l}."
            h = self.rms_norm(x, w[p + "attn_norm.weight"])
            q = self.rope((h @ w[p + "attn_q.weight"].T).reshape(T, self.n_head, hd), pos)
            kc[l, start:S] = self.rope((h @ w[p + "attn_k.weight"].T).reshape(T, self.n_kv, hd), pos)
            vc[l, start:S] = (h @ w[p + "attn_v.weight"].T).reshape(T, self.n_kv, hd)
            k, v = np.repeat(kc[l, :S], group, axis=1), np.repeat(vc[l, :S], group, axis=1)  # (S, n_head, hd)
            scores = np.einsum("thd,shd->hts", q, k) * self.dtype(1.0 / np.sqrt(hd)) + mask[None]
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs = scores / scores.sum(axis=-1, keepdims=True)
            attn = np.einsum("hts,shd->thd", probs, v).reshape(T, self.n_head * hd)
            x = x + attn @ w[p + "attn_output.weight"].T
            h = self.rms_norm(x, w[p + "ffn_norm.weight"])
            g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T  # SiLU(gate) * up
        x = self.rms_norm(x[-1], w["output_norm.weight"])
        return self.w_out @ x


def generate(model, ids, n):
    """Greedy decoding of n tokens (EOS is not a stop: exactly n tokens). Ties go to the lowest id."""
    cache = model.new_cache(len(ids) + n)
    logits = model.forward(ids, 0, cache)
    first, out, margins = logits.copy(), [], []
    for step in range(n):
        nxt = int(np.argmax(logits))  # first maximum = lowest id
        top2 = np.sort(logits)[-2:]
        out.append(nxt)
        margins.append(float(top2[1] - top2[0]))
        if step + 1 < n:
            logits = model.forward([nxt], len(ids) + step, cache)
    return first, out, margins


def prompt_text(model, tok, kind, prompt):
    if kind == "text":
        return prompt
    assert kind == "chat"
    m = model.meta
    return render_chat(m["tokenizer.chat_template"], prompt, tok.tokens[m["tokenizer.ggml.bos_token_id"]],
                       tok.tokens[m["tokenizer.ggml.eos_token_id"]])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--n", type=int, default=32, help="greedy tokens to generate")
    ap.add_argument("--prompts", help="prompts.json (with --out): write fixtures")
    ap.add_argument("--out", help="fixture directory for expected.json and <name>.logits.f32")
    ap.add_argument("--verify", action="store_true", help="with --prompts: also run float64 and compare")
    ap.add_argument("--prompt", help="one-off plain-text prompt")
    ap.add_argument("--chat", help="one-off single user message, rendered with the GGUF chat template")
    args = ap.parse_args()
    if not (args.prompt or args.chat or (args.prompts and args.out)):
        ap.error("give --prompt, --chat, or --prompts with --out")

    t0 = time.time()
    model = Llama(args.model, np.dtype(args.dtype).type)
    tok = GgufTokenizer(model.meta)
    print(f"loaded {args.model} as {args.dtype} in {time.time() - t0:.1f}s", file=sys.stderr)

    if args.prompt is not None or args.chat is not None:
        kind, prompt = ("chat", [{"role": "user", "content": args.chat}]) if args.chat is not None else ("text", args.prompt)
        text = prompt_text(model, tok, kind, prompt)
        ids = tok.encode(text)
        _, out, margins = generate(model, ids, args.n)
        print(json.dumps({"prompt_ids": ids, "greedy_ids": out, "min_margin": min(margins),
                          "greedy_text": tok.decode(out)}, ensure_ascii=False))
        print(repr(text + tok.decode(out)) if kind == "chat" else repr(tok.decode(ids + out)))
        return

    with open(args.prompts, encoding="utf-8") as f:
        prompts = json.load(f)
    check = Llama(args.model, np.float64) if args.verify else None
    os.makedirs(args.out, exist_ok=True)
    expected, worst, diverged = [], 0.0, []
    for p in prompts:
        t1 = time.time()
        text = prompt_text(model, tok, p["kind"], p["prompt"])
        ids = tok.encode(text)
        first, out, margins = generate(model, ids, args.n)
        logits_file = f"{p['name']}.logits.f32"
        first.astype("<f4").tofile(os.path.join(args.out, logits_file))
        eos = model.meta["tokenizer.ggml.eos_token_id"]
        expected.append({"name": p["name"], "kind": p["kind"], "prompt": p["prompt"], "rendered": text, "prompt_ids": ids,
                         "greedy_ids": out, "min_margin": min(margins), "margins": margins,
                         "eos_index": out.index(eos) if eos in out else None,
                         "greedy_text": tok.decode(out), "logits_file": logits_file})
        msg = f"{p['name']}: {len(ids)} prompt tokens, min margin {min(margins):.4f}, {time.time() - t1:.1f}s"
        if check is not None:
            first64, out64, margins64 = generate(check, ids, args.n)
            diff = float(np.max(np.abs(first.astype(np.float64) - first64)))
            worst = max(worst, diff)
            same = out == out64
            msg += f" | f64: greedy {'same' if same else 'DIVERGES'}, logits max|diff| {diff:.3e}"
            if not same:
                diverged.append(p["name"])
                k = next(i for i, (a, b) in enumerate(zip(out, out64)) if a != b)
                msg += f" at step {k} (f32 margin {margins[k]:.4g}, f64 margin {margins64[k]:.4g})"
        print(msg, file=sys.stderr)
        print(f"    {tok.decode(out)!r}", file=sys.stderr)
    with open(os.path.join(args.out, "expected.json"), "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(json.dumps(e, ensure_ascii=False) for e in expected) + "\n]\n")  # one entry a line
    if check is not None:
        print(f"max |f32 - f64| first-step logits over all prompts: {worst:.3e}", file=sys.stderr)
    print(f"total {time.time() - t0:.1f}s", file=sys.stderr)
    if diverged:
        sys.exit(f"f32 and f64 greedy tokens diverge for: {', '.join(diverged)}")


if __name__ == "__main__":
    main()
