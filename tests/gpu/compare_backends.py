#!/usr/bin/env python3
"""CUDA backend vs CPU backend (bf16 weights) on a real model: first-step
logits error and 32 greedy tokens per prompt.

    python3 tests/gpu/compare_backends.py --ingot BIN --model SmolLM2.gguf \
        [--cuda-flags "--cuda-weights native"] [--cpu-flags "--cpu-weights f32"]

--cpu-flags replaces the CPU's default `--dtype bf16 --cpu-weights f32`
(e.g. f32 weights for the exact reference); --cuda-flags are added to
every CUDA run.

A greedy divergence passes only at a near-tie: the CPU's top-1/top-2 margin
at the diverging step is printed and must be below --tie-margin. Exit 1 on a
logits error at or above --threshold or a divergence at a clear margin.
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
]



FLAGS = {"cpu": ["--dtype", "bf16", "--cpu-weights", "f32"], "cuda": []}


def logits(binary, model, device, ids, out):
    flags = FLAGS[device]
    ingot(binary, "logits", "--model", model, "--device", device, *flags,
          "--prompt-ids", ",".join(map(str, ids)), "--out", out)
    return np.fromfile(out, dtype="<f4").astype(np.float64)


def greedy(binary, model, device, prompt, n):
    flags = FLAGS[device]
    r = ingot(binary, "generate", "--model", model, "--device", device, *flags, "--prompt", prompt,
              "--max-tokens", str(n), "--ignore-eos", "--print-ids")
    return json.loads(r.stderr.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ingot", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threshold", type=float, default=2e-2)
    ap.add_argument("--tie-margin", type=float, default=0.1)
    ap.add_argument("--cuda-flags", default="")
    ap.add_argument("--cpu-flags")
    args = ap.parse_args()
    FLAGS["cuda"] = args.cuda_flags.split()
    if args.cpu_flags is not None:
        FLAGS["cpu"] = args.cpu_flags.split()
    tmp = tempfile.mkdtemp()
    failures = []
    print(f"{'prompt':40} {'rel_l2':>9} {'rel_max':>9} {'greedy':>12}")
    for prompt in PROMPTS:
        cpu_run = greedy(args.ingot, args.model, "cpu", prompt, args.tokens)
        gpu_run = greedy(args.ingot, args.model, "cuda", prompt, args.tokens)
        ids = cpu_run["prompt_ids"]
        a = logits(args.ingot, args.model, "cuda", ids, os.path.join(tmp, "gpu.f32"))
        b = logits(args.ingot, args.model, "cpu", ids, os.path.join(tmp, "cpu.f32"))
        rel_l2 = float(np.linalg.norm(a - b) / np.linalg.norm(b))
        rel_max = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
        out_c, out_g = cpu_run["output_ids"], gpu_run["output_ids"]
        if out_c == out_g:
            verdict = f"{len(out_c)}/{len(out_c)} same"
        else:
            step = next(i for i, (x, y) in enumerate(zip(out_c, out_g)) if x != y)
            ctx = logits(args.ingot, args.model, "cpu", ids + out_c[:step], os.path.join(tmp, "m.f32"))
            top2 = np.sort(ctx)[-2:]
            margin = float(top2[1] - top2[0])
            verdict = f"diverge@{step} margin {margin:.3f}"
            if margin >= args.tie_margin:
                failures.append(f"{prompt!r}: greedy diverges at step {step} with margin {margin:.3f}")
        if not (rel_l2 < args.threshold and rel_max < args.threshold):
            failures.append(f"{prompt!r}: logits rel_l2 {rel_l2:.2e} rel_max {rel_max:.2e}")
        print(f"{prompt[:40]:40} {rel_l2:9.2e} {rel_max:9.2e} {verdict:>12}")
    print(json.dumps({"ok": not failures, "failures": failures}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
