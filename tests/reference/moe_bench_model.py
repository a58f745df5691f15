#!/usr/bin/env python3
"""A small but not tiny random-weight Qwen3-MoE GGUF for CPU decode benchmarks (scripts/bench-moe-cpu).

    python tests/reference/moe_bench_model.py --out FILE [--type q8_0|q4_0] [--smollm2-gguf FILE]

One GGUF, general.architecture `qwen3moe` as llama.cpp's convert_hf_to_gguf.py writes it (keys and
tensor names: hf_tiny_models.save_gguf), with every `tokenizer.*` key of the SmolLM2-135M GGUF
(moe_serve_models.smollm2_tokenizer: gpt2 BPE, vocab 49152), so both ingot and llama.cpp load it:

  hidden 1024, 12 layers, all sparse; 16 query heads / 4 kv heads of head_dim 64 with Qwen3's per-head
  q/k RMSNorm; 32 experts, top 4 renormalised, expert width 512; untied output matrix; context 4096;
  rope_theta 1e6, rms eps 1e-6. About 736M parameters, about 208M of them used per token (157M without
  the embedding rows, of which one is read); Q8_0 ~0.78 GB, Q4_0 ~0.41 GB.

Matrices and expert stacks are `--type` (gguf-py's quantizer; Q4_0 includes the output matrix, which
llama-quantize would make Q6_K), norms and routers F32. Weights are hf_tiny_models.random_weights drawn
in float32 (seeded: the same bytes for one numpy / gguf-py version) with its scales; the control
tokens' output rows are scaled down as in moe_serve_models. No reference forward pass: the file is
for timing, not for checking numbers. Prints the parameter counts, file size and seconds to stderr.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_tiny_models as tiny  # noqa: E402
import moe_serve_models as serve  # noqa: E402

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 12, 1024, 16, 4, 64
EXPERTS, TOP_K, EXPERT_FF, DENSE_FF = 32, 4, 512, 3072  # DENSE_FF: metadata only (no dense layer)
SEED = 43


def bench_config(vocab):
    cfg = tiny.qwen3_moe_config(LAYERS, "float32", HEAD_DIM, EXPERTS, TOP_K, EXPERT_FF, [], True)
    cfg.update(vocab_size=vocab, hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
               intermediate_size=DENSE_FF, max_position_embeddings=serve.CONTEXT)
    return cfg


def param_counts(weights, spec):
    """(total, used per token, used per token without the embedding matrix)."""
    total = sum(w.size for w in weights.values())
    per_expert = sum(weights[f"model.layers.0.mlp.experts.0.{p}.weight"].size for p in spec.expert_proj)
    active = total - spec.layers * (spec.experts - spec.top_k) * per_expert
    return total, active, active - weights["model.embed_tokens.weight"].size


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the GGUF file to write")
    ap.add_argument("--type", default="q8_0", choices=("q8_0", "q4_0"), help="matrices' type (default q8_0)")
    ap.add_argument("--smollm2-gguf", help="the SmolLM2 GGUF to copy the tokenizer from "
                    "(default: scripts/fetch-test-model)")
    args = ap.parse_args()
    start = time.perf_counter()
    kv, vocab, control = serve.smollm2_tokenizer(args.smollm2_gguf or serve.fetched("fetch-test-model"))
    cfg = bench_config(vocab)
    spec = tiny.Spec(cfg)
    weights = tiny.random_weights(spec, np.random.default_rng(SEED), dtype=np.float32)
    serve.suppress(weights["lm_head.weight"], control)

    def add_tokenizer(wr):
        for key, value, vtype, sub_type in kv:
            wr.add_key_value(key, value, vtype, sub_type=sub_type)

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tiny.save_gguf(args.out, f"qwen3moe_bench_{args.type}", "qwen3moe", spec, cfg, weights,
                   add_metadata=add_tokenizer, read_back=False, qtype=args.type, keep=False)
    total, active, active_no_embd = param_counts(weights, spec)
    print(f"{args.out}: qwen3moe {spec.layers} layers, hidden {spec.hidden}, {spec.heads}/{spec.kv_heads} heads "
          f"x {spec.head_dim}, {spec.experts} experts top {spec.top_k} width {spec.moe_ff}, vocab {spec.vocab}, "
          f"{args.type}: {total / 1e6:.1f}M parameters, {active / 1e6:.1f}M used per token "
          f"({active_no_embd / 1e6:.1f}M without the embedding), {os.path.getsize(args.out) / 1e6:.1f} MB, "
          f"{time.perf_counter() - start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
