#!/usr/bin/env python3
"""Times the expert blocks of a Mixture-of-Experts layer (moe.cu) at the
Qwen3-30B-A3B shape (hidden 2048, 128 experts of 768, top 8) for a range of
tokens per step: the per-slot GEMVs (moe_gate_up_silu + moe_down_sum) against
the grouped tensor-core path (moe_align, moe_grouped_gate_up_silu,
moe_grouped_down, moe_weighted_sum), on the same routing (each token's 8
experts drawn uniformly). Prints one line per token count: µs per layer of
each path (and of the GEMVs' gate/up kernel alone, with the GB/s the pair
reads its slots' rows at), the grouped path's TFLOP/s, and which is faster:
the crossover the runner's MOE_GROUPED_MIN_TOKENS is set from.

    python3 tests/gpu/bench_moe.py --cubins DIR [--tokens 1,8,16,...]
"""
import argparse
import os

import ctypes

import numpy as np
import torch

import check_kernels as ck
from check_kernels import Module, i32, moe_tiles, ptr, time_launches

D, E, K, FF = 2048, 128, 8, 768


def launch(f, grid, block, args, smem=0):
    """A launch on torch's current stream without check_kernels' synchronize (so it can be
    captured in a graph); `smem`: dynamic shared memory bytes (at most the default 48 KiB)."""
    params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
    g = tuple(grid) + (1,) * (3 - len(grid))
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    ck.ok(ck.cu.cuLaunchKernel(f, g[0], g[1], g[2], block, 1, 1, smem, stream, params, None), "launch")


def graph_us(run, reps=10, iters=5):
    """µs of one `run()` replayed back to back from a CUDA graph of `reps` of them: the kernels'
    time without Python's launch overhead."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            run()
    return time_launches(g.replay, iters) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cubins", required=True)
    ap.add_argument("--tokens", default="1,2,4,8,12,16,24,32,48,64,128,256,512,1024,2048,4096")
    args = ap.parse_args()
    torch.zeros(1, device="cuda")
    m = Module(os.path.join(args.cubins, "moe.sm_90.cubin"))
    rng = np.random.default_rng(0)
    gate = (torch.rand(E, FF, D, device="cuda") * 0.04 - 0.02).to(torch.bfloat16)
    up = (torch.rand(E, FF, D, device="cuda") * 0.04 - 0.02).to(torch.bfloat16)
    down = (torch.rand(E, D, FF, device="cuda") * 0.04 - 0.02).to(torch.bfloat16)
    fns = {n: m.fn(n) for n in ("moe_gate_up_silu", "moe_down_sum", "moe_gate_up_silu_b1", "moe_down_sum_b1",
                                "moe_align", "moe_grouped_gate_up_silu",
                                "moe_grouped_down", "moe_weighted_sum")}
    print(f"{'tokens':>6} {'gemv µs':>9} {'gate/up':>8} {'GB/s':>6} {'grouped µs':>10} {'TFLOP/s':>8}  faster   max rel diff")
    for T in [int(t) for t in args.tokens.split(",")]:
        ids = torch.tensor(np.sort(np.stack([rng.choice(E, K, replace=False) for _ in range(T)]), 1),
                           dtype=torch.int32, device="cuda")
        w = torch.full((T, K), 1.0 / K, dtype=torch.float32, device="cuda")
        x = (torch.rand(T, D, device="cuda") * 2 - 1).to(torch.bfloat16)
        act = torch.empty(T * K, FF, dtype=torch.bfloat16, device="cuda")
        out = torch.empty(T * K, D, dtype=torch.float32, device="cuda")
        r_gemv = torch.zeros(T, D, dtype=torch.float32, device="cuda")
        r_grp = torch.zeros(T, D, dtype=torch.float32, device="cuda")
        tiles = moe_tiles(T, K, E)
        srt = torch.empty(tiles * 64, dtype=torch.int32, device="cuda")
        te = torch.empty(tiles, dtype=torch.int32, device="cuda")

        # The runner's choice: the one-token kernels (inputs in shared memory) at one token.
        sfx = "_b1" if T == 1 else ""

        def gate_up():
            launch(fns["moe_gate_up_silu" + sfx], (T * K, FF // 8), 256,
                   [ptr(x), ptr(gate), ptr(up), ptr(ids), i32(K), i32(D), i32(FF), ptr(act)], smem=2 * D if sfx else 0)

        def gemv():
            gate_up()
            launch(fns["moe_down_sum" + sfx], (T, D // 8), 256,
                   [ptr(act), ptr(down), ptr(ids), ptr(w), i32(K), i32(D), i32(FF), ptr(r_gemv), ptr(None),
                    ptr(None), ptr(None)], smem=2 * K * FF if sfx else 0)

        def grouped():
            launch(fns["moe_align"], (1,), 1024, [ptr(ids), i32(T * K), i32(E), i32(tiles), ptr(srt), ptr(te)])
            launch(fns["moe_grouped_gate_up_silu"], (FF // 64, tiles), 128,
                   [ptr(x), i32(K), ptr(gate), ptr(up), i32(FF), i32(D), ptr(srt), ptr(te), ptr(act)])
            launch(fns["moe_grouped_down"], (D // 128, tiles), 128,
                   [ptr(act), ptr(down), i32(D), i32(FF), ptr(srt), ptr(te), ptr(out)])
            launch(fns["moe_weighted_sum"], (T,), 256, [ptr(out), ptr(w), i32(K), i32(D), ptr(r_grp)])

        r_gemv.zero_(), gemv()
        r_grp.zero_(), grouped()
        torch.cuda.synchronize()
        diff = float((r_gemv - r_grp).abs().max() / r_gemv.abs().max().clamp_min(1e-30))
        t_gemv = graph_us(gemv, reps=10 if T <= 256 else 2) if T <= 2048 else float("nan")
        t_gate_up = graph_us(gate_up, reps=10 if T <= 256 else 2) if T <= 2048 else float("nan")
        gbs = T * K * 3 * FF * D * 2 / (t_gemv * 1e-6) / 1e9
        t_grp = graph_us(grouped)
        tflops = 2 * T * K * D * FF * 3 / (t_grp * 1e-6) / 1e12
        faster = "grouped" if t_grp < t_gemv else "gemv"
        print(f"{T:6} {t_gemv:9.1f} {t_gate_up:8.1f} {gbs:6.0f} {t_grp:10.1f} {tflops:8.1f}  {faster:8} {diff:.2e}")


if __name__ == "__main__":
    main()
