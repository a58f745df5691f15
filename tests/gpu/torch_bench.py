#!/usr/bin/env python3
"""PyTorch eager baseline (transformers `generate`) for ingot's benchmark shapes.

The model is built from a config.json alone, with random bf16 weights
initialised directly on the GPU; the default attention implementation (sdpa)
and the default KV cache are used, no torch.compile.

Usage:
  python3 tests/gpu/torch_bench.py --model-dir DIR --case latency \\
      [--input-len 128] [--output-len 256]
  python3 tests/gpu/torch_bench.py --model-dir DIR --case decode256 \\
      [--batch 256] [--input-len 1024] [--output-len 128]

Cases:
  latency    batch 1: prefill time, decode tok/s, end-to-end seconds.
  decode256  batch B (halved on CUDA OOM until it fits): decode tok/s over
             all sequences and end-to-end output tok/s.

Prefill is timed as a generate with max_new_tokens=1; decode time is the
full generate minus that. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

DEFAULTS = {
    "latency": {"batch": 1, "input_len": 128, "output_len": 256},
    "decode256": {"batch": 256, "input_len": 1024, "output_len": 128},
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def dtype_kwarg(dtype: torch.dtype) -> dict:
    """transformers renamed `torch_dtype` to `dtype` in 4.56."""
    nums = [int(x) for x in re.findall(r"\d+", transformers.__version__)[:2]]
    return {"dtype": dtype} if tuple(nums) >= (4, 56) else {"torch_dtype": dtype}


def build_model(model_dir: str) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(model_dir)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    # Build on the GPU so 8B params are never materialised on the CPU.
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, **dtype_kwarg(torch.bfloat16))
    model.eval()
    torch.cuda.synchronize()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"built {type(model).__name__} {n_params / 1e9:.2f}B params in {time.perf_counter() - t0:.1f}s")
    return model


def random_ids(model: torch.nn.Module, batch: int, length: int) -> torch.Tensor:
    vocab = model.config.vocab_size
    gen = torch.Generator(device="cuda").manual_seed(1234)
    return torch.randint(0, vocab, (batch, length), device="cuda", generator=gen)


@torch.inference_mode()
def timed_generate(model, ids: torch.Tensor, new_tokens: int, cache: str | None) -> float:
    """Greedy generate of exactly `new_tokens` tokens; returns seconds."""
    kwargs = dict(
        attention_mask=torch.ones_like(ids),  # same lengths: no padding
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,  # random weights may emit EOS early
        do_sample=False,
        pad_token_id=0,
    )
    if cache:
        kwargs["cache_implementation"] = cache
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids, **kwargs)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    got = out.shape[1] - ids.shape[1]
    if got != new_tokens:
        raise RuntimeError(f"generate produced {got} tokens, expected {new_tokens}")
    return elapsed


def warmup(model, input_len: int, cache: str | None) -> None:
    """Loads kernels / cuBLAS handles once, on a tiny batch."""
    timed_generate(model, random_ids(model, 1, min(input_len, 32)), 2, cache)


def measure(model, batch: int, input_len: int, output_len: int, cache: str | None) -> dict:
    ids = random_ids(model, batch, input_len)
    t_prefill = timed_generate(model, ids, 1, cache)
    t_full = timed_generate(model, ids, output_len, cache)
    t_decode = max(t_full - t_prefill, 1e-9)
    return {
        "batch": batch,
        "prefill_ms": round(t_prefill * 1e3, 2),
        "decode_tok_s": round(batch * (output_len - 1) / t_decode, 1),
        "output_tok_s": round(batch * output_len / t_full, 1),
        "e2e_s": round(t_full, 3),
    }


def free_gpu() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def measure_fitting(model, batch: int, input_len: int, output_len: int, cache: str | None) -> dict:
    """Halves the batch on CUDA OOM until it fits (or batch 1 fails)."""
    while True:
        try:
            return measure(model, batch, input_len, output_len, cache)
        except torch.cuda.OutOfMemoryError:
            if batch == 1:
                raise
            log(f"OOM at batch {batch}, retrying with {batch // 2}")
        # Outside the except block so the exception's frames (and tensors) are gone.
        free_gpu()
        batch //= 2


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True, help="dir with config.json")
    p.add_argument("--case", required=True, choices=list(DEFAULTS))
    p.add_argument("--batch", type=int, help="decode256 only (default 256)")
    p.add_argument("--input-len", type=int)
    p.add_argument("--output-len", type=int)
    p.add_argument(
        "--cache-implementation",
        default=None,
        help="generate's cache_implementation, e.g. 'static' (default: transformers' default cache)",
    )
    args = p.parse_args()
    for key, value in DEFAULTS[args.case].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.case == "latency" and args.batch != 1:
        p.error("the latency case runs at batch 1")
    if args.output_len < 2:
        p.error("--output-len must be at least 2")
    return args


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("CUDA is not available")
    model = build_model(args.model_dir)
    cache = args.cache_implementation
    warmup(model, args.input_len, cache)
    if args.case == "latency":
        result = measure(model, 1, args.input_len, args.output_len, cache)
    else:
        result = measure_fitting(model, args.batch, args.input_len, args.output_len, cache)
    summary = {
        "case": args.case,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "batch_requested": args.batch,
        **result,
        "cache": cache or "default",
        "attn": getattr(model.config, "_attn_implementation", None),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
