#!/usr/bin/env python3
"""Check ingot's CUDA backend against Hugging Face transformers.

Small models with random weights are built with transformers and saved
as bf16 safetensors HF directories:

  llama3-2l    Llama-3.1-8B width (llama3 rope scaling), 2 layers, untied head
  qwen3-2l     Qwen3-0.6B width (q_norm/k_norm), 2 layers, tied embeddings
  qwen3moe-2l  Qwen3-30B-A3B width (128 experts of 768, top 8, renormalised),
               2 layers; routers drawn wider than transformers' init so the
               top-k choice is decisive, not a near-tie of bf16 roundings
  mixtral-2l   Mixtral layout (8 experts, top 2) at hidden 1024, 2 layers

For a few seeded random prompts, the last position's logits of
`ingot logits` are compared with transformers' logits computed in float32
from the same bf16-rounded weights. transformers' own bf16 run is compared
with that too ("hf bf16"): a case fails past the threshold or past 1.5x
the bf16 run's own error, whichever is larger.

Usage:
  python3 tests/gpu/compare_hf.py --ingot target/release/ingot \\
      --tokenizers DIR --work DIR [--device cuda] [--threshold 2e-2] [--ingot-flags "..."]

  --tokenizers DIR  holds llama3/ and qwen3/, each with tokenizer.json and
                    tokenizer_config.json (copied into the model dirs,
                    since ingot needs a tokenizer to open an HF dir).
  --work DIR        models go to DIR/models/<name> (reused when they
                    already hold weights); logits files to DIR/logits/.

Prints one table row per (model, prompt) and a final JSON summary line.
Exits 1 when any rel_l2 or rel_max reaches the threshold (or is not finite),
2 when ingot fails to run.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import shutil
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, MixtralConfig, Qwen3Config, Qwen3MoeConfig

PROMPT_LENGTHS = (7, 64, 300)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

LLAMA3_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# name -> (tokenizer subdir, config class, config kwargs). The rope keys are
# also written to config.json verbatim afterwards (see patch_config).
MODELS = {
    "llama3-2l": (
        "llama3",
        LlamaConfig,
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=2,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=128256,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            rope_scaling=dict(LLAMA3_ROPE_SCALING),
            max_position_embeddings=131072,
            tie_word_embeddings=False,
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
            bos_token_id=128000,
            eos_token_id=128001,
            architectures=["LlamaForCausalLM"],
        ),
    ),
    "qwen3-2l": (
        "qwen3",
        Qwen3Config,
        dict(
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=2,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            max_position_embeddings=40960,
            tie_word_embeddings=True,
            hidden_act="silu",
            attention_bias=False,
            use_sliding_window=False,
            bos_token_id=151643,
            eos_token_id=151645,
            architectures=["Qwen3ForCausalLM"],
        ),
    ),
    "qwen3moe-2l": (
        "qwen3",
        Qwen3MoeConfig,
        dict(
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            num_hidden_layers=2,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            vocab_size=151936,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            max_position_embeddings=40960,
            tie_word_embeddings=False,
            hidden_act="silu",
            attention_bias=False,
            use_sliding_window=False,
            bos_token_id=151643,
            eos_token_id=151645,
            architectures=["Qwen3MoeForCausalLM"],
        ),
    ),
    "mixtral-2l": (
        "llama3",
        MixtralConfig,
        dict(
            hidden_size=1024,
            intermediate_size=3584,
            num_local_experts=8,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=128,
            vocab_size=128256,
            rms_norm_eps=1e-5,
            rope_theta=1000000.0,
            max_position_embeddings=32768,
            sliding_window=None,
            tie_word_embeddings=False,
            hidden_act="silu",
            bos_token_id=128000,
            eos_token_id=128001,
            architectures=["MixtralForCausalLM"],
        ),
    ),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def dtype_kwarg(dtype: torch.dtype) -> dict:
    """transformers renamed `torch_dtype` to `dtype` in 4.56."""
    nums = [int(x) for x in re.findall(r"\d+", transformers.__version__)[:2]]
    return {"dtype": dtype} if tuple(nums) >= (4, 56) else {"torch_dtype": dtype}


def has_weights(model_dir: Path) -> bool:
    return (model_dir / "model.safetensors").exists() or (
        model_dir / "model.safetensors.index.json"
    ).exists()


def randomize_norms(model: torch.nn.Module) -> int:
    """Default init sets RMSNorm weights to 1, which would hide a missing or
    misapplied norm; make every norm (incl. Qwen3 q_norm/k_norm) random."""
    count = 0
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                w = module.weight
                w.copy_(1.0 + 0.1 * torch.randn(w.shape, device=w.device, dtype=w.dtype))
                count += 1
    return count


def widen_routers(model: torch.nn.Module, hidden: int) -> int:
    """transformers initialises routers like any linear layer (std 0.02): the
    router logits of a random model are then all within a few hundredths,
    and which experts win depends on bf16 rounding. Draw them at std
    2/sqrt(hidden) instead (logits of std ~2), as trained routers are."""
    count = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
                param.normal_(0.0, 2.0 / hidden**0.5)
                count += 1
    return count


def build_model(name: str, model_dir: Path, build_device: str) -> None:
    _, config_cls, kwargs = MODELS[name]
    config = config_cls(**kwargs)
    torch.manual_seed(0)
    # Init directly on the GPU: the llama3 model has ~1.5B params, slow on CPU.
    with torch.device(build_device):
        model = AutoModelForCausalLM.from_config(config, **dtype_kwarg(torch.float32))
    norms = randomize_norms(model)
    routers = widen_routers(model, kwargs["hidden_size"])
    if routers:
        log(f"[{name}] {routers} routers drawn at std 2/sqrt(hidden)")
    model.to(torch.bfloat16)
    model_dir.mkdir(parents=True, exist_ok=True)
    save_kwargs = dict(max_shard_size="20GB")  # one model.safetensors file
    try:
        model.save_pretrained(model_dir, safe_serialization=True, **save_kwargs)
    except TypeError:  # newer transformers dropped the flag (always safetensors)
        model.save_pretrained(model_dir, **save_kwargs)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"[{name}] built {n_params / 1e6:.0f}M params, {norms} random norms -> {model_dir}")
    del model
    free_gpu()


def patch_config(name: str, model_dir: Path) -> None:
    """Newer transformers write `rope_parameters` instead of the top-level
    `rope_theta`/`rope_scaling` keys that ingot reads; add them if missing."""
    _, _, kwargs = MODELS[name]
    path = model_dir / "config.json"
    cfg = json.loads(path.read_text())
    changed = False
    wanted = {"rope_theta": kwargs["rope_theta"]}
    if "rope_scaling" in kwargs:
        wanted["rope_scaling"] = kwargs["rope_scaling"]
    if cfg.get("dtype") is None:  # transformers >= 4.56 writes `dtype`
        wanted["torch_dtype"] = "bfloat16"
    for key, value in wanted.items():
        if cfg.get(key) is None:
            cfg[key] = value
            changed = True
    if changed:
        path.write_text(json.dumps(cfg, indent=2) + "\n")


def prepare_model(name: str, args: argparse.Namespace, build_device: str) -> Path:
    tok_subdir = MODELS[name][0]
    model_dir = Path(args.work) / "models" / name
    if has_weights(model_dir):
        log(f"[{name}] reusing {model_dir}")
    else:
        build_model(name, model_dir, build_device)
    patch_config(name, model_dir)
    for fname in TOKENIZER_FILES:
        src = Path(args.tokenizers) / tok_subdir / fname
        if not src.exists():
            raise SystemExit(f"missing tokenizer file {src}")
        shutil.copyfile(src, model_dir / fname)
    return model_dir


def make_prompts(vocab_size: int, seed: int) -> list[list[int]]:
    rng = np.random.RandomState(seed)
    return [rng.randint(0, vocab_size, size=n).tolist() for n in PROMPT_LENGTHS]


def free_gpu() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@torch.no_grad()
def reference_logits(
    model_dir: Path, prompts: list[list[int]], device: str, dtype: torch.dtype = torch.float32
) -> list[np.ndarray]:
    """fp32 math on the bf16-rounded weights, so only ingot's own rounding shows
    (bf16: transformers' own bf16 run, the tolerance bf16 math has on this model)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, **dtype_kwarg(dtype))
    model = model.to(device).eval()
    out = []
    for ids in prompts:
        input_ids = torch.tensor([ids], dtype=torch.long, device=device)
        logits = model(input_ids).logits[0, -1]
        out.append(logits.float().cpu().numpy().astype(np.float32))
    del model
    free_gpu()
    return out


def ingot_logits(args: argparse.Namespace, model_dir: Path, ids: list[int], out_file: Path) -> tuple[np.ndarray, dict]:
    cmd = [
        args.ingot, "logits",
        "--model", str(model_dir),
        "--device", args.device,
        "--max-model-len", "4096",
        "--prompt-ids", ",".join(str(i) for i in ids),
        "--out", str(out_file),
        *shlex.split(args.ingot_flags),
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900)
    except subprocess.CalledProcessError as e:
        log(f"ingot failed (exit {e.returncode}): {' '.join(cmd[:8])} ...")
        log(e.stderr or "")
        raise
    info = {}
    lines = [line for line in proc.stdout.splitlines() if line.strip().startswith("{")]
    if lines:
        info = json.loads(lines[-1])
    return np.fromfile(out_file, dtype="<f4"), info


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    """a: ingot, b: reference."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    diff = a64 - b64
    top5_a = set(np.argsort(-a64)[:5].tolist())
    top5_b = set(np.argsort(-b64)[:5].tolist())
    return {
        "rel_l2": float(np.linalg.norm(diff) / np.linalg.norm(b64)),
        "rel_max": float(np.max(np.abs(diff)) / np.max(np.abs(b64))),
        "top1": bool(int(np.argmax(a64)) == int(np.argmax(b64))),
        "top5_overlap": len(top5_a & top5_b),
    }


def run_model(name: str, args: argparse.Namespace, ref_device: str) -> list[dict]:
    model_dir = prepare_model(name, args, ref_device)
    vocab = MODELS[name][2]["vocab_size"]
    prompts = make_prompts(vocab, seed=1234)
    t0 = time.time()
    refs = reference_logits(model_dir, prompts, ref_device)
    bf16_refs = reference_logits(model_dir, prompts, ref_device, torch.bfloat16)
    log(f"[{name}] reference logits (fp32 and bf16) in {time.time() - t0:.1f}s")
    logits_dir = Path(args.work) / "logits"
    logits_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for ids, ref, bf16_ref in zip(prompts, refs, bf16_refs):
        out_file = logits_dir / f"{name}-{len(ids)}.f32"
        got, info = ingot_logits(args, model_dir, ids, out_file)
        row = {"model": name, "prompt_len": len(ids), "device": info.get("device")}
        row["bf16_rel_l2"] = compare(bf16_ref, ref)["rel_l2"]
        if got.shape != ref.shape:
            row.update(error=f"ingot wrote {got.size} logits, expected {ref.size}")
        else:
            row.update(compare(got, ref))
        rows.append(row)
        print_row(row)
    return rows


def print_header() -> None:
    print(
        f"{'model':<12} {'len':>4} {'rel_l2':>10} {'rel_max':>10} {'top1':>5} {'top5':>4} {'hf bf16':>10}  device",
        flush=True,
    )


def print_row(row: dict) -> None:
    if "error" in row:
        print(f"{row['model']:<12} {row['prompt_len']:>4}  ERROR: {row['error']}", flush=True)
        return
    print(
        f"{row['model']:<12} {row['prompt_len']:>4} {row['rel_l2']:>10.3e} {row['rel_max']:>10.3e}"
        f" {str(row['top1']):>5} {row['top5_overlap']:>4} {row['bf16_rel_l2']:>10.3e}  {row['device']}",
        flush=True,
    )


def failures(rows: list[dict], threshold: float) -> list[str]:
    """A case fails past `threshold` or past 1.5x what transformers' own bf16 run
    is off by on it, whichever is larger: bf16 math moves a mixture of experts'
    near-tie routing choices, so its tolerance is the model's, not a constant."""
    out = []
    for r in rows:
        case = f"{r['model']}/len{r['prompt_len']}"
        if "error" in r:
            out.append(f"{case}: {r['error']}")
            continue
        limit = max(threshold, 1.5 * r.get("bf16_rel_l2", 0.0))
        # `not <` also catches NaN/inf.
        for key in ("rel_l2", "rel_max"):
            if not r[key] < limit:
                out.append(f"{case}: {key}={r[key]:.3e} >= {limit:.3g}")
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ingot", required=True, help="path to the ingot binary")
    p.add_argument("--tokenizers", required=True, help="dir with llama3/ and qwen3/ tokenizers")
    p.add_argument("--work", required=True, help="work dir for models and logits files")
    p.add_argument("--device", default="cuda", help="ingot --device (default cuda)")
    p.add_argument("--ingot-flags", default="", help="more ingot flags (e.g. \"--tensor-parallel-size 2\")")
    p.add_argument("--threshold", type=float, default=2e-2, help="max rel_l2 and rel_max")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    return p.parse_args()


def main() -> int:
    args = parse_args()
    # The reference must be true fp32: no TF32 in matmuls/convs.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    ref_device = "cuda" if torch.cuda.is_available() else "cpu"
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, reference on {ref_device}")

    print_header()
    rows: list[dict] = []
    try:
        for name in args.models:
            rows.extend(run_model(name, args, ref_device))
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        print(json.dumps({"ok": False, "error": f"ingot did not run: {type(e).__name__}", "cases": rows}))
        return 2

    failed = failures(rows, args.threshold)
    for f in failed:
        print(f"FAIL {f}")
    summary = {
        "ok": not failed,
        "threshold": args.threshold,
        "worst_rel_l2": max((r.get("rel_l2", float("inf")) for r in rows), default=None),
        "worst_rel_max": max((r.get("rel_max", float("inf")) for r in rows), default=None),
        "failures": failed,
        "cases": rows,
    }
    print(json.dumps(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
