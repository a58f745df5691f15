#!/usr/bin/env python3
"""Optional, manual: cross-checks the fixtures against llama.cpp (through llama-cpp-python's ctypes API).

llama.cpp's native Q4_1 path quantizes activations to Q8_1 and keeps the KV cache in f16, so it cannot
match an exact reference. To compare like with like, this writes a GGUF whose tensors are the
`gguf`-dequantized weights in F32 (same metadata), and runs llama.cpp on it with an f32 KV cache and
flash attention off. It then checks, for every fixture: llama.cpp's tokenization of `rendered`,
its first-step logits (max |diff|), and its 32 greedy tokens. `--native` also runs the original Q4_1
file the ordinary way, for information (expect logit differences of order 0.5-2).

Needs a built libllama (e.g. from the llama-cpp-python 0.3.36 sdist: cmake -DBUILD_SHARED_LIBS=ON) and
the sdist's `llama_cpp` Python package (plus numpy, jinja2, diskcache, typing-extensions):

    LLAMA_CPP_LIB_PATH=LIBDIR LD_LIBRARY_PATH=LIBDIR python tests/reference/crosscheck_llama_cpp.py \
        --model M.gguf --pkg SDIST_DIR [--native]
"""
import argparse
import json
import os
import sys

import gguf
import numpy as np
from gguf.quants import dequantize

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "smollm2")


def write_f32(src, dst):
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, 0 if name == "general.file_type" else f.contents(), f.types[0], sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, dequantize(t.data, t.tensor_type).reshape(tuple(int(d) for d in reversed(t.shape))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run(Llama, path, **kw):
    llm = Llama(path, n_ctx=512, n_batch=512, n_threads=1, logits_all=True, verbose=False, **kw)
    bad = 0
    for e in json.load(open(os.path.join(FIX, "expected.json"), encoding="utf-8")):
        ids = llm.tokenize(e["rendered"].encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        first = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        ref = np.fromfile(os.path.join(FIX, e["logits_file"]), "<f4")
        out = []
        for _ in range(len(e["greedy_ids"])):
            out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([out[-1]])
        k = next((i for i, (a, b) in enumerate(zip(out, e["greedy_ids"])) if a != b), None)
        bad += (ids != e["prompt_ids"]) + (k is not None)
        print(f"{e['name']:15s} tokens {'same' if ids == e['prompt_ids'] else 'DIFFER'}, first-step logits "
              f"max|diff| {np.max(np.abs(first - ref)):.2e}, greedy "
              + ("32/32 same" if k is None else f"differs from step {k} (reference margin {e['margins'][k]:.4f})"))
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--pkg", required=True, help="directory holding the llama_cpp package (the sdist root)")
    ap.add_argument("--f32", default="/tmp/ingot-reference-f32.gguf", help="where to write the F32 GGUF")
    ap.add_argument("--native", action="store_true", help="also run the original quantized model")
    args = ap.parse_args()
    sys.path.insert(0, args.pkg)
    from llama_cpp import Llama

    if not os.path.exists(args.f32):
        write_f32(args.model, args.f32)
    print("llama.cpp on the dequantized F32 model, f32 KV cache, no flash attention:")
    bad = run(Llama, args.f32, type_k=0, type_v=0, flash_attn=False)  # 0 = GGML_TYPE_F32
    if args.native:
        print("llama.cpp on the original model, defaults (informational):")
        run(Llama, args.model)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
