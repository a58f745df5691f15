#!/usr/bin/env python3
"""Gemma 3 on the CUDA backend against the CPU backend and transformers, on
the real GGUF weights and the prompts of tests/fixtures/gemma3/expected.json
(6 prompts of 65 to 965 tokens: one is longer than the 512-token window).

    python3 tests/gpu/compare_gemma.py --ingot BIN --model gemma-3-270m-q4_k_m.gguf \
        --fixture tests/fixtures/gemma3/expected.json [--long tests/fixtures/gemma3/long.json] [--hf]

Per prompt: ingot's tokenization against the fixture's (HF tokenizer) ids;
first-step logits CUDA vs CPU (bf16 weights on both, as compare_backends.py)
as rel_l2 / rel_max; 32 greedy tokens CUDA vs CPU; CUDA's first 16 greedy
tokens vs the f32 numpy reference's (the fixture). With --hf, the GGUF is
dequantized with the `gguf` package into a transformers Gemma3ForCausalLM
(norm weights minus the one the GGUF holds: transformers' RMSNorm scales by
1 + w; q/k rows are in HF order for gemma3) and run on the GPU in f32 and
bf16: first-step logits vs CUDA and 32 greedy tokens vs CUDA.

With --long (tests/fixtures/gemma3/long.json: 1,670 tokens, several windows,
48 reference tokens), that prompt runs the same checks with its 48 tokens, the
greedy runs (prefilled in the default 512-token chunks) in a KV pool of
--long-kv-tokens: fewer pages than one table shared by all layers needs, so
it completes only if the sliding layers give their blocks back.

A greedy divergence passes only at a near-tie (the reference side's
top-1/top-2 margin at that step below --tie-margin). Exit 1 on a logits error
at or above --threshold or a divergence at a clear margin.
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

from ingot_cli import ingot

LOCAL_ROPE_BASE = 10000.0  # rope_local_base_freq: not in llama.cpp's GGUF



def cpu_flags(device):
    return ["--dtype", "bf16", "--cpu-weights", "f32"] if device == "cpu" else []


# `ingot logits` runs the whole prompt as one step: the CUDA workspace must hold it.
ONE_STEP = ["--max-num-batched-tokens", "2048"]


def logits(binary, model, device, ids, out):
    ingot(binary, "logits", "--model", model, "--device", device, *cpu_flags(device), *ONE_STEP,
          "--prompt-ids", ",".join(map(str, ids)), "--out", out)
    return np.fromfile(out, dtype="<f4").astype(np.float64)


def greedy(binary, model, device, prompt, n, kv_tokens=None):
    pool = ["--kv-cache-tokens", str(kv_tokens)] if kv_tokens else []
    r = ingot(binary, "generate", "--model", model, "--device", device, *cpu_flags(device), *pool,
              "--prompt", prompt, "--max-tokens", str(n), "--ignore-eos", "--print-ids")
    return json.loads(r.stderr.strip().splitlines()[-1])


def errors(a, b):
    return (float(np.linalg.norm(a - b) / np.linalg.norm(b)),
            float(np.max(np.abs(a - b)) / np.max(np.abs(b))))


def margin(row):
    top2 = np.sort(row)[-2:]
    return float(top2[1] - top2[0])


def first_divergence(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


class HfGemma:
    """transformers' Gemma3ForCausalLM holding the GGUF's dequantized weights."""

    def __init__(self, path, dtype):
        import gguf
        import torch
        from gguf.quants import dequantize
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        r = gguf.GGUFReader(path)
        f = lambda k: r.fields[f"gemma3.{k}"].contents()
        d, layers = int(f("embedding_length")), int(f("block_count"))
        hd = int(f("attention.key_length"))
        w = {t.name: dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)])
             for t in r.tensors}
        vocab = w["token_embd.weight"].shape[0]
        kw = dict(
            vocab_size=vocab, hidden_size=d, intermediate_size=int(f("feed_forward_length")),
            num_hidden_layers=layers, num_attention_heads=int(f("attention.head_count")),
            num_key_value_heads=int(f("attention.head_count_kv")), head_dim=hd,
            rms_norm_eps=float(np.float32(f("attention.layer_norm_rms_epsilon"))),
            sliding_window=int(f("attention.sliding_window")), query_pre_attn_scalar=hd,
            max_position_embeddings=int(f("context_length")), final_logit_softcapping=None,
            attn_logit_softcapping=None, tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
            layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)],
        )
        base = float(f("rope.freq_base"))
        try:  # transformers 5: one rope dict per layer type
            cfg = Gemma3TextConfig(**kw, rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": base},
                "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_ROPE_BASE}})
        except (TypeError, ValueError):
            cfg = Gemma3TextConfig(**kw, rope_theta=base, rope_local_base_freq=LOCAL_ROPE_BASE)
        print("hf config rope:", getattr(cfg, "rope_parameters", None) or (cfg.rope_theta, cfg.rope_local_base_freq))
        model = Gemma3ForCausalLM(cfg)
        norm = lambda name: torch.tensor(w[name] - 1.0)  # GGUF norms hold 1 + w
        mat = lambda name: torch.tensor(w[name])
        sd = {"model.embed_tokens.weight": mat("token_embd.weight"), "model.norm.weight": norm("output_norm.weight")}
        for i in range(layers):
            p, g = f"model.layers.{i}.", f"blk.{i}."
            sd.update({
                p + "input_layernorm.weight": norm(g + "attn_norm.weight"),
                p + "self_attn.q_proj.weight": mat(g + "attn_q.weight"),
                p + "self_attn.k_proj.weight": mat(g + "attn_k.weight"),
                p + "self_attn.v_proj.weight": mat(g + "attn_v.weight"),
                p + "self_attn.o_proj.weight": mat(g + "attn_output.weight"),
                p + "self_attn.q_norm.weight": norm(g + "attn_q_norm.weight"),
                p + "self_attn.k_norm.weight": norm(g + "attn_k_norm.weight"),
                p + "post_attention_layernorm.weight": norm(g + "post_attention_norm.weight"),
                p + "pre_feedforward_layernorm.weight": norm(g + "ffn_norm.weight"),
                p + "post_feedforward_layernorm.weight": norm(g + "post_ffw_norm.weight"),
                p + "mlp.gate_proj.weight": mat(g + "ffn_gate.weight"),
                p + "mlp.up_proj.weight": mat(g + "ffn_up.weight"),
                p + "mlp.down_proj.weight": mat(g + "ffn_down.weight"),
            })
        missing, unexpected = model.load_state_dict(sd, strict=False)
        assert not unexpected and all("lm_head" in m for m in missing), (missing, unexpected)
        model.tie_weights()
        self.torch = torch
        self.model = model.to(dtype=dtype, device="cuda").eval()

    def logits(self, ids):
        with self.torch.no_grad():
            x = self.torch.tensor([ids], device="cuda")
            return self.model(x).logits[0, -1].double().cpu().numpy()

    def greedy(self, ids, n):
        """n greedy tokens, each step's logits recomputed over the whole
        sequence (no cache implementation differences), with margins."""
        out, margins = [], []
        for _ in range(n):
            row = self.logits(ids + out)
            margins.append(margin(row))
            out.append(int(np.argmax(row)))
        return out, margins


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ingot", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threshold", type=float, default=3e-2)
    ap.add_argument("--tie-margin", type=float, default=0.15)
    ap.add_argument("--hf", action="store_true")
    ap.add_argument("--long", help="a fixture of prompts several windows long, run in a small KV pool")
    # 480 pages of 3 layers (block 16): 108 blocks x 6 pages = 648 would be
    # one shared table for 1,718 positions; the grouped layout needs 108 +
    # 65 x 5 = 433 with 512-token chunks.
    ap.add_argument("--long-kv-tokens", type=int, default=1280)
    args = ap.parse_args()
    cases = json.load(open(args.fixture))
    if args.long:
        cases += [dict(c, kv_tokens=args.long_kv_tokens) for c in json.load(open(args.long))]
    tmp = tempfile.mkdtemp()
    failures, rows = [], []

    def check_greedy(name, tag, want, got, margins, strict=True):
        step = first_divergence(want, got)
        if step is None:
            return f"{len(want)}/{len(want)}"
        if strict and margins[step] >= args.tie_margin:
            failures.append(f"{name}: {tag} diverges at step {step} (margin {margins[step]:.3f})")
        return f"@{step}({margins[step]:.2f})"

    print(f"{'prompt':14} {'len':>4} {'ids':>4} {'rel_l2':>8} {'rel_max':>8} {'cpu32':>10} {'ref16':>10}")
    for case in cases:
        name, ids = case["name"], case["prompt_ids"]
        n, pool = max(args.tokens, len(case["greedy_ids"])), case.get("kv_tokens")
        cpu_run = greedy(args.ingot, args.model, "cpu", case["prompt"], n, pool)
        gpu_run = greedy(args.ingot, args.model, "cuda", case["prompt"], n, pool)
        same_ids = cpu_run["prompt_ids"] == ids and gpu_run["prompt_ids"] == ids
        if not same_ids:
            failures.append(f"{name}: ingot's prompt ids differ from the fixture's")
        g = logits(args.ingot, args.model, "cuda", ids, os.path.join(tmp, "gpu.f32"))
        c = logits(args.ingot, args.model, "cpu", ids, os.path.join(tmp, "cpu.f32"))
        rel_l2, rel_max = errors(g, c)
        if not (rel_l2 < args.threshold and rel_max < args.threshold):
            failures.append(f"{name}: CUDA vs CPU logits rel_l2 {rel_l2:.2e} rel_max {rel_max:.2e}")
        out_c, out_g = cpu_run["output_ids"], gpu_run["output_ids"]
        step = first_divergence(out_c, out_g)
        cpu_margins = [0.0] * len(out_c)
        if step is not None:
            ctx = logits(args.ingot, args.model, "cpu", ids + out_c[:step], os.path.join(tmp, "m.f32"))
            cpu_margins[step] = margin(ctx)
        v_cpu = check_greedy(name, "CUDA vs CPU", out_c, out_g, cpu_margins)
        ref = case["greedy_ids"]
        v_ref = check_greedy(name, "CUDA vs f32 reference", ref, out_g[:len(ref)], case["margins"])
        row = {"name": name, "tokens": len(ids), "rel_l2": rel_l2, "rel_max": rel_max,
               "cpu_greedy": v_cpu, "ref_greedy": v_ref, "gpu_ids": out_g, "gpu_logits": g}
        rows.append(row)
        print(f"{name[:14]:14} {len(ids):4} {'ok' if same_ids else 'DIFF':>4} {rel_l2:8.2e} {rel_max:8.2e} "
              f"{v_cpu:>10} {v_ref:>10}", flush=True)

    if args.hf:
        import torch
        print(f"\n{'transformers':14} {'dtype':>5} {'rel_l2':>8} {'rel_max':>8} {'greedy32':>10} {'vs numpy ref':>12}")
        for dtype in (torch.float32, torch.bfloat16):
            hf = HfGemma(args.model, dtype)
            tag = str(dtype).split(".")[-1]
            for case, row in zip(cases, rows):
                name, ids = case["name"], case["prompt_ids"]
                g = row["gpu_logits"]
                h = hf.logits(ids)
                rel_l2, rel_max = errors(g, h)
                out_h, margins = hf.greedy(ids, args.tokens)
                # bf16 transformers only reported: its own rounding can flip moderate margins.
                v = check_greedy(name, f"CUDA vs transformers {tag}", out_h, row["gpu_ids"], margins,
                                 strict=dtype == torch.float32)
                if dtype == torch.float32 and not (rel_l2 < args.threshold and rel_max < args.threshold):
                    failures.append(f"{name}: CUDA vs transformers f32 logits rel_l2 {rel_l2:.2e}")
                # The conversion itself, checked against the f32 numpy reference's top-16 first logits.
                top = np.array(case["first_logits_top"])
                ref_err = float(np.max(np.abs(h[top[:, 0].astype(int)] - top[:, 1])))
                if dtype == torch.float32 and ref_err > 1e-2:
                    failures.append(f"{name}: transformers f32 differs from the numpy reference by {ref_err:.2e}")
                row[f"hf_{tag}"] = {"rel_l2": rel_l2, "rel_max": rel_max, "greedy": v, "ref_top16_err": ref_err}
                print(f"{name[:14]:14} {tag[:5]:>5} {rel_l2:8.2e} {rel_max:8.2e} {v:>10} {ref_err:12.2e}", flush=True)
            del hf
    for row in rows:
        row.pop("gpu_ids")
        row.pop("gpu_logits")
    print(json.dumps({"ok": not failures, "failures": failures, "rows": rows}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
