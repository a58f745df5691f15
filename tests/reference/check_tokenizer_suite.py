#!/usr/bin/env python3
"""Checks llama_reference.GgufTokenizer against llama.cpp's tokenizer conformance suite.

llama.cpp ships ggml-vocab-<name>.gguf with .inp (test strings) and .out (expected ids, produced by
HF tokenizers). The vocabularies checked here are the ones llama.cpp pre-tokenizes exactly like
"smollm" (same case in llama-vocab.cpp): starcoder, refact, command-r. Their own vocab/merges
differ from SmolLM2's, so this validates our tokenizer construction (byte-level BPE + split regexes +
special-token handling), and the pure-Python BPE cross-check inside GgufTokenizer.encode with it.

    python tests/reference/check_tokenizer_suite.py [MODELS_DIR]   # default: scripts/fetch-llama-cpp-sdist
"""
import os
import subprocess
import sys

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_reference as ref  # noqa: E402

SAME_AS_SMOLLM = ["starcoder", "refact", "command-r"]


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    models = sys.argv[1] if len(sys.argv) > 1 else subprocess.check_output(
        [os.path.join(root, "scripts", "fetch-llama-cpp-sdist")], text=True).strip()
    failed = 0
    for name in SAME_AS_SMOLLM:
        path = os.path.join(models, f"ggml-vocab-{name}.gguf")
        meta = {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items() if k.startswith("tokenizer.")}
        ref.PRE_SPLITS[meta["tokenizer.ggml.pre"]] = ref.PRE_SPLITS["smollm"]
        tok = ref.GgufTokenizer(meta)
        with open(path + ".inp", encoding="utf-8") as f:
            inputs = f.read().split("\n__ggml_vocab_test__\n")
        with open(path + ".out", encoding="utf-8") as f:
            outputs = f.read().split("\n")
        ok = 0
        for text, line in zip(inputs, outputs):
            want = [int(x) for x in line.split()]
            got = tok.encode(text)  # also asserts tokenizers == pure-python BPE
            if got == want:
                ok += 1
            else:
                failed += 1
                print(f"{name}: {text!r}\n  got  {got}\n  want {want}")
        print(f"{name}: {ok}/{min(len(inputs), len(outputs))} match")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
