#!/usr/bin/env python3
"""Compares ingot's greedy tokens with the independent numpy reference on any
prompt (the exactness check for prompts that are not in the fixtures).

    py=$(scripts/python-env); model=$(scripts/fetch-test-model); cargo build
    $py tests/reference/compare_with_ingot.py --model "$model" --prompt "Rust is"
    $py tests/reference/compare_with_ingot.py --model "$model" --chat "Name three rivers."

Exit code 0 when prompt ids and all greedy ids agree; otherwise it prints the
first divergence and the reference's top1-top2 margin at that step.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--ingot", default=os.path.join(ROOT, "target", "debug", "ingot"))
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--prompt")
    group.add_argument("--chat")
    args = ap.parse_args()

    kind = ["--chat", args.chat] if args.chat is not None else ["--prompt", args.prompt]
    ref = subprocess.run(
        [sys.executable, os.path.join(HERE, "llama_reference.py"), "--model", args.model, "--n", str(args.n), *kind],
        check=True, capture_output=True, text=True,
    )
    expected = json.loads(ref.stdout.splitlines()[0])
    ingot_flags = ["--chat", "--prompt", args.chat] if args.chat is not None else ["--prompt", args.prompt]
    run = subprocess.run(
        [args.ingot, "generate", "--model", args.model, *ingot_flags, "--max-tokens", str(args.n),
         "--ignore-eos", "--print-ids"],
        check=True, capture_output=True, text=True,
    )
    got = json.loads(run.stderr.strip().splitlines()[-1])
    ok = True
    if got["prompt_ids"] != expected["prompt_ids"]:
        ok = False
        print(f"prompt ids differ:\n  ingot     {got['prompt_ids']}\n  reference {expected['prompt_ids']}")
    out, want = got["output_ids"], expected["greedy_ids"]
    if out != want:
        ok = False
        step = next((i for i, (a, b) in enumerate(zip(out, want)) if a != b), min(len(out), len(want)))
        print(f"greedy ids diverge at step {step}:\n  ingot     {out}\n  reference {want}")
    print(json.dumps({"match": ok, "tokens": len(want), "reference_min_margin": expected["min_margin"],
                      "text": expected["greedy_text"]}, ensure_ascii=False))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
