#!/usr/bin/env python3
"""FP8 weights (`--quantization fp8`) vs BF16 on the CUDA backend: logits
of each prompt's prefill (rel_l2, rel_max; the prefill runs the cuBLASLt
FP8 GEMM) and 32 greedy tokens per prompt (decode runs the FP8 GEMV).

    python3 tests/gpu/compare_fp8.py --ingot BIN --model SmolLM2.gguf
    python3 tests/gpu/compare_fp8.py --ingot BIN --model DIR --dummy --prompts 3

A continuation agrees when all its tokens equal BF16's. Exit 1 when the
worst rel_l2 reaches --max-rel-l2 (5e-2) or fewer than --min-agree (0.9)
of the continuations agree (not checked with --dummy: random weights give
near-flat logits, where greedy picks flip at ties; their figures are
reported).
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

from ingot_cli import ingot

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "List three primary colors:",
    "Once upon a time, in a small village,",
    "The theory of relativity states that",
    "To make a cup of tea, first",
    "import numpy as np\n",
    "The largest planet in the solar system is",
    "Here is a haiku about the ocean:",
    "In 1492, Christopher Columbus",
    "The main ingredients of bread are",
    "A good way to learn a new language is",
    "SELECT name FROM users WHERE",
    "The quick brown fox",
    "Photosynthesis is the process by which",
    "My favourite book is",
    "The three laws of motion are",
    "Dear hiring manager,",
    "The recipe calls for two cups of",
]



def run_args(model, fp8, dummy):
    extra = ["--quantization", "fp8"] if fp8 else []
    if dummy:
        extra += ["--load-format", "dummy", "--max-model-len", "4096"]
    return ["--model", model, "--device", "cuda", *extra]


def greedy(binary, model, fp8, dummy, prompt, n):
    r = ingot(binary, "generate", *run_args(model, fp8, dummy), "--prompt", prompt,
              "--max-tokens", str(n), "--ignore-eos", "--print-ids")
    return json.loads(r.stderr.strip().splitlines()[-1])


def logits(binary, model, fp8, dummy, ids, out):
    ingot(binary, "logits", *run_args(model, fp8, dummy), "--enforce-eager",
          "--prompt-ids", ",".join(map(str, ids)), "--out", out)
    return np.fromfile(out, dtype="<f4").astype(np.float64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ingot", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dummy", action="store_true", help="random weights (--load-format dummy)")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--max-rel-l2", type=float, default=5e-2)
    ap.add_argument("--min-agree", type=float, default=0.9)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    rows = []
    print(f"{'prompt':40} {'rel_l2':>9} {'rel_max':>9} {'greedy':>14}")
    for prompt in PROMPTS[: args.prompts]:
        ref = greedy(args.ingot, args.model, False, args.dummy, prompt, args.tokens)
        got = greedy(args.ingot, args.model, True, args.dummy, prompt, args.tokens)
        ids = ref["prompt_ids"]
        b = logits(args.ingot, args.model, False, args.dummy, ids, os.path.join(tmp, "bf16.f32"))
        a = logits(args.ingot, args.model, True, args.dummy, ids, os.path.join(tmp, "fp8.f32"))
        rel_l2 = float(np.linalg.norm(a - b) / np.linalg.norm(b))
        rel_max = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
        out_b, out_a = ref["output_ids"], got["output_ids"]
        same = next((i for i, (x, y) in enumerate(zip(out_b, out_a)) if x != y), len(out_b))
        verdict = f"{same}/{len(out_b)} same" if same == len(out_b) else f"diverge@{same}"
        rows.append({"prompt": prompt, "rel_l2": rel_l2, "rel_max": rel_max,
                     "agree": out_a == out_b, "same_prefix": same})
        print(f"{prompt[:40]!r:40} {rel_l2:9.2e} {rel_max:9.2e} {verdict:>14}", flush=True)
    agree = sum(r["agree"] for r in rows) / len(rows)
    worst = max(r["rel_l2"] for r in rows)
    summary = {
        "model": os.path.basename(args.model.rstrip("/")),
        "dummy": args.dummy,
        "prompts": len(rows),
        "agree": agree,
        "mean_same_prefix": sum(r["same_prefix"] for r in rows) / len(rows),
        "mean_rel_l2": sum(r["rel_l2"] for r in rows) / len(rows),
        "max_rel_l2": worst,
    }
    ok = args.dummy or (worst < args.max_rel_l2 and agree >= args.min_agree)
    summary["ok"] = ok
    print(json.dumps(summary))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
