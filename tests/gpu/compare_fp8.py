#!/usr/bin/env python3
"""FP8 weights (`--quantization fp8`) vs BF16 on the CUDA backend: logits
of each prompt's prefill (rel_l2, rel_max; the prefill runs the cuBLASLt
FP8 GEMM) and 32 greedy tokens per prompt (decode runs the FP8 GEMV).

    python3 tests/gpu/compare_fp8.py --ingot BIN --model SmolLM2.gguf
    python3 tests/gpu/compare_fp8.py --ingot BIN --model DIR --dummy --prompts 3
    python3 tests/gpu/compare_fp8.py --ingot BIN --model SmolLM2.gguf \
        --recipe fp8= --recipe "keep-down=--fp8-ignore down_proj"

Each --recipe NAME=FLAGS (FLAGS space-separated, added to `--quantization
fp8`) is compared with the same BF16 runs; the default is one plain `fp8`.
--ref NAME=FLAGS compares them with that FP8 recipe instead of BF16, e.g.
the FP8 LM head against FP8 with a bf16 head:

    python3 tests/gpu/compare_fp8.py --ingot BIN --model DIR --dummy --prompts 3 \
        --ref fp8= --recipe "fp8-head=--fp8-lm-head"
--jobs N runs N prompts at once (each ingot process then gets a small KV
pool and memory share: --kv-cache-tokens 4096 --gpu-memory-utilization 0.1).
--ids-out writes every run's prompt and greedy ids (JSON) for comparisons
elsewhere (e.g. against tests/reference/fp8_recipes.py's f32 reference).

A continuation agrees when all its tokens equal the reference's. Exit 1 when the
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
from concurrent.futures import ThreadPoolExecutor

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



SHARED = []  # flags that let --jobs processes share the GPU


def run_args(model, fp8, dummy):
    """fp8: None (BF16) or the recipe's extra flags."""
    extra = ["--quantization", "fp8", *fp8] if fp8 is not None else []
    extra += SHARED
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


def parse_recipe(spec):
    name, _, flags = spec.partition("=")
    return name, flags.split()


def compare(args, prompt, ref, b, fp8, path):
    got = greedy(args.ingot, args.model, fp8, args.dummy, prompt, args.tokens)
    a = logits(args.ingot, args.model, fp8, args.dummy, ref["prompt_ids"], path)
    out_b, out_a = ref["output_ids"], got["output_ids"]
    same = next((i for i, (x, y) in enumerate(zip(out_b, out_a)) if x != y), len(out_b))
    return {"prompt": prompt, "rel_l2": float(np.linalg.norm(a - b) / np.linalg.norm(b)),
            "rel_max": float(np.max(np.abs(a - b)) / np.max(np.abs(b))),
            "agree": out_a == out_b, "same_prefix": same, "output_ids": out_a}


def summarize(args, name, rows):
    agree = sum(r["agree"] for r in rows) / len(rows)
    worst = max(r["rel_l2"] for r in rows)
    summary = {
        "recipe": name,
        "model": os.path.basename(args.model.rstrip("/")),
        "dummy": args.dummy,
        "prompts": len(rows),
        "agree": agree,
        "mean_same_prefix": sum(r["same_prefix"] for r in rows) / len(rows),
        "mean_rel_l2": sum(r["rel_l2"] for r in rows) / len(rows),
        "max_rel_l2": worst,
    }
    summary["ok"] = args.dummy or (worst < args.max_rel_l2 and agree >= args.min_agree)
    return summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ingot", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dummy", action="store_true", help="random weights (--load-format dummy)")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--max-rel-l2", type=float, default=5e-2)
    ap.add_argument("--min-agree", type=float, default=0.9)
    ap.add_argument("--recipe", action="append", default=[],
                    help="NAME=FLAGS: extra ingot flags (space-separated) with --quantization fp8")
    ap.add_argument("--ref", help="NAME=FLAGS: the reference is this FP8 recipe, not BF16")
    ap.add_argument("--ids-out", help="write the reference's and the recipes' prompt/greedy ids here (JSON)")
    ap.add_argument("--jobs", type=int, default=1, help="prompts run at once")
    args = ap.parse_args()
    if args.jobs > 1:
        SHARED.extend(["--kv-cache-tokens", "4096", "--gpu-memory-utilization", "0.1"])
    recipes = [parse_recipe(r) for r in args.recipe] or [("fp8", [])]
    ref_name, ref_flags = parse_recipe(args.ref) if args.ref else ("bf16", None)
    tmp = tempfile.mkdtemp()

    def one_prompt(i):
        prompt = PROMPTS[i]
        ref = greedy(args.ingot, args.model, ref_flags, args.dummy, prompt, args.tokens)
        b = logits(args.ingot, args.model, ref_flags, args.dummy, ref["prompt_ids"], os.path.join(tmp, f"ref.{i}.f32"))
        return ref, [compare(args, prompt, ref, b, flags, os.path.join(tmp, f"fp8.{i}.f32"))
                     for _, flags in recipes]

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        done = list(pool.map(one_prompt, range(min(args.prompts, len(PROMPTS)))))
    rows = {name: [r[k] for _, r in done] for k, (name, _) in enumerate(recipes)}
    refs = [ref for ref, _ in done]
    print(f"reference: {ref_name}")
    print(f"{'recipe':12} {'prompt':40} {'rel_l2':>9} {'rel_max':>9} {'greedy':>14}")
    for name, _ in recipes:
        for ref, r in zip(refs, rows[name]):
            n = len(ref["output_ids"])
            verdict = f"{n}/{n} same" if r["agree"] else f"diverge@{r['same_prefix']}"
            print(f"{name[:12]:12} {r['prompt'][:40]!r:40} {r['rel_l2']:9.2e} {r['rel_max']:9.2e} {verdict:>14}")
    summaries = [dict(summarize(args, name, rows[name]), reference=ref_name) for name, _ in recipes]
    for summary in summaries:
        print(json.dumps(summary))
    if args.ids_out:
        with open(args.ids_out, "w", encoding="utf-8") as f:
            json.dump({ref_name: refs, **{name: rows[name] for name, _ in recipes}}, f)
    sys.exit(0 if all(s["ok"] for s in summaries) else 1)


if __name__ == "__main__":
    main()
