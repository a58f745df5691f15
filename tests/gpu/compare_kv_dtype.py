#!/usr/bin/env python3
"""FP8 KV cache vs bf16 KV cache on CUDA: logits after each prompt (rel_l2;
the prompt is prefilled, its last token decoded, so both attention kernels
read the FP8 cache) and greedy agreement over --tokens steps. Any two flag
sets compare the same way (--ref / --test; e.g. tensor parallel sizes).

    python3 tests/gpu/compare_kv_dtype.py --ingot BIN --model M [-- extra ingot flags]
    python3 tests/gpu/compare_kv_dtype.py --ref "--tensor-parallel-size 1" --test "--tensor-parallel-size 2" ...

Prints one line per prompt and a summary line (also as JSON with --json).
Exit 1 when the mean rel_l2 reaches --threshold or fewer than --min-agree of
the continuations are identical.
"""
import argparse
import json
import os
import shlex
import sys
import tempfile

import numpy as np

from ingot_cli import ingot

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "Water boils at a temperature of",
]
# A long prompt (~400 tokens): most of the attention reads cached keys.
LONG = " ".join(
    f"Section {i}: the committee reviewed the budget, the schedule and the staffing plan, "
    f"and asked for a revised estimate of item {i * 7 % 13} before the next meeting."
    for i in range(12)
) + " In summary, the committee"



def logits(a, flags, prompt, out):
    ingot(a.ingot, "logits", "--model", a.model, "--device", "cuda", *shlex.split(flags),
          "--max-num-batched-tokens", "1024", *a.extra, "--prompt", prompt, "--out", out)
    return np.fromfile(out, dtype="<f4").astype(np.float64)


def greedy(a, flags, prompt):
    r = ingot(a.ingot, "generate", "--model", a.model, "--device", "cuda", *shlex.split(flags),
              "--max-num-batched-tokens", "1024", *a.extra, "--prompt", prompt, "--max-tokens", str(a.tokens), "--ignore-eos", "--print-ids")
    return json.loads(r.stderr.strip().splitlines()[-1])["output_ids"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ingot", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threshold", type=float, default=5e-2)
    ap.add_argument("--min-agree", type=float, default=0.9)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ref", default="--kv-cache-dtype bf16", help="the reference run's flags")
    ap.add_argument("--test", default="--kv-cache-dtype fp8", help="the compared run's flags")
    ap.add_argument("extra", nargs="*", help="more ingot flags (after --)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    rows = []
    for i, prompt in enumerate(PROMPTS[: a.prompts] + [LONG]):
        ref = logits(a, a.ref, prompt, os.path.join(tmp, "ref.f32"))
        got = logits(a, a.test, prompt, os.path.join(tmp, "test.f32"))
        rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        ids_ref, ids_fp8 = greedy(a, a.ref, prompt), greedy(a, a.test, prompt)
        same = next((k for k, (x, y) in enumerate(zip(ids_ref, ids_fp8)) if x != y), len(ids_ref))
        rows.append({"prompt": i, "long": prompt is LONG, "rel_l2": rel, "argmax_equal": int(ref.argmax() == got.argmax()),
                     "same_prefix": same, "tokens": len(ids_ref), "identical": same == len(ids_ref)})
        print(f"prompt {i}{' (long)' if prompt is LONG else ''}: logits rel_l2 {rel:.3e}, "
              f"greedy identical for {same}/{len(ids_ref)} tokens", flush=True)
    mean_rel = float(np.mean([r["rel_l2"] for r in rows]))
    agree = float(np.mean([r["identical"] for r in rows]))
    token_agree = float(np.mean([r["same_prefix"] / r["tokens"] for r in rows]))
    summary = {"model": a.model, "mean_rel_l2": mean_rel, "max_rel_l2": max(r["rel_l2"] for r in rows),
               "identical_continuations": agree, "mean_identical_prefix": token_agree, "rows": rows}
    print(f"summary: mean rel_l2 {mean_rel:.3e} (max {summary['max_rel_l2']:.3e}), "
          f"identical {a.tokens}-token continuations {agree:.0%}, mean identical prefix {token_agree:.0%}")
    if a.json:
        print(json.dumps(summary))
    sys.exit(0 if mean_rel < a.threshold and agree >= a.min_agree else 1)


if __name__ == "__main__":
    main()
