#!/usr/bin/env python3
"""Times one decode row's attention (`paged_attention{,_fp8}_hd*_g*`) and its
split combine (`attention_combine`) per split count and context length, on
SmolLM2-135M's heads (9 query, 3 kv, head_dim 64, 30 layers) and the 8B's
(32, 8, 128, 32 layers), bf16 and FP8 caches, 1 and 8 decode rows: the
numbers the split counts of the runner's small decode graphs
(`SMALL_GRAPH_SPLITS`, `SMALL_KEYS_PER_SPLIT` in runner-cuda's buffers.rs)
were chosen from.

    python3 tests/gpu/bench_decode_splits.py --cubins DIR

Each timing replays a CUDA graph of one launch (or launch pair) per layer,
every layer with its own K/V (so the caches are not all in L2), and prints
microseconds per layer: the attention alone, and attention + combine (with
one split the attention writes its rows and no combine runs). Launched
without programmatic dependent launch, so a kernel boundary costs more here
than in the runner's graphs; the best split count per context is what this
is for.
"""
import argparse
import ctypes
import itertools
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_kernels import Module, f32, i32, ok, cu  # noqa: E402

BS = 16
SHAPES = {"smol": (9, 3, 64, 30), "8b": (32, 8, 128, 32)}  # heads, kv heads, head_dim, layers


class Layers:
    """K/V of `layers` layers for `rows` sequences of `ctx` tokens, one
    query row each."""

    def __init__(self, shape, ctx, rows, kv_dtype):
        H, KVH, HD, L = shape
        nb = math.ceil(ctx / BS)
        g = torch.Generator(device="cuda").manual_seed(ctx)
        self.rows = rows
        self.kv = [(torch.randn((rows * nb, KVH, BS, HD), generator=g, device="cuda").mul(1.5).to(kv_dtype),
                    torch.randn((rows * nb, KVH, BS, HD), generator=g, device="cuda").to(kv_dtype))
                   for _ in range(L)]
        self.table = torch.randperm(rows * nb, generator=g, device="cuda").to(torch.int32)
        self.stride = torch.tensor([nb], dtype=torch.int32, device="cuda")
        self.seq = torch.arange(rows, dtype=torch.int32, device="cuda")
        self.pos = torch.full((rows,), ctx - 1, dtype=torch.int32, device="cuda")
        self.q = torch.randn(rows, H * HD, generator=g, device="cuda").to(torch.bfloat16)
        self.out = torch.zeros(rows, H * HD, dtype=torch.bfloat16, device="cuda")


class Launch:
    """A prepared cuLaunchKernel (its argument storage kept alive)."""

    def __init__(self, fn, grid, args):
        self.fn, self.grid, self.args = fn, grid, args
        self.params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])

    def __call__(self, stream):
        g = self.grid
        ok(cu.cuLaunchKernel(self.fn, g[0], g[1], g[2], 128, 1, 1, 0, ctypes.c_void_p(stream), self.params, None),
           "launch")


def u64(t):
    return ctypes.c_uint64(t.data_ptr() if t is not None else 0)


def launches(mod, shape, lay, splits, fp8, part_acc, part_ml, combine):
    H, KVH, HD, _ = shape
    att = mod.fn(f"paged_attention{'_fp8' if fp8 else ''}_hd{HD}_g{H // KVH}")
    comb = mod.fn("attention_combine")
    out = []
    for k, v in lay.kv:
        args = [u64(lay.q), u64(k), u64(v), u64(lay.table), u64(lay.stride), u64(lay.seq), u64(lay.pos), u64(None),
                u64(lay.out), u64(part_acc), u64(part_ml), i32(H), i32(KVH), i32(BS),
                f32(math.log2(math.e) / math.sqrt(HD)), i32(splits), u64(None), ctypes.c_uint64(0), i32(0), i32(0)]
        out.append(Launch(att, (lay.rows, KVH, splits), args))
        if combine and splits > 1:
            out.append(Launch(comb, (lay.rows, H, 1), [u64(part_acc), u64(part_ml), u64(None), u64(lay.out), i32(H),
                                                i32(HD), i32(splits)]))
    return out


def time_graph(steps, layers, reps=20):
    """Microseconds per layer of a graph running `steps` once each."""
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for s in steps:  # warm-up outside the capture
            s(stream.cuda_stream)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for s in steps:
                s(stream.cuda_stream)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * layers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cubins", required=True)
    ap.add_argument("--ctx", default="32,64,128,192,256,384,512,768,1024,1536,2048,3072,4096")
    ap.add_argument("--splits", default="1,2,3,4,6,8,12,16,24,32")
    ap.add_argument("--rows", default="1,8", help="decode rows (sequences) per step")
    args = ap.parse_args()
    torch.zeros(1, device="cuda")
    mod = Module(os.path.join(args.cubins, "attention.sm_90.cubin"))
    ctxs = [int(c) for c in args.ctx.split(",")]
    split_counts = [int(s) for s in args.splits.split(",")]
    print("us per layer: attention + combine (attention alone); * = best split count")
    rows_list = [int(r) for r in args.rows.split(",")]
    for rows, (name, shape), fp8 in itertools.product(rows_list, SHAPES.items(), (False, True)):
        H, KVH, HD, L = shape
        part_acc = torch.zeros(rows * H * max(split_counts) * HD, dtype=torch.float32, device="cuda")
        part_ml = torch.zeros(rows * H * max(split_counts) * 2, dtype=torch.float32, device="cuda")
        print(f"\n{name} {'fp8' if fp8 else 'bf16'} KV, {rows} rows; ctx | "
              + " ".join(f"{s:>13}" for s in split_counts))
        for ctx in ctxs:
            lay = Layers(shape, ctx, rows, torch.float8_e4m3fn if fp8 else torch.bfloat16)
            both = [time_graph(launches(mod, shape, lay, s, fp8, part_acc, part_ml, True), L)
                    for s in split_counts]
            alone = [time_graph(launches(mod, shape, lay, s, fp8, part_acc, part_ml, False), L)
                     for s in split_counts]
            best = min(range(len(both)), key=both.__getitem__)
            cells = [f"{b:6.2f}({a:5.2f}){'*' if i == best else ' '}" for i, (b, a) in enumerate(zip(both, alone))]
            print(f"{name:4} {'fp8 ' if fp8 else 'bf16'} {ctx:5} | " + "".join(cells), flush=True)
            del lay


if __name__ == "__main__":
    main()
