#!/usr/bin/env python3
"""Times `prefill_attention{,_fp8}_hd*` alone from one or more attention
cubins, so kernel versions compare in one device call without a binary each:

    python3 tests/gpu/bench_prefill_attention.py main=DIR_A:64:128:qkv new=DIR_B:128:256

Each version is LABEL=DIR:ROWS:THREADS[:qkv] (DIR holds attention.sm_90.cubin;
ROWS the query rows of its tiles, THREADS its block size; its shared
memory: Q of ROWS rows, K and V of 64, and a raw FP8 tile for FP8 caches,
or with `qkv` (the kernel before prefill21) three 64-row tiles). Shapes, on
the 8B's heads (32 query heads, 8 kv heads, head_dim 128, 16-slot blocks):
one 1,024-token prompt, and a mixed step's prompt work in the 256 x (1024
in, 128 out) run (7 whole 1,024-token prompts + the second half of an
eighth: 7,680 tokens); on SmolLM2-135M's (9, 3, 64): one 1,024-token
prompt. Prints the mean time
per launch, the causal TFLOP/s, and each version's largest difference from
the first version's output (all read the same inputs). --once runs each
launch once, for ncu.
"""
import argparse
import ctypes
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_kernels import Module, cu, f32, i32, ok, time_launches  # noqa: E402

BS = 16
LLAMA_8B, SMOLLM2 = (32, 8, 128), (9, 3, 64)  # query heads, kv heads, head_dim


def shapes():
    """(name, heads, [(prefix, chunk)] of the prompts' chunks)."""
    return [("8B 1x1024", LLAMA_8B, [(0, 1024)]),
            ("8B mixed 7,680", LLAMA_8B, [(0, 1024)] * 7 + [(512, 512)]),
            ("smol 1x1024", SMOLLM2, [(0, 1024)])]


class Inputs:
    def __init__(self, heads, chunks, kv_dtype, seed=0):
        self.heads = heads
        H, KVH, HD = heads
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.chunks = chunks
        lens = [p + c for p, c in chunks]
        blocks = [math.ceil(n / BS) for n in lens]
        self.stride = max(blocks)
        perm = torch.randperm(sum(blocks), generator=g, device="cuda").to(torch.int32)
        table = torch.zeros(len(lens), self.stride, dtype=torch.int32, device="cuda")
        at = 0
        for s, nb in enumerate(blocks):
            table[s, :nb] = perm[at:at + nb]
            at += nb
        self.table = table.reshape(-1).contiguous()
        shape = (sum(blocks), KVH, BS, HD)
        self.k = torch.randn(shape, generator=g, device="cuda").mul(1.5).to(kv_dtype)
        self.v = torch.randn(shape, generator=g, device="cuda").to(kv_dtype)
        self.tokens = sum(c for _, c in chunks)
        self.q = torch.randn(self.tokens, H * HD, generator=g, device="cuda").to(torch.bfloat16)
        self.positions = torch.cat([torch.arange(p, p + c, dtype=torch.int32) for p, c in chunks]).cuda()
        self.stride_d = torch.tensor([self.stride], dtype=torch.int32, device="cuda")
        # Causal FLOPs: QK^T and PV, 2 * HD each per (query head, visible key).
        self.flops = 4 * HD * H * sum(sum(range(p + 1, p + c + 1)) for p, c in chunks)

    def tiles(self, rows):
        tt = rows // (self.heads[0] // self.heads[1])
        out, first = [], 0
        for s, (_, c) in enumerate(self.chunks):
            for start in range(0, c, tt):
                out += [first + start, min(tt, c - start), s]
            first += c
        return torch.tensor(out, dtype=torch.int32, device="cuda")


class Version:
    def __init__(self, spec):
        label, rest = spec.split("=", 1)
        path, *fields = rest.split(":")
        self.label, self.rows, self.threads = label, int(fields[0]), int(fields[1])
        self.qkv_layout = fields[2:] == ["qkv"]
        self.module = Module(os.path.join(path, "attention.sm_90.cubin"))

    def smem(self, hd, fp8):
        if self.qkv_layout:
            return 3 * 64 * (hd + 8) * 2
        return (self.rows + 2 * 64) * (hd + 8) * 2 + (64 * hd if fp8 else 0)

    def launcher(self, inp, fp8):
        H, KVH, HD = inp.heads
        fn = self.module.fn(f"prefill_attention{'_fp8' if fp8 else ''}_hd{HD}")
        smem = self.smem(HD, fp8)
        ok(cu.cuFuncSetAttribute(fn, 8, smem), "set max dynamic smem")
        tiles = inp.tiles(self.rows)
        out = torch.zeros_like(inp.q)
        args = [ctypes.c_uint64(t.data_ptr()) for t in (inp.q, inp.k, inp.v, inp.table, inp.stride_d, tiles,
                                                          inp.positions, out)]
        args += [i32(H), i32(KVH), i32(BS), f32(math.log2(math.e) / math.sqrt(HD)), i32(0)]
        keep = [tiles, out, args]  # the launch reads args through pointers
        params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
        grid = (len(tiles) // 3, KVH, 1)

        def run():
            ok(cu.cuLaunchKernel(fn, grid[0], grid[1], grid[2], self.threads, 1, 1, smem, None, params, None),
               "launch")

        return run, out, keep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("versions", nargs="+", help="LABEL=DIR:ROWS:THREADS")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--once", action="store_true", help="one launch per version and shape (for ncu)")
    ap.add_argument("--fp8", action="store_true", help="also the FP8-cache kernels")
    args = ap.parse_args()
    torch.zeros(1, device="cuda")  # makes the primary context current for the driver calls
    versions = [Version(s) for s in args.versions]
    print(f"{'shape':15} {'kv':5} {'version':10} {'us/launch':>10} {'TFLOP/s':>8} {'max diff vs first':>18}")
    for (name, heads, chunks), fp8 in [(s, f) for f in ([False, True] if args.fp8 else [False]) for s in shapes()]:
        inp = Inputs(heads, chunks, torch.float8_e4m3fn if fp8 else torch.bfloat16)
        first = None
        for v in versions:
            run, out, _keep = v.launcher(inp, fp8)
            us = time_launches(run, args.iters, args.once)
            res = out.float()
            diff = 0.0 if first is None else float((res - first).abs().max() / first.abs().max())
            first = res if first is None else first
            print(f"{name:15} {'fp8' if fp8 else 'bf16':5} {v.label:10} {us:10.1f} {inp.flops / us / 1e6:8.1f} "
                  f"{diff:18.2e}", flush=True)


if __name__ == "__main__":
    main()
