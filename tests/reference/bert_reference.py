#!/usr/bin/env python3
"""Independent numpy reference for BERT sentence-embedding models (written for all-MiniLM-L6-v2).

Shares no code with the Rust engine. Weights are read straight from model.safetensors (the format's
JSON header plus raw little-endian arrays); tokenization uses the `tokenizers` package on the
directory's tokenizer.json with its truncation and padding switched off. The forward pass is
BertModel's, in float32 (default) or float64: word + position + token-type embeddings and LayerNorm;
per layer biased q/k/v, softmax(q kᵀ / √d) v over the whole sentence, output projection, residual,
LayerNorm, GELU(erf) FFN, residual, LayerNorm; then sentence-transformers' mean pooling over the
tokens and L2 normalisation.

    python tests/reference/bert_reference.py --model DIR --text "A sentence." [--text ...]
    python tests/reference/bert_reference.py --model DIR --sentences FILE.json --out OUT.json

check_bert_reference.py compares this module with sentence-transformers itself.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import struct
from pathlib import Path

# Threaded BLAS on small matrices only spins against the server on two cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402
from tokenizers import Tokenizer

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        buf = raw[base + start : base + end]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=np.dtype(DTYPES[info["dtype"]]).newbyteorder("<"))
        out[name] = arr.reshape(info["shape"])
    return out


try:  # scipy is in scripts/requirements-test.txt; math.erf is the same function, elementwise and slower
    from scipy.special import erf
except ImportError:  # pragma: no cover
    def erf(x: np.ndarray) -> np.ndarray:
        return np.vectorize(math.erf, otypes=[np.float64])(x)


class BertReference:
    def __init__(self, model_dir: str | Path, dtype=np.float32):
        d = Path(model_dir)
        self.config = json.loads((d / "config.json").read_text())
        self.dtype = dtype
        w = read_safetensors(d / "model.safetensors")
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in w else ""
        self.w = {k[len(prefix) :]: v.astype(dtype) for k, v in w.items() if k.startswith(prefix) and v.dtype != np.int64}
        self.tokenizer = Tokenizer.from_file(str(d / "tokenizer.json"))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def layer_norm(self, x, name):
        eps = self.config.get("layer_norm_eps", 1e-12)
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + eps) * self.w[f"{name}.weight"] + self.w[f"{name}.bias"]

    def linear(self, x, name):
        return x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def token_states(self, ids: list[int]) -> np.ndarray:
        c, w = self.config, self.w
        n = len(ids)
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:n]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self.layer_norm(x, "embeddings.LayerNorm")
        heads = c["num_attention_heads"]
        hd = c["hidden_size"] // heads
        for i in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{i}"
            q, k, v = (
                self.linear(x, f"{p}.attention.self.{part}").reshape(n, heads, hd).transpose(1, 0, 2)
                for part in ("query", "key", "value")
            )
            scores = q @ k.transpose(0, 2, 1) / np.sqrt(hd).astype(self.dtype)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            probs = scores / scores.sum(-1, keepdims=True)
            attended = (probs @ v).transpose(1, 0, 2).reshape(n, heads * hd)
            y = self.layer_norm(self.linear(attended, f"{p}.attention.output.dense") + x, f"{p}.attention.output.LayerNorm")
            up = self.linear(y, f"{p}.intermediate.dense")
            up = (0.5 * up * (1.0 + erf(up / math.sqrt(2.0)))).astype(self.dtype)
            x = self.layer_norm(self.linear(up, f"{p}.output.dense") + y, f"{p}.output.LayerNorm")
        return x

    def embed_ids(self, ids: list[int]) -> np.ndarray:
        pooled = self.token_states(ids).mean(0)
        return pooled / max(float(np.linalg.norm(pooled)), 1e-12)

    def embed(self, text: str) -> np.ndarray:
        return self.embed_ids(self.encode(text))


WORDS = (
    "the a of model server token cache batch river mountain quickly slowly bright dark engine "
    "learning vector embedding sentence meaning language window garden music theory coffee "
    "tomorrow yesterday because although however paris berlin tokyo 42 3.14 2026 e-mail "
    "naïve café résumé façade jalapeño Zürich straße"
).split()
UNICODE = ["東京は大きい都市です。", "Привет, как дела?", "Γειά σου κόσμε", "مرحبا بالعالم", "🙂 emoji 🚀 test",
           "नमस्ते दुनिया", "한국어 문장입니다", "Ünïcödé àccents ñ ø å"]
PUNCT = ["?!", "...", ";", " -- ", "(", ")", "\"", "'", ",", ":", "/", "#", "@", "%", "&"]


def varied_sentences(reference: BertReference, n: int) -> list[str]:
    """Deterministic, varied: short, medium, unicode, punctuation, and a few
    long ones trimmed to just under 512 tokens."""
    rng = random.Random(14)
    out = []
    for i in range(n):
        kind = i % 10
        if kind == 9 and i % 30 == 9:
            words = [rng.choice(WORDS) for _ in range(600)]
            while len(reference.encode(" ".join(words))) > 510:
                words = words[:-8]
            out.append(" ".join(words))
        elif kind in (3, 7):
            out.append(rng.choice(UNICODE) + " " + " ".join(rng.choices(WORDS, k=rng.randint(1, 12))))
        elif kind == 5:
            out.append("".join(rng.choice(WORDS) + rng.choice(PUNCT) for _ in range(rng.randint(1, 15))))
        else:
            s = " ".join(rng.choices(WORDS, k=rng.randint(1, 40)))
            out.append(s[0].upper() + s[1:] + rng.choice([".", "!", "?", ""]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the model directory")
    ap.add_argument("--text", action="append", default=[], help="a sentence (repeatable)")
    ap.add_argument("--sentences", help="a JSON array of sentences")
    ap.add_argument("--out", help="write {sentences, tokens, embeddings} as JSON here")
    ap.add_argument("--f64", action="store_true", help="compute in float64")
    a = ap.parse_args()
    ref = BertReference(a.model, np.float64 if a.f64 else np.float32)
    texts = list(a.text) + (json.loads(Path(a.sentences).read_text()) if a.sentences else [])
    rows = [ref.embed(t) for t in texts]
    if a.out:
        Path(a.out).write_text(json.dumps({
            "sentences": texts,
            "tokens": [len(ref.encode(t)) for t in texts],
            "embeddings": [r.astype(float).tolist() for r in rows],
        }))
    else:
        for t, r in zip(texts, rows):
            print(f"{len(ref.encode(t)):4d} tokens  {np.array2string(r[:6], precision=5)}  {t[:60]!r}")


if __name__ == "__main__":
    main()
