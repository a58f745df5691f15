#!/usr/bin/env python3
"""Greedy decode of two ingot binaries (or two flag sets) on the same model:
per prompt, the first step where the picked ids differ and the largest
difference of the picked tokens' logprobs before it.

    python3 tests/gpu/compare_decode.py --a BIN_A --b BIN_B --model M [--dummy] \
        [--tokens 64] [--prompts 4] [--b-env KEY=VALUE] [-- more ingot flags]

Runs `ingot generate --ignore-eos --print-ids --logprobs 1`, so every step
goes through the device sampler (the logits path) with CUDA graphs; a second
pass without --logprobs takes the plain argmax path. Exit 1 when --require-equal
is given and any continuation differs.
"""
import argparse
import json
import os
import re
import subprocess
import sys

PROMPTS = [
    "The capital of France is",
    "The quick brown fox",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "SELECT name FROM users WHERE",
    "The three laws of motion are",
    "Dear hiring manager,",
]
LOGPROB = re.compile(r"logprob=(-?[0-9.]+|-?inf|NaN) top")


def run(binary, args, prompt, logprobs, env=None):
    flags = ["--model", args.model, "--device", "cuda", *args.extra]
    if args.dummy:
        flags += ["--load-format", "dummy", "--max-model-len", "4096"]
    if logprobs:
        flags += ["--logprobs", "1"]
    r = subprocess.run([binary, "generate", *flags, "--prompt", prompt, "--max-tokens", str(args.tokens),
                        "--ignore-eos", "--print-ids"], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    if r.returncode != 0:
        # A dummy model with another model's tokenizer: some prompts hold
        # ids outside its vocabulary.
        print(f"{binary}: {prompt[:28]!r} refused: {r.stderr.strip().splitlines()[0] if r.stderr.strip() else r.returncode}")
        return None
    ids = json.loads(r.stderr.strip().splitlines()[-1])["output_ids"]
    lps = [float(x) for x in LOGPROB.findall(r.stderr)] if logprobs else []
    return ids, lps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dummy", action="store_true")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--require-equal", action="store_true")
    ap.add_argument("--b-env", action="append", default=[], help="KEY=VALUE in B's environment only")
    ap.add_argument("extra", nargs="*", help="more ingot flags (after --)")
    args = ap.parse_args()
    differ = 0
    for prompt in PROMPTS[:args.prompts]:
        for logprobs in (True, False):
            b_env = dict(kv.split("=", 1) for kv in args.b_env)
            a, b = run(args.a, args, prompt, logprobs), run(args.b, args, prompt, logprobs, b_env)
            if a is None and b is None:
                break  # both refuse the prompt
            if a is None or b is None:
                print(f"FAIL {prompt[:28]!r}: only {'b' if a is None else 'a'} ran")
                differ += 1
                break
            (a_ids, a_lp), (b_ids, b_lp) = a, b
            same = next((i for i, (x, y) in enumerate(zip(a_ids, b_ids)) if x != y), len(a_ids))
            dlp = max((abs(x - y) for x, y in list(zip(a_lp, b_lp))[:same]), default=0.0)
            differ += same < len(a_ids)
            path = "sampler" if logprobs else "argmax "
            print(f"{path} {prompt[:28]!r:32} equal steps {same:3}/{len(a_ids)}"
                  + (f"  max |dlogprob| before {dlp:.4f}" if logprobs else ""), flush=True)
    print(f"continuations that differ: {differ}")
    sys.exit(1 if args.require_equal and differ else 0)


if __name__ == "__main__":
    main()
